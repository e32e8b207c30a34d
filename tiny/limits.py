"""Every default and limit of the server, in one place (a leaf module: it imports nothing of tiny).

tiny.config takes its defaults from here; the components take theirs as arguments from the
Config or from here. The copies that cannot import Python say where they come from and are
held equal to these by tests/test_limits.py: the compiled codec (rust/tiny_codec exports its
own, which tiny.codec checks at import), nginx/proxy.conf (``client_max_body_size`` and its
413 message) and docker-compose.yml (``TINY_MAX_BODY``).
"""

from __future__ import annotations

KiB, MiB = 1024, 1024**2

# -- bodies and records (POST /ingest) ----------------------------------------------------
MAX_BODY = 64 * MiB  # --max-body: a body, and a body decompressed; nginx's client_max_body_size
MAX_DAYS = 16  # --max-days: distinct days in one body; the compiled codec's default too
MAX_REJECTS = 1000  # --max-rejects: invalid lines kept per body; the compiled codec's default too
MAX_STRING = 1024  # characters (code points) of a string field; the compiled codec's too
MAX_ERRORS = 10  # per-line errors listed in a 200 answer; all of them go to rejects/
MAX_GZIP_MEMBERS = 250_000  # members of a gzip body: about 0.5 s of zlib set-up
INLINE_DECODE_BYTES = 1 * MiB  # bodies up to this are decoded on the event loop itself
MAX_OTHER_BODY = 64 * KiB  # a body sent to any other endpoint (none takes one): Tornado's own limit

# -- headers and the HTTP connection -----------------------------------------------------
MAX_HEADERS = 100  # request headers, answered 431 past it
MAX_HEADER_BYTES = 64 * KiB  # bytes of request headers, answered 431 past it
HEADER_READ_LIMIT = 1 * MiB  # past this Tornado closes the connection unanswered
MAX_LENGTH_DIGITS = 20  # characters of a Content-Length (2**64 has 20 digits): int() of thousands would raise
MAX_CHUNK_LINE = 4096  # bytes of a chunk-size line with its extensions
MAX_TRAILERS = 64 * KiB  # bytes of trailer fields after the last chunk
IDLE_TIMEOUT = 60.0  # --idle-timeout: seconds a connection may idle, or take to send its headers
BODY_TIMEOUT = 60.0  # --body-timeout: seconds a client may take to send a body
DRAIN_TIMEOUT = 8.0  # --drain-timeout: seconds a stop waits for requests in flight
DRAIN_GRACE = 0.5  # seconds requests on open connections are still served after a stop

# -- the write path -----------------------------------------------------------------------
MAX_BACKLOG = 256 * MiB  # --max-backlog: unwritten bytes per process before 503
MAX_FLUSH_APPENDS = 256  # appends (so keys) in one flush
LOCK_TIMEOUT = 5.0  # --lock-timeout: seconds a flush waits for the data dir's lock
STALL_TIMEOUT = 10.0  # --stall-timeout: seconds a worker's loop may stall before it is replaced

# -- exactly once ---------------------------------------------------------------------------
MAX_KEY = 255  # characters of an Idempotency-Key
IDEMPOTENCY_WINDOW = 86_400.0  # --idempotency-window: seconds a key counts at least
IDEMPOTENCY_MAX_KEYS = 10_000_000  # --idempotency-max-keys: keys kept at most (at least MAX_FLUSH_APPENDS)

# -- analytics --------------------------------------------------------------------------------
ANALYTICS_PROCESSES = 1  # --analytics-processes
ANALYTICS_CPU = 0.1  # --analytics-cpu: CPUs of all analytics pool processes of a server together
ANALYTICS_ROW_QUERIES = 1  # day files whose rows are read at once per worker; another gets 503
ANALYTICS_MAX_QUEUED = 32  # --analytics-max-queued
ANALYTICS_CACHE_BYTES = 64 * MiB  # --analytics-cache-bytes
READ_RATE = 2.0  # --read-rate: reads a worker starts per second while ingest requests are in flight in it
READ_WAIT = 10.0  # seconds a paced read waits for its turn at most; further away: 503 at once

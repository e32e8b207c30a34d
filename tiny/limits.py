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
IDLE_TIMEOUT = (
    60.0  # --idle-timeout: seconds a connection may idle, take to send its headers, or leave an answer untaken
)
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
MAX_ANSWER = 2 * KiB  # bytes of /ingest's 200 answer at most (its MAX_ERRORS errors): a key's record keeps it
IDEMPOTENCY_WINDOW = 86_400.0  # --idempotency-window: seconds a key counts at least
IDEMPOTENCY_MAX_KEYS = 10_000_000  # --idempotency-max-keys: keys kept at most (at least MAX_FLUSH_APPENDS)

# -- analytics --------------------------------------------------------------------------------
ANALYTICS_PROCESSES = 1  # --analytics-processes
ANALYTICS_CPU = 0.1  # --analytics-cpu: CPUs of all analytics pool processes of a server together
ANALYTICS_ROW_QUERIES = 1  # day files whose rows are read at once per worker; another gets 503
ANALYTICS_MAX_QUEUED = 32  # --analytics-max-queued
# --analytics-cache-bytes: every analytics cache of a worker and its pool processes together (a
# quarter the worker's, a quarter its answers lane's, half its rows lane's: tiny.analytics.caches)
ANALYTICS_CACHE_BYTES = 128 * MiB
ANSWERS_KEPT = 1024  # answers from the aggregates a worker keeps at most (within its bytes)
DAY_AGGREGATES_KEPT = 64  # day aggregates a pool process keeps at most, per version of the day
COUNTED_FILES_KEPT = 4096  # day files whose line count a pool process keeps at most
ANALYTICS_JOB_SECONDS = 60.0  # a pool job running longer is stuck: its process is killed, its pool replaced
READ_RATE = 2.0  # --read-rate: reads a worker starts per second while ingest requests are in flight in it
READ_WAIT = 10.0  # seconds a paced read waits for its turn at most; further away: 503 at once
FOLD_SECONDS = 10.0  # a query is answered within this long (and a fold step) or gets 503 (tiny.aggregate_errors.Behind)
LATE_SECONDS = 1.0  # past FOLD_SECONDS and this, the worker answers 503 itself (the pool has not reached the query)
STAT_DAYS = 366  # a query naming at most this many days also versions its answer by their files' stats

# -- folding the aggregates (tiny.aggregates, tiny.fold_pace) ------------------------------------
FOLD_FIRST_STEP = 256 * KiB  # bytes of a process's first fold step, before it has timed one
FOLD_MIN_STEP = 64 * KiB  # longer than any CRAN row (a record's strings are at most 1,024 characters each)
FOLD_MAX_STEP = 8 * MiB  # memory stays bounded on a big day
FOLD_STEP_SECONDS = 2.0  # a fold step (one transaction) aims to take this long, wall clock (8 MiB at 0.1 CPU)
FOLD_MARGIN = 0.5  # of the time left before a deadline, the share a step is sized to (its time is a guess)
SETTLED_NS = 1_000_000_000  # a day file unchanged this long before a check is remembered by its stat
SEEN_DAYS = 4096  # day files a process remembers so
# Bytes left up to which a Behind counts the rows left (their line ends) rather than estimating
# them: the compiled count reads gigabytes a second, Python's about a tenth of that.
EXACT_LEFT_COMPILED = 64 * MiB
EXACT_LEFT_PYTHON = 4 * MiB

# -- the dashboard's API (tiny.handlers.analytics) -------------------------------------------------
WHALES_DEFAULT_TOP = 6  # whales a dashboard query shows when it names no ``top``
WHALES_MAX_TOP = 100  # whales a dashboard query may ask for (``top``)
WHALE_DOWNLOADS_DEFAULT_LIMIT = 1000  # one whale's downloads listed when the query names no ``limit``
WHALE_DOWNLOADS_MAX_LIMIT = 100_000
DAYS_PAGE_DEFAULT = 100  # days listed per page of /api/days when the query names no ``limit``
DAYS_PAGE_MAX = 1000

# -- the CRAN downloads API (tiny.cran_api), as the public service -----------------------------------
CRAN_MAX_TOP = 100  # the public service keeps the top 100 of each period: a larger count gets 100
CRAN_DEFAULT_TOP = 9  # the public service's count when none is given
CRAN_MAX_PACKAGES = 1000  # packages one /downloads request names at most (400 past it)
CRAN_MAX_NAME = 100  # characters of a package name at most (CRAN's longest are about 40; 400 past it)
CRAN_MAX_DAILY_COUNTS = 100_000  # days x packages one /downloads/daily answer holds at most (400 past it)
TRENDING_MIN = 1000  # downloads in the last week for a package to trend
TRENDING_WEEKS = 24  # the weeks before the last one a package's rise is measured against

"""``POST /ingest``: the HTTP side of the data flow, handler -> codec -> rejects -> sink."""

from __future__ import annotations

import asyncio
import zlib
from datetime import UTC, datetime

import orjson
from tornado import web

from tiny import codec, layout, rejects
from tiny.handlers.base import APIError, Deps, JSONHandler
from tiny.journal import Claim
from tiny.profiling import profile
from tiny.sink import BacklogFull, SinkError

MAX_ERRORS = 10  # per-line errors listed in a 200 answer; all of them go to rejects/
INLINE_DECODE_BYTES = 1024 * 1024  # bodies up to this are decoded on the event loop itself
MAX_GZIP_MEMBERS = 250_000  # about 0.5 s of zlib set-up; real bodies have one member, or a few
_MIN_FEED, _MAX_FEED = 64, 64 * 1024  # bytes given to zlib at once (see gunzip)
MAX_KEY = 255  # characters of an Idempotency-Key
# The key a proxy gives a request that has none of its own (nginx/proxy.conf: $request_id, the
# same for every upstream it tries): a client's own Idempotency-Key headers pass through
# untouched, so that a doubled or empty one is refused the same way directly and via nginx.
PROXY_KEY_HEADER = "Proxy-Idempotency-Key"
NDJSON_TYPES = frozenset(
    {
        "application/x-ndjson",
        "application/ndjson",
        "application/jsonl",
        "application/x-jsonl",
        "application/jsonlines",
        "application/x-jsonlines",
        "application/json",
        "text/plain",
        "application/octet-stream",
        "application/x-www-form-urlencoded",  # curl --data-binary's default
    }
)


def gunzip(body: bytes, limit: int) -> bytes:
    """Decompress a gzip body of one or more members; 413 past ``limit`` bytes or
    MAX_GZIP_MEMBERS members, 400 if corrupt or truncated. Linear in the body's size.

    zlib copies the input left over after a member's end (``unused_data``); fed the whole
    rest of the body, that copy made many small members quadratic. So the inflater is fed
    slices of about twice the previous member's size, and the position is tracked here.
    """
    out: list[bytes] = []
    size = members = pos = 0
    view = memoryview(body)
    feed = _MAX_FEED
    try:
        while pos < len(body):
            members += 1
            if members > MAX_GZIP_MEMBERS:
                raise APIError(413, f"gzip body has more than {MAX_GZIP_MEMBERS} members")
            inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            start = pos
            while not inflater.eof:
                data = view[pos : pos + feed]
                if not data:
                    raise APIError(400, "gzip body is truncated")
                # max_length bounds the memory a gzip bomb can take before it is refused
                chunk = inflater.decompress(data, limit - size + 1)
                size += len(chunk)
                if size > limit or inflater.unconsumed_tail:
                    raise APIError(413, f"decompressed body is larger than {limit} bytes")
                out.append(chunk)
                pos += len(data) - len(inflater.unused_data)
            feed = min(max(2 * (pos - start), _MIN_FEED), _MAX_FEED)
    except zlib.error as exc:
        raise APIError(400, f"gzip body is corrupt: {exc}") from None
    return b"".join(out)


def idempotency_key(values: list[str], header: str = "Idempotency-Key") -> str | None:
    """The key the ``header`` lines of a request give (None without one): 1 to 255 visible
    ASCII characters, in double quotes or not (the IETF draft's structured-field string); 400
    for anything else, a header sent twice included."""
    if not values:
        return None
    if len(values) > 1:
        raise APIError(400, f"{header} was sent {len(values)} times; send one key")
    key = values[0].strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1]
    if not 1 <= len(key) <= MAX_KEY or not all("!" <= char <= "~" for char in key):
        raise APIError(400, f"{header} must be 1 to {MAX_KEY} visible ASCII characters")
    return key


@web.stream_request_body
class IngestHandler(JSONHandler):
    """``POST /ingest``: NDJSON CRAN records in, appended to the day files, then a 200.

    - Body: one JSON object per line (LF or CRLF), ``Content-Encoding`` identity or gzip,
      ``Content-Type`` absent or NDJSON-like (see NDJSON_TYPES), else 415.
    - Limits: body and decompressed body at most ``--max-body`` bytes (413; a larger
      declared Content-Length is refused before the body is read).
    - 200 once every valid row and every reject is written (see tiny.sink), with counts and
      the first MAX_ERRORS line errors; invalid lines never fail the batch.
    - ``Idempotency-Key`` (1-255 visible ASCII characters, optionally in double quotes):
      the first request with a key is processed and its answer stored with the key and a
      digest of its decompressed body, atomically with its rows (tiny.journal). The same key
      with the same body later, from any process sharing the data dir, gets that answer again
      with ``Idempotent-Replayed: true`` and writes nothing; with another body, 422. A second
      request with a key whose first is still in flight waits for it, then is answered so.
    - 400 corrupt gzip or a malformed Idempotency-Key, 401 bad token, 405 other methods, 422
      a key reused for another body, 431 header limits, 503 + Retry-After when the backlog is
      full or the disk refuses the write (nothing stored: a retry is processed afresh).
    """

    name = "ingest"
    allowed = ("POST",)
    SUPPORTED_METHODS = ("POST", "GET", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS")

    def initialize(self, deps: Deps) -> None:
        super().initialize(deps)
        self._chunks: list[bytes] = []
        self._received = 0
        self._counted = False
        self._body_read = False
        self._key: str | None = None

    def prepare(self) -> None:
        self._counted = True
        self.deps.drain.in_flight += 1
        super().prepare()  # header limits
        if self.request.method != "POST":
            raise APIError(405, "use POST to send records")
        self.check_token()
        headers = self.request.headers
        self._key = idempotency_key(headers.get_list("Idempotency-Key")) or idempotency_key(
            headers.get_list(PROXY_KEY_HEADER), PROXY_KEY_HEADER
        )
        encoding = self.request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("identity", "gzip", "x-gzip", ""):
            raise APIError(415, f"Content-Encoding {encoding!r} is not supported; use identity or gzip")
        self._gzip = encoding in ("gzip", "x-gzip")
        media = self.request.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        if media and media not in NDJSON_TYPES:
            raise APIError(415, f"Content-Type {media!r} is not NDJSON; send application/x-ndjson")
        declared = self.request.headers.get("Content-Length")
        limit = self.config.max_body
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                raise APIError(400, "Content-Length is not a number") from None
            if length > limit:
                raise APIError(413, f"body of {length} bytes is larger than the limit of {limit} bytes")
        # Our own count in data_received enforces the limit (chunked bodies too), so that
        # the answer is a JSON 413 rather than Tornado's bare 400 for an oversized body.
        self.request.connection.set_max_body_size(2**62)  # type: ignore[union-attr]
        self.request.connection.set_body_timeout(self.config.body_timeout)  # type: ignore[union-attr]

    def data_received(self, chunk: bytes) -> None:
        if self._finished:
            return
        self._received += len(chunk)
        if self._received > self.config.max_body:
            self._chunks = []
            self.send_error(413, message=f"body is larger than the limit of {self.config.max_body} bytes")
            return
        self._chunks.append(chunk)

    def body_read(self) -> bool:
        return self._body_read

    @profile
    async def post(self) -> None:
        self._body_read = True  # Tornado calls post() once the whole body is in
        if self._finished:  # answered already (413 while streaming)
            return
        sink = self.deps.sink
        if not sink.journal.is_open:  # it failed to open (or was refused since): try again, or say why
            try:
                await sink.ready()
            except SinkError as exc:
                raise APIError(503, f"{exc}; nothing of this request was kept", {"Retry-After": "5"}) from None
        body = b"".join(self._chunks)
        self._chunks = []
        received = len(body)
        if received > INLINE_DECODE_BYTES or self._gzip:
            # A big body (or any gzip body: a small one may inflate to --max-body) would hold
            # the event loop for milliseconds: decode it, and render its rejects, on a thread
            # (zlib and the compiled codec release the GIL, so other requests go on meanwhile).
            loop = asyncio.get_running_loop()
            batch, chunks, digest = await loop.run_in_executor(None, self._encode, body)
        else:
            batch, chunks, digest = self._encode(body)
        answer = orjson.dumps(
            {
                "result": {
                    "status": "ok",
                    "stats": {
                        "bytes": received,
                        "records": {
                            "valid": batch.valid,
                            "invalid": batch.invalid,
                            "total": batch.valid + batch.invalid,
                        },
                    },
                },
                "errors": [{"line": line, "error": reason} for line, reason, _ in batch.rejects[:MAX_ERRORS]],
            }
        )
        metrics = self.deps.metrics
        metrics.bytes_in.inc(received)
        if chunks or self._key is not None:
            claim = Claim(self._key, digest, answer) if self._key is not None else None
            try:
                stored = await sink.append(chunks, claim)
            except BacklogFull:
                raise APIError(
                    503, "too many writes are waiting for the disk; retry later", {"Retry-After": "1"}
                ) from None
            except SinkError as exc:
                raise APIError(503, f"{exc}; nothing of this request was kept", {"Retry-After": "5"}) from None
            if stored is not None:  # the key was stored before: nothing was written now
                if stored.digest != digest:
                    metrics.conflicts.labels("422").inc()
                    raise APIError(422, "this Idempotency-Key was used for another body; use a new key")
                metrics.replayed.inc()
                self.set_header("Idempotent-Replayed", "true")
                self.finish(stored.answer)
                return
        metrics.valid.inc(batch.valid)
        metrics.invalid.inc(batch.invalid)
        self.finish(answer)

    def _encode(self, body: bytes) -> tuple[codec.Batch, dict[str, bytes], bytes]:
        """The body's batch, the bytes it appends to each file (relative to DATA_DIR), and the
        decompressed body's digest when the request has an Idempotency-Key."""
        if self._gzip:
            body = gunzip(body, self.config.max_body)
        digest = self.deps.sink.digest(body) if self._key is not None else b""
        batch = codec.encode(body, self.config.max_days, self.config.max_rejects)
        chunks = {layout.day_file(day): rows for day, rows in batch.days.items()}
        if batch.invalid:
            now = datetime.now(UTC)
            omitted = None
            if batch.omitted is not None:
                omitted = (batch.invalid - len(batch.rejects), *batch.omitted)
            chunks[layout.rejects_file(now)] = rejects.render(batch.rejects, now, omitted)
        return batch, chunks, digest

    def _done(self) -> None:
        if self._counted:
            self._counted = False
            self.deps.drain.in_flight -= 1

    def on_finish(self) -> None:
        self._done()
        super().on_finish()

    def on_connection_close(self) -> None:
        self._done()
        super().on_connection_close()

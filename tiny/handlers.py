"""HTTP handlers: /ingest, /healthz, /metrics, and the one JSON error shape for them all.

Every non-200 answer is ``{"error": {"status": S, "message": "..."}}``; the message is
meant for the client and never carries internals.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import socket
import time
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from tornado import web

from tiny import codec, metrics, rejects
from tiny.config import Config
from tiny.profiling import profile
from tiny.sink import BacklogFull, DailyFileSink, SinkError

log = logging.getLogger("tiny.handlers")

MAX_ERRORS = 10  # per-line errors listed in a 200 answer; all of them go to rejects/
# Header limits, answered with a JSON 431. Tornado itself reads up to HEADER_READ_LIMIT and
# closes the connection without an answer past it (tiny.server), which bounds the memory.
MAX_HEADER_BYTES = 64 * 1024
MAX_HEADERS = 100
HEADER_READ_LIMIT = 1024 * 1024
INLINE_DECODE_BYTES = 1024 * 1024  # bodies up to this are decoded on the event loop itself
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


@dataclass
class ServerState:
    """What the handlers of one worker process share besides config, sink and metrics."""

    instance: str
    started: float = field(default_factory=time.monotonic)
    draining: bool = False
    in_flight: int = 0


class APIError(web.HTTPError):
    """An error whose ``message`` is shown to the client, with optional extra headers."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(status, "%s", message)
        self.message = message
        self.headers = headers or {}


def instance_name(port: int) -> str:
    """``<hostname>:<port>/<pid>``: which process answered (for /healthz and load tests)."""
    return f"{socket.gethostname()}:{port}/{os.getpid()}"


class JSONHandler(web.RequestHandler):
    """Base: JSON bodies, the JSON error shape, request metrics."""

    name = "other"

    def initialize(self, config: Config, state: ServerState, metrics: metrics.Metrics, sink: DailyFileSink) -> None:
        self.config = config
        self.state = state
        self.metrics = metrics
        self.sink = sink

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json")

    def prepare(self) -> None:
        self.check_headers()

    def check_headers(self) -> None:
        """431 for more than MAX_HEADERS headers or MAX_HEADER_BYTES of them."""
        headers = list(self.request.headers.get_all())
        if len(headers) > MAX_HEADERS:
            raise APIError(431, f"more than {MAX_HEADERS} request headers")
        if sum(len(name) + len(value) + 4 for name, value in headers) > MAX_HEADER_BYTES:
            raise APIError(431, f"request headers larger than {MAX_HEADER_BYTES} bytes")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        message = kwargs.get("message")
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, APIError):
            message = exc.message
            for name, value in exc.headers.items():
                self.set_header(name, value)
        if message is None:
            message = self._reason
        if status_code == 405:
            self.set_header("Allow", ", ".join(getattr(self, "allowed", ("GET",))))
        if self.state.draining:
            self.set_header("Connection", "close")
        self.finish(orjson.dumps({"error": {"status": status_code, "message": message}}))

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        if isinstance(value, web.HTTPError):  # a client's mistake: a warning, no traceback
            log.warning(
                "%d %s %s: %s",
                value.status_code,
                self.request.method,
                self.request.uri,
                getattr(value, "message", value.log_message),
            )
        else:
            super().log_exception(typ, value, tb)

    def on_finish(self) -> None:
        self.metrics.observe_request(self.name, self.get_status(), self.request.request_time())

    def check_token(self) -> None:
        """401 unless the request carries ``Authorization: Bearer <token>`` (when one is set)."""
        token = self.config.token
        if token is None:
            return
        sent = self.request.headers.get("Authorization", "")
        # compare_digest: the time taken does not tell how much of the token was right
        if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
            raise APIError(401, "missing or wrong bearer token", {"WWW-Authenticate": 'Bearer realm="tiny"'})


def _gunzip(body: bytes, limit: int) -> bytes:
    """Decompress a gzip body (one or more members); 413 past ``limit``, 400 if corrupt."""
    out: list[bytes] = []
    size = 0
    data = body
    try:
        while data:
            inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            # max_length bounds the memory a gzip bomb can take before it is refused
            chunk = inflater.decompress(data, limit - size + 1)
            size += len(chunk)
            if size > limit or inflater.unconsumed_tail:
                raise APIError(413, f"decompressed body is larger than {limit} bytes")
            if not inflater.eof:
                raise APIError(400, "gzip body is truncated")
            out.append(chunk)
            data = inflater.unused_data
    except zlib.error as exc:
        raise APIError(400, f"gzip body is corrupt: {exc}") from None
    return b"".join(out)


@web.stream_request_body
class IngestHandler(JSONHandler):
    """``POST /ingest``: NDJSON CRAN records in, appended to the day files, then a 200.

    - Body: one JSON object per line (LF or CRLF), ``Content-Encoding`` identity or gzip,
      ``Content-Type`` absent or NDJSON-like (see NDJSON_TYPES), else 415.
    - Limits: body and decompressed body at most ``--max-body`` bytes (413; a larger
      declared Content-Length is refused before the body is read).
    - 200 once every valid row and every reject is written (see tiny.sink), with counts and
      the first MAX_ERRORS line errors; invalid lines never fail the batch.
    - 400 corrupt gzip, 401 bad token, 405 other methods, 431 header limits, 503 +
      Retry-After when the backlog is full or the disk refuses the write.
    """

    name = "ingest"
    allowed = ("POST",)
    SUPPORTED_METHODS = ("POST", "GET", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS")

    def initialize(self, config: Config, state: ServerState, metrics: metrics.Metrics, sink: DailyFileSink) -> None:
        super().initialize(config, state, metrics, sink)
        self._chunks: list[bytes] = []
        self._received = 0
        self._counted = False

    def prepare(self) -> None:
        self.state.in_flight += 1
        self._counted = True
        super().prepare()  # header limits
        if self.request.method != "POST":
            raise APIError(405, "use POST to send records")
        if self.state.draining:  # served during the drain grace; the client should reconnect
            self.set_header("Connection", "close")
        self.check_token()
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

    @profile
    async def post(self) -> None:
        if self._finished:  # answered already (413 while streaming)
            return
        body = b"".join(self._chunks)
        self._chunks = []
        received = len(body)
        if received > INLINE_DECODE_BYTES or self._gzip:
            # A big body (or any gzip body: a small one may inflate to --max-body) would hold
            # the event loop for milliseconds: decode it on a thread (zlib and the compiled
            # codec release the GIL, so other requests go on meanwhile).
            loop = asyncio.get_running_loop()
            batch = await loop.run_in_executor(None, self._decode, body)
        else:
            batch = self._decode(body)
        chunks = {f"{day}.csv": rows for day, rows in batch.days.items()}
        if batch.rejects:
            now = datetime.now(UTC)
            chunks[rejects.file_name(now)] = rejects.render(batch.rejects, now)
        if chunks:
            try:
                await self.sink.append(chunks)
            except BacklogFull:
                raise APIError(
                    503, "too many writes are waiting for the disk; retry later", {"Retry-After": "1"}
                ) from None
            except SinkError as exc:
                raise APIError(503, f"{exc}; nothing of this request was kept", {"Retry-After": "5"}) from None
        self.metrics.bytes_in.inc(received)
        self.metrics.valid.inc(batch.valid)
        self.metrics.invalid.inc(batch.invalid)
        self.finish(
            orjson.dumps(
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
        )

    def _decode(self, body: bytes) -> codec.Batch:
        if self._gzip:
            body = _gunzip(body, self.config.max_body)
        return codec.encode(body)

    def _done(self) -> None:
        if self._counted:
            self._counted = False
            self.state.in_flight -= 1

    def on_finish(self) -> None:
        self._done()
        super().on_finish()

    def on_connection_close(self) -> None:
        self._done()
        super().on_connection_close()


class HealthHandler(JSONHandler):
    """``GET /healthz``: 200 ``{"status": "ok", "instance": ...}``; 503 while shutting down."""

    name = "healthz"

    def get(self) -> None:
        status = "draining" if self.state.draining else "ok"
        if self.state.draining:
            self.set_status(503)
            self.set_header("Connection", "close")
        self.finish(
            orjson.dumps(
                {
                    "status": status,
                    "instance": self.state.instance,
                    "pid": os.getpid(),
                    "codec": codec.CODEC,
                    "durability": self.config.durability,
                    "backlog_bytes": self.sink.backlog,
                    "uptime_seconds": round(time.monotonic() - self.state.started, 3),
                }
            )
        )


class MetricsHandler(JSONHandler):
    """``GET /metrics``: Prometheus text format, summed over all worker processes."""

    name = "metrics"

    def get(self) -> None:
        self.set_header("Content-Type", metrics.CONTENT_TYPE)
        self.finish(metrics.render())


class NotFoundHandler(JSONHandler):
    """Any other path: 404 in the JSON error shape."""

    def prepare(self) -> None:
        super().prepare()
        raise APIError(404, f"no such endpoint: {self.request.path}")

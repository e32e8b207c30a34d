"""``/ingest``: the HTTP side of the data flow, request -> codec -> rejects -> sink, one delegate for every way in."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson
from tornado import httputil
from tornado.log import access_log

from tiny import codec, layout, rejects
from tiny.commit import Claim, CommitError, OutcomeUnknown
from tiny.handlers.base import APIError, Deps, closes_connection, header_refusal
from tiny.handlers.rules import Head
from tiny.limits import INLINE_DECODE_BYTES, MAX_ERRORS
from tiny.profiling import profile
from tiny.protocol import answer_head, error_body
from tiny.sink import BacklogFull

log = logging.getLogger("tiny.handlers")

# 421 Misdirected Request (RFC 9110, 15.5.20): this host cannot answer /ingest at all, whenever
# asked. A 503 would say "later, here": clients would retry it here after Retry-After, and
# nginx (proxy_next_upstream http_503) would count a healthy read host as a failing one.
READ_ONLY = "this host serves reads only (--role read): send /ingest to an ingest host"


class ClientGone(Exception):
    """The client's connection was found closed before its batch was written (IOStream read its
    close with the request): nothing of it is kept, and no answer can reach it (its retry is
    processed afresh). A reset while the batch is written is seen only when its answer is: the
    batch is then written and unanswered, as any request in flight when a connection drops."""


def _connected() -> bool:
    return False


@profile
async def process(
    deps: Deps, head: Head, body: bytes, gone: Callable[[], bool] = _connected
) -> tuple[bytes, bool, int | None]:
    """One /ingest request once its whole body is in (:class:`IngestRequest`): decoded,
    encoded, written; returns the 200 answer, whether it was replayed from a stored key, and
    its position in the cluster's global order (cluster mode; for a replay, the position of
    the flush that wrote it; None: one host, or a batch that wrote no bytes). Raises APIError
    for every other answer (400 or 413 for a gzip body, 422, 503), ClientGone when ``gone()``
    says the connection closed before the batch was handed to the sink."""
    sink = deps.sink
    if not sink.is_open:  # it failed to open (or was refused since): try again, or say why
        try:
            await sink.ready()
        except CommitError as exc:
            raise APIError(
                503, f"{exc}; nothing of this request was kept", {"Retry-After": str(exc.retry_after)}
            ) from None
    received = len(body)
    if received > INLINE_DECODE_BYTES or head.gzip:
        # A big body (or any gzip body: a small one may inflate to --max-body) would hold
        # the event loop for milliseconds: decode it, and render its rejects, on a thread
        # (zlib and the compiled codec release the GIL, so other requests go on meanwhile).
        loop = asyncio.get_running_loop()
        batch, chunks, digest = await loop.run_in_executor(None, _encode, deps, head, body)
    else:
        batch, chunks, digest = _encode(deps, head, body)
    answer = answer_of(received, batch)
    metrics = deps.metrics
    metrics.bytes_in.inc(received)
    position = None
    if gone():  # rows no answer could acknowledge are not written (a retry would write them twice)
        raise ClientGone
    if chunks or head.key is not None:
        claim = Claim(head.key, digest, answer) if head.key is not None else None
        try:
            outcome = await sink.append(chunks, claim)
        except BacklogFull:
            raise APIError(503, "too many writes are waiting for the disk; retry later", {"Retry-After": "1"}) from None
        except OutcomeUnknown as exc:
            retry = "retry with the same Idempotency-Key" if claim else "a retry may write this batch twice"
            raise APIError(
                503,
                f"{exc}; this request may or may not have been written: {retry}",
                {"Retry-After": str(exc.retry_after)},
            ) from None
        except CommitError as exc:
            raise APIError(
                503, f"{exc}; nothing of this request was kept", {"Retry-After": str(exc.retry_after)}
            ) from None
        stored, position = outcome.stored, outcome.position
        if stored is not None:  # the key was stored before: nothing was written now
            if stored.digest != digest:
                metrics.conflicts.labels("422").inc()
                raise APIError(422, "this Idempotency-Key was used for another body; use a new key")
            metrics.replayed.inc()
            return stored.answer, True, stored.position
    metrics.valid.inc(batch.valid)
    metrics.invalid.inc(batch.invalid)
    return answer, False, position


def answer_of(received: int, batch: codec.Batch) -> bytes:
    """The 200 answer to a body of ``received`` bytes that became ``batch``: its counts and its
    first MAX_ERRORS line errors (at most tiny.limits.MAX_ANSWER bytes, which a key's record keeps)."""
    return orjson.dumps(
        {
            "result": {
                "status": "ok",
                "stats": {
                    "bytes": received,
                    "records": {"valid": batch.valid, "invalid": batch.invalid, "total": batch.valid + batch.invalid},
                },
            },
            "errors": [{"line": line, "error": reason} for line, reason, _ in batch.rejects[:MAX_ERRORS]],
        }
    )


def _encode(deps: Deps, head: Head, body: bytes) -> tuple[codec.Batch, dict[str, bytes], bytes]:
    """The body's batch, the bytes it appends to each file (relative to DATA_DIR), and the
    decompressed body's digest when the request has an Idempotency-Key."""
    body = deps.rules.decode(body, head)
    digest = deps.sink.digest(body) if head.key is not None else b""
    batch = codec.encode(body, deps.config.max_days, deps.config.max_rejects)
    chunks = {layout.day_file(day): rows for day, rows in batch.days.items()}
    if batch.invalid:
        now = datetime.now(UTC)
        omitted = None
        if batch.omitted is not None:
            omitted = (batch.invalid - len(batch.rejects), *batch.omitted)
        chunks[layout.rejects_file(now)] = rejects.render(batch.rejects, now, omitted)
    return batch, chunks, digest


def route(deps: Deps, start_line: httputil.RequestStartLine, headers: Any, connection: Any) -> IngestRequest | None:
    """The :class:`IngestRequest` of a request to ``/ingest`` (any method, any query string), or
    None for any other path. ``headers`` and ``connection`` are those of the parser that read
    the head: an ``HTTPHeaders`` and a tiny.connection.TornadoConnection, or tiny.fasthead's
    ``Fields`` and a tiny.connection.FastConnection."""
    path = start_line.path
    if path != "/ingest" and path.partition("?")[0] != "/ingest":
        return None
    return IngestRequest(deps, start_line.method, connection)


class IngestRequest(httputil.HTTPMessageDelegate):
    """``/ingest``: NDJSON CRAN records in, appended to the day files, then a 200. Every request
    to /ingest reaches this delegate, whichever parser read its head, and it answers every one.

    - The header limits (tiny.handlers.base.header_refusal: 431) and the request rules
      (tiny.handlers.rules: 405 with ``Allow: POST`` for another method, 401, 400, 415, 413,
      411 in that order), checked when the head is in: a refusal is answered before the body is
      read, with ``Connection: close`` (the rest of the body is never read).
    - Body: one JSON object per line (LF or CRLF), Content-Length or chunked (extensions and
      trailers taken), held to --max-body as it streams in (413; a chunk past it, at its size
      line: :meth:`body_refused`).
    - 200 once every valid row and every reject is written (see tiny.sink), with counts and
      the first MAX_ERRORS line errors; invalid lines never fail the batch.
    - ``Idempotency-Key`` (1-255 visible ASCII characters, optionally in double quotes):
      the first request with a key is processed and its answer stored with the key and a
      digest of its decompressed body, atomically with its rows (tiny.commit). The same key
      with the same body later, from any process sharing the data dir, gets that answer again
      with ``Idempotent-Replayed: true`` and writes nothing; with another body, 422. A second
      request with a key whose first is still in flight waits for it, then is answered so.
    - 400 corrupt gzip, 422 a key reused for another body, 503 + Retry-After when the backlog
      is full or the disk refuses the write (nothing stored: a retry is processed afresh).
    - Cluster mode: a 200 (and a replay) says ``Tiny-Position: N``, the batch's place in the
      cluster's one global order (a replay: that of the flush that wrote it; none for a batch
      that wrote no bytes), which a read on any host can wait for (``Tiny-Wait-Position``,
      tiny.readwait); a host for reads only (``--role read``) answers 421 at the head.

    Every answer is one block (tiny.protocol.answer_head, the connection's ``write_answer``):
    Server, Content-Type, Date, Content-Length, then ``Idempotent-Replayed``, ``Retry-After``,
    ``Allow`` or ``WWW-Authenticate`` where they apply, then ``Connection``. It keeps the drain's
    in-flight count and its ``Connection: close`` (tiny.handlers.base.closes_connection), the
    metrics (``tiny_requests_total{handler="ingest"}``, the duration, and
    ``tiny_ingest_heads_total`` by the parser that read the head) and the log line of a refusal.
    """

    def __init__(self, deps: Deps, method: str, connection: Any) -> None:
        self.deps = deps
        self.method = method
        self.connection = connection
        self.started = time.monotonic()
        self.head = Head(None, False)
        self.chunks: list[bytes] = []
        self.received = 0
        self.answered = False
        self.body_read = False
        self.task: asyncio.Task[None] | None = None
        deps.metrics.heads[connection.parser].inc()
        deps.drain.in_flight += 1
        self.counted = True

    def headers_received(self, start_line: httputil.RequestStartLine | httputil.ResponseStartLine, headers: Any) -> Any:
        """Check the head (header limits, request rules); a refusal is answered at once, and its
        future (done once written) returned, so Tornado's parser reads nothing more."""
        try:
            refused = header_refusal(headers)
            if refused is not None:
                raise refused
            if self.deps.config.role == "read":
                raise APIError(421, READ_ONLY)
            self.head = self.deps.rules.head(self.method, headers)
        except APIError as exc:
            written = self._refuse(exc)
            self._done()  # nothing more of it is read
            return written
        # The rules hold the body to --max-body (the head's Content-Length, then what streams
        # in: data_received); Tornado's own limit, that of the other endpoints, is this one for
        # this request, so a chunk past it is refused at its size line (a JSON 413: body_refused).
        self.connection.set_max_body_size(self.deps.rules.max_body)
        self.connection.set_body_timeout(self.deps.config.body_timeout)
        return None

    def data_received(self, chunk: bytes) -> None:
        if self.answered:
            return
        self.received += len(chunk)
        refused = self.deps.rules.over_limit(self.received)
        if refused is not None:
            self.chunks = []
            self._refuse(refused)
            return
        self.chunks.append(chunk)

    def body_refused(self, status: int, message: str) -> Any:
        """The body refused while it was read (tiny.connection: a chunked body past the limit,
        413, or malformed, 400): answered so; the connection closes."""
        self.chunks = []
        return self._refuse(APIError(status, message))

    def finish(self) -> None:
        self.body_read = True
        if not self.answered:
            body = b"".join(self.chunks)
            self.chunks = []
            self.task = asyncio.ensure_future(self._process(body))  # referenced: not collected mid-way
        else:
            self._done()

    def on_connection_close(self) -> None:
        self.chunks = []
        self._done()

    async def finished(self) -> None:
        """Return once the answer is handed to the connection, or the connection is gone
        (the fast way reads the next request only then)."""
        if self.task is not None:
            await self.task

    async def _process(self, body: bytes) -> None:
        try:
            answer, replayed, position = await process(self.deps, self.head, body, self.connection.stream.closed)
        except ClientGone:
            log.info(
                "%s /ingest: the client closed its connection before its batch was written; nothing was kept",
                self.method,
            )
        except APIError as exc:
            self._refuse(exc)
        except Exception:
            log.exception("uncaught exception in POST /ingest")
            self._refuse(APIError(500, "Internal Server Error"))
        else:
            extra = {"Idempotent-Replayed": "true"} if replayed else {}
            if position is not None:
                extra["Tiny-Position"] = str(position)
            self._answer(200, answer, extra or None)
        finally:
            self._done()

    def _refuse(self, exc: APIError) -> Any:
        log.warning("%d %s /ingest: %s", exc.status_code, self.method, exc.message)
        return self._answer(exc.status_code, error_body(exc.status_code, exc.message, exc.details), exc.headers)

    def _answer(self, status: int, body: bytes, extra: dict[str, str] | None) -> Any:
        if self.answered or self.connection.stream.closed():
            return None
        self.answered = True
        close = closes_connection(self.deps.drain, self.body_read)
        head = answer_head(status, len(body), extra)
        # Counted before the answer is written: a client that scrapes /metrics as soon as it has
        # its answer (the write's send releases the GIL) finds its request counted.
        seconds = time.monotonic() - self.started
        self.deps.metrics.observe_request("ingest", status, seconds)
        written = self.connection.write_answer(head, b"" if self.method == "HEAD" else body, close)
        if status >= 500:
            access_log.error(
                "%d %s /ingest (%s) %.2fms", status, self.method, self.connection.context.remote_ip, 1000 * seconds
            )
        return written

    def _done(self) -> None:
        if self.counted:
            self.counted = False
            self.deps.drain.in_flight -= 1

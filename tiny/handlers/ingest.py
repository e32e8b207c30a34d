"""``POST /ingest``: the HTTP side of the data flow, handler -> codec -> rejects -> sink."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import orjson
from tornado import web

from tiny import codec, layout, rejects
from tiny.commit import Claim, CommitError, OutcomeUnknown
from tiny.handlers.base import APIError, Deps, JSONHandler
from tiny.handlers.rules import Head
from tiny.limits import INLINE_DECODE_BYTES, MAX_ERRORS
from tiny.profiling import profile
from tiny.sink import BacklogFull


@profile
async def process(deps: Deps, head: Head, body: bytes) -> tuple[bytes, bool]:
    """One /ingest request once its whole body is in, whichever way it came (this handler, or
    tiny.handlers.lean): decoded, encoded, written; returns the 200 answer and whether it was
    replayed from a stored key. Raises APIError for every other answer (400 or 413 for a gzip
    body, 422, 503)."""
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
    answer = orjson.dumps(
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
    metrics = deps.metrics
    metrics.bytes_in.inc(received)
    if chunks or head.key is not None:
        claim = Claim(head.key, digest, answer) if head.key is not None else None
        try:
            stored = (await sink.append(chunks, claim)).stored
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
        if stored is not None:  # the key was stored before: nothing was written now
            if stored.digest != digest:
                metrics.conflicts.labels("422").inc()
                raise APIError(422, "this Idempotency-Key was used for another body; use a new key")
            metrics.replayed.inc()
            return stored.answer, True
    metrics.valid.inc(batch.valid)
    metrics.invalid.inc(batch.invalid)
    return answer, False


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


@web.stream_request_body
class IngestHandler(JSONHandler):
    """``POST /ingest``: NDJSON CRAN records in, appended to the day files, then a 200.

    - The request rules (tiny.handlers.rules): method, token, Idempotency-Key, encoding,
      type, declared and streamed body limit, gzip limits; refused before the body is read
      where the headers already tell.
    - Body: one JSON object per line (LF or CRLF).
    - 200 once every valid row and every reject is written (see tiny.sink), with counts and
      the first MAX_ERRORS line errors; invalid lines never fail the batch.
    - ``Idempotency-Key`` (1-255 visible ASCII characters, optionally in double quotes):
      the first request with a key is processed and its answer stored with the key and a
      digest of its decompressed body, atomically with its rows (tiny.commit). The same key
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
        self._head = Head(None, False)

    def prepare(self) -> None:
        self._counted = True
        self.deps.drain.in_flight += 1
        super().prepare()  # header limits
        self._head = self.deps.rules.head(self.request.method or "", self.request.headers)
        # The rules hold the body to --max-body while it streams (data_received) and answer a
        # JSON 413; Tornado's own limit would answer a bare 400 first: lifted for this request.
        self.request.connection.set_max_body_size(2**62)  # type: ignore[union-attr]

    def data_received(self, chunk: bytes) -> None:
        if self._finished:
            return
        self._received += len(chunk)
        refused = self.deps.rules.over_limit(self._received)
        if refused is not None:
            self._chunks = []
            self.send_error(refused.status_code, exc_info=(type(refused), refused, None))
            return
        self._chunks.append(chunk)

    def body_read(self) -> bool:
        return self._body_read

    async def post(self) -> None:
        self._body_read = True  # Tornado calls post() once the whole body is in
        if self._finished:  # answered already (413 while streaming)
            return
        body = b"".join(self._chunks)
        self._chunks = []
        answer, replayed = await process(self.deps, self._head, body)
        if replayed:
            self.set_header("Idempotent-Replayed", "true")
        self.finish(answer)

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

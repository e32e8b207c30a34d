"""The lean way into ``POST /ingest``: the usual request served without Tornado's RequestHandler.

Tornado's HTTPServer hands each request to an ``HTTPMessageDelegate``; the Application's
(routing, a RequestHandler per request, its prepare, headers and finish) cost about a third
of a small request's CPU. :func:`route` looks at the request line and headers first and takes
the usual request itself: ``POST /ingest`` (no query string) whose headers are within the
header limits (tiny.handlers.base.header_refusal, the general way's own) and pass the request
rules (tiny.handlers.rules: method, token, key, encoding, type, declared length). A Host that
Tornado refuses never gets here (tiny.httpserver refuses it first, on every way). Everything
else goes the general way (tiny.routes), which answers it exactly as it always did: every
refusal of the headers (400, 401, 405, 413, 415, 431), every other path and method. So the
lean path never answers an error of the headers; the errors it answers are those of the body
and the write, with the same rules and the same JSON shape as the handler, because both call
tiny.handlers.ingest.process: 413 while the body streams in, 400/413 of a gzip body, 422, 503
with Retry-After.

It keeps every behaviour of the handler: the drain's in-flight count and ``Connection:
close`` (tiny.handlers.base.closes_connection, the handler's own rule), the metrics
(``tiny_requests_total{handler="ingest"}``, the duration), the answer's headers (Server,
Content-Type, Date, Content-Length, ``Idempotent-Replayed``, ``Retry-After``), the log line of
a refusal. The body timeout is set only when the body is not already buffered: a body that
came with the headers cannot time out, and the timer would cost a call and a cancel.

Two ways reach :func:`route`: Tornado's HTTP1Connection, with its ``HTTPHeaders`` (every head
it reads), and tiny.httpserver's fast way, with ``Fields`` and a connection of its own (the
commonest head, which it parses itself and reads the same as Tornado would). The delegate is
the same for both.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import tornado
from tornado import httputil
from tornado.http1connection import HTTP1Connection
from tornado.httputil import HTTPHeaders
from tornado.log import access_log

from tiny.handlers.base import JSON, APIError, Deps, closes_connection, header_refusal
from tiny.handlers.ingest import process
from tiny.handlers.rules import Head
from tiny.httpserver import Fields, error_body

log = logging.getLogger("tiny.handlers")
_SERVER = f"TornadoServer/{tornado.version}"  # what a RequestHandler says


def route(
    deps: Deps, start_line: httputil.RequestStartLine, headers: HTTPHeaders | Fields, connection: Any
) -> LeanIngest | None:
    """A :class:`LeanIngest` for the usual POST /ingest, or None: the general way takes it.
    ``headers`` and ``connection`` are Tornado's, or on the fast way tiny.httpserver's."""
    if start_line.method != "POST" or start_line.path != "/ingest":
        return None
    if header_refusal(headers) is not None:
        return None  # the handler answers it: the same function, the same 431
    try:
        head = deps.rules.head("POST", headers)
    except APIError:
        return None  # the handler answers it, as always
    return LeanIngest(deps, head, connection, headers)


class LeanIngest(httputil.HTTPMessageDelegate):
    """One usual POST /ingest, from its headers (already checked by :func:`route`) to its answer."""

    def __init__(self, deps: Deps, head: Head, connection: Any, headers: HTTPHeaders | Fields) -> None:
        self.deps = deps
        self.head = head
        self.connection = connection
        self.started = time.monotonic()
        self.chunks: list[bytes] = []
        self.received = 0
        self.answered = False
        self.body_read = False
        self.task: asyncio.Task[None] | None = None
        deps.drain.in_flight += 1
        self.counted = True
        # The rules hold the body to --max-body as it streams in (data_received), with a JSON
        # 413; Tornado's own limit would answer a bare 400 first: lifted for this request.
        connection.set_max_body_size(2**62)
        length = headers.get("Content-Length")
        if not _buffered(connection, length):
            connection.set_body_timeout(deps.config.body_timeout)

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
        (tiny.httpserver's fast way reads the next request only then)."""
        if self.task is not None:
            await self.task

    async def _process(self, body: bytes) -> None:
        try:
            answer, replayed = await process(self.deps, self.head, body)
        except APIError as exc:
            self._refuse(exc)
        except Exception:
            log.exception("uncaught exception in POST /ingest")
            self._refuse(APIError(500, "Internal Server Error"))
        else:
            self._answer(200, answer, {"Idempotent-Replayed": "true"} if replayed else None)
        finally:
            self._done()

    def _refuse(self, exc: APIError) -> None:
        log.warning("%d POST /ingest: %s", exc.status_code, exc.message)
        self._answer(exc.status_code, error_body(exc.status_code, exc.message), exc.headers)

    def _answer(self, status: int, body: bytes, extra: dict[str, str] | None) -> None:
        if self.answered or self.connection.stream.closed():
            return
        self.answered = True
        close = closes_connection(self.deps.drain, self.body_read)
        head = _HEADS.get(status) or _head_for(status)
        lines = [head, b"Date: ", _date(), b"\r\nContent-Length: ", b"%d\r\n" % len(body)]
        for name, value in (extra or {}).items():
            lines.append(f"{name}: {value}\r\n".encode("latin1"))
        # One formatted block, written with the body (tiny.httpserver: write_answer).
        self.connection.write_answer(b"".join(lines), body, close)
        seconds = time.monotonic() - self.started
        self.deps.metrics.observe_request("ingest", status, seconds)
        if status >= 500:
            access_log.error("%d POST /ingest (%s) %.2fms", status, self.connection.context.remote_ip, 1000 * seconds)

    def _done(self) -> None:
        if self.counted:
            self.counted = False
            self.deps.drain.in_flight -= 1


def _buffered(connection: Any, length: str | None) -> bool:
    """Whether the whole body (``length`` bytes) is already in the connection's read buffer.
    (IOStream's private buffer size: tiny.httpserver pins the Tornado version this was
    checked against.)"""
    if length is None or not isinstance(connection, HTTP1Connection):
        return False
    try:
        return connection.stream._read_buffer_size >= int(length)  # type: ignore[attr-defined]
    except (AttributeError, ValueError):
        return False


def _head_for(status: int) -> bytes:
    """The status line and the headers that every answer with ``status`` carries."""
    reason = httputil.responses.get(status, "Unknown")
    return f"HTTP/1.1 {status} {reason}\r\nServer: {_SERVER}\r\nContent-Type: {JSON}\r\n".encode()


_HEADS = {status: _head_for(status) for status in (200, 400, 413, 422, 500, 503)}
_DATE: list[object] = [0, b""]  # (second, its HTTP date): one formatting per second, not per answer


def _date() -> bytes:
    now = int(time.time())
    if _DATE[0] != now:
        _DATE[0], _DATE[1] = now, httputil.format_timestamp(now).encode()
    return _DATE[1]  # type: ignore[return-value]

"""What every handler shares: its typed dependencies, the JSON error shape, limits and auth.

Every non-200 answer is ``{"error": {"status": S, "message": "..."}}`` (tiny.protocol's
``error_body``, whichever way answers); the message is meant for the client and never carries
internals. Two rules hold for every endpoint, the handlers' and the /ingest delegate's
(tiny.handlers.ingest), each in one function here: whether an answer closes its connection
(:func:`closes_connection`), and the header limits (:func:`header_refusal`). Every read
(the downloads API, ``/api``, ``/top``, ``/trending``, ``/badges``) calls
:meth:`JSONHandler.pace` before it reads anything, which in cluster mode first waits until
this host has applied the position the read needs (:meth:`JSONHandler.caught_up`, tiny.readwait).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import os
import socket
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tornado import web
from tornado.httputil import HTTPHeaders
from tornado.log import access_log

from tiny.config import Config
from tiny.drain import Drain
from tiny.fasthead import Fields
from tiny.metrics import Metrics
from tiny.pacing import Paced, ReadPacer
from tiny.protocol import JSON, clipped, error_body, header_limit_refusal
from tiny.readwait import Behind, NeverCommitted, ReadWait, asked_position
from tiny.sink import DailyFileSink

if TYPE_CHECKING:
    from tiny.analytics.service import Analytics
    from tiny.handlers.rules import IngestRules
    from tiny.live import Live

log = logging.getLogger("tiny.handlers")


@dataclass(frozen=True)
class Deps:
    """The dependencies of every handler of one worker process (tiny.routes passes them in)."""

    config: Config
    metrics: Metrics
    sink: DailyFileSink
    analytics: Analytics
    live: Live  # answers from the live aggregates: the downloads API and the dashboard (tiny.live)
    drain: Drain
    pacer: ReadPacer  # the reads' pace while ingest is busy (tiny.pacing)
    rules: IngestRules  # the request rules of /ingest (tiny.handlers.rules)
    instance: str  # ``<hostname>:<port>/<pid>``
    started: float  # time.monotonic() when the worker started
    positions: ReadWait | None = None  # cluster mode: the reads' wait for this host's follower (tiny.readwait)


def instance_name(port: int) -> str:
    """``<hostname>:<port>/<pid>``: which process answered (for /healthz and load tests)."""
    return f"{socket.gethostname()}:{port}/{os.getpid()}"


def check_token(token: str | None, authorization: str) -> None:
    """401 unless ``authorization`` is ``Bearer <token>`` (when a token is set). The scheme is
    case-insensitive (RFC 9110, section 11.1), the token is not, and it is compared in
    constant time: the time taken does not tell how much of it was right."""
    if token is None:
        return
    scheme, _, sent = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(sent.strip().encode(), token.encode()):
        raise APIError(401, "missing or wrong bearer token", {"WWW-Authenticate": 'Bearer realm="tiny"'})


def closes_connection(drain: Drain, body_read: bool) -> bool:
    """Whether an answer closes its connection (says ``Connection: close``, and the server then
    closes it and reads nothing more: tiny.connection): while draining, and whenever the answer
    comes before the request's whole body was read (an early 401, 405, 413, 415 or 431), whose
    rest is never read. Said out loud, a proxy does not put the connection back in its
    keep-alive pool and send the next request into a close."""
    return drain.closes_connection() or not body_read


def header_refusal(headers: HTTPHeaders | Fields) -> APIError | None:
    """The 431 for request headers past the limits (tiny.protocol.header_limit_refusal), or None."""
    refused = header_limit_refusal(headers)
    return None if refused is None else APIError(431, refused)


class APIError(web.HTTPError):
    """An error whose ``message`` is shown to the client, with optional extra headers and
    ``details``, fields of its body beside the status and the message (tiny.protocol.error_body)."""

    def __init__(
        self,
        status: int,
        message: str,
        headers: dict[str, str] | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(status, "%s", message)
        self.message = message
        self.headers = headers or {}
        self.details = details or {}


class JSONHandler(web.RequestHandler):
    """Base: JSON bodies, the JSON error shape, the token rule, request metrics, and HEAD
    wherever there is a GET. (The header limits are the server's, before any handler:
    tiny.httpserver.)"""

    name = "other"
    allowed: tuple[str, ...] = ("GET", "HEAD")

    def initialize(self, deps: Deps) -> None:
        self.deps = deps
        self.config = deps.config

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", JSON)

    def head(self, *args: str, **kwargs: str) -> Awaitable[None] | None:
        """HEAD: the GET's answer, its status and headers (Content-Length of its body), with no
        body (Tornado writes none for a HEAD request). A handler without GET answers 405."""
        return self.get(*args, **kwargs)  # a subclass's get may be a coroutine (Tornado awaits it)

    def check_token(self) -> None:
        """401 unless the request carries ``Authorization: Bearer <token>`` (when one is set)."""
        check_token(self.config.token, self.request.headers.get("Authorization", ""))

    async def pace(self) -> None:
        """Every read calls this before it reads anything: in cluster mode, wait until this
        host has applied the position the read needs (:meth:`caught_up`); then wait for this
        read's turn while ingest is busy (tiny.pacing); 503 + Retry-After when it is more
        than the pacer's ``max_wait`` away."""
        await self.caught_up()
        pacer = self.deps.pacer
        try:
            wait = pacer.reserve()
        except Paced as exc:
            self.deps.metrics.paced.labels("refused").inc()
            retry = max(1, math.ceil(exc.wait - pacer.max_wait))
            raise APIError(503, f"{exc}; try again", {"Retry-After": str(retry)}) from None
        if wait > 0:
            self.deps.metrics.paced.labels("waited").inc()
            await asyncio.sleep(wait)

    async def caught_up(self) -> None:
        """Cluster mode: return once this host has applied the position this read needs: the
        ``Tiny-Wait-Position`` it sends (0: no wait), or the log's head when it arrived
        (tiny.readwait). 400 for a header that is not a position, or one past the head; 503
        + Retry-After, saying how far behind, past ``--read-wait``. One host alone: at once."""
        positions = self.deps.positions
        if positions is None:
            return
        try:
            asked = asked_position(self.request.headers.get("Tiny-Wait-Position"))
        except ValueError as exc:
            raise APIError(400, str(exc)) from None
        arrived = time.monotonic() - self.request.request_time()
        try:
            await positions.wait(asked, arrived)
        except NeverCommitted as exc:
            raise APIError(400, str(exc)) from None
        except Behind as exc:
            raise APIError(503, str(exc), {"Retry-After": str(exc.retry_after)}) from None

    def body_read(self) -> bool:
        """Whether the whole request body has been read (always, unless the handler streams it)."""
        return True

    def finish(self, chunk: str | bytes | dict[str, Any] | None = None) -> Any:
        if closes_connection(self.deps.drain, self.body_read()):
            self.set_header("Connection", "close")  # tiny.connection closes the connection after it
        return super().finish(chunk)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        message = kwargs.get("message")
        details = None
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, APIError):
            message, details = exc.message, exc.details
            for name, value in exc.headers.items():
                self.set_header(name, value)
        if message is None:
            message = self._reason
        if status_code == 405:
            self.set_header("Allow", ", ".join(self.allowed))
        self.finish(error_body(status_code, message, details))

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        if isinstance(value, web.HTTPError):  # a client's mistake: a warning, no traceback
            log.warning(
                "%d %s %s: %s",
                value.status_code,
                self.request.method,
                clipped(self.request.uri or ""),
                clipped(str(getattr(value, "message", value.log_message))),
            )
        else:
            super().log_exception(typ, value, tb)

    def on_finish(self) -> None:
        self.deps.metrics.observe_request(self.name, self.get_status(), self.request.request_time())


def log_request(handler: web.RequestHandler) -> None:
    """Tornado's access line (the application's ``log_function``), the URI clipped."""
    status = handler.get_status()
    write = access_log.info if status < 400 else access_log.warning if status < 500 else access_log.error
    request = handler.request
    write(
        "%d %s %s (%s) %.2fms",
        status,
        request.method,
        clipped(request.uri or ""),
        request.remote_ip,
        1000.0 * request.request_time(),
    )

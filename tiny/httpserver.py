"""The HTTP server of a worker: Tornado's, with limits, a calm accept loop and one way into /ingest.

What Tornado 6.6's ``HTTPServer`` does not do, which a server facing hostile clients, or a fast
one, needs:

- **A cap on open connections** (``--max-connections``): a connection past it is closed at
  once, so idle clients cannot take the descriptors the sink needs for the day files.
- **An accept loop that backs off**: when ``accept(2)`` fails for lack of descriptors or
  memory (EMFILE, ENFILE, ENOBUFS, ENOMEM), Tornado's loop logs a traceback and retries at
  once, spinning; here it logs at most once a second and pauses accepting for a moment.
- **One way into /ingest** (``ingest``): every request to /ingest, whichever parser read its
  head, reaches the one delegate the ``ingest`` route gives (tiny.handlers.ingest); every
  other request goes to the application. The commonest head is read by the fast head parser
  (``fast``, tiny.fasthead, served by tiny.connection), any other by Tornado's.
- **One Host rule for every way in** (tiny.protocol.host_refusal, Tornado's own, which it
  applies only when it builds an ``HTTPServerRequest``): HTTP/1.1 without a Host, a Host that
  is not ``host[:port]``, or two of them get a JSON 400 and a close, before /ingest or the
  application sees the request.
- **Timeouts without a timer per request**: Tornado wraps every header read in a timer
  (``gen.with_timeout``: a few percent of a small request). Here the header timeout
  (``idle_connection_timeout``: idle connections and slow headers alike) is one sweep twice a
  second over the connections waiting for headers, oldest first, so a connection is closed
  between the timeout and half a second after it. The body timeout of a request on the fast
  way is the same sweep over the connections whose body is still to come; Tornado's timer is
  set per request for the others. The same sweep closes a connection whose answer its client
  has not taken a byte of within the header timeout (Tornado has no write timeout), and counts
  a connection idle only once its client has taken the whole answer from the kernel.
- **TCP_NODELAY on for the connection's life**, as nginx's ``tcp_nodelay`` keeps it on
  kept-alive connections: answers are written whole, so Nagle's algorithm would only hold back
  the last packet of a streamed one.

It uses no private name of Tornado's (tiny.connection lists the ones the connections use).
"""

from __future__ import annotations

import errno
import logging
import re
import socket
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tornado import httputil, iostream
from tornado.concurrent import Future
from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop, PeriodicCallback

from tiny.bodybuffers import BODY_PIECE, WholeBuffers
from tiny.connection import IngestDelegate, ServerConnection, TornadoConnection, bytes_written, unsent
from tiny.protocol import (
    answer_head,
    clipped,
    error_body,
    expectation_refusal,
    framing_refusal,
    header_limit_refusal,
    host_refusal,
    transfer_refusal,
)

log = logging.getLogger("tiny.httpserver")

_ACCEPT_BATCH = 128  # connections accepted per wake-up before other work gets a turn
_ACCEPT_PAUSE = 0.1  # seconds accept pauses after it ran out of descriptors or memory
_SWEEP_SECONDS = 0.5  # how often connections past the header timeout are closed
_LOG_EVERY = 1.0  # seconds between two log lines of the same kind
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

# The /ingest route (tiny.handlers.ingest.route): the request's delegate, or None when the request
# is not to /ingest. It is given the start line, the head's fields (an HTTPHeaders, or on the fast
# way tiny.fasthead.Fields) and the connection to answer through (tiny.connection's).
IngestRoute = Callable[[httputil.RequestStartLine, Any, Any], IngestDelegate | None]


class _Every:
    """A log line at most once per ``seconds``, with the count of the ones held back."""

    def __init__(self, seconds: float = _LOG_EVERY) -> None:
        self.seconds = seconds
        self.last = 0.0
        self.held = 0

    def log(self, level: int, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self.last < self.seconds:
            self.held += 1
            return
        held, self.held, self.last = self.held, 0, now
        log.log(level, message + (" (and %d more like it)" if held else ""), *args, *((held,) if held else ()))


class _Context:
    """What a request knows of its connection (Tornado's ``connection.context``): the peer's
    address and IP, and the protocol (plain HTTP: the server takes neither TLS nor X-headers)."""

    __slots__ = ("address", "remote_ip", "protocol")

    def __init__(self, address: Any, family: int) -> None:
        self.address = address
        self.remote_ip = address[0] if family in (socket.AF_INET, socket.AF_INET6) and address else "0.0.0.0"
        self.protocol = "http"

    def __str__(self) -> str:
        return self.remote_ip


class TinyHTTPServer(HTTPServer):
    """``HTTPServer`` plus ``max_connections``, a backing-off accept loop, the /ingest route
    ``ingest`` (None: every request goes to the application) and the fast head parser
    (``fast``; off, Tornado's parser reads every head).

    ``on_connections(n)`` is called with the number of open connections whenever it changes.
    """

    def initialize(  # type: ignore[override]  # keyword arguments of its own, Tornado's passed on
        self,
        *args: Any,
        max_connections: int,
        on_connections: Callable[[int], None] | None = None,
        ingest: IngestRoute | None = None,
        fast: bool = True,
        body_timeout: float | None = None,
        **kwargs: Any,
    ) -> None:
        # Tornado would wrap every body read in a timer of its own (params.body_timeout); here
        # each request gets one only when its body is not read the fast way (see _Route).
        super().initialize(*args, **kwargs)
        if self.xheaders or self.ssl_options is not None:
            raise ValueError("TinyHTTPServer serves plain HTTP: it reads neither X-Real-IP nor TLS")
        self.ingest = ingest
        self.fast = fast and ingest is not None
        self.request_body_timeout = body_timeout
        # The header timeout (--idle-timeout) is one sweep over the connections waiting for
        # headers, twice a second, instead of Tornado's timer around every header read.
        self.header_timeout = self.conn_params.header_timeout
        self.conn_params.header_timeout = None
        # A body is handed over in pieces of up to 1 MiB of what the socket delivered (read
        # 64 KiB at a time, Tornado's default: a 1 MiB read allocates and zeroes 1 MiB each
        # time): a 276 KB body that arrived whole is one piece, not five to copy together.
        self.conn_params.chunk_size = BODY_PIECE
        self.waiting: dict[ServerConnection, float] = {}  # in the order they began to wait
        self.whole = WholeBuffers()  # the buffers bodies are read into whole (tiny.connection)
        # The fast way's body timeout, the same way: the connections whose body is still to
        # come, in the order they began to read it.
        self.reading: dict[ServerConnection, float] = {}
        # answers still pending: since when no byte of them was taken (the sweep's), and the bytes taken then
        self.sending: dict[ServerConnection, tuple[float, int]] = {}
        self._kernel_held: dict[ServerConnection, int] = {}  # an answer's bytes the kernel held at the last look
        self.connections: set[ServerConnection] = set()
        self._listening: dict[socket.socket, Callable[[], None]] = {}  # each socket's accept loop's stop
        self._sweeper: PeriodicCallback | None = None
        self.max_connections = max_connections
        self._on_connections = on_connections
        self._refused = _Every()
        self._untaken = _Every()  # the answers dropped by the sweep
        self._accept_errors = _Every()

    @property
    def open_connections(self) -> int:
        return len(self.connections)

    def add_sockets(self, sockets: Any) -> None:
        """Accept connections on ``sockets`` (listening, non-blocking) until :meth:`stop`."""
        if self._sweeper is None and (self.header_timeout or self.request_body_timeout):
            self._sweeper = PeriodicCallback(self._close_slow, _SWEEP_SECONDS * 1000)
            self._sweeper.start()
        for sock in sockets:
            self._listening[sock] = self._accept_on(sock)

    def _accept_on(self, sock: socket.socket) -> Callable[[], None]:
        io_loop = IOLoop.current()
        state = {"removed": False, "paused": False}

        def resume() -> None:
            state["paused"] = False
            if not state["removed"]:
                io_loop.add_handler(sock, accept, IOLoop.READ)

        def accept(fd: object, events: int) -> None:
            for _ in range(_ACCEPT_BATCH):
                if state["removed"] or state["paused"]:
                    return
                try:
                    connection, address = sock.accept()
                except (BlockingIOError, ConnectionAbortedError, InterruptedError):
                    return
                except OSError as exc:
                    if exc.errno not in _OUT_OF_RESOURCES:
                        raise
                    # Out of descriptors or memory: retrying now would spin. The kernel keeps
                    # the connections queued meanwhile.
                    self._accept_errors.log(logging.ERROR, "accept() failed: %s; pausing %.1f s", exc, _ACCEPT_PAUSE)
                    state["paused"] = True
                    io_loop.remove_handler(sock)
                    io_loop.call_later(_ACCEPT_PAUSE, resume)
                    return
                stream = iostream.IOStream(
                    connection, max_buffer_size=self.max_buffer_size, read_chunk_size=self.read_chunk_size
                )
                self.handle_stream(stream, address)

        def remove() -> None:
            if not state["paused"]:
                io_loop.remove_handler(sock)
            state["removed"] = True

        io_loop.add_handler(sock, accept, IOLoop.READ)
        return remove

    def stop(self) -> None:
        """Stop accepting and close the listening sockets; open connections go on."""
        if self._sweeper is not None:
            self._sweeper.stop()
        for sock, remove in self._listening.items():
            remove()
            sock.close()
        self._listening.clear()
        super().stop()

    def start_request(self, server_conn: object, request_conn: httputil.HTTPConnection) -> httputil.HTTPMessageDelegate:
        assert isinstance(server_conn, ServerConnection) and isinstance(request_conn, TornadoConnection)
        return _Route(self, server_conn, request_conn)

    def handle_stream(self, stream: iostream.IOStream, address: tuple[Any, ...]) -> None:
        if self.open_connections >= self.max_connections:
            self._refused.log(logging.WARNING, "%d connections open: closed a new one at once", self.open_connections)
            stream.close()
            return
        stream.set_nodelay(True)
        family = stream.socket.family if stream.socket is not None else socket.AF_UNSPEC
        conn = ServerConnection(stream, self.conn_params, _Context(address, family))
        conn.server = self
        self.connections.add(conn)
        self._count()
        conn.start_serving(self)

    def on_close(self, server_conn: object) -> None:
        assert isinstance(server_conn, ServerConnection)
        self.connections.discard(server_conn)
        self.waiting.pop(server_conn, None)
        self.sending.pop(server_conn, None)
        self._kernel_held.pop(server_conn, None)
        self._count()

    async def close_all_connections(self) -> None:
        """Close every open connection, and return once each has stopped serving."""
        while self.connections:
            await next(iter(self.connections)).close()

    def _close_slow(self) -> None:
        """Close the connections that have waited longer than the header timeout for a
        request's headers (idle, or sending them slowly), those that have taken longer than the
        body timeout to send a body on the fast way (oldest first: each walk stops at the first
        within its bound), and those whose answer has not all been taken by the client within
        the header timeout (a client that never reads would hold its answer's megabytes)."""
        now = IOLoop.current().time()
        for waits, timeout in ((self.waiting, self.header_timeout), (self.reading, self.request_body_timeout)):
            if timeout is None:
                continue
            for conn, since in list(waits.items()):
                if since > now - timeout:
                    break
                del waits[conn]
                if waits is self.waiting and self._still_taking(conn):
                    waits[conn] = now  # not idle: its client still takes the last answer from the kernel
                    continue
                conn.timed_out = True
                conn.stream.close()
        if self.header_timeout is None:
            return
        # Every open connection, twice a second (a method call each: 10,000 connections cost
        # about a millisecond; an ioctl more for each whose answer is pending); an answer
        # pending with no byte of it taken by the client (the kernel's send queue is counted:
        # with megabytes of it, the server writes again only once a third is free) for longer
        # than the timeout is dropped, as nginx's send_timeout does: a slow reader that keeps
        # reading is never cut.
        sending, since_before = self.sending, now - self.header_timeout
        for conn in list(self.connections):
            stream = conn.stream
            if not stream.writing():
                sending.pop(conn, None)
                continue
            taken = bytes_written(stream) - unsent(stream)  # by the client (the kernel may hold megabytes)
            seen = sending.get(conn)
            if seen is None or seen[1] != taken:
                sending[conn] = (now, taken)
            elif seen[0] <= since_before:
                del sending[conn]
                self._untaken.log(
                    logging.INFO, "closed a connection whose client took no answer for %.0f s", self.header_timeout
                )
                conn.stream.close()

    def _still_taking(self, conn: ServerConnection) -> bool:
        """Whether the kernel still holds bytes of ``conn``'s last answer and its client took
        some since the last look (one ioctl, only for a connection past its idle timeout): the
        wait for the next request's head began when the answer was handed to the kernel, and a
        close then would drop what the kernel holds (up to its send buffer, megabytes)."""
        queued = unsent(conn.stream)
        if queued and self._kernel_held.get(conn) != queued:
            self._kernel_held[conn] = queued
            return True
        self._kernel_held.pop(conn, None)
        return False

    def _count(self) -> None:
        if self._on_connections is not None:
            self._on_connections(self.open_connections)


class _Route(httputil.HTTPMessageDelegate):
    """Hands a request Tornado's parser read, once its head is in, to the /ingest delegate when
    it is to /ingest, else to the application (its delegate made only then, with the server's
    body timeout); or refuses it first, with a JSON error and a close, where Tornado would answer
    a bare 400 or nothing useful: a Host that Tornado refuses (tiny.protocol), a Transfer-Encoding
    in HTTP/1.0, an ``Expect`` other than 100-continue (417), and, for the application, headers
    past the limits (431) or a body framed as Tornado does not take or declared past its limit
    (400, 413). It also takes what Tornado does not: ``Expect: 100-continue`` in any case, a
    request-target in absolute form (``http://host/path``, RFC 9112 3.2.2), read as its path,
    and a client that half-closes after its request (answered all the same)."""

    __slots__ = ("_server", "_server_conn", "_connection", "_chosen", "_start_line")

    def __init__(self, server: TinyHTTPServer, server_conn: ServerConnection, connection: TornadoConnection) -> None:
        self._server = server
        self._server_conn = server_conn
        self._connection = connection
        self._chosen: httputil.HTTPMessageDelegate | IngestDelegate | None = None
        self._start_line: httputil.RequestStartLine | None = None

    def headers_received(
        self, start_line: httputil.RequestStartLine | httputil.ResponseStartLine, headers: httputil.HTTPHeaders
    ) -> Any:
        assert isinstance(start_line, httputil.RequestStartLine)
        server, connection = self._server, self._connection
        server.waiting.pop(self._server_conn, None)
        connection.begin(start_line, headers, server.conn_params.no_keep_alive)
        connection.answer_half_closed()
        start_line = self._start_line = _origin_form(start_line)
        refusal = host_refusal(start_line.version, headers.get("Host")) or transfer_refusal(start_line.version, headers)
        status = 400
        if refusal is None:
            refusal = expectation_refusal(start_line.version, headers)
            status = 417
        if refusal is not None:
            self._chosen = httputil.HTTPMessageDelegate()  # its methods do nothing: the body is dropped
            return self._refuse(status, refusal)
        if server.ingest is not None:
            ingest = server.ingest(start_line, headers, connection)
            if ingest is not None:
                self._chosen = ingest
                return ingest.headers_received(start_line, headers)
        declared = headers.get("Content-Length")
        if declared is not None and "," in declared and len(set(re.split(r",[ \t]*", declared))) == 1:
            headers["Content-Length"] = declared.split(",")[0]  # the same length twice: Tornado's rule takes it
        too_many = header_limit_refusal(headers)  # (the /ingest delegate answers its own, counted)
        framing = (431, too_many) if too_many is not None else framing_refusal(headers, connection.body_limit)
        if framing is not None:
            self._chosen = httputil.HTTPMessageDelegate()
            return self._refuse(*framing)
        if server.request_body_timeout is not None:
            connection.set_body_timeout(server.request_body_timeout)
        self._chosen = HTTPServer.start_request(server, self._server_conn, connection)
        return self._chosen.headers_received(start_line, headers)

    def _refuse(self, status: int, message: str) -> Future[None]:
        """Answer ``status`` with a JSON error body and close the connection (never read further).
        The future is done once the answer is written and the connection closed: Tornado, which
        awaits it, then reads nothing more and writes nothing else (a framing error of the
        body it would find next would be a second answer)."""
        start_line = self._start_line
        assert start_line is not None
        log.warning("%d %s %s: %s", status, start_line.method, clipped(start_line.path), message)
        body = error_body(status, message)
        head = answer_head(status, len(body))
        # The body is never read: the connection closes once the answer is out. Tornado's own
        # limit lifted, so it finds the stream closed instead of refusing the length again (a
        # second answer, to a closed stream, and a log line).
        self._connection.set_max_body_size(2**62)
        return self._connection.write_answer(head, b"" if start_line.method == "HEAD" else body, close=True)

    def body_refused(self, status: int, message: str) -> Any:
        """A body refused while it is read (a chunked body past its limit: 413, or malformed:
        400), by tiny.connection: the /ingest delegate answers it, or the route for the application."""
        refused = getattr(self._chosen, "body_refused", None)
        if refused is not None:
            return refused(status, message)
        return self._refuse(status, message)

    def data_received(self, chunk: bytes) -> Any:
        assert self._chosen is not None
        return self._chosen.data_received(chunk)

    def finish(self) -> None:
        assert self._chosen is not None
        self._chosen.finish()

    def on_connection_close(self) -> None:
        if self._chosen is not None:
            self._chosen.on_connection_close()


def _origin_form(start_line: httputil.RequestStartLine) -> httputil.RequestStartLine:
    """``start_line`` with a request-target in absolute form (``http://host/path?query``, which
    a server must accept: RFC 9112, 3.2.2) made its origin form (``/path?query``); as it is otherwise."""
    target = start_line.path
    if target.startswith("/") or "://" not in target:
        return start_line
    try:
        parts = urlsplit(target)
    except ValueError:  # a bracket unclosed ("http://[::1/"): no URL, so no such path (404)
        return start_line
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        return start_line
    return start_line._replace(path=urlunsplit(("", "", parts.path or "/", parts.query, "")))

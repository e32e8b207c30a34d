"""The HTTP server of a worker: Tornado's, with limits, a calm accept loop, chunk extensions, a lean way in.

Things Tornado 6.6's ``HTTPServer`` does not do, which a server facing hostile clients, or
a fast one, needs:

- **A cap on open connections** (``--max-connections``): a connection past it is closed at
  once, so idle clients cannot take the descriptors the sink needs for the day files.
- **An accept loop that backs off**: when ``accept(2)`` fails for lack of descriptors or
  memory (EMFILE, ENFILE, ENOBUFS, ENOMEM), Tornado's loop logs a traceback and retries at
  once, spinning; here it logs at most once a second and pauses accepting for a moment.
- **HTTP/1.1 chunk extensions and trailers** (RFC 9112, section 7.1): ``1a;name=value``
  size lines and trailer fields after the last chunk are valid, and Tornado answers them
  with a bare 400. Here extensions are skipped and trailers read and ignored, within
  bounds.
- **A lean way in** (``lean``): once a request's headers are in, a callable may take it with
  a delegate of its own (tiny.handlers.lean: the usual POST /ingest without a
  RequestHandler); every other request goes to the application as before.
- **One Host rule for every way in** (:func:`host_refusal`, Tornado's own, which it applies
  only when it builds an ``HTTPServerRequest``, so never on the lean way): HTTP/1.1 without a
  Host, a Host that is not ``host[:port]``, or two of them (a comma) get a JSON 400 and a
  close (:func:`error_body`), before the lean way or the application sees the request.
- **An answer that closes, closes** (RFC 9112, section 9.6): whichever way answered, once an
  answer says ``Connection: close`` (a refusal before the body was read, a drain) the
  connection is closed after it, and nothing sent after that request is read or processed.
  Tornado closes after a refusal sent before the body was read, but its loop could still take
  the next request already in the read buffer; and it kept the connection open after an
  answer that said ``Connection: close`` of its own accord.
- **A fast way to the lean one**: the commonest request head (``POST /ingest HTTP/1.1`` or 1.0,
  well-formed header fields each sent once, CRLF line ends, a Content-Length, no
  Transfer-Encoding, Expect or Upgrade) is parsed here, without Tornado's
  ``HTTP1Connection`` per request, its header parser and its callbacks (about a third of a
  1-record request's event-loop time), and its body read straight from the stream into the
  lean delegate. Any other head is put back into the stream's buffer, unread, and Tornado
  reads it as before: only requests that Tornado would parse the same way take the fast
  way, so every answer is the one it always was. The fast way gives up at once on a head of
  more than 8 KiB or 32 fields (no client sends one; a hostile one is parsed once, by Tornado,
  not twice). A body of 64 KiB to 1 MiB still to come is read into one buffer
  (``IOStream.read_into``), an anonymous mapping whose pages take memory only as the bytes
  land in them: a client that declares 1 MiB and sends 1 KB holds about 1 KB
  (:class:`_WholeBuffers`: at most 32 in use per worker, the last 4 kept for the next bodies).
- **Timeouts without a timer per request**: Tornado wraps every header read, and every body
  read, in a timer (``gen.with_timeout``: a few percent of a small request). Here the header
  timeout (``idle_connection_timeout``: idle connections and slow headers alike) is one sweep
  twice a second over the connections waiting for headers, oldest first, so a connection is
  closed between the timeout and half a second after it. The body timeout of a request on
  the fast way is the same sweep over the connections whose body is still to come (none for
  a body that came with its head); Tornado's timer is set per request only for the other
  requests (the application's always, the lean way's when the body is not already buffered).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import mmap
import re
import socket
import time
from collections.abc import Callable
from typing import Any, Protocol

import orjson
import tornado
from tornado import httputil, iostream

# Two methods below are copies of Tornado's own, changed (HTTP1Connection._read_chunked_body and
# HTTP1ServerConnection._server_request_loop), a third (_Connection.write_answer) does what
# HTTP1Connection.write_headers and finish do for one kind of response, and they use private
# names of Tornado's. They were checked against these versions only: any other refuses to
# import, saying what to check.
# tests/test_httpserver.py fails when the upstream methods' source changes.
CHECKED_TORNADO = ("6.6.1",)
if tornado.version not in CHECKED_TORNADO:
    raise ImportError(
        f"tiny.httpserver copies Tornado {', '.join(CHECKED_TORNADO)}'s HTTP1Connection._read_chunked_body and "
        "HTTP1ServerConnection._server_request_loop, writes an answer as HTTP1Connection.write_headers and finish "
        "do, and uses its private _CHUNK_YIELD_COST, _YIELD_THRESHOLD, _is_done, _HTTPRequestContext, _ABNF.host, "
        "HTTP1Connection's response state, and IOStream's _read_buffer, _read_buffer_size and _user_read_buffer; "
        f"Tornado {tornado.version} is installed: compare them with its source, "
        "then add it to CHECKED_TORNADO (or install tornado==6.6.1, the pinned version)"
    )

from tornado.concurrent import Future, future_add_done_callback  # noqa: E402
from tornado.http1connection import (  # noqa: E402
    _CHUNK_YIELD_COST,
    _YIELD_THRESHOLD,
    HTTP1Connection,
    HTTP1ServerConnection,
    _is_done,
)
from tornado.httpserver import HTTPServer, _HTTPRequestContext  # noqa: E402
from tornado.httputil import _ABNF  # noqa: E402
from tornado.ioloop import IOLoop, PeriodicCallback  # noqa: E402
from tornado.log import gen_log  # noqa: E402

from tiny.limits import MAX_CHUNK_LINE, MAX_LENGTH_DIGITS, MAX_TRAILERS  # noqa: E402

_SERVER = f"TornadoServer/{tornado.version}"  # what a RequestHandler says

log = logging.getLogger("tiny.httpserver")

_ACCEPT_BATCH = 128  # connections accepted per wake-up before other work gets a turn
_ACCEPT_PAUSE = 0.1  # seconds accept pauses after it ran out of descriptors or memory
_SWEEP_SECONDS = 0.5  # how often connections past the header timeout are closed
BODY_PIECE = 1024 * 1024  # bytes of a body handed to a request at most at once
_WHOLE_BODY = 64 * 1024  # a fast-way body from this size on, not yet buffered, is read into one buffer
_WHOLE_BUFFERS = 32  # such buffers (of BODY_PIECE bytes of address space each) in use at most per worker
_WHOLE_KEPT = 4  # such buffers kept for the next bodies (their pages touched so far stay in memory)
_LOG_EVERY = 1.0  # seconds between two log lines of the same kind
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


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


class TinyHTTPServer(HTTPServer):
    """``HTTPServer`` plus ``max_connections``, a backing-off accept loop and chunk extensions.

    ``on_connections(n)`` is called with the number of open connections whenever it changes.
    """

    def initialize(  # type: ignore[override]
        self,
        *args: Any,
        max_connections: int,
        on_connections: Callable[[int], None] | None = None,
        lean: Lean | None = None,
        body_timeout: float | None = None,
        **kwargs: Any,
    ) -> None:
        # Tornado would wrap every body read in a timer of its own (params.body_timeout); here
        # each request gets one only when its body is still to come (see _Route).
        super().initialize(*args, **kwargs)
        self.lean = lean
        self.request_body_timeout = body_timeout
        # The header timeout (--idle-timeout) is one sweep over the connections waiting for
        # headers, twice a second, instead of Tornado's timer around every header read.
        self.header_timeout = self.conn_params.header_timeout
        self.conn_params.header_timeout = None
        # A body is handed over in pieces of up to 1 MiB of what the socket delivered (read
        # 64 KiB at a time, Tornado's default: a 1 MiB read allocates and zeroes 1 MiB each
        # time): a 276 KB body that arrived whole is one piece, not five to copy together.
        self.conn_params.chunk_size = BODY_PIECE
        self.waiting: dict[_ServerConnection, float] = {}  # in the order they began to wait
        self.whole = _WholeBuffers()  # the buffers bodies are read into whole (_serve_fast)
        # The fast way's body timeout, the same way: the connections whose body is still to
        # come, in the order they began to read it.
        self.reading: dict[_ServerConnection, float] = {}
        self._sweeper: PeriodicCallback | None = None
        self.max_connections = max_connections
        self.open_connections = 0
        self._on_connections = on_connections
        self._refused = _Every()
        self._accept_errors = _Every()

    def add_sockets(self, sockets: Any) -> None:
        # TCPServer.add_sockets with our accept loop; _sockets and _handlers are what its
        # stop() uses to close the sockets and remove their handlers.
        if self._sweeper is None and (self.header_timeout or self.request_body_timeout):
            self._sweeper = PeriodicCallback(self._close_slow, _SWEEP_SECONDS * 1000)
            self._sweeper.start()
        for sock in sockets:
            self._sockets[sock.fileno()] = sock
            self._handlers[sock.fileno()] = self._accept_on(sock)

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
                self._handle_connection(connection, address)

        def remove() -> None:
            if not state["paused"]:
                io_loop.remove_handler(sock)
            state["removed"] = True

        io_loop.add_handler(sock, accept, IOLoop.READ)
        return remove

    def start_request(self, server_conn: object, request_conn: httputil.HTTPConnection) -> httputil.HTTPMessageDelegate:
        return _Route(self, server_conn, request_conn)

    def handle_stream(self, stream: iostream.IOStream, address: tuple[Any, ...]) -> None:
        if self.open_connections >= self.max_connections:
            self._refused.log(logging.WARNING, "%d connections open: closed a new one at once", self.open_connections)
            stream.close()
            return
        # TCP_NODELAY on for the connection's life, as nginx's tcp_nodelay keeps it on kept-alive
        # connections. Tornado turns it on as each answer ends and off after: two setsockopt(2)
        # calls a request, 4% of the event loop's busy time at 1-record bodies (py-spy, session
        # 12). Answers are written whole, so Nagle's algorithm would only hold back the last
        # packet of a streamed one.
        stream.set_nodelay(True)
        stream.set_nodelay = _nodelay_kept  # type: ignore[method-assign]
        context = _HTTPRequestContext(stream, address, self.protocol, self.trusted_downstream)
        conn = _ServerConnection(stream, self.conn_params, context)
        conn.server = self
        self._connections.add(conn)
        self._count(+1)
        conn.start_serving(self)

    def on_close(self, server_conn: object) -> None:
        super().on_close(server_conn)
        self.waiting.pop(server_conn, None)  # type: ignore[call-overload]
        self._count(-1)

    def _close_slow(self) -> None:
        """Close the connections that have waited longer than the header timeout for a
        request's headers (idle, or sending them slowly), and those that have taken longer
        than the body timeout to send a body on the fast way. Oldest first: each walk stops
        at the first within its bound."""
        now = IOLoop.current().time()
        for waits, timeout in ((self.waiting, self.header_timeout), (self.reading, self.request_body_timeout)):
            if timeout is None:
                continue
            for conn, since in list(waits.items()):
                if since > now - timeout:
                    break
                del waits[conn]
                conn.timed_out = True
                conn.stream.close()

    def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.stop()
        super().stop()

    def _count(self, change: int) -> None:
        self.open_connections += change
        if self._on_connections is not None:
            self._on_connections(self.open_connections)


def _nodelay_kept(value: bool) -> None:
    """A stream's set_nodelay once TinyHTTPServer.handle_stream has turned TCP_NODELAY on."""


# A request's lean way in (tiny.handlers.lean.route): its delegate, or None for the app's. It is
# given an HTTPHeaders and an HTTP1Connection, or on the fast way Fields and a _FastConnection.
Lean = Callable[[httputil.RequestStartLine, Any, Any], Any]


class _Route(httputil.HTTPMessageDelegate):
    """Hands a request, once its headers are in, to the lean way in when it takes it (which
    sets its own body timeout), else to the application (its delegate made only then), with
    the server's body timeout; or refuses it first, for a Host that Tornado refuses
    (:func:`host_refusal`)."""

    __slots__ = ("_server", "_server_conn", "_connection", "_chosen")

    def __init__(self, server: TinyHTTPServer, server_conn: object, connection: httputil.HTTPConnection) -> None:
        self._server = server
        self._server_conn = server_conn
        self._connection = connection
        self._chosen: httputil.HTTPMessageDelegate | None = None

    def headers_received(
        self, start_line: httputil.RequestStartLine | httputil.ResponseStartLine, headers: httputil.HTTPHeaders
    ) -> Any:
        assert isinstance(start_line, httputil.RequestStartLine)
        self._server.waiting.pop(self._server_conn, None)  # type: ignore[call-overload]
        refusal = host_refusal(start_line.version, headers.get("Host"))
        if refusal is not None:
            self._chosen = httputil.HTTPMessageDelegate()  # its methods do nothing: the body is dropped
            return self._refuse(start_line, 400, refusal)
        if self._server.lean is not None:
            lean = self._server.lean(start_line, headers, self._connection)
            if lean is not None:
                self._chosen = lean
                return None
        if self._server.request_body_timeout is not None:
            self._connection.set_body_timeout(self._server.request_body_timeout)  # type: ignore[attr-defined]
        self._chosen = HTTPServer.start_request(self._server, self._server_conn, self._connection)
        return self._chosen.headers_received(start_line, headers)

    def _refuse(self, start_line: httputil.RequestStartLine, status: int, message: str) -> Future[None]:
        """Answer ``status`` with a JSON error body and close the connection (never read further).
        The future is done once the answer is written and the connection closed: Tornado, which
        awaits it, then reads nothing more and writes nothing else (a framing error of the
        body it would find next would be a second answer)."""
        log.warning("%d %s %s: %s", status, start_line.method, start_line.path, message)
        connection = self._connection
        assert isinstance(connection, _Connection)
        body = error_body(status, message)
        head = (
            f"HTTP/1.1 {status} {httputil.responses.get(status, 'Unknown')}\r\nServer: {_SERVER}\r\n"
            f"Content-Type: {JSON}\r\nDate: {httputil.format_timestamp(time.time())}\r\n"
            f"Content-Length: {len(body)}\r\n"
        ).encode()
        return connection.write_answer(head, b"" if start_line.method == "HEAD" else body, close=True)

    def data_received(self, chunk: bytes) -> Any:
        assert self._chosen is not None
        return self._chosen.data_received(chunk)

    def finish(self) -> None:
        assert self._chosen is not None
        self._chosen.finish()

    def on_connection_close(self) -> None:
        if self._chosen is not None:
            self._chosen.on_connection_close()


class _Connection(HTTP1Connection):
    """``HTTP1Connection`` whose chunked-body reader accepts chunk extensions and trailers,
    which writes a whole answer at once (:meth:`write_answer`), and which closes after every
    answer that says ``Connection: close`` (Tornado closes only after one it decided to close)."""

    def write_headers(
        self,
        start_line: httputil.RequestStartLine | httputil.ResponseStartLine,
        headers: httputil.HTTPHeaders,
        chunk: bytes | None = None,
    ) -> Future[None]:
        if _says_close(headers.get("Connection")):  # the application's answer: it closes the connection
            self._disconnect_on_finish = True
        return super().write_headers(start_line, headers, chunk)

    def write_answer(self, head: bytes, body: bytes, close: bool = False) -> Future[None]:
        """Write a server response whose status line and headers are ``head`` (each line ending
        in CRLF, Content-Length among them) and whose body is ``body``, then finish it: what
        ``write_headers(start, headers, body)`` and ``finish()`` do for such a response in
        Tornado 6.6.1, without building an HTTPHeaders and formatting it line by line.
        ``close`` adds ``Connection: close`` and closes the connection after the answer; as
        write_headers does, so does a request that asked for it, and an HTTP/1.0 request that
        asked for keep-alive gets it. Returns a future done once the answer is written (and the
        connection closed, when it closes)."""
        request = self._request_start_line
        assert request is not None and self._request_headers is not None
        asked = request.version == "HTTP/1.0" and self._request_headers.get("Connection", "").lower() == "keep-alive"
        if close:
            self._disconnect_on_finish = True
        head += _connection_line(request.version, close, self._disconnect_on_finish, asked)
        self._chunking_output = False
        self._expected_content_remaining = 0
        future = self._write_future = Future()
        if self.stream.closed():
            future.set_exception(iostream.StreamClosedError())
            future.exception()
        else:
            self._pending_write = self.stream.write(head + b"\r\n" + body)
            future_add_done_callback(self._pending_write, self._on_write_complete)
        self.finish()
        return future

    async def _read_chunked_body(self, delegate: httputil.HTTPMessageDelegate) -> None:
        # Tornado 6.6's _read_chunked_body, with two changes marked "RFC 9112": the size line
        # may carry extensions, and the last chunk may be followed by trailer fields.
        total_size = 0
        pending = bytearray()
        work = 0

        def read(future: Any) -> Any:
            if pending and not _is_done(future):
                return flush_and_read(future)
            return future

        async def flush_and_read(future: Any) -> bytes:
            data = bytes(pending)
            pending.clear()
            await self._deliver_body(delegate, data)
            return await future  # type: ignore[no-any-return]

        while True:
            work += _CHUNK_YIELD_COST
            if work >= _YIELD_THRESHOLD:
                work = 0
                await asyncio.sleep(0)
            line = await read(self.stream.read_until(b"\r\n", max_bytes=MAX_CHUNK_LINE))
            chunk_len = _chunk_size(line)  # RFC 9112: chunk-size [ chunk-ext ] CRLF
            if chunk_len == 0:
                await self._read_trailers(read)  # RFC 9112: trailer-section CRLF
                if pending:
                    await self._deliver_body(delegate, bytes(pending))
                return
            total_size += chunk_len
            if total_size > self._max_body_size:
                raise httputil.HTTPInputError("chunked body too large")
            bytes_to_read = chunk_len
            while bytes_to_read:
                chunk = await read(self.stream.read_bytes(min(bytes_to_read, self.params.chunk_size), partial=True))
                bytes_to_read -= len(chunk)
                if not pending and len(chunk) == self.params.chunk_size:
                    await self._deliver_body(delegate, chunk)
                else:
                    pending += chunk
                    if len(pending) >= self.params.chunk_size:
                        data = bytes(pending[: self.params.chunk_size])
                        del pending[: self.params.chunk_size]
                        await self._deliver_body(delegate, data)
                work += len(chunk)
                if work >= _YIELD_THRESHOLD:
                    work = 0
                    await asyncio.sleep(0)
            crlf = await read(self.stream.read_bytes(2))
            if crlf != b"\r\n":
                raise httputil.HTTPInputError("improperly terminated chunk")

    async def _read_trailers(self, read: Callable[[Any], Any]) -> None:
        """Read and drop the trailer fields up to the empty line (at most MAX_TRAILERS bytes)."""
        left = MAX_TRAILERS
        while True:
            line = await read(self.stream.read_until(b"\r\n", max_bytes=left))
            if line == b"\r\n":
                return
            left -= len(line)
            if b":" not in line or left <= 2:
                raise httputil.HTTPInputError("malformed chunked trailer")


def _chunk_size(line: bytes) -> int:
    """The size of a chunk-size line ``HEX [ ; ext ]... CRLF``; HTTPInputError if malformed."""
    size = line[:-2].split(b";", 1)[0].rstrip(b" \t")  # BWS is allowed before ";"
    if not size or size.strip(b"0123456789abcdefABCDEF"):
        raise httputil.HTTPInputError("invalid chunk size")
    return int(size, 16)


class _ServerConnection(HTTP1ServerConnection):
    """``HTTP1ServerConnection`` that reads each request with :class:`_Connection`, or the
    commonest ingest request itself (:meth:`_serve_fast`), and is in its server's ``waiting``
    while it waits for a request's headers."""

    server: TinyHTTPServer
    timed_out = False  # the server's sweep closed it: its client took too long

    async def _server_request_loop(self, delegate: httputil.HTTPServerConnectionDelegate) -> None:
        # Tornado 6.6's loop, constructing our _Connection instead of HTTP1Connection, and with
        # the fast way first when the server has a lean way in.
        server = self.server
        try:
            # An answer that closed the connection ends the loop, whatever is left in the read
            # buffer: those requests came after a close and are not processed (RFC 9112, 9.6).
            while not self.stream.closed():
                if server.lean is not None:
                    server.waiting[self] = IOLoop.current().time()  # until the head is in
                    try:
                        head = await self.stream.read_until_regex(b"\r?\n\r?\n", max_bytes=self.params.max_header_size)
                    except (iostream.StreamClosedError, iostream.UnsatisfiableReadError, asyncio.CancelledError):
                        return
                    server.waiting.pop(self, None)
                    try:
                        kept = await self._serve_fast(head)
                    except Exception:
                        log.error("Uncaught exception", exc_info=True)
                        self.stream.close()
                        return
                    if kept is False:
                        return
                    if kept:
                        await asyncio.sleep(0)
                        continue
                    _unread(self.stream, head)  # not the fast way's: Tornado reads it, as always
                conn = _Connection(self.stream, False, self.params, self.context)
                server.waiting[self] = IOLoop.current().time()  # until _Route has its headers
                request_delegate = delegate.start_request(self, conn)
                try:
                    ret = await conn.read_response(request_delegate)
                except (iostream.StreamClosedError, iostream.UnsatisfiableReadError, asyncio.CancelledError):
                    return
                except Exception:
                    log.error("Uncaught exception", exc_info=True)
                    conn.close()
                    return
                if not ret:
                    return
                await asyncio.sleep(0)
        finally:
            delegate.on_close(self)

    async def _serve_fast(self, head: bytes) -> bool | None:
        """Serve the request whose head is ``head`` the fast way, if it is the commonest kind
        (:func:`parse_fast_head`) and the lean way takes it: True when the connection stays
        open for the next request, False when it closed. None, having read nothing more: the
        request is not the fast way's."""
        fields = parse_fast_head(head)
        if fields is None:
            return None
        stream, server = self.stream, self.server
        start_line = _START_LINES[head[_VERSION_AT] == 0x31]  # HTTP/1.1, else HTTP/1.0
        asked = fields.get("Connection", "").lower()
        keep_alive = not self.params.no_keep_alive and (
            asked != "close" if start_line.version == "HTTP/1.1" else asked == "keep-alive"
        )
        conn = _FastConnection(stream, self.context, start_line.version, keep_alive, asked == "keep-alive")
        assert server.lean is not None
        request: FastDelegate | None = server.lean(start_line, fields, conn)
        if request is None:
            return None
        left = int(fields["Content-Length"])
        to_come = stream._read_buffer_size < left  # type: ignore[attr-defined]
        # A body still to come is bounded by the body timeout: the server's sweep closes the
        # stream past it (no timer per request), which ends the read below.
        timed = to_come and conn.body_timeout is not None
        if timed:
            self.timed_out = False
            server.reading[self] = IOLoop.current().time()
        try:
            if to_come and _WHOLE_BODY <= left <= BODY_PIECE:
                left = await self._read_whole(request, left)
            while left > 0:  # in pieces of at most BODY_PIECE, as Tornado's _read_fixed_body
                chunk = await stream.read_bytes(min(left, BODY_PIECE), partial=True)
                left -= len(chunk)
                request.data_received(chunk)
        except iostream.StreamClosedError:
            if timed and self.timed_out:
                gen_log.info("Timeout reading body from %s", self.context)
            request.on_connection_close()
            return False
        finally:
            if timed:
                server.reading.pop(self, None)
        request.finish()
        await request.finished()
        if conn.written is not None:
            try:
                await conn.written
            except iostream.StreamClosedError:
                return False
        if conn.close or stream.closed():
            stream.close()
            return False
        return True

    async def _read_whole(self, request: FastDelegate, size: int) -> int:
        """Read a body of ``size`` bytes still to come into one buffer (:class:`_WholeBuffers`)
        and hand it to ``request``; returns what is left to read: 0, or ``size`` when no buffer
        could be had (the pieces read it then). The socket reads land in the buffer
        (recv_into), where pieces would each be a zeroed 64 KiB buffer, copied into the
        stream's buffer, copied out, then joined."""
        buffers = self.server.whole
        whole = buffers.take()
        if whole is None:
            return size
        mapped = memoryview(whole)
        view = mapped[:size]
        try:
            await self.stream.read_into(view)  # type: ignore[arg-type]  # any writable buffer
        except BaseException:
            buffers.give(whole, reusable=False)  # the stream may still hold it: unmapped once it lets go
            raise
        body = bytes(view)
        view.release()
        mapped.release()
        buffers.give(whole, reusable=True)
        request.data_received(body)
        return 0


class _WholeBuffers:
    """The buffers bodies are read into whole, per worker: anonymous private mappings of
    BODY_PIECE bytes. A mapping's pages take memory only when bytes land in them, where a
    bytearray of the body's size is zeroed, so all of it touched, when it is made: a client
    that declares 1 MiB and sends 1 KB holds 1 KB (and 1 MiB of address space), not 1 MiB.
    A fresh mapping costs a page fault per 4 KiB that arrives, so the last ``_WHOLE_KEPT``
    given back are kept for the next bodies, their pages already in memory: at most that many
    MiB stay in memory between bodies. At most ``_WHOLE_BUFFERS`` are in use at once: past
    them, bodies come in pieces, as many as arrive."""

    def __init__(self) -> None:
        self.kept: list[mmap.mmap] = []
        self.in_use = 0

    @property
    def reserved(self) -> int:
        """Bytes of address space of the buffers in use."""
        return self.in_use * BODY_PIECE

    def take(self) -> mmap.mmap | None:
        """A buffer of BODY_PIECE bytes, or None past the budget or out of mappings."""
        if self.in_use >= _WHOLE_BUFFERS:
            return None
        if self.kept:
            whole = self.kept.pop()
        else:
            try:
                whole = mmap.mmap(-1, BODY_PIECE, flags=mmap.MAP_PRIVATE)
            except OSError:  # out of address space or of mappings: the pieces need neither
                return None
        self.in_use += 1
        return whole

    def give(self, whole: mmap.mmap, reusable: bool) -> None:
        """Give back a buffer taken: kept for the next body while fewer than ``_WHOLE_KEPT`` are,
        and ``reusable`` (no stream holds it), else unmapped once nothing refers to it."""
        self.in_use -= 1
        if reusable and len(self.kept) < _WHOLE_KEPT:
            self.kept.append(whole)


class FastDelegate(Protocol):
    """What the lean way in returns for a request on the fast way: an HTTPMessageDelegate
    whose ``finished()`` returns once its answer is handed to the connection (or the
    connection is gone)."""

    def data_received(self, chunk: bytes) -> Any: ...

    def finish(self) -> None: ...

    def on_connection_close(self) -> None: ...

    async def finished(self) -> None: ...


class _FastConnection:
    """The connection a request on the fast way answers through: what the lean way uses of
    :class:`_Connection` (``write_answer``, the body limits, ``stream``, ``context``)."""

    __slots__ = ("stream", "context", "version", "close", "asked_keep_alive", "body_timeout", "written")

    def __init__(
        self, stream: iostream.IOStream, context: Any, version: str, keep_alive: bool, asked_keep_alive: bool
    ) -> None:
        self.stream = stream
        self.context = context
        self.version = version
        self.close = not keep_alive  # the connection closes after this answer
        self.asked_keep_alive = asked_keep_alive  # Connection: keep-alive (HTTP/1.0's way to ask)
        self.body_timeout: float | None = None
        self.written: Future[None] | None = None

    def set_max_body_size(self, max_body_size: int) -> None:
        """Nothing to lift: the fast way reads exactly the declared Content-Length, which the
        request rules held to --max-body before the body was read."""

    def set_body_timeout(self, timeout: float) -> None:
        self.body_timeout = timeout

    def write_answer(self, head: bytes, body: bytes, close: bool = False) -> None:
        """Write the answer as :meth:`_Connection.write_answer` does, with the same
        ``Connection`` header."""
        head += _connection_line(self.version, close, self.close, self.asked_keep_alive)
        self.close = self.close or close
        if not self.stream.closed():
            self.written = self.stream.write(head + b"\r\n" + body)


def _says_close(connection: str | None) -> bool:
    """Whether an answer's ``Connection`` header holds the ``close`` option (RFC 9110, 7.6.1)."""
    return connection is not None and "close" in (option.strip().lower() for option in connection.split(","))


JSON = "application/json; charset=utf-8"  # said out loud: a client need not guess (httr warns when it must)


def error_body(status: int, message: str) -> bytes:
    """The body of every error answer, whichever way answers it: ``{"error": {"status": S,
    "message": "..."}}``, the message meant for the client."""
    return orjson.dumps({"error": {"status": status, "message": message}})


def host_refusal(version: str, host: str | None) -> str | None:
    """Why a request of HTTP ``version`` whose Host header is ``host`` (its lines joined with
    commas, as HTTPHeaders joins them; None without one) is refused with a 400, or None when it
    is not: Tornado 6.6.1's rule (``HTTPServerRequest.__init__``, which the application's way
    applies and the lean way never reached). A Host is required but in HTTP/1.0; it is
    ``host[:port]`` of RFC 3986's characters (Tornado's own pattern); a comma means two."""
    if host is None:
        return None if version == "HTTP/1.0" else "the Host header is missing; a request needs one, but in HTTP/1.0"
    if not _ABNF.host.fullmatch(host):
        return f"the Host header {host[:64]!r} is not a host name with an optional port"
    if "," in host:
        return f"the Host header {host[:64]!r} was sent more than once or holds a list; send one host"
    return None


def _connection_line(version: str, close: bool, disconnect: bool, asked_keep_alive: bool) -> bytes:
    """The ``Connection`` line of an answer, as ``HTTP1Connection.write_headers`` writes it:
    ``close`` when the answer closes the connection (``close``) or an HTTP/1.1 request's
    connection ends after it (``disconnect``); ``Keep-Alive`` to an HTTP/1.0 request that asked
    for it; else none."""
    if close or (version == "HTTP/1.1" and disconnect):
        return b"Connection: close\r\n"
    if version == "HTTP/1.0" and asked_keep_alive:
        return b"Connection: Keep-Alive\r\n"
    return b""


# The fast way's request head: this request line, CRLF line ends, header fields whose names are
# tokens (RFC 9110) sent once each, whose values hold no control character but HTAB.
_FAST_REQUEST_LINE = b"POST /ingest HTTP/1."  # then 1 or 0, CRLF
_VERSION_AT = len(_FAST_REQUEST_LINE)
_START_LINES = {  # by "is it HTTP/1.1"
    False: httputil.RequestStartLine("POST", "/ingest", "HTTP/1.0"),
    True: httputil.RequestStartLine("POST", "/ingest", "HTTP/1.1"),
}
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CONTROLS = bytes([*range(0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])  # but HTAB, CR and LF
_NOT_FAST = frozenset({"Transfer-Encoding", "Expect", "Upgrade"})  # bodies and answers of other kinds
_NAMES: dict[bytes, str] = {}  # header names as sent -> Http-Header-Case (Tornado's _normalize_header)
_MAX_NAMES = 512
_HOSTS: set[str] = set()  # Host values that passed host_refusal (at most _MAX_NAMES)
# The fast way's bounds: the heads clients send are a few hundred bytes of up to a dozen fields.
# A longer head goes to Tornado's parser at once: parsed by both, a hostile head of 1 MB cost
# up to half as much again as on the general way (tests/test_httpserver.py measures it).
_FAST_HEAD_BYTES = 8 * 1024
_FAST_FIELDS = 32


class Fields(dict[str, str]):
    """The header fields of a head read by :func:`parse_fast_head`, by Http-Header-Case name:
    what the lean way reads of an ``HTTPHeaders`` (``get``, ``get_list``, ``get_all``)."""

    def get_list(self, name: str) -> list[str]:
        value = self.get(name)
        return [] if value is None else [value]

    def get_all(self) -> Any:
        return self.items()


def parse_fast_head(head: bytes) -> Fields | None:
    """The header fields of ``head`` (a request head up to its empty line) if it is the fast
    way's: ``POST /ingest HTTP/1.1`` (or 1.0), at most 8 KiB and 32 fields, CRLF line ends, no
    control characters but HTAB, each field ``token ":" OWS value OWS`` and sent once, a
    Content-Length of at most ``MAX_LENGTH_DIGITS`` digits, a Host that Tornado takes
    (:func:`host_refusal`), no Transfer-Encoding, Expect or Upgrade. None for any other head
    (Tornado's parser reads it, and it is answered as it always was). Linear in the head's size,
    and bounded: a head past the bounds costs two comparisons."""
    if len(head) > _FAST_HEAD_BYTES:
        return None
    lines = head.count(b"\n")  # the request line, the fields, the empty line
    if (
        lines > _FAST_FIELDS + 2
        or not head.startswith(_FAST_REQUEST_LINE)
        or head[_VERSION_AT : _VERSION_AT + 3] not in (b"1\r\n", b"0\r\n")
        or not head.endswith(b"\r\n\r\n")
        # (a regular expression for these took half of the parse: 6 µs of 11 for ab's head)
        or lines != head.count(b"\r\n")  # a lone LF
        or head.count(b"\r") != head.count(b"\r\n")  # a lone CR
        or len(head.translate(None, _CONTROLS)) != len(head)  # another control character
    ):
        return None
    fields = Fields()
    for line in head[_VERSION_AT + 3 : -4].split(b"\r\n"):
        name, colon, value = line.partition(b":")
        if not colon:
            return None
        key = _NAMES.get(name)  # a name seen before passed the check below
        if key is None:
            if not _TOKEN.fullmatch(name):
                return None  # an empty or odd name, a folded line
            key = "-".join([word.capitalize() for word in name.decode("latin1").split("-")])
            if len(_NAMES) < _MAX_NAMES:
                _NAMES[name] = key
        if key in fields or key in _NOT_FAST:
            return None  # a field sent twice: Tornado joins or refuses it
        fields[key] = value.strip(b" \t").decode("latin1")
    length = fields.get("Content-Length")
    if length is None or len(length) > MAX_LENGTH_DIGITS or not (length.isascii() and length.isdigit()):
        return None
    host = fields.get("Host")
    if host not in _HOSTS:  # (a set lookup: the pattern costs a microsecond)
        if host_refusal(_START_LINES[head[_VERSION_AT] == 0x31].version, host) is not None:
            return None  # Tornado reads it, and it is refused as every way refuses it
        if host is not None and len(host) <= 255 and len(_HOSTS) < _MAX_NAMES:
            _HOSTS.add(host)
    return fields


def _unread(stream: iostream.IOStream, data: bytes) -> None:
    """Put ``data``, just read from ``stream``, back in front of its read buffer, for the next
    read (IOStream's private buffer: CHECKED_TORNADO)."""
    assert not stream._user_read_buffer  # type: ignore[attr-defined]
    stream._read_buffer[:0] = data  # type: ignore[attr-defined]
    stream._read_buffer_size += len(data)  # type: ignore[attr-defined]

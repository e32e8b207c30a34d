"""One client connection of the server: its request loop, and the two ways a request head is read.

:class:`ServerConnection` serves the requests of one connection, one after the other. Each head
is read once from the stream; the commonest ``POST /ingest`` head (tiny.fasthead) is served at
once, the fast way: its body read straight from the stream into the /ingest delegate, answered
through a :class:`FastConnection`, with no ``HTTP1Connection`` and no ``HTTPHeaders``. Any other
head is put back into the stream's buffer, unread, and Tornado's parser reads it through a
:class:`TornadoConnection` (the /ingest delegate again for any other request to /ingest, else the
application). Both connections answer the /ingest delegate the same way, byte for byte
(:meth:`FastConnection.write_answer`, :meth:`TornadoConnection.write_answer`, both built on
tiny.protocol), and both count the request's way (tiny.metrics: ``tiny_ingest_heads_total``).

What holds on both ways:

- **An answer that closes, closes** (RFC 9112, section 9.6): once an answer says ``Connection:
  close`` (an early refusal, a drain, the application's own), the connection is closed after it
  and nothing sent after that request is read or processed.
- **The header timeout** is the server's sweep (tiny.httpserver), not a timer per read: the
  connection is in its server's ``waiting`` while it waits for a head. The fast way's body
  timeout is the same sweep over ``reading``; Tornado's way keeps Tornado's timer per body.
- **Chunked bodies** take chunk extensions and trailers (tiny.chunked).

Tornado's private names this module uses, each for what it buys (BENCHMARKS.md, "One way into
/ingest: the private Tornado surface, measured"), and nothing else of Tornado's that is not public:

====================================================  =============================================
``HTTP1ServerConnection._server_request_loop``        overridden (a copy of 6.6.1's, changed): the
                                                      one place a connection's requests are read,
                                                      so the only place for the fast way, for
                                                      TornadoConnection instead of HTTP1Connection
                                                      (chunk extensions), and for ending the loop
                                                      after a close. Gain: the fast way's.
``HTTP1Connection._read_chunked_body``                overridden: chunk extensions and trailers
                                                      (a behaviour; Tornado has no public seam).
``IOStream._total_write_done_index``                read by :func:`bytes_written`: the bytes of
                                                      answers the kernel took so far, so the write
                                                      timeout (tiny.httpserver) cuts a client that
                                                      takes nothing, never one that reads slowly.
                                                      Gain: a bound on memory held for clients.
``IOStream._read_buffer``, ``_read_buffer_size``,     read and written by :func:`unread`: a head
``_user_read_buffer``                                 the fast way does not take goes back into the
                                                      stream for Tornado's parser. Gain: the fast
                                                      way's (0.56x, 0.66x, 0.74x the CPU per request
                                                      of Tornado's way at 1, 100, 1,600 records).
====================================================  =============================================

They were checked against Tornado 6.6.1 only (CHECKED_TORNADO): any other version refuses to
import, and tests/test_httpserver.py fails when the upstream source of the two methods and of
``BaseIOStream._consume`` (the read buffer's reader) changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import struct
import termios
from typing import TYPE_CHECKING, Any, Protocol

import tornado
from tornado import httputil, iostream

CHECKED_TORNADO = ("6.6.1",)
if tornado.version not in CHECKED_TORNADO:
    raise ImportError(
        f"tiny.connection overrides Tornado {', '.join(CHECKED_TORNADO)}'s HTTP1ServerConnection._server_request_loop "
        "(a changed copy) and HTTP1Connection._read_chunked_body, and writes IOStream's _read_buffer, "
        "_read_buffer_size and reads _user_read_buffer and _total_write_done_index; "
        f"Tornado {tornado.version} is installed: compare them with "
        "its source, then add it to CHECKED_TORNADO (or install tornado==6.6.1, the pinned version)"
    )

from tornado.concurrent import Future, future_add_done_callback  # noqa: E402
from tornado.http1connection import HTTP1Connection, HTTP1ServerConnection  # noqa: E402
from tornado.ioloop import IOLoop  # noqa: E402
from tornado.log import gen_log  # noqa: E402

from tiny import chunked  # noqa: E402
from tiny.bodybuffers import BODY_PIECE, WHOLE_BODY  # noqa: E402
from tiny.fasthead import START_LINES, VERSION_AT, Fields, parse_fast_head  # noqa: E402
from tiny.protocol import connection_line, keeps_alive  # noqa: E402

if TYPE_CHECKING:
    from tiny.httpserver import TinyHTTPServer

log = logging.getLogger("tiny.httpserver")


class IngestDelegate(Protocol):
    """What the /ingest route gives for a request (tiny.handlers.ingest): an HTTPMessageDelegate
    whose ``finished()`` returns once its answer is handed to the connection (or the connection
    is gone)."""

    def headers_received(self, start_line: httputil.RequestStartLine, headers: Any) -> Any: ...

    def data_received(self, chunk: bytes) -> Any: ...

    def finish(self) -> None: ...

    def on_connection_close(self) -> None: ...

    async def finished(self) -> None: ...


class _Answering:
    """What both connections share: the request's keep-alive, and an answer written whole."""

    stream: iostream.IOStream
    version = "HTTP/1.1"
    keep_alive = True  # the request's own rule (tiny.protocol.keeps_alive)
    asked_keep_alive = False  # it said Connection: keep-alive (HTTP/1.0's way to ask)
    closing = False  # the answer closes the connection: nothing after it is read
    answered = False  # an answer was written (or the stream was found closed)

    def begin(self, start_line: httputil.RequestStartLine, headers: Any, no_keep_alive: bool) -> None:
        """Note what the request's head says about its connection."""
        self.version = start_line.version
        self.keep_alive = not no_keep_alive and keeps_alive(start_line.version, start_line.method, headers)
        self.asked_keep_alive = (headers.get("Connection") or "").lower() == "keep-alive"

    def _data(self, head: bytes, body: bytes, close: bool) -> bytes:
        """The answer's bytes: ``head`` (its status line and headers, tiny.protocol.answer_head),
        its Connection line, the empty line, ``body``; and whether the connection closes."""
        line = connection_line(self.version, close, self.keep_alive, self.asked_keep_alive)
        self.answered = True
        self.closing = self.closing or close or not self.keep_alive
        return head + line + b"\r\n" + body


class FastConnection(_Answering):
    """The connection a request on the fast way answers through: what the /ingest delegate uses
    of a connection (``write_answer``, the body limits, ``stream``, ``context``, ``parser``)."""

    parser = "fast"

    def __init__(self, stream: iostream.IOStream, context: Any) -> None:
        self.stream = stream
        self.context = context
        self.body_timeout: float | None = None
        self.written: Future[None] | None = None

    def set_max_body_size(self, max_body_size: int) -> None:
        """Nothing to lift: the fast way reads exactly the declared Content-Length, which the
        request rules held to --max-body before the body was read."""

    def set_body_timeout(self, timeout: float) -> None:
        self.body_timeout = timeout

    def write_answer(self, head: bytes, body: bytes, close: bool = False) -> None:
        """Write the answer whole; ``close``: the connection closes after it, whatever the
        request asked."""
        data = self._data(head, body, close)
        if not self.stream.closed():
            self.written = self.stream.write(data)


class TornadoConnection(_Answering, HTTP1Connection):
    """``HTTP1Connection`` (Tornado's parser, every head the fast way leaves) whose chunked-body
    reader takes chunk extensions and trailers, which writes the /ingest delegate's answer
    whole, as the fast way does (:meth:`write_answer`), and whose connection closes after every
    answer that says ``Connection: close``, the application's included."""

    parser = "tornado"

    def __init__(self, stream: iostream.IOStream, params: Any, context: Any) -> None:
        super().__init__(stream, False, params, context)
        self.body_limit = params.max_body_size if params.max_body_size is not None else stream.max_buffer_size
        self.answered = False

    def set_max_body_size(self, max_body_size: int) -> None:
        super().set_max_body_size(max_body_size)
        self.body_limit = max_body_size

    def write_headers(
        self,
        start_line: httputil.RequestStartLine | httputil.ResponseStartLine,
        headers: httputil.HTTPHeaders,
        chunk: bytes | None = None,
    ) -> Future[None]:
        if _says_close(headers.get("Connection")):  # the application's answer: it closes the connection
            self.closing = True
        return super().write_headers(start_line, headers, chunk)

    def answer_half_closed(self) -> None:
        """Answer this request even when its client half-closes (``shutdown(SHUT_WR)``) after
        sending it, as the fast way does. Once the body is read, Tornado's HTTP1Connection sets
        the stream's close callback while the answer is pending, which makes the stream listen
        for reads, and IOStream closes the whole socket at the EOF: /ingest's rows were written
        and never answered, and no read was answered. Every request is answered (the server's
        handlers never stop for a client gone), so the callback is not set (this instance's
        ``set_close_callback`` does nothing) until :meth:`finish`; a client gone meanwhile
        fails the answer's write, which ends the request as the close would."""
        setattr(self.stream, "set_close_callback", _no_close_callback)  # noqa: B010  # an instance's method, shadowed

    def finish(self) -> None:
        self.answered = True
        self.stream.__dict__.pop("set_close_callback", None)  # the stream's own method again
        super().finish()

    def write_answer(self, head: bytes, body: bytes, close: bool = False) -> Future[None]:
        """Write the answer whole (as :meth:`FastConnection.write_answer`), then finish the
        request as Tornado's connection does once an answer is written, and close when the
        answer closes. Returns a future done then (failed when the stream is closed)."""
        data = self._data(head, body, close)
        done: Future[None] = Future()
        if self.stream.closed():
            done.set_exception(iostream.StreamClosedError())
            done.exception()  # retrieved: the caller may drop it
            return done

        def written(future: Future[None]) -> None:
            try:
                future.result()
            except iostream.StreamClosedError as exc:
                done.set_exception(exc)
                done.exception()
            else:
                done.set_result(None)
            self.finish()  # all of the answer is out: Tornado ends the request (or closes)
            if self.closing:
                self.stream.close()

        future_add_done_callback(self.stream.write(data), written)
        return done

    async def _read_chunked_body(self, delegate: httputil.HTTPMessageDelegate) -> None:
        async def deliver(data: bytes) -> None:
            if not self.answered:  # an answer given: the rest of the body is read and dropped
                result = delegate.data_received(data)
                if result is not None:
                    await result

        try:
            await chunked.read_chunked_body(self.stream, deliver, self.body_limit, self.params.chunk_size)
        except (httputil.HTTPInputError, iostream.UnsatisfiableReadError) as exc:
            # Tornado would answer a bare 400 (and one to a body too large); a chunk-size line or
            # trailers past their bounds found in what was read already (an unsatisfiable read:
            # found as bytes arrive, IOStream closes the connection itself, unanswered); the request's
            # delegate (tiny.httpserver's route) answers a JSON 413 or 400 and the connection
            # closes. The stream's close then ends the request as a client's close would.
            refused = getattr(delegate, "body_refused", None)
            if refused is None:
                raise
            if not self.answered:  # (answered already: no second answer, the close alone)
                too_large = isinstance(exc, chunked.TooLarge)
                if isinstance(exc, iostream.UnsatisfiableReadError):
                    message = f"the chunked body: a chunk-size line or its trailers are longer than allowed ({exc})"
                else:
                    message = str(exc) if too_large else f"the chunked body: {exc}"
                written = refused(413 if too_large else 400, message)
                if written is not None:
                    with contextlib.suppress(iostream.StreamClosedError):
                        await written
            self.stream.close()
            raise iostream.StreamClosedError() from None


def _no_close_callback(callback: object) -> None:
    """A stream's ``set_close_callback`` while a request answers half-closed clients (above)."""


def _says_close(connection: str | None) -> bool:
    """Whether an answer's ``Connection`` header holds the ``close`` option (RFC 9110, 7.6.1)."""
    return connection is not None and "close" in (option.strip().lower() for option in connection.split(","))


class ServerConnection(HTTP1ServerConnection):
    """``HTTP1ServerConnection`` that reads the commonest /ingest head itself (:meth:`_serve_fast`)
    and every other with :class:`TornadoConnection`, and is in its server's ``waiting`` while it
    waits for a request's head."""

    server: TinyHTTPServer
    timed_out = False  # the server's sweep closed it: its client took too long

    async def _server_request_loop(self, delegate: httputil.HTTPServerConnectionDelegate) -> None:
        # Tornado 6.6's loop, constructing TornadoConnection instead of HTTP1Connection, with the
        # fast way first, and ending once an answer closed the connection: what is left in the read
        # buffer came after a close and is not processed (RFC 9112, 9.6).
        server = self.server
        try:
            while not self.stream.closed():
                if server.fast:
                    served = await self._next_fast()
                    if served is False:
                        return
                    if served:
                        await asyncio.sleep(0)
                        continue
                conn = TornadoConnection(self.stream, self.params, self.context)
                server.waiting[self] = IOLoop.current().time()  # until the route has its head
                request_delegate = delegate.start_request(self, conn)
                try:
                    ret = await conn.read_response(request_delegate)
                except (iostream.StreamClosedError, iostream.UnsatisfiableReadError, asyncio.CancelledError):
                    return
                except Exception:
                    log.error("Uncaught exception", exc_info=True)
                    conn.close()
                    return
                if not ret or conn.closing:
                    self.stream.close()
                    return
                self.stream.set_nodelay(True)  # Tornado turns it off after its answer: on for the connection's life
                await asyncio.sleep(0)
        finally:
            delegate.on_close(self)

    async def _next_fast(self) -> bool | None:
        """Read the next head and serve it the fast way when it is the fast way's: True when
        the connection stays open for the next request, False when it closed; None when the
        head went back into the stream for Tornado's parser."""
        server = self.server
        server.waiting[self] = IOLoop.current().time()  # until the head is in
        try:
            head = await self.stream.read_until_regex(b"\r?\n\r?\n", max_bytes=self.params.max_header_size)
        except (iostream.StreamClosedError, iostream.UnsatisfiableReadError, asyncio.CancelledError):
            return False
        server.waiting.pop(self, None)
        try:
            served = await self._serve_fast(head)
        except Exception:
            log.error("Uncaught exception", exc_info=True)
            self.stream.close()
            return False
        if served is None:
            unread(self.stream, head)  # not the fast way's: Tornado reads it, as always
        return served

    async def _serve_fast(self, head: bytes) -> bool | None:
        """Serve the request whose head is ``head`` the fast way, if it is the commonest kind
        (tiny.fasthead): True when the connection stays open for the next request, False when
        it closed. None, having read nothing more: the request is not the fast way's."""
        fields = parse_fast_head(head)
        if fields is None:
            return None
        stream, server = self.stream, self.server
        start_line = START_LINES[head[VERSION_AT] == 0x31]  # HTTP/1.1, else HTTP/1.0
        conn = FastConnection(stream, self.context)
        conn.begin(start_line, fields, self.params.no_keep_alive)
        assert server.ingest is not None
        request = server.ingest(start_line, fields, conn)
        assert request is not None  # every POST /ingest is the /ingest delegate's
        request.headers_received(start_line, fields)
        if not conn.answered and not await self._read_body(request, conn, fields):
            return False
        await request.finished()
        if conn.written is not None:
            try:
                await conn.written
            except iostream.StreamClosedError:
                return False
        if conn.closing or stream.closed():
            stream.close()
            return False
        return True

    async def _read_body(self, request: IngestDelegate, conn: FastConnection, fields: Fields) -> bool:
        """Read the body of Content-Length bytes into ``request`` and finish it; False when the
        connection closed first (the body timeout, the client)."""
        server, stream = self.server, self.stream
        left = int(fields["Content-Length"])
        # The body is bounded by the body timeout: the server's sweep closes the stream past it
        # (no timer per request), which ends the read below.
        timed = conn.body_timeout is not None and left > 0
        if timed:
            self.timed_out = False
            server.reading[self] = IOLoop.current().time()
        try:
            if WHOLE_BODY <= left <= BODY_PIECE:
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
        return True

    async def _read_whole(self, request: IngestDelegate, size: int) -> int:
        """Read a body of ``size`` bytes into one buffer (tiny.bodybuffers) and hand it to
        ``request``; returns what is left to read: 0, or ``size`` when no buffer could be had
        (the pieces read it then). The socket reads land in the buffer (recv_into), where pieces
        would each be a zeroed 64 KiB buffer, copied into the stream's buffer, copied out, then
        joined; what the stream already holds is copied in first."""
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


def unread(stream: iostream.IOStream, data: bytes) -> None:
    """Put ``data``, just read from ``stream``, back in front of its read buffer, for the next
    read (IOStream's private buffer: see the table above)."""
    assert not stream._user_read_buffer  # type: ignore[attr-defined]
    stream._read_buffer[:0] = data  # type: ignore[attr-defined]
    stream._read_buffer_size += len(data)  # type: ignore[attr-defined]


def bytes_written(stream: iostream.IOStream) -> int:
    """The bytes the stream has handed to the kernel so far (IOStream's private count: see the
    table above)."""
    return stream._total_write_done_index  # type: ignore[attr-defined,no-any-return]


def unsent(stream: iostream.IOStream) -> int:
    """The bytes written to the stream's socket that its peer has not yet taken (the kernel's
    send queue, SIOCOUTQ); 0 when the socket is gone or cannot say."""
    sock = stream.socket
    if sock is None:
        return 0
    try:
        return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0])
    except (OSError, ValueError):
        return 0

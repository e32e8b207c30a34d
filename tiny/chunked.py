"""The chunked request body reader (RFC 9112, section 7.1), with chunk extensions and trailers.

Tornado 6.6's ``HTTP1Connection._read_chunked_body`` answers a bare 400 to a chunk-size line
that carries an extension (``1a;name=value``) and to trailer fields after the last chunk; both
are valid HTTP/1.1. :func:`read_chunked_body` is Tornado's reader with those two changes
(marked "RFC 9112" below), called by tiny.connection for every chunked body Tornado's parser
reads. Extensions are skipped; trailers are read within MAX_TRAILERS bytes and dropped. A chunk
whose size would take the body past its limit is refused at its size line (:class:`TooLarge`),
before any of its bytes is read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from tornado import httputil, iostream

from tiny.limits import MAX_CHUNK_LINE, MAX_TRAILERS

# Tornado's own pacing of a long body (its http1connection's): a chunk counts as this many bytes
# of work, and the loop yields to other connections after every YIELD_AFTER bytes of it.
_CHUNK_COST = 1024
_YIELD_AFTER = 256 * 1024


class TooLarge(httputil.HTTPInputError):
    """A chunked body's chunks add up to more than its limit (a 413, where other framing errors are 400s)."""


async def read_chunked_body(
    stream: iostream.IOStream, deliver: Callable[[bytes], Awaitable[None]], limit: int, piece: int
) -> None:
    """Read a chunked body from ``stream`` and hand it to ``deliver`` in pieces of at most
    ``piece`` bytes; HTTPInputError when it is malformed, TooLarge when its chunks add up to
    more than ``limit`` bytes. Consecutive small chunks are joined, and what is pending is handed over
    whenever the next read would wait for the network."""
    total_size = 0
    pending = bytearray()
    work = 0

    def read(future: Awaitable[bytes]) -> Awaitable[bytes]:
        if pending and not (isinstance(future, asyncio.Future) and future.done()):
            return flush_and_read(future)
        return future

    async def flush_and_read(future: Awaitable[bytes]) -> bytes:
        data = bytes(pending)
        pending.clear()
        await deliver(data)
        return await future

    while True:
        work += _CHUNK_COST
        if work >= _YIELD_AFTER:
            work = 0
            await asyncio.sleep(0)
        line = await read(stream.read_until(b"\r\n", max_bytes=MAX_CHUNK_LINE))
        chunk_len = chunk_size(line)  # RFC 9112: chunk-size [ chunk-ext ] CRLF
        if chunk_len == 0:
            await _read_trailers(stream, read)  # RFC 9112: trailer-section CRLF
            if pending:
                await deliver(bytes(pending))
            return
        total_size += chunk_len
        if total_size > limit:
            raise TooLarge(f"body is larger than the limit of {limit} bytes")
        bytes_to_read = chunk_len
        while bytes_to_read:
            chunk = await read(stream.read_bytes(min(bytes_to_read, piece), partial=True))
            bytes_to_read -= len(chunk)
            if not pending and len(chunk) == piece:
                await deliver(chunk)
            else:
                pending += chunk
                if len(pending) >= piece:
                    data = bytes(pending[:piece])
                    del pending[:piece]
                    await deliver(data)
            work += len(chunk)
            if work >= _YIELD_AFTER:
                work = 0
                await asyncio.sleep(0)
        crlf = await read(stream.read_bytes(2))
        if crlf != b"\r\n":
            raise httputil.HTTPInputError("improperly terminated chunk")


def chunk_size(line: bytes) -> int:
    """The size of a chunk-size line ``HEX [ ; ext ]... CRLF``; HTTPInputError if malformed."""
    size = line[:-2].split(b";", 1)[0].rstrip(b" \t")  # BWS is allowed before ";"
    if not size or size.strip(b"0123456789abcdefABCDEF"):
        raise httputil.HTTPInputError("invalid chunk size")
    return int(size, 16)


async def _read_trailers(stream: iostream.IOStream, read: Callable[[Any], Any]) -> None:
    """Read and drop the trailer fields up to the empty line (at most MAX_TRAILERS bytes)."""
    left = MAX_TRAILERS
    while True:
        line = await read(stream.read_until(b"\r\n", max_bytes=left))
        if line == b"\r\n":
            return
        left -= len(line)
        if b":" not in line or left <= 2:
            raise httputil.HTTPInputError("malformed chunked trailer")

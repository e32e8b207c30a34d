"""tiny.httpserver against the Tornado it copies from: the copies are of the source they say, and
what it changes of Tornado's behaviour holds."""

from __future__ import annotations

import hashlib
import http.client
import inspect
import socket
from pathlib import Path

import orjson
import tornado
from tornado.http1connection import HTTP1Connection, HTTP1ServerConnection

from tests.support import record
from tiny import httpserver
from tiny.testing import InProcessServer

# sha256 of the upstream methods' source in Tornado 6.6.1, the version the copies were made from.
UPSTREAM = {
    "HTTP1Connection._read_chunked_body": "bb6888d2ff152ee940219729ba4f28724ff30ba775e77fa581ba26b868aab957",
    "HTTP1ServerConnection._server_request_loop": "878caf064d85d615c371d09ed9068eaaadfda25e70a8e9a35cb92996d0a7e539",
    "HTTP1Connection.write_headers": "0cfc1ef0b6793acd62306d4ac65a1cab806858506cc7e17e64295263190c1250",
    "HTTP1Connection.finish": "06764160f2a948ce6c07da810b967bb254e3d8723be30c94d90844eb118dcd88",
}


def test_the_copied_tornado_methods_are_unchanged_upstream() -> None:
    """Fails when Tornado's own methods differ from those the copies were made from: compare
    tiny/httpserver.py's _Connection and _ServerConnection with them before bumping the pin."""
    found = {
        method.__qualname__: hashlib.sha256(inspect.getsource(method).encode()).hexdigest()
        for method in (
            HTTP1Connection._read_chunked_body,
            HTTP1ServerConnection._server_request_loop,
            HTTP1Connection.write_headers,
            HTTP1Connection.finish,
        )
    }
    assert found == UPSTREAM


def test_the_installed_tornado_is_one_the_copies_were_checked_against() -> None:
    assert tornado.version in httpserver.CHECKED_TORNADO


def test_a_kept_alive_connection_keeps_tcp_nodelay_on_between_requests(tmp_path: Path) -> None:
    # (Tornado turns it off after each answer: a setsockopt(2) each way per request.)
    with InProcessServer(tmp_path / "data") as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        try:
            for _ in range(2):
                conn.request("POST", "/ingest", orjson.dumps(record()) + b"\n")
                response = conn.getresponse()
                assert response.status == 200, response.read()
                response.read()
            (connection,) = server._server._connections
            assert connection.stream.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        finally:
            conn.close()

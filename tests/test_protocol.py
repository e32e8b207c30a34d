"""tiny.protocol: the HTTP rules every way into the server applies, held to Tornado's own."""

from __future__ import annotations

import orjson
from hypothesis import event, given
from hypothesis import strategies as st
from tornado import httputil
from tornado.http1connection import HTTP1Connection, HTTP1ConnectionParameters

from tiny import protocol


class _Deciding:
    """What HTTP1Connection._can_keep_alive reads of its connection: the server's parameters."""

    params = HTTP1ConnectionParameters()


def _tornados_rule(version: str, method: str, headers: httputil.HTTPHeaders) -> bool:
    """Tornado 6.6.1's keep-alive rule for a request, as its HTTP1Connection applies it."""
    start_line = httputil.RequestStartLine(method, "/ingest", version)
    return HTTP1Connection._can_keep_alive(_Deciding(), start_line, headers)  # type: ignore[arg-type]


@given(
    st.sampled_from(["HTTP/1.0", "HTTP/1.1"]),
    st.sampled_from(["POST", "GET", "HEAD", "PUT"]),
    st.sampled_from([None, "close", "Close", "keep-alive", "Keep-Alive", "close, x", "upgrade", ""]),
    st.sampled_from([None, "5", "0"]),
    st.sampled_from([None, "chunked", "Chunked", "gzip"]),
)
def test_the_keep_alive_rule_is_tornados(
    version: str, method: str, connection: str | None, length: str | None, encoding: str | None
) -> None:
    headers = httputil.HTTPHeaders()
    for name, value in (("Connection", connection), ("Content-Length", length), ("Transfer-Encoding", encoding)):
        if value is not None:
            headers[name] = value
    try:
        expected = _tornados_rule(version, method, headers)
    except httputil.HTTPInputError:
        expected = False  # Tornado refuses the head before any answer
    event("kept alive" if expected else "closed")
    assert protocol.keeps_alive(version, method, headers) is expected
    assert protocol.keeps_alive(version, method, dict(headers)) is expected  # the fast parser's fields


def test_the_connection_line_says_close_when_the_server_closes_whatever_the_request_asked() -> None:
    assert protocol.connection_line("HTTP/1.1", True, True, False) == b"Connection: close\r\n"
    assert protocol.connection_line("HTTP/1.0", True, True, True) == b"Connection: close\r\n"
    assert protocol.connection_line("HTTP/1.0", True, False, False) == b"Connection: close\r\n"


def test_the_connection_line_answers_what_the_request_asked_otherwise() -> None:
    assert protocol.connection_line("HTTP/1.1", False, True, False) == b""
    assert protocol.connection_line("HTTP/1.1", False, False, False) == b"Connection: close\r\n"
    assert protocol.connection_line("HTTP/1.0", False, True, True) == b"Connection: Keep-Alive\r\n"
    assert protocol.connection_line("HTTP/1.0", False, False, False) == b""


def test_an_answer_head_carries_the_handlers_headers_in_order_and_its_extras_in_http_header_case() -> None:
    head = protocol.answer_head(401, 66, {"WWW-Authenticate": 'Bearer realm="tiny"', "Retry-After": "5"})
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 401 Unauthorized"
    assert [line.split(b":")[0] for line in lines[1:-1]] == [
        b"Server",
        b"Content-Type",
        b"Date",
        b"Content-Length",
        b"Www-Authenticate",
        b"Retry-After",
    ]
    assert b"Content-Length: 66" in lines and lines[-1] == b""


def test_every_error_body_is_the_one_json_shape() -> None:
    assert orjson.loads(protocol.error_body(413, "too big")) == {"error": {"status": 413, "message": "too big"}}

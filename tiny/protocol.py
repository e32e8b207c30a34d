"""The HTTP/1.1 rules that every way into the server applies, each stated once, in one function.

Whichever parser read a request's head (tiny.fasthead, or Tornado's ``HTTP1Connection``) and
whichever code answers it (the /ingest delegate, the refusal of a Host, a RequestHandler through
tiny.handlers.base), these decide the same way:

- :func:`host_refusal`: which Host headers are refused (Tornado 6.6.1's rule, RFC 9112 section
  3.2, which Tornado applies only when it builds an ``HTTPServerRequest``);
- :func:`keeps_alive`: whether a request's connection may carry another request after its
  answer (RFC 9112 section 9.3; Tornado's ``_can_keep_alive``, held equal by a test);
- :func:`transfer_refusal` and :func:`framing_refusal`: which bodies' framing is refused, and with which status (400 or
  413), before the body is read (Tornado's own checks, which answer a bare 400, made first);
- :func:`expectation_refusal`: the ``Expect`` header (RFC 9110, 10.1.1), read without regard
  to case, as Tornado does not;
- :func:`connection_line`: the ``Connection`` header of an answer;
- :func:`header_limit_refusal`: the headers past the limits (431);
- :func:`clipped`: a client's text as an answer or a log line shows it (its first characters);
- :func:`error_body` and :func:`answer_head`: the bytes of every error body, and the status line
  and headers of every answer the server writes itself (the ones a RequestHandler writes carry
  the same headers, in Tornado's order).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

import orjson
import tornado
from tornado import httputil
from tornado.http1connection import is_transfer_encoding_chunked

from tiny.limits import MAX_HEADER_BYTES, MAX_HEADERS, MAX_LENGTH_DIGITS

_SHOWN = 200  # characters of a client's path shown in an answer or a log line
JSON = "application/json; charset=utf-8"  # said out loud: a client need not guess (httr warns when it must)
SERVER = f"TornadoServer/{tornado.version}"  # what a RequestHandler says

# RFC 3986's host (brackets and colons anywhere, as Tornado simplifies it) and an optional port:
# Tornado 6.6.1's own pattern (httputil._ABNF.host), which tests/test_httpserver.py holds equal to
# the rule Tornado applies.
_HOST = re.compile(r"(?:(?:[\[\]:]|[A-Za-z0-9\-._~]|[!$&'()*+,;=]|%[0-9A-Fa-f]{2})*)(?::[0-9]*)?")


def error_body(status: int, message: str, details: Mapping[str, Any] | None = None) -> bytes:
    """The body of every error answer, whichever way answers it: ``{"error": {"status": S,
    "message": "..."}}``, the message meant for the client, and ``details`` beside them (the
    figures a client can act on, e.g. ``"counting"`` of a 503 while a day is counted)."""
    return orjson.dumps({"error": {"status": status, "message": message, **(details or {})}})


def host_refusal(version: str, host: str | None) -> str | None:
    """Why a request of HTTP ``version`` whose Host header is ``host`` (its lines joined with
    commas, as HTTPHeaders joins them; None without one) is refused with a 400, or None when it
    is not: Tornado 6.6.1's rule (``HTTPServerRequest.__init__``). A Host is required but in
    HTTP/1.0; it is ``host[:port]`` of RFC 3986's characters; a comma means two."""
    if host is None:
        return None if version == "HTTP/1.0" else "the Host header is missing; a request needs one, but in HTTP/1.0"
    if not _HOST.fullmatch(host):
        return f"the Host header {host[:64]!r} is not a host name with an optional port"
    if "," in host:
        return f"the Host header {host[:64]!r} was sent more than once or holds a list; send one host"
    return None


def transfer_refusal(version: str, headers: httputil.HTTPHeaders) -> str | None:
    """Why a request is refused (400) for a Transfer-Encoding in HTTP/1.0, whose framing is then
    faulty (RFC 9112, 6.1), or None. (The fast parser takes no Transfer-Encoding at all.)"""
    if version == "HTTP/1.0" and "Transfer-Encoding" in headers:
        return "HTTP/1.0 has no Transfer-Encoding (RFC 9112, 6.1); send a Content-Length, or use HTTP/1.1"
    return None


def framing_refusal(headers: httputil.HTTPHeaders | Any, limit: int) -> tuple[int, str] | None:
    """The status and message refusing a request whose head says its body is framed as Tornado
    does not take, or declares more than ``limit`` bytes; None when it may send its body. 400: a
    Transfer-Encoding other than chunked or beside a Content-Length (Tornado's rule: no
    smuggling), a Content-Length that is not one number of decimal digits, or of more than
    MAX_LENGTH_DIGITS digits; 413: a Content-Length over ``limit``. ``headers``: an
    HTTPHeaders, or tiny.fasthead's Fields."""
    try:
        is_transfer_encoding_chunked(headers)
    except httputil.HTTPInputError as exc:  # its message quotes the value: cut short
        return 400, f"{str(exc)[:120]}; send chunked or a Content-Length"
    declared = headers.get("Content-Length")
    if declared is None:
        return None
    if not (declared.isascii() and declared.isdigit()):  # Tornado's parse_int's rule
        return 400, f"Content-Length {declared[:64]!r} is not one number of decimal digits"
    size, most = declared.lstrip("0") or "0", str(limit)
    # Compared as digits: int() refuses over 4,300 of them.
    if len(size) > len(most) or (len(size) == len(most) and size > most):
        shown = size if len(size) <= 24 else f"{size[:24]}... ({len(size)} digits)"
        return 413, f"body of {shown} bytes is larger than the limit of {limit} bytes"
    if len(declared) > MAX_LENGTH_DIGITS:  # leading zeros: no length needs them
        return 400, f"Content-Length has {len(declared)} digits; send at most {MAX_LENGTH_DIGITS}"
    return None


def header_limit_refusal(headers: httputil.HTTPHeaders | Any) -> str | None:
    """Why request headers past the limits (tiny.limits) are refused (431), or None: more than
    MAX_HEADERS field lines (each line counts: a name sent 150 times is 150 fields, RFC 9110
    section 5.3), or more than MAX_HEADER_BYTES of them. ``headers`` is an ``HTTPHeaders`` or
    the fast way's ``Fields`` (whose ``get_all`` yields each line). Past HEADER_READ_LIMIT
    bytes Tornado itself closes the connection unanswered."""
    count = size = 0
    for name, value in headers.get_all():
        count += 1
        size += len(name) + len(value) + 4
    if count > MAX_HEADERS:
        return f"more than {MAX_HEADERS} request header fields"
    if size > MAX_HEADER_BYTES:
        return f"request headers larger than {MAX_HEADER_BYTES} bytes"
    return None


def clipped(text: str) -> str:
    """``text``, or its first characters and its length when longer: a client's 1 MB path is
    no 1 MB answer, nor a 1 MB log line."""
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}... ({len(text):,} characters)"


def expectation_refusal(version: str, headers: httputil.HTTPHeaders) -> str | None:
    """Why a request's ``Expect`` header is refused (417), or None. ``100-continue`` is the one
    expectation, in any case (RFC 9110, 10.1.1); it is written back in Tornado's case, the one
    its parser answers ``100 Continue`` to, but in HTTP/1.0, which must ignore it (removed)."""
    expect = headers.get("Expect")
    if expect is None:
        return None
    if expect.strip().lower() != "100-continue":
        return f"the expectation {expect[:64]!r} cannot be met; the one this server meets is 100-continue"
    if version == "HTTP/1.0":
        del headers["Expect"]
    else:
        headers["Expect"] = "100-continue"
    return None


def keeps_alive(version: str, method: str, headers: httputil.HTTPHeaders | dict[str, str]) -> bool:
    """Whether the connection of a request may carry another one after its answer, as the
    client asked (RFC 9112 section 9.3, as Tornado 6.6.1 reads it): HTTP/1.1 unless it says
    ``Connection: close``; HTTP/1.0 when it says ``Connection: keep-alive`` and its body has a
    length (Content-Length or chunked; GET and HEAD have none to wait for). The server may
    still close after an answer of its own accord (tiny.handlers.base.closes_connection)."""
    asked = headers.get("Connection")
    asked = asked.lower() if asked is not None else None
    if version == "HTTP/1.1":
        return asked != "close"
    encoding = headers.get("Transfer-Encoding")
    if "Content-Length" in headers:
        framed = True
    elif encoding is not None:  # another than chunked is refused before any answer (Tornado, the rules)
        framed = encoding.lower() == "chunked"
    else:
        framed = method in ("HEAD", "GET")
    return framed and asked == "keep-alive"


def connection_line(version: str, close: bool, keep_alive: bool, asked_keep_alive: bool) -> bytes:
    """The ``Connection`` line of an answer, as ``HTTP1Connection.write_headers`` writes it:
    ``close`` when the server closes the connection after the answer of its own accord
    (``close``: an early answer, a drain) or an HTTP/1.1 request's connection ends with it (not
    ``keep_alive``); ``Keep-Alive`` to an HTTP/1.0 request that asked for it; else none
    (HTTP/1.0 closes by default)."""
    if close or (version == "HTTP/1.1" and not keep_alive):
        return b"Connection: close\r\n"
    if version == "HTTP/1.0" and asked_keep_alive:
        return b"Connection: Keep-Alive\r\n"
    return b""


def answer_head(status: int, length: int, extra: dict[str, str] | None = None) -> bytes:
    """The status line and headers of an answer the server writes itself, but its ``Connection``
    line and the empty line: Server, Content-Type (JSON), Date, Content-Length ``length``, then
    ``extra`` in its order."""
    lines = [_HEADS.get(status) or _head_for(status), b"Date: ", _date(), b"\r\nContent-Length: %d\r\n" % length]
    for name, value in (extra or {}).items():  # in Http-Header-Case, as a RequestHandler writes them
        lines.append(f"{'-'.join([word.capitalize() for word in name.split('-')])}: {value}\r\n".encode("latin1"))
    return b"".join(lines)


def _head_for(status: int) -> bytes:
    """The status line and the headers that every answer with ``status`` carries before its Date."""
    reason = httputil.responses.get(status, "Unknown")
    return f"HTTP/1.1 {status} {reason}\r\nServer: {SERVER}\r\nContent-Type: {JSON}\r\n".encode()


_HEADS = {status: _head_for(status) for status in (200, 400, 401, 405, 413, 415, 422, 431, 500, 503)}
_DATE = {0: b""}  # {second: its HTTP date}: one formatting per second, not per answer


def _date() -> bytes:
    now = int(time.time())
    date = _DATE.get(now)
    if date is None:
        _DATE.clear()
        date = _DATE[now] = httputil.format_timestamp(now).encode()
    return date

"""The fast head parser: the commonest request head of ``POST /ingest``, read without Tornado's.

:func:`parse_fast_head` reads ``POST /ingest HTTP/1.1`` (or 1.0: ab's), CRLF line ends,
well-formed header fields each sent once, a Content-Length, no Transfer-Encoding, Expect or
Upgrade, within 8 KiB and 32 fields: about a third of a 1-record request's event-loop time is
Tornado's ``HTTP1Connection`` per request, its header parser and its callbacks, which such a head
does without (tiny.connection serves it). Any other head is left to Tornado's parser, so only
heads that Tornado reads the same way are read here (tests/test_httpserver.py holds the two equal
on every head it generates), and every answer is the one Tornado's way gives.
"""

from __future__ import annotations

import re
from typing import Any

from tornado import httputil

from tiny.limits import MAX_LENGTH_DIGITS
from tiny.protocol import host_refusal

# The fast way's request head: this request line, CRLF line ends, header fields whose names are
# tokens (RFC 9110) sent once each, whose values hold no control character but HTAB.
FAST_REQUEST_LINE = b"POST /ingest HTTP/1."  # then 1 or 0, CRLF
VERSION_AT = len(FAST_REQUEST_LINE)
START_LINES = {  # by "is it HTTP/1.1"
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
# A longer head goes to Tornado's parser at once, so a hostile head is parsed once, not by both
# (tests/test_httpserver.py measures what a 1 MB head costs).
FAST_HEAD_BYTES = 8 * 1024
FAST_FIELDS = 32


class Fields(dict[str, str]):
    """The header fields of a head read by :func:`parse_fast_head`, by Http-Header-Case name:
    what the /ingest delegate and the protocol rules read of an ``HTTPHeaders`` (``get``,
    ``get_list``, ``get_all``, ``in``)."""

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
    if len(head) > FAST_HEAD_BYTES:
        return None
    lines = head.count(b"\n")  # the request line, the fields, the empty line
    if (
        lines > FAST_FIELDS + 2
        or not head.startswith(FAST_REQUEST_LINE)
        or head[VERSION_AT : VERSION_AT + 3] not in (b"1\r\n", b"0\r\n")
        or not head.endswith(b"\r\n\r\n")
        # (a regular expression for these costs half of the parse: 6 of 11 µs for ab's head)
        or lines != head.count(b"\r\n")  # a lone LF
        or head.count(b"\r") != head.count(b"\r\n")  # a lone CR
        or len(head.translate(None, _CONTROLS)) != len(head)  # another control character
    ):
        return None
    fields = Fields()
    for line in head[VERSION_AT + 3 : -4].split(b"\r\n"):
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
        if host_refusal(START_LINES[head[VERSION_AT] == 0x31].version, host) is not None:
            return None  # Tornado reads it, and it is refused as every way refuses it
        if host is not None and len(host) <= 255 and len(_HOSTS) < _MAX_NAMES:
            _HOSTS.add(host)
    return fields

"""The request rules of ``POST /ingest``, in one place for every way into it.

:class:`IngestRules` decides, from the method and headers alone, whether a request may send
its body (:meth:`IngestRules.head`: 405, 401, 400, 415, 413 or 411 in that order, as a JSON
:class:`~tiny.handlers.base.APIError`), then holds the body to the one limit, ``max_body``,
twice: while it streams in (:meth:`IngestRules.over_limit`) and when it is decompressed
(:meth:`IngestRules.decode`, :func:`gunzip`). The one way into /ingest (tiny.handlers.ingest)
calls the three. (Tornado's own body limit, ``max_body_size``, is ``max_body`` for a request to
/ingest, so that a chunk past it is refused at its size line, with this JSON 413
(tiny.connection); the other endpoints, which take no body, keep tiny.limits.MAX_OTHER_BODY.)
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from tornado.httputil import HTTPHeaders

from tiny.fasthead import Fields
from tiny.handlers.base import APIError, check_token
from tiny.limits import MAX_GZIP_MEMBERS, MAX_KEY
from tiny.protocol import framing_refusal

_MIN_FEED, _MAX_FEED = 64, 64 * 1024  # bytes given to zlib at once (see gunzip)
# The key a proxy gives a request that has none of its own (nginx/proxy.conf: $request_id, the
# same for every upstream it tries): a client's own Idempotency-Key headers pass through
# untouched, so that a doubled or empty one is refused the same way directly and via nginx.
PROXY_KEY_HEADER = "Proxy-Idempotency-Key"
NDJSON_TYPES = frozenset(
    {
        "application/x-ndjson",
        "application/ndjson",
        "application/jsonl",
        "application/x-jsonl",
        "application/jsonlines",
        "application/x-jsonlines",
        "application/json",
        "text/plain",
        "application/octet-stream",
        "application/x-www-form-urlencoded",  # curl --data-binary's default
    }
)
_GZIP = ("gzip", "x-gzip")
_KEY = re.compile(f"[!-~]{{1,{MAX_KEY}}}")  # a key: visible ASCII (a regex: a fifth of a loop's time per request)
_IDENTITY = ("identity", "")


@dataclass(frozen=True, slots=True)
class Head:
    """What the headers of an accepted /ingest request say about its body."""

    key: str | None  # its Idempotency-Key (or the proxy's), None without one
    gzip: bool  # Content-Encoding: gzip


class IngestRules:
    """The rules of /ingest for a server with body limit ``max_body`` and bearer ``token``
    (None: no token needed)."""

    def __init__(self, max_body: int, token: str | None) -> None:
        self.max_body = max_body
        self.token = token

    def head(self, method: str, headers: HTTPHeaders | Fields) -> Head:
        """The request's :class:`Head`, or the APIError that refuses it before its body is read:
        405 a method other than POST (with ``Allow: POST``), 401 a missing or wrong token, 400 a malformed key, 415 an
        encoding other than identity or gzip or a type that is not NDJSON, 413 a declared
        Content-Length over ``max_body`` (400 one that is not decimal digits, a Transfer-Encoding
        with it, or one other than chunked: tiny.protocol.framing_refusal), 411 neither a
        Content-Length nor chunked."""
        if method != "POST":
            raise APIError(405, "use POST to send records", {"Allow": "POST"})
        check_token(self.token, headers.get("Authorization", ""))
        key = idempotency_key(headers.get_list("Idempotency-Key")) or idempotency_key(
            headers.get_list(PROXY_KEY_HEADER), PROXY_KEY_HEADER
        )
        encoding = headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in _IDENTITY and encoding not in _GZIP:
            raise APIError(415, f"Content-Encoding {encoding!r} is not supported; use identity or gzip")
        media = headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        if media and media not in NDJSON_TYPES:
            raise APIError(415, f"Content-Type {media!r} is not NDJSON; send application/x-ndjson")
        # The framing Tornado refuses later with a bare 400, refused here first with the same
        # status, in JSON (tiny.protocol); a POST with no length at all is a 411.
        refused = framing_refusal(headers, self.max_body)
        if refused is not None:
            raise APIError(*refused)
        if "Content-Length" not in headers and "Transfer-Encoding" not in headers:
            raise APIError(411, "a POST to /ingest needs a Content-Length or a chunked body")
        return Head(key, encoding in _GZIP)

    def over_limit(self, received: int) -> APIError | None:
        """The 413 for a body of which ``received`` bytes came in so far, or None while within
        the limit (chunked bodies, and bodies whose length was not declared)."""
        if received > self.max_body:
            return APIError(413, f"body is larger than the limit of {self.max_body} bytes")
        return None

    def decode(self, body: bytes, head: Head) -> bytes:
        """The body as the codec reads it: decompressed when gzip, within ``max_body`` (413),
        or 400 when the gzip is corrupt or truncated."""
        return gunzip(body, self.max_body) if head.gzip else body


def idempotency_key(values: list[str], header: str = "Idempotency-Key") -> str | None:
    """The key the ``header`` lines of a request give (None without one): 1 to 255 visible
    ASCII characters, in double quotes or not (the IETF draft's structured-field string); 400
    for anything else, a header sent twice included."""
    if not values:
        return None
    if len(values) > 1:
        raise APIError(400, f"{header} was sent {len(values)} times; send one key")
    key = values[0].strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1]
    if _KEY.fullmatch(key) is None:
        raise APIError(400, f"{header} must be 1 to {MAX_KEY} visible ASCII characters")
    return key


def gunzip(body: bytes, limit: int) -> bytes:
    """Decompress a gzip body of one or more members; 413 past ``limit`` bytes or
    MAX_GZIP_MEMBERS members, 400 if corrupt or truncated. Linear in the body's size.

    zlib copies the input left over after a member's end (``unused_data``); fed the whole
    rest of the body, that copy made many small members quadratic. So the inflater is fed
    slices of about twice the previous member's size, and the position is tracked here.
    """
    out: list[bytes] = []
    size = members = pos = 0
    view = memoryview(body)
    feed = _MAX_FEED
    try:
        while pos < len(body):
            members += 1
            if members > MAX_GZIP_MEMBERS:
                raise APIError(413, f"gzip body has more than {MAX_GZIP_MEMBERS} members")
            inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            start = pos
            while not inflater.eof:
                data = view[pos : pos + feed]
                if not data:
                    raise APIError(400, "gzip body is truncated")
                # max_length bounds the memory a gzip bomb can take before it is refused
                chunk = inflater.decompress(data, limit - size + 1)
                size += len(chunk)
                if size > limit or inflater.unconsumed_tail:
                    raise APIError(413, f"decompressed body is larger than {limit} bytes")
                out.append(chunk)
                pos += len(data) - len(inflater.unused_data)
            feed = min(max(2 * (pos - start), _MIN_FEED), _MAX_FEED)
    except zlib.error as exc:
        raise APIError(400, f"gzip body is corrupt: {exc}") from None
    return b"".join(out)

"""The rejects file format (the file is tiny.layout.rejects_file: rejects/<UTC date received>.ndjson).

One JSON object per refused input line, so that rows written + lines here = lines sent::

    {"received": "2026-11-23T09:41:07.123456Z", "line": 3, "reason": "size: not an integer",
     "raw": "{\\"date\\": ...}"}

``raw`` is the line as sent, without its LF/CRLF. Where it is not UTF-8 the bad bytes are
escaped as ``\\xNN`` in ``raw`` and the exact bytes are also given as ``raw_base64``.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from datetime import datetime

import orjson


def render(rejects: Iterable[tuple[int, str, bytes]], received: datetime) -> bytes:
    """The rejects-file lines, LF-terminated, for one request's invalid lines."""
    stamp = received.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    out = []
    for line, reason, raw in rejects:
        entry: dict[str, object] = {"received": stamp, "line": line, "reason": reason}
        try:
            entry["raw"] = raw.decode("utf-8")
        except UnicodeDecodeError:
            entry["raw"] = raw.decode("utf-8", "backslashreplace")
            entry["raw_base64"] = base64.b64encode(raw).decode("ascii")
        out.append(orjson.dumps(entry))
    out.append(b"")
    return b"\n".join(out)

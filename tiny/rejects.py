"""The rejects file format (the file is tiny.layout.rejects_file: rejects/<UTC date received>.ndjson).

One JSON object per refused input line, so that rows written + lines here = lines sent::

    {"received": "2026-11-23T09:41:07.123456Z", "line": 3, "reason": "size: not an integer",
     "raw": "{\\"date\\": ...}"}

``raw`` is the line as sent, without its LF/CRLF. Where it is not UTF-8 the bad bytes are
escaped as ``\\xNN`` in ``raw`` and the exact bytes are also given as ``raw_base64``.

At most ``--max-rejects`` lines of one request are kept; the others are summarised by one
more object that gives their count and line range, so that the counts stay exact::

    {"received": "...", "line": 1001, "last_line": 500000, "omitted": 499000,
     "reason": "499000 more invalid lines (1001-500000) not kept: over --max-rejects"}
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from datetime import datetime

import orjson


def render(
    rejects: Iterable[tuple[int, str, bytes]], received: datetime, omitted: tuple[int, int, int] | None = None
) -> bytes:
    """The rejects-file lines, LF-terminated, for one request's invalid lines.

    ``omitted``: ``(count, first line, last line)`` of the invalid lines not kept, if any.
    """
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
    if omitted is not None:
        count, first, last = omitted
        reason = f"{count} more invalid lines ({first}-{last}) not kept: over --max-rejects"
        summary = {"received": stamp, "line": first, "last_line": last, "omitted": count, "reason": reason}
        out.append(orjson.dumps(summary))
    out.append(b"")
    return b"\n".join(out)

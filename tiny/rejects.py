"""The rejects file format (the file is tiny.layout.rejects_file: rejects/<UTC date received>.ndjson).

One JSON object per refused input line, so that rows written + lines here = lines sent::

    {"received": "2026-11-23T09:41:07.123456Z", "line": 3, "reason": "size: not an integer",
     "raw": "{\\"date\\": ...}"}

``raw`` is the line as sent, without its LF/CRLF. Where it is not UTF-8 the bad bytes are
escaped as ``\\xNN`` in ``raw`` and the exact bytes are also given as ``raw_base64``.

A line's first :data:`RAW_LINE` bytes are kept, and at most :data:`RAW_REQUEST` bytes of one
request's lines in all; a line cut short says its whole length in ``raw_bytes`` (so one
request writes at most a few MB here, however its lines escape: a control byte is 6 bytes of
JSON, a byte that is not UTF-8 about 6.3).

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

RAW_LINE = 4096  # bytes of one refused line kept (a CRAN record is about 170)
RAW_REQUEST = 1 << 20  # bytes of refused lines one request keeps in all


def render(
    rejects: Iterable[tuple[int, str, bytes]], received: datetime, omitted: tuple[int, int, int] | None = None
) -> bytes:
    """The rejects-file lines, LF-terminated, for one request's invalid lines.

    ``omitted``: ``(count, first line, last line)`` of the invalid lines not kept, if any.
    """
    stamp = received.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    out = []
    left = RAW_REQUEST
    for line, reason, whole in rejects:
        entry: dict[str, object] = {"received": stamp, "line": line, "reason": reason}
        raw = whole[: min(RAW_LINE, left)]
        left -= len(raw)
        if len(raw) < len(whole):
            raw = _whole_characters(raw)
        try:
            entry["raw"] = raw.decode("utf-8")
        except UnicodeDecodeError:
            entry["raw"] = raw.decode("utf-8", "backslashreplace")
            entry["raw_base64"] = base64.b64encode(raw).decode("ascii")
        if len(raw) < len(whole):
            entry["raw_bytes"] = len(whole)
        out.append(orjson.dumps(entry))
    if omitted is not None:
        count, first, last = omitted
        reason = f"{count} more invalid lines ({first}-{last}) not kept: over --max-rejects"
        summary = {"received": stamp, "line": first, "last_line": last, "omitted": count, "reason": reason}
        out.append(orjson.dumps(summary))
    out.append(b"")
    return b"\n".join(out)


def _whole_characters(cut: bytes) -> bytes:
    """``cut`` without the UTF-8 character its cut split, if any (a valid line cut short stays
    valid UTF-8)."""
    for back in range(1, min(4, len(cut)) + 1):
        byte = cut[-back]
        if byte < 0x80:
            return cut  # ASCII: nothing was split
        if byte >= 0xC0:  # the lead byte of the last character: is the character whole?
            needed = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return cut if back == needed else cut[:-back]
    return cut

"""One ip_id's rows of a day file, read in a pool process: its downloads, and the rows its ``detail`` chart draws.

Everything else the dashboard shows comes from the aggregate store (tiny.analytics.answers).
This runs in an analytics pool process (see :mod:`tiny.analytics.service`), never in a
worker serving HTTP, within the server's analytics CPU quota (tiny.analytics.cpu): the
``*_job`` functions are what the worker submits, and they return small, picklable results.

Only that ip_id's rows are read: ip_id is a day file's last column, a bare integer, so each
of its rows ends with ``,<ip_id>`` and its LF, which a byte search finds (memchr speed: about
10 ms for 10 MB); those lines alone are read, by the rule the aggregates count with
(tiny.cranlog.read_row: a line that is not a row for them is not one here either), and held
to the ip_id again. The pool process keeps the rows of its last ip_ids and file versions,
within its caches' budget (tiny.analytics.caches): queries of the same version share them.

Reading a file that is being appended to: a job reads exactly the first ``size`` bytes (the
stat its :class:`DayFile` came from) and ignores a last line without its LF (a write in
progress).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from typing import Any

from tiny.analytics import caches
from tiny.analytics.json_bytes import dumps
from tiny.analytics.names import whale_name
from tiny.cranlog import Row, read_row

_ROW_WEIGHT = 4  # a Row weighs about 4x its line


@dataclass(frozen=True)
class DayFile:
    """One version of a day file: what a job reads and what a cached result is keyed on."""

    date: str
    path: str
    size: int
    mtime_ns: int

    @property
    def version(self) -> tuple[int, int]:
        return (self.size, self.mtime_ns)


def read_complete_lines(path: str, size: int) -> bytes:
    """The first ``size`` bytes of ``path`` up to and including the last LF among them; a path
    that is not a regular file is refused (tiny.regular_files.NotARegularFile), never waited on."""
    from tiny.regular_files import open_regular

    fd = open_regular(path)
    try:
        chunks, read = [], 0
        while read < size and (chunk := os.pread(fd, size - read, read)):
            chunks.append(chunk)
            read += len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    return data[: data.rfind(b"\n") + 1]


def lines_of(data: bytes, ip_id: int, start: int = 0) -> bytes:
    """The lines of ``data[start:]`` (complete day-file lines from ``start``, a line's start)
    that end with ``,<ip_id>``: its rows."""
    needle = b",%d\n" % ip_id
    found = []
    at = data.find(needle, start)
    while at != -1:  # each step: one search forward and one back to the line's start
        end = at + len(needle)
        found.append(data[max(data.rfind(b"\n", 0, at) + 1, start) : end])
        at = data.find(needle, end)
    return b"".join(found)


def rows_of(day: DayFile, ip_id: int) -> list[Row]:
    """The rows of ``ip_id`` in this version of the day file, in file order (cached)."""
    kept = _rows_cache()
    key = (day.path, day.size, day.mtime_ns, ip_id)
    held = kept.get(key)
    if isinstance(held, list):
        return held
    data = read_complete_lines(day.path, day.size)
    mine = lines_of(data, ip_id, data.find(b"\n") + 1)  # after the header
    lines = mine.decode("utf-8", "replace").split("\n")[:-1]
    rows = [row for line in lines if (row := read_row(line)) is not None and row.ip_id == ip_id]
    kept.put(key, rows, len(mine) * _ROW_WEIGHT)
    return rows


def _rows_cache() -> caches.Cache[list[Row]]:
    """The rows of the ip_ids read last, by version of their day file."""
    return caches.process_budget().cache("rows of one ip_id")


def ranked(values: list[str]) -> list[tuple[str, int]]:
    """``(value, count)`` of each distinct value, most frequent first, ties alphabetical."""
    return sorted(Counter(values).items(), key=lambda item: (-item[1], item[0]))


def whale_downloads(rows: list[Row], date: str, ip_id: int, limit: int) -> dict[str, Any] | None:
    """One ip_id's downloads in time order (file order within a second), the first ``limit``."""
    if not rows:
        return None
    ordered = sorted(rows, key=lambda row: row.time)  # stable: file order within a second
    countries = ranked([row.country for row in rows if row.country is not None])
    return {
        "date": date,
        "ip_id": ip_id,
        "name": whale_name(date, ip_id),
        "country": countries[0][0] if countries else None,
        "total": len(rows),
        "bytes": sum(row.size for row in rows),
        "packages": len({row.package for row in rows}),
        "limit": limit,
        "truncated": len(rows) > limit,
        "downloads": [
            {"time": row.time, "package": row.package, "version": row.version, "size": row.size}
            for row in ordered[:limit]
        ],
    }


def whale_downloads_job(day: DayFile, ip_id: int, limit: int) -> bytes | None:
    """Pool job: one ip_id's downloads (see :func:`whale_downloads`) as JSON bytes, None if it has
    none. Serialised here: an answer of 100,000 downloads is megabytes the worker only sends."""
    result = whale_downloads(rows_of(day, ip_id), day.date, ip_id, limit)
    return None if result is None else dumps(result)

"""The dashboard's answers and charts from the live aggregate store (tiny.aggregates): no row is read.

Functions of an :class:`tiny.aggregates.Aggregates` store, run in the analytics pool after
the day was folded up to its committed size (tiny.live.fold_job). Each reads a
day's few aggregate rows through an index: the top N whales are an index range of
``ips_by_downloads``, their hours and countries N small lookups (the tests hold the results to
an independent count of the rows). The ``traffic``, ``whales`` and ``hourly`` charts are drawn from
:func:`day_aggregate`'s result in the same job (tiny.analytics.charts: milliseconds).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

from tiny import codec, layout
from tiny.aggregates import IP_OFFSET, Aggregates, join_bytes, open_regular
from tiny.analytics import charts
from tiny.analytics.names import whale_name

HOURS = 24
_TAIL = 256
_COUNTED = 4096  # day files whose line count a pool process remembers
# path -> (its inode, bytes counted, LFs in them, their last _TAIL bytes)
_counted: dict[str, tuple[int, int, int, bytes]] = {}
_AGGREGATES = 64  # day aggregates a pool process keeps, per version of the day in the store
_aggregates: OrderedDict[tuple[Any, ...], tuple[int, dict[str, Any]]] = OrderedDict()
UNFOLDED = frozenset(("days",))  # queries answered without folding first


def answer(store: Aggregates, query: tuple[Any, ...], sizes: dict[str, int]) -> bytes:
    """The dashboard's answer to ``query``, as the bytes to send: JSON (``null`` when the day
    has no file), or SVG for a chart. Queries:
    ``("days", dates)``, ``("summary" | "whales" | "hourly", date, top)``, ``("biggest", date)``
    (the top whale's ip_id) and ``("chart", view, date, top)`` (a view of
    tiny.analytics.charts drawn from :func:`day_aggregate`). ``sizes``: the committed sizes
    of the days' files."""
    from tiny.analytics.compute import dumps

    kind, *args = query
    if kind == "days":
        return dumps(days(store, list(args[0]), sizes))
    if kind == "chart":
        view, date, top = args
        aggregate = day_aggregate(store, date, top)
        return b"null" if aggregate is None else charts.render(view, date, aggregate)
    if kind == "biggest":
        aggregate = day_aggregate(store, args[0], 1)
        return dumps(None if aggregate is None else (aggregate["whales"] or [{"ip_id": None}])[0]["ip_id"])
    date, top = args
    aggregate = day_aggregate(store, date, top)
    if aggregate is None:
        return b"null"
    return dumps(_SHAPES[kind](date, top, aggregate))


def _summary(date: str, top: int, aggregate: dict[str, Any]) -> dict[str, Any]:
    whales = aggregate["whales"]
    hourly_whales = [sum(whale["hourly"][hour] for whale in whales) for hour in range(HOURS)]
    return {
        "date": date,
        "top": top,
        "downloads": aggregate["downloads"],
        "bytes": aggregate["bytes"],
        "downloaders": aggregate["downloaders"],
        "whale_downloads": sum(whale["downloads"] for whale in whales),
        "hourly": [
            {"hour": hour, "all": aggregate["hourly"][hour], "whales": hourly_whales[hour]} for hour in range(HOURS)
        ],
    }


def _whales(date: str, top: int, aggregate: dict[str, Any]) -> dict[str, Any]:
    fields = ("ip_id", "name", "country", "downloads", "bytes")
    return {"date": date, "top": top, "whales": [{k: w[k] for k in fields} for w in aggregate["whales"]]}


def _hourly(date: str, top: int, aggregate: dict[str, Any]) -> dict[str, Any]:
    fields = ("ip_id", "name", "country", "downloads", "hourly")
    return {"date": date, "top": top, "whales": [{k: w[k] for k in fields} for w in aggregate["whales"]]}


_SHAPES = {"summary": _summary, "whales": _whales, "hourly": _hourly}


def days(store: Aggregates, dates: list[str], sizes: dict[str, int]) -> list[dict[str, Any]]:
    """``{"date", "rows", "bytes"}`` of each of ``dates`` that has a file: its rows (complete
    lines after the header below its committed size) and its size now.

    The rows are counted from the file, not the aggregates: listing the days must not fold
    the day being written (a fold costs ~100x a count of its lines). The count is
    incremental: a file that grew since the last count in this process is counted from where
    that count stopped, if it is the same file (inode) and the bytes just before that point
    are still the same (a flush the sink cut back and rewrote differently, a file replaced,
    gets a full recount). A day file that is not a regular file is refused
    (tiny.aggregates.NotARegularFile), never opened for reading."""
    listed = []
    for day in dates:
        path = layout.day_path(store.data_dir, day)
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            continue
        listed.append({"date": day, "rows": count_rows(str(path), min(sizes.get(day, size), size)), "bytes": size})
    return listed


def count_rows(path: str, size: int) -> int:
    """Rows (complete lines after the header) among the first ``size`` bytes of a day file."""
    known = _counted.pop(path, None)
    start, lines, tail = 0, 0, b""
    fd = open_regular(path)
    try:
        inode = os.fstat(fd).st_ino
        if known is not None and known[0] == inode and known[1] <= size:
            if os.pread(fd, len(known[3]), known[1] - len(known[3])) == known[3]:
                start, lines, tail = known[1:]
        if codec.CODEC == "rust":  # pread and a vectorised count, the GIL released: 10x less CPU
            from tiny import _codec

            more, read, last = _codec.count_lines(fd, start, size, _TAIL)
            lines, end = lines + more, start + read
            tail = (tail + last)[-_TAIL:]
        else:
            end = start
            while end < size:
                chunk = os.pread(fd, min(size - end, 1 << 20), end)
                if not chunk:
                    break
                lines += chunk.count(b"\n")
                end += len(chunk)
                tail = (tail + chunk)[-_TAIL:]
    finally:
        os.close(fd)
    _counted[path] = (inode, end, lines, tail)
    while len(_counted) > _COUNTED:
        del _counted[next(iter(_counted))]
    return max(lines - 1, 0)


def day_aggregate(store: Aggregates, day: str, top: int) -> dict[str, Any] | None:
    """The day's totals, downloads per hour, distinct ip_ids and its ``top`` whales (most
    downloads first, ties by smaller ip_id; country: the most frequent non-missing one, ties
    alphabetical, None if it never had one); None when the day has no file.

    Kept per version of the day in the store (the store's generation, which a rebuild raises,
    and the file counted and how far, which every fold that changes the day's counts moves):
    one computation serves every ``top`` up to the one it was made for (the whales are a
    prefix), and the summary, whales, hourly and chart queries of a dashboard visit ask for
    the same one."""
    db = store.db
    own = not db.in_transaction
    if own:
        db.execute("BEGIN")  # one snapshot: a fold by another process between two reads is not half seen
    try:
        version = db.execute("SELECT inode, head, tail, consumed, rows FROM files WHERE day = ?", (day,)).fetchone()
        if version is None:
            return None
        key = (day, store.generation(), *version)
        cached = _aggregates.get(key)
        if cached is not None and cached[0] >= top:
            _aggregates.move_to_end(key)
            aggregate = cached[1]
        else:
            aggregate = _day_aggregate(store, day, top)
            _aggregates[key] = (top, aggregate)
            while len(_aggregates) > _AGGREGATES:
                _aggregates.popitem(last=False)
    finally:
        if own:
            db.execute("COMMIT")
    return {**aggregate, "whales": aggregate["whales"][:top]}


def _day_aggregate(store: Aggregates, day: str, top: int) -> dict[str, Any]:
    db = store.db
    totals = db.execute("SELECT rows, bytes_hi, bytes_lo FROM files WHERE day = ?", (day,)).fetchone()
    hourly = [0] * HOURS
    for hour, count in db.execute("SELECT hour, downloads FROM hours WHERE day = ?", (day,)):
        hourly[hour] = count
    (downloaders,) = db.execute("SELECT COUNT(*) FROM ips WHERE day = ?", (day,)).fetchone()
    ranked = db.execute(
        "SELECT ip, downloads, bytes_hi, bytes_lo FROM ips WHERE day = ? ORDER BY downloads DESC, ip LIMIT ?",
        (day, top),
    ).fetchall()
    whales = []
    for ip, count, hi, lo in ranked:
        whale_hours = [0] * HOURS
        for hour, n in db.execute("SELECT hour, downloads FROM ip_hours WHERE day = ? AND ip = ?", (day, ip)):
            whale_hours[hour] = n
        country = db.execute(
            "SELECT country FROM ip_countries WHERE day = ? AND ip = ? ORDER BY downloads DESC, country LIMIT 1",
            (day, ip),
        ).fetchone()
        ip_id = ip + IP_OFFSET
        whales.append(
            {
                "ip_id": ip_id,
                "name": whale_name(day, ip_id),
                "country": country[0] if country else None,
                "downloads": count,
                "bytes": join_bytes(hi, lo),
                "hourly": whale_hours,
            }
        )
    return {
        "downloads": totals[0],
        "bytes": join_bytes(totals[1], totals[2]),
        "downloaders": downloaders,
        "hourly": hourly,
        "whales": whales,
    }

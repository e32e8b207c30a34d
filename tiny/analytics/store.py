"""The dashboard's answers and charts from the live aggregate store (tiny.aggregates): no row is read.

Functions of an :class:`tiny.aggregates.Aggregates` store, run in the analytics pool after
the day was folded up to its committed size (tiny.live.fold_job). Each reads a
day's few aggregate rows through an index: the top N whales are an index range of
``ips_by_downloads``, their hours and countries N small lookups. The results have the shape
tiny.analytics.compute.aggregate_frame gives from the rows (the tests hold both to the same
independent count). Charts of the ``traffic``, ``whales`` and ``hourly`` views are drawn from
these results (tiny.analytics.charts) and kept in the pool process per version of the day's
aggregates (its file's inode and the bytes folded) and ``top``, at most _CHART_CACHE_BYTES.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

from tiny import layout
from tiny.aggregates import IP_OFFSET, Aggregates, join_bytes
from tiny.analytics.names import whale_name

HOURS = 24
_CHART_CACHE_BYTES = 16 * 1024**2
_charts: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()
_chart_bytes = 0


def answer(store: Aggregates, query: tuple[Any, ...]) -> bytes:
    """The dashboard's answer to ``query``, as the bytes to send: JSON (``null`` when the day
    has no file) or, for a chart, SVG (empty when the day has no file). Queries:
    ``("days", dates)``, ``("summary" | "whales" | "hourly", date, top)``, ``("biggest", date)``
    (the top whale's ip_id) and ``("chart", date, view, top)``."""
    from tiny.analytics.compute import dumps

    kind, *args = query
    if kind == "days":
        return dumps(days(store, list(args[0])))
    if kind == "chart":
        return chart(store, *args)
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


def chart(store: Aggregates, day: str, view: str, top: int) -> bytes:
    """The SVG of ``view`` (traffic, whales or hourly) of the day's top N; b"" without a file."""
    global _chart_bytes
    from tiny.analytics import charts

    key = (str(store.data_dir), day, day_state(store, day), view, top)
    svg = _charts.get(key)
    if svg is not None:
        _charts.move_to_end(key)
        return svg
    aggregate = day_aggregate(store, day, top)
    if aggregate is None:
        return b""
    svg = charts.render(view, day, aggregate)
    _charts[key] = svg
    _chart_bytes += len(svg)
    while _chart_bytes > _CHART_CACHE_BYTES:
        _, dropped = _charts.popitem(last=False)
        _chart_bytes -= len(dropped)
    return svg


def day_state(store: Aggregates, day: str) -> tuple[int, int] | None:
    """What names the day's aggregates now: (inode, bytes folded) of its file; None without one."""
    row = store.db.execute("SELECT inode, consumed FROM files WHERE day = ?", (day,)).fetchone()
    return None if row is None else (row[0], row[1])


def days(store: Aggregates, dates: list[str]) -> list[dict[str, Any]]:
    """``{"date", "rows", "bytes"}`` of each of ``dates`` that has a file: its rows (complete,
    committed lines) and its size now."""
    if not dates:
        return []
    found = dict(
        store.db.execute("SELECT day, rows FROM files WHERE day BETWEEN ? AND ?", (min(dates), max(dates))).fetchall()
    )
    listed = []
    for day in dates:
        try:
            size = os.stat(layout.day_path(store.data_dir, day)).st_size
        except FileNotFoundError:
            continue
        listed.append({"date": day, "rows": found.get(day, 0), "bytes": size})
    return listed


def day_aggregate(store: Aggregates, day: str, top: int) -> dict[str, Any] | None:
    """The day's totals, downloads per hour, distinct ip_ids and its ``top`` whales (most
    downloads first, ties by smaller ip_id; country: the most frequent non-missing one, ties
    alphabetical, None if it never had one); None when the day has no file."""
    db = store.db
    totals = db.execute("SELECT rows, bytes_hi, bytes_lo FROM files WHERE day = ?", (day,)).fetchone()
    if totals is None:
        return None
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

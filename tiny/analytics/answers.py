"""The dashboard's queries and their answers and charts from the live aggregate store (tiny.aggregates): no row is read.

One frozen dataclass per query (:class:`tiny.live.Query`): :class:`Days`, :class:`Summary`,
:class:`Whales`, :class:`Hourly`, :class:`Biggest` and :class:`Chart`, answered in the
analytics pool after the day was folded up to its committed size (tiny.live.fold_job). Each
reads a day's few aggregate rows (tiny.aggregate_sql) through an index: the top N whales are an index range of
``ips_by_downloads``, their hours and countries N small lookups (the tests hold the results to
an independent count of the rows). The ``traffic``, ``whales`` and ``hourly`` charts are drawn from
:func:`day_aggregate`'s :class:`DayAggregate` in the same job (tiny.analytics.charts: milliseconds).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from tiny import aggregate_sql as sql
from tiny import codec, layout, limits
from tiny.aggregate_sql import HOURS
from tiny.aggregates import Aggregates
from tiny.analytics import caches, charts
from tiny.analytics.caches import Cache
from tiny.analytics.json_bytes import dumps
from tiny.analytics.names import whale_name
from tiny.live import Query
from tiny.regular_files import open_regular

_TAIL = 256


@dataclass(frozen=True)
class Whale:
    """One of a day's top ip_ids: its name (tiny.analytics.names), its most frequent country
    (None if it never had one), its downloads and bytes, and its downloads in each UTC hour."""

    ip_id: int
    name: str
    country: str | None
    downloads: int
    bytes: int
    hourly: tuple[int, ...]


@dataclass(frozen=True)
class DayAggregate:
    """A day's totals, its downloads in each UTC hour, its distinct ip_ids, and its top whales
    (most downloads first, ties by smaller ip_id): what the summaries and the charts are made of."""

    downloads: int
    bytes: int
    downloaders: int
    hourly: tuple[int, ...]
    whales: tuple[Whale, ...]


# -- the queries --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Days(Query):
    """``{"date", "rows", "bytes"}`` of each of ``dates`` that has a file (:func:`days`):
    counted from the files, not folded first."""

    kind: ClassVar[str] = "days"
    folds: ClassVar[bool] = False
    dates: tuple[str, ...]

    @property
    def days(self) -> list[str]:
        return list(self.dates)

    def answer(self, store: Aggregates, sizes: dict[str, int]) -> bytes:
        return dumps(days(store, list(self.dates), sizes))


@dataclass(frozen=True)
class OfDay(Query):
    """A query of one day's aggregate: ``null`` when the day has no file."""

    date: str

    @property
    def days(self) -> list[str]:
        return [self.date]


@dataclass(frozen=True)
class Summary(OfDay):
    """The day's totals and its downloads per hour, of all and of the ``top`` whales."""

    kind: ClassVar[str] = "summary"
    top: int

    def answer(self, store: Aggregates, sizes: dict[str, int]) -> bytes:
        aggregate = day_aggregate(store, self.date, self.top)
        return b"null" if aggregate is None else dumps(_summary(self.date, self.top, aggregate))


@dataclass(frozen=True)
class Whales(OfDay):
    """The ``top`` whales: ip_id, name, country, downloads, bytes."""

    kind: ClassVar[str] = "whales"
    top: int

    def answer(self, store: Aggregates, sizes: dict[str, int]) -> bytes:
        aggregate = day_aggregate(store, self.date, self.top)
        return b"null" if aggregate is None else dumps(_whales(self.date, self.top, aggregate))


@dataclass(frozen=True)
class Hourly(OfDay):
    """The ``top`` whales with their downloads per hour."""

    kind: ClassVar[str] = "hourly"
    top: int

    def answer(self, store: Aggregates, sizes: dict[str, int]) -> bytes:
        aggregate = day_aggregate(store, self.date, self.top)
        return b"null" if aggregate is None else dumps(_hourly(self.date, self.top, aggregate))


@dataclass(frozen=True)
class Biggest(OfDay):
    """The ip_id of the day's biggest whale (``null`` when nobody downloaded anything)."""

    kind: ClassVar[str] = "biggest"

    def answer(self, store: Aggregates, sizes: dict[str, int]) -> bytes:
        aggregate = day_aggregate(store, self.date, 1)
        if aggregate is None:
            return b"null"
        return dumps(aggregate.whales[0].ip_id if aggregate.whales else None)


@dataclass(frozen=True)
class Chart(OfDay):
    """A ``view`` of tiny.analytics.charts drawn from the aggregate with its ``top`` whales (SVG)."""

    kind: ClassVar[str] = "chart"
    view: str
    top: int

    def answer(self, store: Aggregates, sizes: dict[str, int]) -> bytes:
        aggregate = day_aggregate(store, self.date, self.top)
        return b"null" if aggregate is None else charts.render(self.view, self.date, aggregate)


def _summary(date: str, top: int, aggregate: DayAggregate) -> dict[str, Any]:
    whales = aggregate.whales
    hourly_whales = [sum(whale.hourly[hour] for whale in whales) for hour in range(HOURS)]
    return {
        "date": date,
        "top": top,
        "downloads": aggregate.downloads,
        "bytes": aggregate.bytes,
        "downloaders": aggregate.downloaders,
        "whale_downloads": sum(whale.downloads for whale in whales),
        "hourly": [
            {"hour": hour, "all": aggregate.hourly[hour], "whales": hourly_whales[hour]} for hour in range(HOURS)
        ],
    }


def _whales(date: str, top: int, aggregate: DayAggregate) -> dict[str, Any]:
    listed = [
        {"ip_id": w.ip_id, "name": w.name, "country": w.country, "downloads": w.downloads, "bytes": w.bytes}
        for w in aggregate.whales
    ]
    return {"date": date, "top": top, "whales": listed}


def _hourly(date: str, top: int, aggregate: DayAggregate) -> dict[str, Any]:
    listed = [
        {"ip_id": w.ip_id, "name": w.name, "country": w.country, "downloads": w.downloads, "hourly": list(w.hourly)}
        for w in aggregate.whales
    ]
    return {"date": date, "top": top, "whales": listed}


def days(store: Aggregates, dates: list[str], sizes: dict[str, int]) -> list[dict[str, Any]]:
    """``{"date", "rows", "bytes"}`` of each of ``dates`` that has a file: its rows (complete
    lines after the header below its committed size) and its size now.

    The rows are counted from the file, not the aggregates: listing the days must not fold
    the day being written (a fold costs ~100x a count of its lines). The count is
    incremental: a file that grew since the last count in this process is counted from where
    that count stopped, if it is the same file (inode) and the bytes just before that point
    are still the same (a flush the sink cut back and rewrote differently, a file replaced,
    gets a full recount). A day file that is not a regular file is refused
    (tiny.regular_files.NotARegularFile), never opened for reading."""
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
    counted = _counted()
    known = counted.get(path)
    start, lines, tail = 0, 0, b""
    fd = open_regular(path)
    try:
        inode = os.fstat(fd).st_ino
        if isinstance(known, tuple) and known[0] == inode and known[1] <= size:
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
    counted.put(path, (inode, end, lines, tail), 64 + len(path) + len(tail))
    return max(lines - 1, 0)


def _counted() -> Cache[tuple[int, int, int, bytes]]:
    """path -> (its inode, bytes counted, LFs in them, their last _TAIL bytes)."""
    return caches.process_budget().cache("line counts of day files", limits.COUNTED_FILES_KEPT)


def _aggregates() -> Cache[tuple[int, DayAggregate]]:
    """(day, the store's generation, its version in the store) -> (the top it was made for, it)."""
    return caches.process_budget().cache("day aggregates", limits.DAY_AGGREGATES_KEPT)


def _weight(aggregate: DayAggregate) -> int:
    """About what ``aggregate`` weighs in memory: 64 bytes a number or string, and then some."""
    return 64 * (len(aggregate.hourly) + 8) + sum(64 * (len(w.hourly) + 8) + len(w.name) for w in aggregate.whales)


def day_aggregate(store: Aggregates, day: str, top: int) -> DayAggregate | None:
    """The day's :class:`DayAggregate` with its ``top`` whales; None when the day has no file.

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
        version = sql.day_version(db, day)
        if version is None:
            return None
        key = (day, store.generation(), *version)
        kept = _aggregates()
        cached = kept.get(key)
        if isinstance(cached, tuple) and cached[0] >= top:
            aggregate = cached[1]
        else:
            aggregate = _day_aggregate(store, day, top)
            kept.put(key, (top, aggregate), _weight(aggregate))
    finally:
        if own:
            db.execute("COMMIT")
    return replace(aggregate, whales=aggregate.whales[:top])


def _day_aggregate(store: Aggregates, day: str, top: int) -> DayAggregate:
    db = store.db
    downloads, nbytes = sql.day_totals(db, day)
    whales = tuple(
        Whale(
            ip_id,
            whale_name(day, ip_id),
            sql.ip_country(db, day, ip_id),
            count,
            size,
            tuple(sql.ip_hourly(db, day, ip_id)),
        )
        for ip_id, count, size in sql.top_ips(db, day, top)
    )
    return DayAggregate(downloads, nbytes, sql.downloaders(db, day), tuple(sql.day_hourly(db, day)), whales)

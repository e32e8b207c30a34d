"""The CRAN downloads API (r-hub/cranlogs.app's paths and JSON shapes), live from the aggregate store.

Three layers:

- :class:`Period` and :func:`parse_period`: ``last-day`` (the last day with data),
  ``last-week`` (it and the 6 before), ``last-month`` (it and the 29 before), ``YYYY-MM-DD``,
  or ``YYYY-MM-DD:YYYY-MM-DD``; ValueError with the reason for anything else.
- The answers, as pure functions of an :class:`tiny.aggregates.Aggregates` store
  (:func:`totals`, :func:`daily`, :func:`top`, :func:`trending`, :func:`package_total`), and
  :func:`downloads_job`, which the worker runs in its analytics pool: it folds the day files
  up to the sizes the worker noted under the flush lock, then answers. A query reads the days
  and packages it asks for, never the rows.
- :class:`Downloads`, the worker's side: it notes the committed sizes of the days a query
  needs (tiny.sink.DailyFileSink.committed_sizes), runs the job, and keeps the answer until
  the data dir changes. The version of the data is the journal's intent file, which every
  flush of every process rewrites (its modification time and a CRC of its bytes: two flushes
  within one tick of the kernel's coarse clock share a time, never their bytes, since a
  committed flush's sizes are never written again), and the data dir's own modification time
  (a day file added or removed): an open, a read and a stat, so an unchanged badge is
  answered from memory.

Days without data count 0. Ties in ``top`` and ``trending``: the package name, alphabetically.
"""

from __future__ import annotations

import os
import re
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from tiny import layout

if TYPE_CHECKING:
    from tiny.aggregates import Aggregates
    from tiny.analytics.service import Analytics
    from tiny.sink import DailyFileSink

PACKAGE = re.compile(r"[A-Za-z][A-Za-z0-9.]*\Z")  # CRAN's package names: letters, digits, dots
SUMMARIES = {"last-day": "day", "last-week": "week", "last-month": "month", "grand-total": ""}
MAX_TOP = 100
DEFAULT_TOP = 10
TRENDING_MIN = 1000  # downloads in the last week for a package to trend
TRENDING_WEEKS = 24
_CACHE_ANSWERS = 1024
Version = tuple[int, int, int]  # the intent file's mtime and CRC, the data dir's mtime


@dataclass(frozen=True)
class Period:
    start: date
    end: date

    def days(self) -> list[str]:
        count = (self.end - self.start).days + 1
        return [(self.start + timedelta(days=n)).isoformat() for n in range(count)]


def parse_period(text: str, last_day: date) -> Period:
    """The days ``text`` names, ``last_day`` being the last day with data; ValueError else."""
    spans = {"last-day": 0, "last-week": 6, "last-month": 29}
    if text in spans:
        return Period(last_day - timedelta(days=spans[text]), last_day)
    first, colon, second = text.partition(":")
    start = _date(first)
    end = _date(second) if colon else start
    if end < start:
        raise ValueError(f"the period {text!r} ends before it starts")
    if (end - start).days > 366 * 100:
        raise ValueError(f"the period {text!r} is longer than a century")
    return Period(start, end)


def _date(text: str) -> date:
    try:
        return date.fromisoformat(layout.parse_day(text))
    except ValueError:
        raise ValueError(
            f"not a period: {text!r} (last-day, last-week, last-month, YYYY-MM-DD, or two dates joined by ':')"
        ) from None


def parse_packages(text: str) -> list[str]:
    """``pkg1,pkg2``: CRAN package names; ValueError for anything else."""
    names = text.split(",")
    for name in names:
        if not PACKAGE.match(name):
            raise ValueError(f"not a package name: {name!r}")
    return names


# -- the answers, from the store (in the pool) ---------------------------------------------


def totals(store: Aggregates, period: Period, packages: list[str] | None) -> list[dict[str, Any]]:
    start, end = period.start.isoformat(), period.end.isoformat()
    span = {"start": start, "end": end}
    if packages is None:
        (count,) = store.db.execute(
            "SELECT COALESCE(SUM(downloads), 0) FROM packages WHERE day BETWEEN ? AND ?", (start, end)
        ).fetchone()
        return [{"downloads": count, **span}]
    return [{"downloads": package_sum(store, name, start, end), **span, "package": name} for name in packages]


def package_sum(store: Aggregates, package: str, start: str, end: str) -> int:
    (count,) = store.db.execute(
        "SELECT COALESCE(SUM(downloads), 0) FROM packages WHERE package = ? AND day BETWEEN ? AND ?",
        (package, start, end),
    ).fetchone()
    return int(count)


def daily(store: Aggregates, period: Period, packages: list[str] | None) -> list[dict[str, Any]]:
    start, end = period.start.isoformat(), period.end.isoformat()
    span = {"start": start, "end": end}

    def per_day(rows: list[tuple[str, int]]) -> list[dict[str, Any]]:
        found = dict(rows)
        return [{"day": day, "downloads": found.get(day, 0)} for day in period.days()]

    if packages is None:
        rows = store.db.execute(
            "SELECT day, SUM(downloads) FROM packages WHERE day BETWEEN ? AND ? GROUP BY day", (start, end)
        ).fetchall()
        return [{"downloads": per_day(rows), **span}]
    answer = []
    for name in packages:
        rows = store.db.execute(
            "SELECT day, downloads FROM packages WHERE package = ? AND day BETWEEN ? AND ?", (name, start, end)
        ).fetchall()
        answer.append({"downloads": per_day(rows), **span, "package": name})
    return answer


def top(store: Aggregates, period: Period, count: int) -> dict[str, Any]:
    start, end = period.start.isoformat(), period.end.isoformat()
    rows = store.db.execute(
        "SELECT package, SUM(downloads) AS n FROM packages WHERE day BETWEEN ? AND ? "
        "GROUP BY package ORDER BY n DESC, package LIMIT ?",
        (start, end, count),
    ).fetchall()
    # the counts as JSON strings, as the public service sends them (the R client reads strings)
    return {"start": start, "end": end, "downloads": [{"package": name, "downloads": str(n)} for name, n in rows]}


def trending(store: Aggregates, last_day: date) -> list[dict[str, str]]:
    """Packages downloaded at least TRENDING_MIN times in the week ending ``last_day`` whose
    count rose most against their average week over the TRENDING_WEEKS weeks before; the
    increase as the public service computes it: that week / the average week, in percent."""
    week_start = last_day - timedelta(days=6)
    before_start = week_start - timedelta(days=7 * TRENDING_WEEKS)
    rows = store.db.execute(
        "SELECT w.package, 100.0 * ? * w.n / b.n AS increase FROM "
        "(SELECT package, SUM(downloads) AS n FROM packages WHERE day BETWEEN ? AND ? GROUP BY package "
        " HAVING SUM(downloads) >= ?) AS w JOIN "
        "(SELECT package, SUM(downloads) AS n FROM packages WHERE day >= ? AND day < ? GROUP BY package) AS b "
        "ON w.package = b.package ORDER BY increase DESC, w.package LIMIT 100",
        (
            TRENDING_WEEKS,
            week_start.isoformat(),
            last_day.isoformat(),
            TRENDING_MIN,
            before_start.isoformat(),
            week_start.isoformat(),
        ),
    ).fetchall()
    return [{"package": name, "increase": f"{increase:.2f}"} for name, increase in rows]


_stores: dict[str, Aggregates] = {}


def downloads_job(data_dir: str, sizes: dict[str, int], within: tuple[str, str], query: tuple[Any, ...]) -> bytes:
    """In the analytics pool: fold ``sizes`` into the store of ``data_dir`` (the days of
    ``within`` that have no file forgotten), then answer ``query`` as JSON bytes (or, for a
    badge, the count as text)."""
    from tiny.aggregates import Aggregates

    store = _stores.get(data_dir)
    if store is None:
        store = _stores[data_dir] = Aggregates(Path(data_dir))
    store.fold(sizes, within)
    kind, *args = query
    if kind == "total":
        return orjson.dumps(totals(store, *args))
    if kind == "daily":
        return orjson.dumps(daily(store, *args))
    if kind == "top":
        return orjson.dumps(top(store, *args))
    if kind == "trending":
        return orjson.dumps(trending(store, *args))
    if kind == "count":  # one package's total over a period (a badge)
        package, start, end = args
        return str(package_sum(store, package, start, end)).encode()
    raise ValueError(f"unknown query {kind!r}")


# -- the worker's side -----------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    body: bytes
    version: Version

    @property
    def etag(self) -> str:
        return etag_of(self.body)


def etag_of(body: bytes) -> str:
    """A strong validator of ``body``: its CRC-32 and length."""
    return f'"{zlib.crc32(body):08x}-{len(body):x}"'


class Downloads:
    """The downloads API of one worker: see the module docstring."""

    def __init__(self, data_dir: Path, sink: DailyFileSink, analytics: Analytics) -> None:
        self.data_dir = Path(data_dir)
        self.sink = sink
        self.analytics = analytics
        self._answers: OrderedDict[tuple[Any, ...], Answer] = OrderedDict()
        self._days: tuple[int, int, list[str]] = (0, -1, [])  # (listed at, the data dir's mtime, its days)
        self._intent = str(layout.intent_path(self.data_dir))

    def version(self) -> Version:
        """The version of the data: the last flush of any process, and the data dir's listing."""
        try:
            fd = os.open(self._intent, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            intent = (0, 0)
        else:
            try:
                intent = (os.fstat(fd).st_mtime_ns, zlib.crc32(os.pread(fd, 1 << 16, 0)))
            finally:
                os.close(fd)
        return (*intent, os.stat(self.data_dir).st_mtime_ns)

    def days(self, version: Version) -> list[str]:
        """The days that have a day file, oldest first. Listed again when the data dir's
        modification time changed, or while it is less than a second older than the last
        listing: the kernel stamps it from a coarse clock, so a file added just after a
        listing may leave the time as it was."""
        listed_at, mtime, names = self._days
        if mtime != version[2] or listed_at - mtime < 1_000_000_000:
            listed_at = time.time_ns()
            names = sorted(day for entry in os.scandir(self.data_dir) if (day := layout.day_of(entry.name)))
            self._days = (listed_at, version[2], names)
        return names

    def last_day(self, version: Version) -> date:
        """The last day with data (today, UTC, when there is none)."""
        days = self.days(version)
        return date.fromisoformat(days[-1]) if days else datetime.now(UTC).date()

    async def answer(self, query: tuple[Any, ...], needed: list[str] | None) -> Answer:
        """The answer to ``query`` (see downloads_job), reading the days ``needed`` (None: all)."""
        version = self.version()
        cached = self._answers.get(query)
        if cached is not None and cached.version == version:
            self._answers.move_to_end(query)
            return cached
        existing = self.days(version)
        if needed is None:
            days, within = existing, ("0000-00-00", "9999-99-99")
        else:
            days, within = sorted(set(needed).intersection(existing)), (needed[0], needed[-1])
        sizes = await self.sink.committed_sizes(days)
        key = ("downloads", query, version)
        body = await self.analytics.call(key, downloads_job, str(self.data_dir), sizes, within, query)
        answer = Answer(bytes(body), version)
        self._answers[query] = answer
        self._answers.move_to_end(query)
        while len(self._answers) > _CACHE_ANSWERS:
            self._answers.popitem(last=False)
        return answer

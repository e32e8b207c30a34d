"""The CRAN downloads API (r-hub/cranlogs.app's paths and JSON shapes), answered from the aggregate store.

- :class:`Period` and :func:`parse_period`: the public service's periods: ``last-day`` (the
  last day with data), ``last-week`` (it and the 6 before), ``last-month`` (it and the 29
  before), in any case; ``YYYY-MM-DD``, ``YYYY-MM-DD:YYYY-MM-DD`` or ``YYYY-MM-DD:last-day``
  (what the R client sends when ``to`` is left at its default); ValueError with the reason
  for anything else.
- The answers, as pure functions of an :class:`tiny.aggregates.Aggregates` store
  (:func:`totals`, :func:`daily`, :func:`top`, :func:`monthly_totals`, :func:`trending`),
  reading it through tiny.aggregate_sql.
- The queries, one frozen dataclass per kind (:class:`tiny.live.Query`): :class:`Total`,
  :class:`Daily`, :class:`Top`, :class:`MonthlyTotals`, :class:`Trending` and :class:`Count`
  (a badge's), each with the days it reads and its answer, which tiny.live's pool job asks
  for once those days are folded up to their committed sizes. A query reads the days and
  packages it asks for, never the rows.

Days without data count 0. Ties in ``top``, ``monthly_totals`` and ``trending``: the package
name, alphabetically.
The totals of all packages (no package named) count every row, those without a package (a
bare ``NA``) too, as the public service does (its import sums the package field's counts, NA
included): the store's rows per day (``files.rows``), not the sum of its packages.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from tiny import aggregate_sql as sql
from tiny import layout, limits
from tiny.limits import TRENDING_MIN, TRENDING_WEEKS
from tiny.live import Query

if TYPE_CHECKING:
    from tiny.aggregates import Aggregates

PACKAGE = re.compile(r"[A-Za-z][A-Za-z0-9.]*\Z")  # CRAN's package names: letters, digits, dots
SUMMARIES = {"last-day": "day", "last-week": "week", "last-month": "month", "grand-total": ""}
SPANS = {"last-day": 0, "last-week": 6, "last-month": 29}  # the days before the last day with data


@dataclass(frozen=True)
class Period:
    start: date
    end: date

    def days(self) -> list[str]:
        count = (self.end - self.start).days + 1
        return [(self.start + timedelta(days=n)).isoformat() for n in range(count)]

    def span(self) -> tuple[str, str]:
        """Its first and last day, as ISO dates."""
        return self.start.isoformat(), self.end.isoformat()


def parse_period(text: str, last_day: date) -> Period:
    """The days ``text`` names, ``last_day`` being the last day with data; ValueError else."""
    keyword = keyword_of(text)
    if keyword in SPANS:
        return Period(days_before(last_day, SPANS[keyword]), last_day)
    first, colon, second = text.partition(":")
    start = _date(first)
    end = (last_day if keyword_of(second) == "last-day" else _date(second)) if colon else start
    if end < start:
        raise ValueError(f"the period {text!r} ends before it starts (last-day is {last_day}, the last day with data)")
    if (end - start).days > 366 * 100:
        raise ValueError(f"the period {text!r} is longer than a century")
    return Period(start, end)


def days_before(day: date, count: int) -> date:
    """``count`` days before ``day``, or the first day there is (a record dated 0001-01-05 makes
    it the last day with data: a week before it is no date)."""
    return day - timedelta(days=count) if day.toordinal() > count else date.min


def keyword_of(text: str) -> str:
    """``text`` in lower case when it is ASCII (the public service matches its keywords in any
    ASCII case); else ``text``, which no keyword equals."""
    return text.lower() if text.isascii() else text


def _date(text: str) -> date:
    try:
        return date.fromisoformat(layout.parse_day(text))
    except ValueError:
        raise ValueError(
            f"not a period: {text!r} (last-day, last-week, last-month, YYYY-MM-DD, "
            "or YYYY-MM-DD joined by ':' to YYYY-MM-DD or last-day)"
        ) from None


def parse_packages(text: str) -> list[str]:
    """``pkg1,pkg2``: CRAN package names; ValueError for anything else."""
    names = text.split(",")
    for name in names:
        check_name_length(name)
        if not PACKAGE.match(name):
            raise ValueError(f"not a package name: {name!r}")
    return names


def check_name_length(name: str) -> None:
    """ValueError for a package name longer than CRAN_MAX_NAME characters: none is, and each is
    kept in the key of an answer kept in memory (a million-character name would be a megabyte)."""
    if len(name) > limits.CRAN_MAX_NAME:
        raise ValueError(f"a package name of {len(name):,} characters; at most {limits.CRAN_MAX_NAME}")


# -- the answers, from the store (in the pool) ---------------------------------------------


def totals(store: Aggregates, period: Period, packages: Sequence[str] | None) -> list[dict[str, Any]]:
    start, end = period.start.isoformat(), period.end.isoformat()
    span = {"start": start, "end": end}
    if packages is None:
        return [{"downloads": sql.rows_between(store.db, start, end), **span}]
    return [{"downloads": sql.package_sum(store.db, name, start, end), **span, "package": name} for name in packages]


def daily(store: Aggregates, period: Period, packages: Sequence[str] | None) -> list[dict[str, Any]]:
    start, end = period.start.isoformat(), period.end.isoformat()
    span = {"start": start, "end": end}

    def per_day(rows: list[tuple[str, int]]) -> list[dict[str, Any]]:
        found = dict(rows)
        return [{"day": day, "downloads": found.get(day, 0)} for day in period.days()]

    if packages is None:
        return [{"downloads": per_day(sql.rows_per_day(store.db, start, end)), **span}]
    return [
        {"downloads": per_day(sql.package_per_day(store.db, name, start, end)), **span, "package": name}
        for name in packages
    ]


def top(store: Aggregates, period: Period, count: int) -> dict[str, Any]:
    """The ``count`` most downloaded packages, in the public service's shape: start and end as
    its database driver writes a date (midnight UTC, ``2014-05-04T00:00:00.000Z``), the counts
    as JSON strings (the R client reads strings)."""
    rows = _ranked(store, period, count)
    start, end = (f"{day.isoformat()}T00:00:00.000Z" for day in (period.start, period.end))
    return {"start": start, "end": end, "downloads": [{"package": name, "downloads": str(n)} for name, n in rows]}


def monthly_totals(store: Aggregates, period: Period) -> list[dict[str, str]]:
    """Every package downloaded in ``period``, most first: ``[{"package", "count"}]``, the
    counts as JSON strings, as the public service's ``/downloads/monthly-totals``."""
    return [{"package": name, "count": str(n)} for name, n in _ranked(store, period, -1)]


def _ranked(store: Aggregates, period: Period, limit: int) -> list[tuple[str, int]]:
    """(package, downloads in ``period``), most first, ties by name; at most ``limit`` (-1: all)."""
    return sql.ranked_packages(store.db, period.start.isoformat(), period.end.isoformat(), limit)


def trending_period(last_day: date) -> Period:
    """The days /trending reads: the week ending ``last_day`` and the TRENDING_WEEKS weeks before."""
    return Period(days_before(last_day, 6 + 7 * TRENDING_WEEKS), last_day)


def trending(store: Aggregates, last_day: date) -> list[dict[str, str]]:
    """Packages downloaded at least TRENDING_MIN times in the week ending ``last_day`` whose
    count rose most against their average week over the TRENDING_WEEKS weeks before; the
    increase as the public service computes it: that week / the average week, in percent."""
    week_start = days_before(last_day, 6)
    before_start = days_before(week_start, 7 * TRENDING_WEEKS)
    week = (week_start.isoformat(), last_day.isoformat())
    before = (before_start.isoformat(), week_start.isoformat())
    rows = sql.rising_packages(store.db, week, before, TRENDING_WEEKS, TRENDING_MIN)
    return [{"package": name, "increase": f"{increase:.2f}"} for name, increase in rows]


# -- the queries: one frozen dataclass per kind (tiny.live.Query) -------------------------------


@dataclass(frozen=True)
class _OfPeriod(Query):
    period: Period

    @property
    def days(self) -> list[str]:
        return self.period.days()

    @property
    def span(self) -> tuple[str, str]:
        return self.period.span()


@dataclass(frozen=True)
class Total(_OfPeriod):
    """``/downloads/total``: the downloads of each of ``packages`` (None: of all) in the period."""

    kind: ClassVar[str] = "total"
    packages: tuple[str, ...] | None

    def answer(self, store: Aggregates, sizes: dict[str, int]) -> bytes:
        return orjson.dumps(totals(store, self.period, self.packages))


@dataclass(frozen=True)
class Daily(_OfPeriod):
    """``/downloads/daily``: the downloads of each of ``packages`` (None: of all) on each day."""

    kind: ClassVar[str] = "daily"
    packages: tuple[str, ...] | None

    def answer(self, store: Aggregates, sizes: dict[str, int]) -> bytes:
        return orjson.dumps(daily(store, self.period, self.packages))


@dataclass(frozen=True)
class Top(_OfPeriod):
    """``/top``: the ``count`` most downloaded packages of the period."""

    kind: ClassVar[str] = "top"
    count: int

    def answer(self, store: Aggregates, sizes: dict[str, int]) -> bytes:
        return orjson.dumps(top(store, self.period, self.count))


@dataclass(frozen=True)
class MonthlyTotals(_OfPeriod):
    """``/downloads/monthly-totals``: every package of the period, most downloaded first."""

    kind: ClassVar[str] = "monthly-totals"

    def answer(self, store: Aggregates, sizes: dict[str, int]) -> bytes:
        return orjson.dumps(monthly_totals(store, self.period))


@dataclass(frozen=True)
class Trending(Query):
    """``/trending``: the packages whose downloads rose most in the week ending ``last_day``."""

    kind: ClassVar[str] = "trending"
    last_day: date

    @property
    def days(self) -> list[str]:
        return trending_period(self.last_day).days()

    @property
    def span(self) -> tuple[str, str]:
        return trending_period(self.last_day).span()

    def answer(self, store: Aggregates, sizes: dict[str, int]) -> bytes:
        return orjson.dumps(trending(store, self.last_day))


@dataclass(frozen=True)
class Count(Query):
    """A badge's count: the downloads of ``package`` in ``period`` (None: every day), as text."""

    kind: ClassVar[str] = "count"
    package: str
    period: Period | None

    @property
    def days(self) -> list[str] | None:
        return None if self.period is None else self.period.days()

    @property
    def span(self) -> tuple[str, str] | None:
        return None if self.period is None else self.period.span()

    def answer(self, store: Aggregates, sizes: dict[str, int]) -> bytes:
        start, end = ("0001-01-01", "9999-12-31") if self.period is None else self.period.span()
        return str(sql.package_sum(store.db, self.package, start, end)).encode()

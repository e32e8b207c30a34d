"""Answers from the live aggregates (tiny.aggregates): the typed query, the worker's side and the pool job.

Both the downloads API (tiny.cran_api) and the dashboard's API and charts
(tiny.analytics.answers) answer this way:

- :class:`Query`: what each of them asks, one frozen dataclass per kind, with the days it
  reads and how it is answered; the key of its answer here and of its job in the pool.
- :class:`Live`, one per worker: it notes the committed sizes of the days a query needs
  (tiny.sink.DailyFileSink.committed_sizes, under the data dir's flush lock), runs
  :func:`fold_job` in the worker's analytics pool, and keeps the answer until the files it
  reads change. A query that names at most STAT_DAYS days is versioned by their files'
  (inode, size, mtime_ns): its answer is kept while other days are written, and is kept
  only when no bytes were in flight in those files (each size was the committed size). A
  file cut back and written again to the same size within one tick of the kernel's coarse
  clock would go unseen: only a failed flush's recovery cuts a file, and the next flush
  changes it again. A query over all days or longer spans is versioned by the journal's
  intent file, which every flush of every process rewrites (its modification time and a CRC
  of its bytes: two flushes within one tick share a time, never their bytes, since a
  committed flush's sizes are never written again), and the data dir's own modification
  time (a day file added or removed): an open, a read and a stat, so an unchanged answer
  comes from memory. Either way an answer is also kept under the store's generation it was
  read from (tiny.aggregate_generation.read_generation), and served only while the store publishes that
  generation: ``tiny-admin rebuild-aggregates``, or a store deleted and made again, reaches
  every kept answer at the next query (one more small read).
- :func:`fold_job`, in the pool: fold the days up to those sizes (read your writes: an answer
  given after a POST's 200 counts its rows), then answer from the store. A query that cannot
  be brought up to date within FOLD_SECONDS (tiny.limits) of its arrival (rows arrive in that
  day faster than the analytics CPU quota counts them, or its job waited its turn in the pool) stops
  there, keeping what it counted, and gets :class:`tiny.aggregate_errors.Behind`: a 503 that says
  what is left, read at that moment. A pool that has not answered LATE_SECONDS after that (its
  process still starting, or busy with the queries ahead of this one) gets the query a
  :class:`tiny.analytics.service.Busy` from the worker instead. The store's errors reach the query as
  :class:`tiny.aggregate_errors.Unavailable`, saying what they are (a full disk, an I/O error, a
  day file that is not a regular file...).
"""

from __future__ import annotations

import abc
import asyncio
import bisect
import itertools
import os
import pickle
import sqlite3
import time
import zlib
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from tiny import layout, limits
from tiny.aggregate_generation import read_generation

if TYPE_CHECKING:
    from tiny.aggregates import Aggregates
    from tiny.analytics.caches import Cache
    from tiny.analytics.service import Analytics
    from tiny.sink import DailyFileSink

# The intent file's mtime and CRC and the data dir's mtime; or (inode, size, mtime) of each named day.
Version = tuple[int, ...]
_ALL_DAYS = ("0000-00-00", "9999-99-99")

_stores: dict[str, Aggregates] = {}  # in a pool process: the store of each data dir


class Query(abc.ABC):
    """A question to the live aggregates: a frozen dataclass per kind (tiny.cran_api, the CRAN
    downloads API's; tiny.analytics.answers, the dashboard's), its fields the arguments. It says
    which days it reads and how it is answered; being frozen, it is hashable, the key of its
    answer here and of its job in the pool, and picklable, sent to the pool as it is."""

    kind: ClassVar[str]  # what it is, in messages ("the top query of 30 day(s)")
    folds: ClassVar[bool] = True  # False: answered without folding its days first (it counts lines itself)

    @property
    @abc.abstractmethod
    def days(self) -> list[str] | None:
        """The days it reads, oldest first (None: all); a day of their span without a file is
        forgotten by the store."""

    @property
    def span(self) -> tuple[str, str] | None:
        """Its first and last day when it reads every day between them (a period: a century's
        36,525 days are then never listed on the event loop), else None (:attr:`days` says)."""
        return None

    @abc.abstractmethod
    def answer(self, store: Aggregates, sizes: dict[str, int]) -> bytes:
        """The answer, from ``store`` folded up to ``sizes`` (the days' committed sizes), as the
        bytes to send."""


def fold_job(
    data_dir: str,
    sizes: dict[str, int],
    within: tuple[str, str],
    query: Query,
    seen: int,
    deadline: float,
) -> tuple[int, bytes]:
    """In the analytics pool: fold ``sizes`` into the store of ``data_dir`` (the days of
    ``within`` that have no file are forgotten) until ``deadline`` (time.monotonic(): one
    clock for every process of the machine), then answer ``query`` (:meth:`Query.answer`), as
    bytes, with the store's generation it was read from (read before the answer: the answer is
    of that generation or a newer one). ``seen``: the generation the worker read from the
    store's file; when it is not the store's, the file is written again if it says another."""
    from tiny.aggregate_errors import store_error
    from tiny.aggregates import Aggregates

    store = _stores.get(data_dir)
    if store is None:
        store = _stores[data_dir] = Aggregates(Path(data_dir))
    if not query.folds:  # counts lines itself: no fold of a day being written
        return seen, query.answer(store, sizes)
    store.fold(sizes, within, deadline)
    try:
        generation = store.generation()
        body = query.answer(store, sizes)
    except sqlite3.Error as exc:
        raise store_error(exc) from None
    if generation != seen:
        store.publish_generation()
    return generation, body


def warm_job() -> None:
    """Pool job run once at a worker's start (tiny.analytics.service.Analytics.start): import
    what fold_job needs, so the first query does not wait for it."""
    from tiny import cran_api  # noqa: F401
    from tiny.aggregates import Aggregates  # noqa: F401
    from tiny.analytics import answers  # noqa: F401  (and the charts it draws)


@dataclass(frozen=True)
class Answer:
    body: bytes
    version: Version  # the store's generation it was read from, then the Version of the files it read

    @property
    def etag(self) -> str:
        return etag_of(self.body)


def etag_of(body: bytes) -> str:
    """A strong validator of ``body``: its CRC-32 and length."""
    return f'"{zlib.crc32(body):08x}-{len(body):x}"'


class Live:
    """The answers from the aggregates, for one worker: see the module docstring."""

    def __init__(
        self, data_dir: Path, sink: DailyFileSink, analytics: Analytics, fold_seconds: float = limits.FOLD_SECONDS
    ) -> None:
        self.data_dir = Path(data_dir)
        self.fold_seconds = fold_seconds  # a query is answered within this long or gets Behind
        self.sink = sink
        self.analytics = analytics
        self._answers: Cache[Answer] = analytics.budget.cache("answers from the aggregates", limits.ANSWERS_KEPT)
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
        try:
            listing = os.stat(self.data_dir).st_mtime_ns
        except FileNotFoundError:
            listing = 0
        return (*intent, listing)

    def days(self, version: Version) -> list[str]:
        """The days that have a day file, oldest first. Listed again when the data dir's
        modification time changed, or while it is less than a second older than the last
        listing: the kernel stamps it from a coarse clock, so a file added just after a
        listing may leave the time as it was."""
        listed_at, mtime, names = self._days
        if mtime != version[2] or listed_at - mtime < 1_000_000_000:
            listed_at = time.time_ns()
            try:
                with os.scandir(self.data_dir) as entries:
                    names = sorted(day for entry in entries if (day := layout.day_of(entry.name)))
            except FileNotFoundError:
                names = []
            self._days = (listed_at, version[2], names)
        return names

    def last_day(self, version: Version) -> date:
        """The last day with data up to tomorrow (UTC: a day of clock skew), or today when there
        is none: a record dated years ahead (a client's 9999-12-31) is stored, but does not
        make every ``last-day``, badge and cranlogs query count that empty future day."""
        today = datetime.now(UTC).date()
        days = self.days(version)
        before = bisect.bisect_right(days, (today + timedelta(days=1)).isoformat())
        return date.fromisoformat(days[before - 1]) if before else today

    def _stats(self, days: set[str]) -> dict[str, tuple[int, int, int]]:
        """(inode, size, mtime_ns) of each of the days' files, oldest day first; (-1, -1, -1)
        for one without."""
        stats = {}
        for day in sorted(days):
            try:
                stat = os.stat(layout.day_path(self.data_dir, day))
            except FileNotFoundError:
                stats[day] = (-1, -1, -1)
            else:
                stats[day] = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        return stats

    async def answer(self, query: Query) -> Answer:
        """The answer to ``query`` (see fold_job), reading its days."""
        deadline = time.monotonic() + self.fold_seconds
        version = self.version()
        generation = read_generation(self.data_dir)
        existing = self.days(version)
        span = query.span
        if span is not None:  # the files within it found in the sorted list: its days never listed
            days = existing[bisect.bisect_left(existing, span[0]) : bisect.bisect_right(existing, span[1])]
            within = span
            length = (date.fromisoformat(span[1]) - date.fromisoformat(span[0])).days + 1
            needed = query.days if length <= limits.STAT_DAYS else None
        else:
            needed = query.days
            if needed is None:
                days, within = existing, _ALL_DAYS
            elif needed:
                days, within = sorted(set(needed).intersection(existing)), (min(needed), max(needed))
            else:
                days, within = [], ("", "")
        stats = {}
        if needed is not None and len(needed) <= limits.STAT_DAYS:
            # Versioned by the files it reads: its answer stays while other days are written.
            stats = self._stats(set(needed))
            version = tuple(itertools.chain.from_iterable(stats.values()))
        cached = self._answers.get(query)
        if isinstance(cached, Answer) and cached.version == (generation, *version):
            return cached
        sizes = await self.sink.committed_sizes(days)
        key = (query, version)
        job = (str(self.data_dir), sizes, within, query, generation, deadline)
        what = f"the {query.kind} query of {len(days)} day(s)"
        late = asyncio.timeout(max(0.0, deadline + limits.LATE_SECONDS - time.monotonic()))
        try:
            async with late:
                read_from, body = await self.analytics.call(key, fold_job, *job, what=what)
        except TimeoutError:  # (the job goes on: a query asking the same meanwhile waits for it)
            if not late.expired():
                raise
            from tiny.analytics.service import Busy

            raise Busy(
                f"the analytics process has not answered within {self.fold_seconds + limits.LATE_SECONDS:.0f} s "
                "(still counting new rows for the queries ahead of this one)"
            ) from None
        answer = Answer(bytes(body), (read_from, *version))
        if any(sizes.get(day, -1) != size for day, (inode, size, _) in stats.items() if inode != -1):
            return answer  # bytes were in flight: this answer does not count all these files hold
        # Charged what it holds: the answer, and the query it is kept under (its package names).
        self._answers.put(query, answer, len(answer.body) + len(pickle.dumps(query)))
        return answer

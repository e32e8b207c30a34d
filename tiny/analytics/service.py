"""The worker side of the analytics: one :class:`Analytics` per worker process, which owns its pool.

Queries come in from the ``/api`` handlers (:mod:`tiny.handlers.analytics`); the parsing,
aggregation and chart drawing run in a ``ProcessPoolExecutor`` of ``--analytics-processes``
processes started with "spawn" (nothing of the worker's event loop, sockets or locks is
inherited), created on the first query. The worker only stats files and awaits small results
(dicts, lists, SVG bytes), so a query never blocks the event loop that serves ``/ingest``.
Pool processes run at the lowest CPU priority (``--analytics-nice``, default SCHED_IDLE) with
polars on ``--analytics-threads`` threads, so the ingest workers always win the CPU; each one
exits when its worker process is gone. At most ``--analytics-max-queued`` distinct
computations wait: past that a query is refused (:class:`Busy`, a 503) rather than queued
without bound. :meth:`Analytics.close` stops the pool.

Caching. A day file only grows (the sink appends; a failed flush may cut it back), so
``(path, size, mtime_ns)`` names one version of it. The worker keeps the results computed for
the current version of each file in one LRU bounded in bytes (``--analytics-cache-bytes``;
a result is counted by the size of its JSON or SVG); a new version replaces them. Big answers
(one whale's downloads, charts) come from the pool already serialised, so the worker only
sends bytes. Concurrent identical queries share one computation.

Listing the days (``/api/days``) is paginated; the names come from one directory scan on a
thread, kept until the directory changes, and only the page's files are stat'ed.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import gc
import importlib.util
import logging
import multiprocessing
import os
import weakref
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiny import layout, limits
from tiny.analytics import charts, compute
from tiny.analytics.compute import HOURS, DayFile
from tiny.config import Config

log = logging.getLogger("tiny.analytics")

DEFAULT_DAYS_PAGE = 100
MAX_DAYS_PAGE = 1000
_STOP_SECONDS = 2.0  # how long close() waits for the pool processes to exit
_MISSING = object()


class DayNotFound(LookupError):
    """No day file for the date (answered 404)."""


class WhaleNotFound(LookupError):
    """The ip_id downloaded nothing on that day (answered 404)."""


class Missing(RuntimeError):
    """polars or matplotlib is not installed (the ingest-only image): answered 501."""


class Busy(RuntimeError):
    """Too many computations queued in this worker, the pool process died, or it is closed (503)."""


def stat_day(data_dir: Path, date: str) -> DayFile:
    """The current version of ``data_dir/<date>.csv``; DayNotFound if there is none."""
    path = layout.day_path(data_dir, date)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise DayNotFound(date) from None
    return DayFile(date, str(path), st.st_size, st.st_mtime_ns)


def day_names(data_dir: Path) -> list[str]:
    """The dates of every day file in ``data_dir``, oldest first (one directory scan)."""
    try:
        with os.scandir(data_dir) as entries:
            return sorted(date for entry in entries if (date := layout.day_of(entry.name)))
    except FileNotFoundError:
        return []


def stat_days(data_dir: Path, dates: list[str]) -> list[DayFile]:
    """The current version of each of ``dates``' day files (those still there)."""
    days = []
    for date in dates:
        try:
            days.append(stat_day(data_dir, date))
        except DayNotFound:
            continue
    return days


@dataclass(frozen=True)
class DaysPage:
    """One page of ``/api/days``: its days with their row counts, and the cursor of the next."""

    days: list[dict[str, Any]]
    next: str | None


class _Cache:
    """Results per (day file, query), for the file's current version, LRU, at most ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bytes = 0
        self._entries: OrderedDict[tuple[str, tuple[Any, ...]], tuple[tuple[int, int], Any, int]] = OrderedDict()

    def get(self, day: DayFile, query: tuple[Any, ...]) -> Any:
        key = (day.path, query)
        entry = self._entries.get(key)
        if entry is None or entry[0] != day.version:
            return _MISSING
        self._entries.move_to_end(key)
        return entry[1]

    def put(self, day: DayFile, query: tuple[Any, ...], result: Any, size: int) -> None:
        key = (day.path, query)
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old[2]
        if size > self.limit:
            return  # bigger than the whole cache: computed again when asked again
        self._entries[key] = (day.version, result, size)
        self.bytes += size
        while self.bytes > self.limit:
            _, (_, _, dropped) = self._entries.popitem(last=False)
            self.bytes -= dropped


def _size(result: Any) -> int:
    """What a cached result weighs: its bytes, or its JSON's (a row count: a few bytes)."""
    if isinstance(result, bytes):
        return len(result) + 64
    if isinstance(result, int) or result is None:
        return 64
    return len(compute.dumps(result)) * 4  # Python objects weigh about 4x their JSON


class Analytics:
    """The analytics of one worker process: queries in, small results out, cached per day file.

    Every query method stats the day file (DayNotFound if absent), answers from the cache
    when that version was computed already, and otherwise awaits the pool, never blocking
    the event loop. Busy when ``max_queued`` distinct computations are queued already, or
    after :meth:`close`.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        processes: int = 1,
        threads: int = 1,
        nice: str = "idle",
        max_queued: int = limits.ANALYTICS_MAX_QUEUED,
        cache_bytes: int = limits.ANALYTICS_CACHE_BYTES,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.processes = processes
        self.threads = threads
        self.nice = nice
        self.max_queued = max_queued
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._closed = False
        self._cache = _Cache(cache_bytes)
        self._pending: dict[tuple[Any, ...], asyncio.Future[Any]] = {}
        self._names: tuple[int, list[str]] = (-1, [])  # (data dir mtime_ns, its day files' dates)
        # Without them (`pip install .` without the analytics extra, the ingest image), every
        # query but the day list is Missing: answered in the JSON shape, not a 500 from the pool.
        self.installed = all(importlib.util.find_spec(name) for name in ("polars", "matplotlib"))

    @classmethod
    def from_config(cls, config: Config) -> Analytics:
        """The analytics of ``config.data_dir`` with the ``--analytics-*`` settings."""
        return cls(
            config.data_dir,
            processes=config.analytics_processes,
            threads=config.analytics_threads,
            nice=config.analytics_nice,
            max_queued=config.analytics_max_queued,
            cache_bytes=config.analytics_cache_bytes,
        )

    async def days(self, after: str = "", limit: int = DEFAULT_DAYS_PAGE) -> DaysPage:
        """The day files dated after ``after`` (all when empty), oldest first, ``limit`` of them:
        ``{"date", "rows", "bytes"}`` each, and the date to ask ``after`` for the next page.

        The directory is scanned on a thread, and again only when its mtime changed; rows known
        for a file's current version come from the cache, the others are counted in one pool
        job (however many days the page holds).
        """
        loop = asyncio.get_running_loop()
        names = await self._day_names(loop)
        start = bisect.bisect_right(names, after) if after else 0
        page = names[start : start + limit]
        days = await loop.run_in_executor(None, stat_days, self.data_dir, page)
        rows = {day.path: self._known_rows(day) for day in days}
        missing = tuple(day for day in days if rows[day.path] is None)
        if missing:

            def store(counts: list[int]) -> None:
                for day, count in zip(missing, counts, strict=True):
                    self._cache.put(day, ("rows",), count, _size(count))

            key = ("rows", tuple((day.path, day.version) for day in missing))
            counts = await self._run(key, store, compute.count_rows_job, missing)
            rows.update((day.path, count) for day, count in zip(missing, counts, strict=True))
        listed = [{"date": day.date, "rows": rows[day.path], "bytes": day.size} for day in days]
        return DaysPage(listed, page[-1] if start + limit < len(names) else None)

    async def _day_names(self, loop: asyncio.AbstractEventLoop) -> list[str]:
        try:
            changed = os.stat(self.data_dir).st_mtime_ns  # an added or removed file changes it
        except FileNotFoundError:
            return []
        if changed != self._names[0]:
            self._names = (changed, await loop.run_in_executor(None, day_names, self.data_dir))
        return self._names[1]

    async def summary(self, date: str, top: int) -> dict[str, Any]:
        """Totals, distinct downloaders, and downloads per hour of all traffic vs the top N whales."""
        aggregate = await self._aggregate(date)
        whales = aggregate["whales"][:top]
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

    async def whales(self, date: str, top: int) -> dict[str, Any]:
        """The top N whales: ip_id, name, country, downloads, bytes; most downloads first."""
        aggregate = await self._aggregate(date)
        fields = ("ip_id", "name", "country", "downloads", "bytes")
        return {"date": date, "top": top, "whales": [{k: w[k] for k in fields} for w in aggregate["whales"][:top]]}

    async def hourly(self, date: str, top: int) -> dict[str, Any]:
        """Downloads per hour (24 numbers) of each of the top N whales."""
        aggregate = await self._aggregate(date)
        fields = ("ip_id", "name", "country", "downloads", "hourly")
        return {"date": date, "top": top, "whales": [{k: w[k] for k in fields} for w in aggregate["whales"][:top]]}

    async def downloads(self, date: str, ip_id: int, limit: int) -> bytes:
        """One ip_id's downloads of the day in time order (the first ``limit``), as the JSON
        answer (serialised in the pool); WhaleNotFound if none."""
        day = stat_day(self.data_dir, date)
        result = await self._cached(day, ("downloads", ip_id, limit), compute.downloads_job, day, ip_id, limit)
        if result is None:
            raise WhaleNotFound(ip_id)
        return bytes(result)

    async def chart(self, date: str, view: str, top: int, ip_id: int | None = None) -> bytes:
        """One dashboard view (one of charts.VIEWS: the handler checks) as SVG; ``detail`` shows
        ``ip_id`` (default: the top whale)."""
        day = stat_day(self.data_dir, date)
        if view == "detail" and ip_id is None:
            whales = (await self._aggregate(date))["whales"]
            if not whales:
                raise WhaleNotFound(0)
            ip_id = whales[0]["ip_id"]
        query = ("chart", view, top if view != "detail" else 0, ip_id if view == "detail" else 0)
        svg = await self._cached(day, query, charts.chart_job, day, view, top, ip_id)
        if svg is None:
            raise WhaleNotFound(ip_id)
        return bytes(svg)

    async def call(self, key: tuple[Any, ...], func: Callable[..., Any], *args: Any) -> Any:
        """``func(*args)`` in the pool (once for all concurrent callers with the same ``key``),
        for work that needs no polars (the downloads API's: tiny.downloads)."""
        return await self._run(key, lambda result: None, func, *args)

    def close(self) -> None:
        """Stop the pool, if it started: queued work is cancelled, running work is killed.

        Later queries raise :class:`Busy`. Waits up to ``_STOP_SECONDS`` for the pool
        processes, so that the pool's queues and semaphores are released before the worker
        exits (no "leaked semaphore" warning).
        """
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is None:
            return
        # (_processes: the executor has no public handle on its processes.)
        processes = list((getattr(pool, "_processes", None) or {}).values())
        # shutdown(wait=False) forgets its manager thread at once, and a later shutdown(wait=True)
        # then joins nothing: the thread, which holds the queues, is joined here instead.
        manager = getattr(pool, "_executor_manager_thread", None)
        pool.shutdown(wait=False, cancel_futures=True)
        # An idle pool process exits on the shutdown sentinel; a busy one would first finish
        # its query (up to seconds). Nothing it computes is needed any more: stop it now.
        for process in processes:
            if process.is_alive():
                process.terminate()
        for process in processes:
            process.join(_STOP_SECONDS)
        if manager is not None:
            manager.join(_STOP_SECONDS)
        # The queues' semaphores are released when the queues are collected: now, since a
        # forked worker leaves by os._exit, which runs no finalizer.
        del pool, processes, manager
        gc.collect()

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        """The pool, created on first use (in the worker process that uses it)."""
        if self._closed:
            raise Busy("the server is shutting down")
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=self.processes,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=compute.pool_init,
                initargs=(os.getpid(), self.threads, self.nice),
            )
            log.info(
                "analytics pool started: %d process(es), %d polars thread(s), nice %s",
                self.processes,
                self.threads,
                self.nice,
            )
        return self._pool

    def _replace_broken(self, broken: concurrent.futures.ProcessPoolExecutor) -> None:
        """Forget a pool whose process died (killed, out of memory): the next query starts a new one."""
        if self._pool is broken:
            log.error("the analytics process died; starting a new one")
            self._pool = None
            broken.shutdown(wait=False, cancel_futures=True)

    def _need_libraries(self) -> None:
        if not self.installed:
            raise Missing("polars and matplotlib are not installed here")

    async def _aggregate(self, date: str) -> dict[str, Any]:
        day = stat_day(self.data_dir, date)
        result: dict[str, Any] = await self._cached(day, ("aggregate",), compute.aggregate_job, day)
        return result

    def _known_rows(self, day: DayFile) -> int | None:
        for query in (("aggregate",), ("rows",)):
            found = self._cache.get(day, query)
            if found is not _MISSING:
                return int(found["downloads"] if query == ("aggregate",) else found)
        return None

    async def _cached(self, day: DayFile, query: tuple[Any, ...], func: Callable[..., Any], *args: Any) -> Any:
        """``func(*args)`` in the pool, or its cached result for this version of the day file."""
        self._need_libraries()
        found = self._cache.get(day, query)
        if found is not _MISSING:
            return found
        key = (day.path, day.version, query)
        return await self._run(key, lambda result: self._cache.put(day, query, result, _size(result)), func, *args)

    async def _run(
        self, key: tuple[Any, ...], store: Callable[[Any], None], func: Callable[..., Any], *args: Any
    ) -> Any:
        """``func(*args)`` in the pool, once for all concurrent callers with the same ``key``;
        ``store`` gets the result as soon as it is there (even if every caller went away)."""
        future = self._pending.get(key)
        if future is None:
            if len(self._pending) >= self.max_queued:
                raise Busy(f"{len(self._pending)} analytics queries are queued")
            pool = self._executor()
            try:
                future = asyncio.get_running_loop().run_in_executor(pool, func, *args)
            except BrokenProcessPool:  # its process died since the last query
                self._replace_broken(pool)
                raise Busy("the analytics process died; it is being restarted") from None
            self._pending[key] = future
            # Weak references only: neither this frame (suspended below) nor the callback of a
            # future still pending when close() runs may keep the pool, and its queues'
            # semaphores, alive past close() (a "leaked semaphore" at exit otherwise).
            pool_ref = weakref.ref(pool)
            del pool
            future.add_done_callback(lambda done: self._settle(key, store, pool_ref, done))
        try:
            # shield: a client that goes away does not cancel a computation others may await
            return await asyncio.shield(future)
        except BrokenProcessPool:
            raise Busy("the analytics process died; it is being restarted") from None

    def _settle(
        self,
        key: tuple[Any, ...],
        store: Callable[[Any], None],
        pool_ref: weakref.ref[concurrent.futures.ProcessPoolExecutor],
        done: asyncio.Future[Any],
    ) -> None:
        self._pending.pop(key, None)
        if done.cancelled():
            return
        error = done.exception()
        if isinstance(error, BrokenProcessPool):
            if (pool := pool_ref()) is not None:
                self._replace_broken(pool)
        elif error is None:
            store(done.result())

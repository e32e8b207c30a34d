"""The worker side of the analytics: one :class:`Analytics` per worker process, which owns its pool.

Every analytics computation runs in a ``ProcessPoolExecutor`` of ``--analytics-processes``
processes started with "spawn" (nothing of the worker's event loop, sockets or locks is
inherited), one pool per lane: ANSWERS, the answers from the live aggregates (tiny.live,
through :meth:`Analytics.call`: milliseconds) and the charts drawn from them (a
millisecond), started with the worker (:meth:`Analytics.start`); and ROWS, the queries that
read a day's rows (one ip_id's downloads, the ``detail`` chart: the methods here; up to
seconds on a big day), started on first use; so that the first never wait behind the second.
The worker only stats files and awaits small results (JSON or SVG bytes), so a query never
blocks the event loop that serves ``/ingest``.

CPU: the pool processes of every worker of a server share one cgroup quota of
``--analytics-cpu`` CPUs where one can be made (tiny.analytics.cpu), and run at
``--analytics-nice`` (default SCHED_IDLE) within it; each one exits when its worker process
is gone (tiny.analytics.pool_process.pool_init), even a stopped one. Time: every job has a deadline
of ANALYTICS_JOB_SECONDS (tiny.limits) from when it starts to run in a pool process (a job waiting
its turn is not counted); a process whose job runs past it is stuck (stopped, blocked in the kernel, looping)
and is killed: its pool is replaced by the next query, and every query waiting on that pool is
answered :class:`Busy` naming the job that was stuck (:meth:`Analytics.trouble` says so for
/healthz meanwhile). Concurrency: at most
``--analytics-max-queued`` distinct computations wait per worker, and at most
``limits.ANALYTICS_ROW_QUERIES`` distinct day files' rows are read: past either a query is refused at once
(:class:`Busy`, a 503 that says which) rather than queued without bound.
:meth:`Analytics.close` stops the pool.

Caching of the row queries. A day file only grows (the sink appends; a failed flush may cut
it back), so ``(path, size, mtime_ns)`` names one version of it. The worker keeps the results
computed for the current version of each file (a result is counted by the size of its JSON or
SVG; a new version replaces them) in its caches' budget, :attr:`Analytics.budget`, with
tiny.live's answers: the worker's share of ``--analytics-cache-bytes``, its pool processes
having the rest (tiny.analytics.caches). Concurrent identical queries share one computation.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import gc
import logging
import os
import time
import weakref
from collections.abc import Callable, Hashable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiny import affinity, layout, limits
from tiny.analytics import caches, charts, cpu, json_bytes, pool_process, rows
from tiny.analytics.rows import DayFile
from tiny.config import Config
from tiny.regular_files import check_regular

log = logging.getLogger("tiny.analytics")

_STOP_SECONDS = 2.0  # how long close() waits for the pool processes to exit
_WATCH_SECONDS = 0.5  # how often the running jobs are held to it
_TROUBLE_SECONDS = 60.0  # how long trouble() reports a pool replaced because a job was stuck
# The lanes: each its own pool, so that an answer from the aggregates (milliseconds) never
# waits behind a day's rows being read or a whale's detail drawn (seconds, within the quota).
ANSWERS, ROWS = cpu.LANES


class DayNotFound(LookupError):
    """No day file for the date (answered 404)."""


class WhaleNotFound(LookupError):
    """The ip_id downloaded nothing on that day (answered 404)."""


class Busy(RuntimeError):
    """Too many computations queued or reading rows in this worker, the pool process died or
    was stuck, or it is closed (503; the message says which)."""


def _processes_of(pool: concurrent.futures.ProcessPoolExecutor) -> list[Any]:
    # (_processes: the executor has no public handle on its processes.)
    return list((getattr(pool, "_processes", None) or {}).values())


def _stop(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    """Stop one pool: queued work cancelled, running work killed, its threads joined."""
    processes = _processes_of(pool)
    # shutdown(wait=False) forgets its manager thread at once, and a later shutdown(wait=True)
    # then joins nothing: the thread, which holds the queues, is joined here instead.
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    # An idle pool process exits on the shutdown sentinel; a busy one would first finish
    # its query (up to seconds). Nothing it computes is needed any more: stop it now (SIGKILL:
    # a stopped process would leave a SIGTERM pending).
    for process in processes:
        if process.is_alive():
            process.kill()
    for process in processes:
        process.join(_STOP_SECONDS)
    if manager is not None:
        manager.join(_STOP_SECONDS)


@dataclass(eq=False)
class _Job:
    """A computation submitted to a lane's pool: the worker's future for it, the pool's, and
    since when it runs (first seen among the jobs its pool's processes run)."""

    lane: str
    what: str  # for the message when it is stuck
    future: asyncio.Future[Any]
    submitted: concurrent.futures.Future[Any]
    pool: weakref.ref[concurrent.futures.ProcessPoolExecutor]
    running_since: float | None = None


def _call_soon(loop: asyncio.AbstractEventLoop, func: Callable[..., None], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(func, *args)


def stat_day(data_dir: Path, date: str) -> DayFile:
    """The current version of ``data_dir/<date>.csv``; DayNotFound if there is none,
    tiny.regular_files.NotARegularFile if it is a FIFO, a device... (its rows are never read)."""
    path = layout.day_path(data_dir, date)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise DayNotFound(date) from None
    check_regular(path, st.st_mode)
    return DayFile(date, str(path), st.st_size, st.st_mtime_ns)


@dataclass(frozen=True)
class WhaleDownloads:
    """A query of a day's rows: one ip_id's first ``limit`` downloads (JSON)."""

    ip_id: int
    limit: int


@dataclass(frozen=True)
class Detail:
    """A query of a day's rows: the ``detail`` chart of one ip_id's downloads (SVG)."""

    ip_id: int


RowQuery = WhaleDownloads | Detail


def _size(result: Any) -> int:
    """What a cached result weighs: its bytes, or its JSON's (a row count: a few bytes)."""
    if isinstance(result, bytes):
        return len(result) + 64
    if isinstance(result, int) or result is None:
        return 64
    return len(json_bytes.dumps(result)) * 4  # Python objects weigh about 4x their JSON


class Analytics:
    """The analytics pool of one worker process, and the queries that read a day's rows.

    The dashboard's other answers come from the aggregates (tiny.live, tiny.analytics.answers),
    run in this pool through :meth:`call`. The queries here read rows: one ip_id's
    downloads and the ``detail`` chart. Each stats the day file (DayNotFound if absent) and
    answers from the cache when that version was computed already. At most ``row_queries``
    distinct ones run at once in a worker: more get :class:`Busy` at once, saying so, like
    any query past ``max_queued`` pending computations, or after :meth:`close`.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        processes: int = 1,
        nice: str = "idle",
        max_queued: int = limits.ANALYTICS_MAX_QUEUED,
        cache_bytes: int = limits.ANALYTICS_CACHE_BYTES,
        row_queries: int = limits.ANALYTICS_ROW_QUERIES,
        job_seconds: float = limits.ANALYTICS_JOB_SECONDS,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.processes = processes
        self.nice = nice
        self.max_queued = max_queued
        self.row_queries = row_queries
        self.job_seconds = job_seconds
        self._jobs: dict[str, list[_Job]] = {}  # lane -> its jobs not settled, in the order submitted
        self._watch: asyncio.Task[None] | None = None
        self._replaced: tuple[float, str] | None = None  # (when, why) a pool was last replaced as stuck
        self._pools: dict[str, concurrent.futures.ProcessPoolExecutor] = {}  # lane -> its pool
        self._closed = False
        self.shares = caches.Shares.of(cache_bytes, processes)
        self.budget = caches.Budget(self.shares.worker)  # the worker's caches: these results, tiny.live's answers
        self._cache: caches.Cache[tuple[tuple[int, int], Any]] = self.budget.cache("results of the row queries")
        self._pending: dict[Hashable, asyncio.Future[Any]] = {}
        self._reading_rows: dict[Hashable, tuple[str, tuple[int, int]]] = {}  # pending key -> its day

    @classmethod
    def from_config(cls, config: Config) -> Analytics:
        """The analytics of ``config.data_dir`` with the ``--analytics-*`` settings."""
        return cls(
            config.data_dir,
            processes=config.analytics_processes,
            nice=config.analytics_nice,
            max_queued=config.analytics_max_queued,
            cache_bytes=config.analytics_cache_bytes,
        )

    async def whale_downloads(self, date: str, ip_id: int, limit: int) -> bytes:
        """One ip_id's downloads of the day in time order (the first ``limit``), as the JSON
        answer (serialised in the pool); WhaleNotFound if none."""
        day = stat_day(self.data_dir, date)
        result = await self._rows(day, WhaleDownloads(ip_id, limit), rows.whale_downloads_job, day, ip_id, limit)
        if result is None:
            raise WhaleNotFound(ip_id)
        return bytes(result)

    async def detail(self, date: str, ip_id: int) -> bytes:
        """The ``detail`` chart of one ip_id's downloads (SVG); WhaleNotFound if none."""
        day = stat_day(self.data_dir, date)
        svg = await self._rows(day, Detail(ip_id), charts.detail_job, day, ip_id)
        if svg is None:
            raise WhaleNotFound(ip_id)
        return bytes(svg)

    async def call(
        self, key: Hashable, func: Callable[..., Any], *args: Any, what: str = "an answer from the aggregates"
    ) -> Any:
        """``func(*args)`` in the ANSWERS lane (once for all concurrent callers with the same
        ``key``): the answers from the aggregates (tiny.live). ``what`` names it in the message
        if it is stuck."""
        return await self._run(key, lambda result: None, func, *args, lane=ANSWERS, what=what)

    def trouble(self) -> str | None:
        """Why queries needing the pool wait or fail now or did lately (for /healthz), or None:
        a job that has run for over half its deadline, or a pool replaced because a job was
        stuck, for _TROUBLE_SECONDS after."""
        now = time.monotonic()
        for jobs in self._jobs.values():
            for job in jobs:
                if job.running_since is not None and now - job.running_since > self.job_seconds / 2:
                    return (
                        f"an analytics job ({job.what}) has run for {now - job.running_since:.0f} s "
                        f"(it is killed at {self.job_seconds:.0f} s)"
                    )
        if self._replaced is not None and now - self._replaced[0] < _TROUBLE_SECONDS:
            return f"{self._replaced[1]} ({now - self._replaced[0]:.0f} s ago)"
        return None

    def start(self, warm: Callable[[], None]) -> None:
        """Start the ANSWERS lane's processes now, each running ``warm`` (its imports): the
        first query then neither waits for a process to start nor stalls the event loop while
        the pool is made (21-33 ms once). The ROWS lane starts on its first query (a new
        interpreter, 0.03-0.05 CPU-s: a server nobody asks for rows runs no process for them).
        A failure is logged; the next query starts the pool again. Call it on the event loop."""
        try:
            pool = self._executor(ANSWERS)
            for _ in range(self.processes):
                self._submit(pool, ANSWERS, "its start-up", warm).add_done_callback(self._log_failure)
        except (Busy, BrokenProcessPool, RuntimeError) as exc:
            log.warning("the analytics pool (%s) did not start: %s", ANSWERS, exc)

    def _log_failure(self, done: asyncio.Future[Any]) -> None:
        """A start-up job's failure, said unless the pool was stopped under it (a stop's kill)."""
        if not done.cancelled() and (error := done.exception()) is not None and not self._closed:
            log.warning("the analytics pool's start-up job failed: %s", error)

    def close(self) -> None:
        """Stop the pool, if it started: queued work is cancelled, running work is killed.

        Later queries raise :class:`Busy`. Waits up to ``_STOP_SECONDS`` for the pool
        processes, so that the pool's queues and semaphores are released before the worker
        exits (no "leaked semaphore" warning).
        """
        self._closed = True
        if self._watch is not None:
            self._watch.cancel()
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            _stop(pool)
        del pools
        # The queues' semaphores are released when the queues are collected: now, since a
        # forked worker leaves by os._exit, which runs no finalizer.
        gc.collect()

    def _executor(self, lane: str) -> concurrent.futures.ProcessPoolExecutor:
        """The pool of ``lane``, created on first use (in the worker process that uses it). Its
        processes are spawned by the thread that submits to it, the event loop's, which lives
        as long as the worker (tiny.analytics.pool_process.pool_init ties their lives to it)."""
        if self._closed:
            raise Busy("the server is shutting down")
        pool = self._pools.get(lane)
        if pool is None:
            pool = self._pools[lane] = concurrent.futures.ProcessPoolExecutor(
                max_workers=self.processes,
                mp_context=cpu.ConfinedContext(cpu.CGROUP, lane, self.nice),
                initializer=pool_process.pool_init,
                initargs=(
                    os.getpid(),
                    self.shares.rows_process if lane == ROWS else self.shares.answers_process,
                    affinity.unpinned(),
                ),
            )
            log.info(
                "analytics pool (%s) started: %d process(es), nice %s",
                lane,
                self.processes,
                self.nice,
            )
        return pool

    def _keep(self, day: DayFile, query: RowQuery, result: Any, size: int) -> None:
        """Keep ``result`` for this version of the day file (the versions before it are replaced)."""
        self._cache.put((day.path, query), (day.version, result), size)

    def _replace_broken(self, broken: concurrent.futures.ProcessPoolExecutor) -> None:
        """Forget a pool whose process died (killed, out of memory): the next query starts a new one."""
        for lane, pool in list(self._pools.items()):
            if pool is broken:
                log.error("the analytics process (%s) died; starting a new one", lane)
                del self._pools[lane]
                broken.shutdown(wait=False, cancel_futures=True)

    async def _rows(self, day: DayFile, query: RowQuery, func: Callable[..., Any], *args: Any) -> Any:
        """``func(*args)``, a job that reads the day's rows, in the pool, or its cached result
        for this version of the day file. Queries of a day version being read already share
        its parsed rows (the pool keeps them) and are let through; past ``row_queries``
        distinct day versions being read at once, Busy."""
        found = self._cache.get((day.path, query))
        if isinstance(found, tuple) and found[0] == day.version:
            return found[1]
        key = (day.path, day.version, query)
        reading = (day.path, day.version)
        if key not in self._pending and reading not in self._reading_rows.values():
            if len(set(self._reading_rows.values())) >= self.row_queries:
                raise Busy(
                    "a query reading another day's rows is running in this process "
                    f"(at most {self.row_queries} at once: each takes a CPU for seconds on a big day)"
                )
        if key not in self._pending:
            self._reading_rows[key] = reading  # until the computation settles (see _settle)
        try:
            store = functools.partial(self._keep, day, query)
            what = f"reading the rows of {Path(day.path).name}"
            return await self._run(key, lambda result: store(result, _size(result)), func, *args, lane=ROWS, what=what)
        except Busy:
            if key not in self._pending:
                self._reading_rows.pop(key, None)
            raise

    async def _run(
        self,
        key: Hashable,
        store: Callable[[Any], None],
        func: Callable[..., Any],
        *args: Any,
        lane: str,
        what: str,
    ) -> Any:
        """``func(*args)`` in the pool, once for all concurrent callers with the same ``key``;
        ``store`` gets the result as soon as it is there (even if every caller went away)."""
        future = self._pending.get(key)
        if future is None:
            if len(self._pending) >= self.max_queued:
                raise Busy(f"{len(self._pending)} analytics queries are queued")
            pool = self._executor(lane)
            try:
                future = self._submit(pool, lane, what, func, *args)
            except BrokenProcessPool:  # its process died since the last query
                self._replace_broken(pool)
                raise Busy("the analytics process died; it is being restarted") from None
            del pool  # (see _submit)
            self._pending[key] = future
            future.add_done_callback(lambda done: self._settle(key, store, done))
        try:
            # shield: a client that goes away does not cancel a computation others may await
            return await asyncio.shield(future)
        except BrokenProcessPool:
            raise Busy("the analytics process died; it is being restarted") from None

    def _submit(
        self, pool: concurrent.futures.ProcessPoolExecutor, lane: str, what: str, func: Callable[..., Any], *args: Any
    ) -> asyncio.Future[Any]:
        """``func(*args)`` submitted to ``pool``, as a future of this loop that the pool's
        result settles, or the watch (:meth:`_watch_jobs`) when the job is stuck."""
        loop = asyncio.get_running_loop()
        submitted = pool.submit(func, *args)
        # A weak reference to the pool only: no job, and no callback of a job still pending
        # when close() runs, may keep the pool, and its queues' semaphores, alive past close()
        # (a "leaked semaphore" at exit otherwise).
        job = _Job(lane, what, loop.create_future(), submitted, weakref.ref(pool))
        self._jobs.setdefault(lane, []).append(job)
        submitted.add_done_callback(lambda done: _call_soon(loop, self._finish, job))
        if self._watch is None or self._watch.done():
            self._watch = loop.create_task(self._watch_jobs())
        return job.future

    def _finish(self, job: _Job) -> None:
        """The pool settled ``job``: its result (or error) to the worker's future, unless the
        watch settled that already."""
        with contextlib.suppress(ValueError):
            self._jobs.get(job.lane, []).remove(job)
        submitted = job.submitted
        error = None if submitted.cancelled() else submitted.exception()
        if isinstance(error, BrokenProcessPool) and (pool := job.pool()) is not None:
            self._replace_broken(pool)
        if job.future.done():
            return
        if submitted.cancelled():
            job.future.cancel()
        elif error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(submitted.result())

    async def _watch_jobs(self) -> None:
        """While jobs are pending: which of them each pool runs (its first ``processes`` jobs
        marked running, in the order submitted: its processes take them in that order), since
        when; a job past ``job_seconds`` is stuck (:meth:`_kill`)."""
        while any(self._jobs.values()):
            await asyncio.sleep(_WATCH_SECONDS)
            now = time.monotonic()
            for lane, jobs in list(self._jobs.items()):
                running = [job for job in jobs if job.submitted.running()][: self.processes]
                for job in running:
                    if job.running_since is None:
                        job.running_since = now
                stuck = next((job for job in running if now - (job.running_since or now) > self.job_seconds), None)
                if stuck is not None:
                    self._kill(lane, f"an analytics job ({stuck.what}) ran past its {self.job_seconds:.0f} s deadline")

    def _kill(self, lane: str, cause: str) -> None:
        """Kill the pool of ``lane`` (SIGKILL: a stopped process dies of it too) and answer every
        query waiting on it Busy, saying ``cause``; the next query starts a new pool."""
        log.error("%s: the analytics process (%s) is killed and a new one starts with the next query", cause, lane)
        pool = self._pools.pop(lane, None)
        if pool is not None:
            for process in _processes_of(pool):
                with contextlib.suppress(OSError, ValueError):
                    process.kill()
            pool.shutdown(wait=False, cancel_futures=True)  # its manager thread joins the processes
        self._replaced = (time.monotonic(), f"{cause}: its process was killed and replaced")
        for job in self._jobs.pop(lane, []):
            if not job.future.done():
                job.future.set_exception(Busy(f"{cause}: its process was killed, a new one starts"))

    def _settle(self, key: Hashable, store: Callable[[Any], None], done: asyncio.Future[Any]) -> None:
        self._pending.pop(key, None)
        self._reading_rows.pop(key, None)
        if done.cancelled():
            return
        if done.exception() is None:
            store(done.result())

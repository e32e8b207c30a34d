"""Cluster mode's reads: answered once this host has applied the position they need, waiting a bounded time.

Every host answers reads (the downloads API, ``/api``, ``/top``, ``/trending``, ``/badges``)
from its own day files, which its follower (tiny.follower) brings up to the log's positions
in order. So that an answer includes what it must, a read first waits (:meth:`ReadWait.wait`)
until this host has applied:

- with ``Tiny-Wait-Position: N``: position N (the ``Tiny-Position`` of a 200 from /ingest, on
  any host: read-your-writes across hosts). 0 asks for no wait: the answer is what this
  host has, even while no primary answers. An N past the log's head was never acknowledged:
  400 (:class:`NeverCommitted`);
- without it: the log's head as read after the read arrived (:class:`HeadReader`), so an
  answer includes every batch acknowledged before the read began, on any host.

It waits at most ``bound`` seconds (``--read-wait``) from the read's arrival; past it, or at
once when the follower cannot follow (tiny.follower_status ``trouble``: its reason), or when
the head cannot be read (no primary), :class:`Behind` (503 + Retry-After, saying how far
behind the host is).

Bounded work: one head query at a time per worker, shared by every read that arrived before
it began (a read waits for at most the one under way and the next); and while reads wait for
positions, one poll of the follower's shared status every :data:`POLL` seconds for all of them
(a heap by position; a read that gave up is dropped from it as soon as half of it are such).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tiny.follower_status import FollowerStatus

POLL = 0.002  # seconds between two looks at the applied position while reads wait for it
_RETRY_BEHIND = 2  # Retry-After of a read whose host is behind (seconds)


class Behind(Exception):
    """The host has not applied what the read needs (or cannot tell what that is) within the
    bound: 503 with ``Retry-After: retry_after``."""

    def __init__(self, message: str, retry_after: int = _RETRY_BEHIND) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class NeverCommitted(ValueError):
    """A Tiny-Wait-Position past the log's head: no write was ever acknowledged at it (400)."""


def asked_position(value: str | None) -> int | None:
    """The position a ``Tiny-Wait-Position`` header asks for (None: no header); ValueError
    unless it is 1-19 ASCII digits."""
    if value is None:
        return None
    text = value.strip()
    if not (0 < len(text) <= 19 and text.isascii() and text.isdigit()):
        raise ValueError(f"Tiny-Wait-Position must be a position (a whole number), not {value[:40]!r}")
    return int(text)


class HeadReader:
    """The log's head, read on a thread of its own with its own connection, one query at a
    time: :meth:`after` gives the result of a query that began after a given moment."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tiny-head")
        self._log: Any = None  # a tiny.cluster.log.CommitLog, made on the thread (psycopg is imported there)
        self._round: tuple[float, asyncio.Future[int]] | None = None

    async def after(self, since: float) -> int:
        """The head as read by a query that began at or after ``since`` (time.monotonic());
        raises what the query raised (tiny.cluster.errors.Unavailable)."""
        loop = asyncio.get_running_loop()
        while True:
            if self._round is None:
                began = time.monotonic()
                future = loop.run_in_executor(self._executor, self._read)
                this = self._round = (began, future)
                future.add_done_callback(lambda done, this=this: self._ended(this, done))  # type: ignore[misc]
            began, future = self._round
            if began >= since:
                return await asyncio.shield(future)
            try:
                await asyncio.shield(future)  # began before the read arrived: the next one counts
            except Exception:
                pass

    def _ended(self, this: tuple[float, asyncio.Future[int]], done: asyncio.Future[int]) -> None:
        if self._round is this:
            self._round = None
        if not done.cancelled():
            done.exception()  # retrieved: a failed round nobody awaited is not logged as lost

    def _read(self) -> int:
        if self._log is None:
            from tiny.cluster.log import CommitLog
            from tiny.commit.cluster import TIMEOUTS

            self._log = CommitLog(self.dsn, timeouts=TIMEOUTS)
        return int(self._log.head())

    def close(self) -> None:
        if self._log is not None:
            self._executor.submit(self._log.close)
        self._executor.shutdown(wait=False)


class ReadWait:
    """The reads' wait of one worker process: ``status`` is its host's follower's, ``heads``
    reads the log's head, ``bound`` is ``--read-wait``, ``busy_bound`` the follower's bound
    for one operation (tiny.follower_status ``trouble``)."""

    def __init__(self, status: FollowerStatus, heads: HeadReader, bound: float, busy_bound: float) -> None:
        self.status = status
        self.heads = heads
        self.bound = bound
        self.busy_bound = busy_bound
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []  # (position, order, waiter): a heap
        self._live = 0  # waiters in the heap that still wait
        self._order = itertools.count()
        self._poller: asyncio.Task[None] | None = None

    async def wait(self, asked: int | None, arrived: float) -> int:
        """Return once this host has applied what the read needs (see the module docstring);
        the position it waited for. ``arrived``: time.monotonic() when the read arrived."""
        deadline = arrived + self.bound
        if asked == 0 or (asked is not None and self.status.applied() >= asked):
            return asked
        self._check_follower()
        head = await self._head(arrived, deadline, required=asked is None)
        if asked is not None and head is not None and asked > head:
            raise NeverCommitted(
                f"Tiny-Wait-Position {asked} is past the log's head, {head}: nothing was acknowledged at it"
            )
        target = asked if asked is not None else int(head or 0)
        if self.status.applied() < target:
            await self._until(target, deadline)
        return target

    def _check_follower(self) -> None:
        trouble = self.status.trouble(self.busy_bound)
        if trouble:
            raise Behind(f"this host cannot bring its files up to date: {trouble}")

    async def _head(self, arrived: float, deadline: float, required: bool) -> int | None:
        """The head read after ``arrived``; Behind when it cannot be read in time and the read
        needs it (``required``), else None."""
        try:
            return await asyncio.wait_for(self.heads.after(arrived), max(0.0, deadline - time.monotonic()))
        except Exception as exc:
            if not required:
                return None
            why = "in time" if isinstance(exc, TimeoutError) else f"({str(exc).splitlines()[0]})"
            raise Behind(
                f"the log's head could not be read {why}, so this host cannot tell whether it has every batch "
                "acknowledged before this read: retry, or send Tiny-Wait-Position: 0 to be answered from what "
                f"this host has (position {self.status.applied()})"
            ) from None

    async def _until(self, target: int, deadline: float) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (target, next(self._order), waiter))
        self._live += 1
        if self._poller is None:
            self._poller = asyncio.get_running_loop().create_task(self._poll())
        try:
            await asyncio.wait_for(waiter, max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise self._behind(target) from None
        finally:
            self._live -= 1
            if len(self._waiting) > 64 and len(self._waiting) > 2 * self._live:
                self._waiting = [entry for entry in self._waiting if not entry[2].done()]
                heapq.heapify(self._waiting)

    def _behind(self, target: int) -> Behind:
        progress = self.status.progress()
        trouble = self.status.trouble(self.busy_bound)
        why = f": {trouble}" if trouble else ""
        lag = f"{progress.lag_seconds():.1f} s" if progress.behind_since else "a moment"
        return Behind(
            f"this host has applied position {progress.applied} of the log, the read needs {target} "
            f"({max(0, target - progress.applied)} behind, for {lag}){why}; retry",
            max(1, math.ceil(min(30.0, progress.lag_seconds() / 2))) if progress.behind_since else _RETRY_BEHIND,
        )

    async def _poll(self) -> None:
        try:
            while self._waiting:
                applied = self.status.applied()
                while self._waiting and (self._waiting[0][0] <= applied or self._waiting[0][2].done()):
                    _, _, waiter = heapq.heappop(self._waiting)
                    if not waiter.done():
                        waiter.set_result(None)
                await asyncio.sleep(POLL)
        finally:
            self._poller = None

    def close(self) -> None:
        self.heads.close()

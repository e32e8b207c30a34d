"""The sink: buffered, group-committed appends to the data files, made durable by a commit point.

On disk (names relative to DATA_DIR, see tiny.layout): ``YYYY-MM-DD.csv``, the CRAN log rows
of that day, opened by the CSV header exactly once; ``rejects/YYYY-MM-DD.ndjson``, one JSON
object per refused line. How a flush of them becomes durable, exactly once per key, whatever
crashes, is the commit point's (tiny.commit; on one host tiny.commit.local, the data dir's
journal under ``.tiny/``, docs/exactly-once.md); the sink queues, groups and answers:

- :meth:`DailyFileSink.append` returns a future that resolves to an :class:`Outcome` once the
  flush of its append committed (with ``--durability fsync``, on disk): ``stored`` None, its
  bytes were written; or the :class:`~tiny.commit.Stored` digest and answer of its key, stored
  before or by an earlier append of the same flush (per key, the first append of a flush
  decides), and nothing was written: the caller answers from them (the same body: replayed;
  another: 422). So a retry, in any process, never writes a batch twice. A 200 is sent only
  then. Or the future fails with a :class:`~tiny.commit.CommitError`, which says what was kept.
- Group commit: appends that arrive while a flush is in flight go out together in the next
  one. The flushes run on one worker thread, never on the event loop; that thread is the only
  writer of this process, so flushes are ordered. :attr:`DailyFileSink.busy_since` tells a
  watchdog how long that thread has been in one flush.
- Failures, by the commit point's error (tiny.commit.errors): a :class:`~tiny.commit.WriteFailed`
  flush kept nothing, and one request's failure never fails another's write: each append of it
  is flushed again on its own, and only those that fail then fail. A
  :class:`~tiny.commit.Refused` flush (the data dir as a whole) fails the whole group at once,
  without retries, and the commit point is opened again (with every check) at most once a
  second. An :class:`~tiny.commit.Unavailable` one (the way in not free in time) fails the
  appends whose own wait bound has passed; the others are flushed again, ahead of anything
  newer, each waiting at most until its own bound: every append waits at most the commit
  point's ``wait_bound`` from when it was queued, whatever waited before it (an earlier
  group, a /healthz probe).
- Bounds: a flush touches at most ``max_files`` files and holds at most
  :data:`MAX_FLUSH_APPENDS` appends (a group commit past either is split in order; one append
  always goes whole); the backlog (bytes accepted, not yet written) at most ``max_backlog``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from sqlite3 import Error as SQLiteError

from tiny import layout, limits
from tiny.commit import Claim, CommitError, CommitPoint, Receipt, Refused, Stored, Unavailable, WriteFailed
from tiny.profiling import profile

log = logging.getLogger("tiny.sink")

MAX_FLUSH_APPENDS = limits.MAX_FLUSH_APPENDS  # appends (so keys) in one flush: bounds its transaction and expiry
_REOPEN_SECONDS = 1.0  # a commit point that failed to open is tried again at most this often
_PROBE_WAIT = 0.2  # seconds a /healthz probe waits for the way in (the flush lock)
_STOPPING = "the server is stopping"
_PROBE_ROOM = 1 << 20  # a probe after the disk refused a flush asks room for its bytes, at most this many
_DEADLINE_SLACK = 0.05  # an append this close to its wait bound fails with the flush that timed out


class SinkError(CommitError):
    """The sink itself refused (it is stopping; a committed-sizes read failed): nothing was kept."""


class BacklogFull(SinkError):
    """This process already holds more unwritten bytes than it may."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message, retry_after)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one append: ``stored`` None, written; else the key's stored digest and
    answer (nothing written). ``position``: the commit's place in a global order (cluster mode)."""

    stored: Stored | None
    position: int | None = None


_WRITTEN = Outcome(None)


class _Append:
    """One :meth:`DailyFileSink.append`: its chunks, claim, size, the future that answers it,
    and the time.monotonic() past which it waits for its flush to begin no longer."""

    __slots__ = ("chunks", "claim", "deadline", "size", "waiter")

    def __init__(
        self,
        chunks: Mapping[str, bytes],
        claim: Claim | None,
        size: int,
        waiter: asyncio.Future[Outcome],
        deadline: float,
    ) -> None:
        self.chunks = chunks
        self.claim = claim
        self.size = size
        self.waiter = waiter
        self.deadline = deadline


def _groups(appends: list[_Append], max_files: int, max_appends: int = MAX_FLUSH_APPENDS) -> list[list[_Append]]:
    """``appends`` cut, in order, into groups of at most ``max_appends`` that touch at most
    ``max_files`` files each (a group of one append may touch more: an append is never split)."""
    groups: list[list[_Append]] = []
    files: set[str] = set()
    for append in appends:
        if groups and len(groups[-1]) < max_appends and len(files | append.chunks.keys()) <= max_files:
            files |= append.chunks.keys()
            groups[-1].append(append)
        else:
            files = set(append.chunks)
            groups.append([append])
    return groups


class DailyFileSink:
    """Appends byte chunks to files through ``commit_point``; see the module docstring.
    :meth:`open` opens the commit point, or the first flush does. ``on_flush(seconds, nbytes,
    ok)`` is called on the event loop after each flush."""

    def __init__(
        self,
        commit_point: CommitPoint,
        *,
        max_backlog: int = limits.MAX_BACKLOG,
        max_files: int = 32,
        on_flush: Callable[[float, int, bool], None] | None = None,
        idle_probes: bool = True,
    ) -> None:
        self.commit_point = commit_point
        # /healthz's probe of a way in no flush took for a second (one host's data dir; not
        # cluster mode's primary, which a host for reads never writes to: its follower says)
        self.idle_probes = idle_probes
        self.max_backlog = max_backlog
        self.max_files = max_files
        self._on_flush = on_flush
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tiny-sink")
        self._pending: list[_Append] = []
        self._backlog = 0  # pending + in flight
        self._flushing: asyncio.Task[None] | None = None
        self._open_tried = -_REOPEN_SECONDS
        self._probed = -_REOPEN_SECONDS
        self._flushed = -_REOPEN_SECONDS  # when the last flush (or probe) ended
        self._give_up_at = float("inf")  # time.monotonic() past which no flush waits (the stop)
        self._closed = False  # close() has written the last flush: appends are refused
        self._closed_ok = True  # what close() returned
        self.fault: str | None = None  # why the last flush (or opening) failed; None after a success
        # The files, bytes and reason of a flush the disk refused, until a flush succeeds:
        self._refused: tuple[list[str], int, str] | None = None
        self.failures = 0  # appends answered with an error
        self.busy_since = 0.0  # time.monotonic() when the sink thread began the flush it is in; 0 when idle

    @property
    def backlog(self) -> int:
        """Bytes accepted by :meth:`append` and not yet written."""
        return self._backlog

    @property
    def is_open(self) -> bool:
        """The commit point is open (else :meth:`ready` tries it, or says why not)."""
        return self.commit_point.is_open

    def open(self) -> None:
        """Open the commit point now (a worker's start), so that :meth:`digest` works; on a
        CommitError the sink starts faulty and tries again later (see :meth:`ready`)."""
        self._open_tried = time.monotonic()
        try:
            self.commit_point.open()
        except CommitError as exc:
            self.fault = str(exc)
            raise

    async def ready(self) -> None:
        """Return once the commit point is open; its CommitError (the reason) when it cannot
        be. One that failed is tried again at most once a second; in between, the last reason
        is raised at once."""
        if self._closed:
            raise SinkError(_STOPPING)
        if self.commit_point.is_open:
            return
        if time.monotonic() - self._open_tried < _REOPEN_SECONDS and self.fault:
            raise Refused(self.fault)
        await asyncio.get_running_loop().run_in_executor(self._executor, self._open_on_thread)

    def _open_on_thread(self) -> None:
        if self.commit_point.is_open:
            return
        self._open_tried = time.monotonic()
        try:
            self.commit_point.open()
        except CommitError as exc:
            if str(exc) != self.fault:  # (tried again once a second: said once)
                log.error("%s", exc)
            self.fault = str(exc)
            raise
        if self.fault is not None:  # said out loud: the files taken may be a copy put back
            log.warning(
                "the journal is usable again after a refusal; writes go on in the data dir as it is now (a copy "
                "restored from a backup lacks the batches acknowledged after it: a retry of one is written again)"
            )
        self.fault = None

    async def committed_sizes(self, days: list[str]) -> dict[str, int]:
        """The sizes of the day files of ``days`` (those that exist) below which every byte is
        committed, such that no later recovery cuts below them. SinkError when they cannot be
        read. (For the live aggregates: tiny.aggregates.)"""
        try:
            await self.ready()
        except CommitError as exc:
            raise SinkError(str(exc)) from None
        names = [layout.day_file(day) for day in days]
        try:
            # Without waiting when no flush is under way: a reader neither waits for flushes nor
            # holds them up. A few system calls, on the loop: a thread would take the GIL from it.
            sizes = self.commit_point.peek_committed_sizes(names)
            if sizes is None:
                sizes = await asyncio.get_running_loop().run_in_executor(
                    self._executor, self.commit_point.committed_sizes, names
                )
        except (CommitError, OSError, SQLiteError) as exc:
            raise SinkError(str(exc)) from None
        return {day: sizes[name] for day, name in zip(days, names, strict=True) if name in sizes}

    def trouble(self) -> str | None:
        """Why writes fail or wait now (for /healthz), or None: a wait of more than a second
        for the way in (and for what), the reason the last flush failed, or what outside this
        process would make a flush wait now, seen without waiting."""
        return self.commit_point.waiting() or self.fault or self.commit_point.blocked_elsewhere()

    def digest(self, body: bytes) -> bytes:
        """The commit point's digest of a body (any thread; after :meth:`ready`)."""
        return self.commit_point.digest(body)

    def append(self, chunks: Mapping[str, bytes], claim: Claim | None = None) -> asyncio.Future[Outcome]:
        """Queue ``{relative_path: bytes}`` for the next flush; all or nothing (see the module
        docstring for what the future resolves to). Raises :class:`BacklogFull` at once,
        queueing nothing, when the backlog would exceed ``max_backlog``, and SinkError at once
        after :meth:`close` (a request that reached a stopping worker on a kept-alive
        connection: it gets a 503 to retry elsewhere, not a flush on a closed commit point)."""
        if self._closed:
            raise SinkError(_STOPPING)
        size = sum(len(data) for data in chunks.values())
        if self._backlog and self._backlog + size > self.max_backlog:
            raise BacklogFull(f"{self._backlog} bytes are waiting for the disk")
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Outcome] = loop.create_future()
        deadline = time.monotonic() + self.commit_point.wait_bound
        self._pending.append(_Append(chunks, claim, size, waiter, deadline))
        self._backlog += size
        if self._flushing is None:
            self._flushing = loop.create_task(self._flush_loop())
        return waiter

    def probe(self) -> None:
        """If no flush is under way, try the write path, writing nothing (the commit point
        opened, the way in taken with its checks of the data dir's files, recovery run), at
        most once a second: when the last flush failed, so that a fault that went away is
        cleared without waiting for a request; and when no flush has run for a second, so that
        a data dir moved or replaced since is found without one either (a worker that had no
        request said ok while the others' writes got 503; ``idle_probes``: one host only).
        After the disk refused a flush, the
        fault stays until the commit point finds room for that flush's bytes (at most
        _PROBE_ROOM) and its files open for appending (its ``writable``), or a flush succeeds:
        a write that writes nothing proves nothing of a disk."""
        now = time.monotonic()
        if self._closed or self._flushing is not None or now - self._probed < _REOPEN_SECONDS:
            return
        if self.fault is None and (not self.idle_probes or now - self._flushed < _REOPEN_SECONDS):
            return  # a flush just took the way in, with the same checks
        self._probed = now
        self._flushing = asyncio.get_running_loop().create_task(self._flush_loop(probe=True))

    async def _flush_loop(self, probe: bool = False) -> None:
        try:
            if probe:
                await self._probe()
            while self._pending:
                pending, self._pending = self._pending, []
                queue = deque(_groups(pending, self.max_files))
                while queue:
                    group = queue.popleft()
                    left = await self._flush(group)
                    if left is None:
                        # One append's failure (a day file the disk refuses) must not fail the
                        # others: each is written on its own now, in order.
                        queue.extendleft([append] for append in reversed(group))
                    elif left:
                        # The way in was not free by the first deadline of the group: the appends
                        # whose own deadline is still ahead wait on, before anything newer.
                        self._pending[:0] = [*left, *(append for rest in queue for append in rest)]
                        break
        finally:
            self._flushing = None
            self._flushed = time.monotonic()

    async def _probe(self) -> None:
        refused = self._refused
        await self._flush([])
        if refused is None or self.fault is not None:
            return
        names, size, reason = refused
        self.fault = reason  # at once (no await since the flush): an empty flush proves nothing of a disk
        loop = asyncio.get_running_loop()
        why = await loop.run_in_executor(self._executor, self.commit_point.writable, names, min(size, _PROBE_ROOM))
        if why is None:
            self.fault = self._refused = None
        else:
            self.fault = f"{reason} (still: {why})"

    async def _flush(self, group: list[_Append]) -> list[_Append] | None:
        """Write ``group`` in one flush, all or nothing. Returns None when it failed and is
        left to retry append by append (a file's failure in a group of several); the appends
        still within their wait bound when the way in was not free by the group's first (they
        are flushed again, each waiting at most until its own); otherwise [] and every append
        of it is answered (with its error when it failed)."""
        size = sum(append.size for append in group)
        started = time.perf_counter()
        left: list[_Append] | None = []
        ok = False
        try:
            receipt = await asyncio.get_running_loop().run_in_executor(self._executor, self._write_group, group)
        except Unavailable as exc:
            if not group:  # a probe found the lock busy: it proves nothing either way (trouble() says past 1 s)
                return []
            late = time.monotonic() + _DEADLINE_SLACK
            if late >= self._give_up_at:  # stopping: no wait goes on
                late = float("inf")
            left = [append for append in group if append.deadline > late]
            if group or str(exc) != self.fault:  # (a probe says a fault once, not once a second)
                log.error("flush of %d bytes (%d appends) refused: %s", size, len(group) - len(left), exc)
            self._fail([append for append in group if append.deadline <= late], exc)
        except WriteFailed as exc:
            if group or str(exc) != self.fault:
                log.error("flush of %d bytes (%d appends) failed: %s", size, len(group), exc)
            self.fault = str(exc)
            self._refused = (sorted({name for append in group for name in append.chunks}), size, str(exc))
            if len(group) == 1:
                self._fail(group, exc)
            else:
                left = None
        except CommitError as exc:  # the data dir (or cluster) as a whole: retrying each would not help
            if group or str(exc) != self.fault:
                log.error("flush of %d bytes (%d appends) refused: %s", size, len(group), exc)
            self._fail(group, exc)
        else:
            self.fault, ok = None, True
            if group:
                self._refused = None
            position = receipt.position
            for append, stored in zip(group, receipt.decisions, strict=True):
                self._backlog -= append.size
                if not append.waiter.done():
                    append.waiter.set_result(
                        _WRITTEN if stored is None and position is None else Outcome(stored, position)
                    )
        if self._on_flush is not None and group:  # not for a probe
            self._on_flush(time.perf_counter() - started, size, ok)
        return left

    def _fail(self, group: list[_Append], error: CommitError) -> None:
        self.fault = str(error)
        self.failures += len(group)
        for append in group:
            self._backlog -= append.size
            if not append.waiter.done():
                append.waiter.set_exception(error.again())

    @profile
    def _write_group(self, group: list[_Append]) -> Receipt:
        """Runs on the sink thread: one flush of ``group`` through the commit point."""
        self.busy_since = time.monotonic()
        try:
            if not self.commit_point.is_open:
                if time.monotonic() - self._open_tried < _REOPEN_SECONDS and self.fault:
                    raise Refused(self.fault)
                self._open_on_thread()
            # Each append waits at most its bound from when it was queued, whatever waited before
            # it (an earlier group, a /healthz probe, a committed-sizes read).
            # (a probe, with no append, waits a moment only: it must not hold the sink's thread)
            deadline = min((append.deadline for append in group), default=time.monotonic() + _PROBE_WAIT)
            try:
                return self.commit_point.commit(group, deadline)
            except Unavailable:
                raise
            except Refused:
                self.commit_point.close()  # opened again, with every check, by a later flush
                self._open_tried = time.monotonic()
                raise
        finally:
            self.busy_since = 0.0

    async def close(self, timeout: float = limits.DRAIN_TIMEOUT) -> bool:
        """Write everything still pending within ``timeout`` seconds (waiting for the way in at
        most what is left of it), then close the commit point and stop the sink thread. Returns
        True when every append was written; False when some failed, or the sink thread is
        stuck in a flush (its appends are then never answered: the caller exits). Appends that
        come while it waits for the flushes are written; any after that are refused. A second
        call returns what the first did (True while the first is still under way)."""
        if self._closed:
            return self._closed_ok
        deadline = time.monotonic() + timeout
        failures = self.failures
        # Waits for the way in, the one under way included, end a little before the deadline: a
        # flush that cannot begin then fails (503) instead of writing after the stop.
        self._give_up_at = deadline - min(0.2, timeout / 4)
        self.commit_point.stop_waits_at(self._give_up_at)
        loop = asyncio.get_running_loop()
        try:
            while self._flushing is not None:
                await asyncio.wait_for(asyncio.shield(self._flushing), max(0.0, deadline - time.monotonic()))
            self._closed = True  # (no await since the last flush ended: nothing is left pending)
            if self.commit_point.unfinished:
                await asyncio.wait_for(
                    loop.run_in_executor(self._executor, self._recover), max(0.1, deadline - time.monotonic())
                )
            await asyncio.wait_for(loop.run_in_executor(self._executor, self.commit_point.close), 1.0)
        except TimeoutError:
            log.error("the sink thread is stuck in a flush for %.1f s; leaving it", time.monotonic() - self.busy_since)
            self._closed = True
            self._fail(self._pending, SinkError("the server stopped before this request could be written"))
            self._pending = []
            self._executor.shutdown(wait=False)
            self._closed_ok = False
            return False
        self._executor.shutdown(wait=True)
        self._closed_ok = self.failures == failures and not self.commit_point.unfinished
        return self._closed_ok

    def _recover(self) -> None:
        try:
            self.commit_point.recover()
        except CommitError as exc:
            log.error("could not repair the last failed flush before stopping: %s", exc)

"""The daily-file sink: buffered, group-committed, journaled appends to the files under DATA_DIR.

On disk (names relative to DATA_DIR, see tiny.layout): ``YYYY-MM-DD.csv``, the CRAN log rows
of that day, opened by the CSV header exactly once; ``rejects/YYYY-MM-DD.ndjson``, one JSON
object per refused line; ``.tiny/``, the journal (tiny.journal).

Locking, journal and ack rules, which hold across every process and container sharing
DATA_DIR:

- A flush holds the data dir's flush lock from start to end (every writer takes it, waiting
  at most the journal's ``lock_timeout``), so rows of different writers never interleave,
  and "is the file empty, then write the header" is race-free. It first lets the journal
  repair what a crashed flush left, then claims its appends' idempotency keys (the new ones
  are inserted in a transaction that commits only after the data), then records its intent
  (the files, their sizes before and after, the first new key), then writes each file it
  touches with ONE ``writev(2)`` of the appends' chunks (as they are: no join) on an
  ``O_APPEND`` descriptor, then checks that its lock, intent and files are still as it left
  them (:meth:`~tiny.journal.Journal.confirm`), then commits the keys' transaction (if any:
  the commit point) and marks its intent committed (the commit point of a flush without
  keys). Killed at any point, a flush leaves its rows and keys both, or neither. A flush that
  finds its lock or files changed before its commit point (:class:`~tiny.journal.LockLost`:
  its lock file replaced while it was paused) commits nothing and cuts nothing: another
  writer may hold the data dir's lock now, and the next recovery under it cuts the flush.
- Which append writes and which is answered from a stored answer is the journal's to say
  (:meth:`~tiny.journal.Journal.begin`: per key, the first append of a flush decides). An
  append that writes nothing resolves to the :class:`~tiny.journal.Stored` digest and answer,
  and the caller answers from them (the same body: replayed; another: 422). So a retry, in
  any process, never writes a batch twice.
- If a flush fails before its commit point (disk full, EFBIG, EIO, its keys' commit refused),
  every file of it is cut back to its size before, a file it created is removed, and its
  intent marked undone, all before any append is answered: a SinkError means nothing of it
  is on disk. One request's failure never fails another's write: each append of a failed
  flush is written again on its own, and only those that fail then get SinkError. A failure
  of the data dir as a whole (the lock held too long by another process, a journal
  refused: :class:`~tiny.journal.JournalError`) fails the whole group at once, without
  retries. A flush that fails after its commit point (the committed mark of a flush with
  keys) is a success: the next recovery finds its key and keeps its rows.
- A file whose last byte is not an LF (a row copied in or edited by hand) gets one before
  the flush's rows: bytes the sink did not write are never removed.
- Bounds: a flush opens at most ``max_files`` files at once and holds at most
  :data:`MAX_FLUSH_APPENDS` appends (a group commit past either is split in order; one append
  always goes whole). Each append waits for the lock at most the lock timeout from when it
  was queued, whatever waited before it (an earlier group, a /healthz probe): a flush waits
  until the first deadline of its appends; those past it get SinkError, the others are
  flushed again, ahead of anything newer, until their own.
- :meth:`DailyFileSink.append` returns a future that resolves once the flush committed
  (``fsync``: after the data, the directories of new files and the commit reached the disk),
  or fails with :class:`SinkError`. A 200 is sent only then.
- Group commit: appends that arrive while a flush is in flight go out together in the next
  one. The disk work runs on one worker thread, never on the event loop; that thread is the
  only writer of this process, so flushes are ordered. :attr:`DailyFileSink.busy_since` tells
  a watchdog how long that thread has been in one flush.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import random
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from sqlite3 import Error as SQLiteError

from tiny import layout, limits
from tiny.journal import (
    Claim,
    Flush,
    Intent,
    Journal,
    JournalError,
    LockLost,
    LockTimeout,
    Stored,
    fsync_dir,
    lock_held_past,
)
from tiny.profiling import profile

log = logging.getLogger("tiny.sink")

# Where the crash tests make a flush kill (or stop) its process; "worker-start": a worker, as it starts (tiny.worker).
CRASH_POINTS = ("before-writes", "between-writes", "after-writes", "after-commit", "after-finish", "worker-start")
MAX_FLUSH_APPENDS = limits.MAX_FLUSH_APPENDS  # appends (so keys) in one flush: bounds its transaction and expiry
_IOV_MAX = 1024  # buffers one writev(2) takes (Linux's IOV_MAX)
_APPEND = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC  # how a flush opens its files (RDWR: the last byte is read)
_REOPEN_SECONDS = 1.0  # a journal that failed to open is tried again at most this often
_STOPPING = "the server is stopping"
_WAIT_REPORTED_AFTER = 1.0  # seconds of waiting for (or another's holding of) the lock before /healthz reports it
_DEADLINE_SLACK = 0.05  # an append this close to its lock deadline fails with the flush that timed out


class SinkError(Exception):
    """The disk or the data dir refused a flush; nothing of the requests in it was kept."""


class BacklogFull(SinkError):
    """This process already holds more unwritten bytes than it may."""


def _write_fully(fd: int, parts: list[bytes]) -> None:
    """Append ``parts`` with one writev(2): no copy of them joined first (a flush of many
    appends wrote megabytes twice); more calls only after a short write (a disk filling up)."""
    views = [memoryview(part) for part in parts if part]
    first = 0
    while first < len(views):
        written = os.writev(fd, views[first : first + _IOV_MAX])
        if written == 0:  # pragma: no cover - writev(2) returns 0 only for empty buffers
            raise OSError(errno.EIO, "write returned 0")
        while written:
            if written >= len(views[first]):
                written -= len(views[first])
                first += 1
            else:
                views[first] = views[first][written:]
                written = 0


class _Append:
    """One :meth:`DailyFileSink.append`: its chunks, claim, size, the future that answers it,
    and the time.monotonic() past which it waits for the flush lock no longer."""

    __slots__ = ("chunks", "claim", "deadline", "size", "waiter")

    def __init__(
        self,
        chunks: Mapping[str, bytes],
        claim: Claim | None,
        size: int,
        waiter: asyncio.Future[Stored | None],
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
    """Appends byte chunks to files under ``data_dir``; see the module docstring for rules.

    ``headers`` maps a file suffix to the bytes that open every new file with that suffix.
    ``journal`` is the data dir's journal (default: one with ``fsync``); :meth:`open` opens
    it, or the first flush does. ``on_flush(seconds, nbytes, ok)`` is called on the event
    loop after each flush. ``crash_at`` (``"point:probability[:stop|:stop-once]"``, a point
    of CRASH_POINTS) makes a flush kill its own process there with SIGKILL (or stop it with
    SIGSTOP, the lock held; ``stop-once``: only the first process of the data dir to get
    there), for the crash tests.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        fsync: bool = False,
        max_backlog: int = limits.MAX_BACKLOG,
        max_files: int = 32,
        headers: Mapping[str, bytes] | None = None,
        journal: Journal | None = None,
        on_flush: Callable[[float, int, bool], None] | None = None,
        crash_at: str = "",
    ) -> None:
        self.data_dir = Path(data_dir)
        self._data_dir = str(self.data_dir)  # joined as a str on the hot path: Path joins cost more
        self.fsync = fsync
        self.max_backlog = max_backlog
        self.max_files = max_files
        self.headers = dict(headers or {})
        self.journal = journal or Journal(self.data_dir, fsync=fsync)
        self._on_flush = on_flush
        point, _, rest = crash_at.partition(":")
        chance, _, how = rest.partition(":")
        self._crash_point = point
        self._crash_chance = float(chance or 1) if point else 0.0
        self._crash_signal = signal.SIGSTOP if how.startswith("stop") else signal.SIGKILL
        self._crash_once = how == "stop-once"  # only the first process of the data dir to get there
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tiny-sink")
        self._pending: list[_Append] = []
        self._backlog = 0  # pending + in flight
        self._flushing: asyncio.Task[None] | None = None
        self._open_tried = -_REOPEN_SECONDS
        self._probed = -_REOPEN_SECONDS
        self._repair = False  # a flush failed to cut its files back or mark its intent: recover at close
        self._closed = False  # close() has written the last flush: appends are refused
        self._closed_ok = True  # what close() returned
        self.fault: str | None = None  # why the last flush (or opening the journal) failed; None after a success
        self.failures = 0  # appends answered with SinkError
        self.busy_since = 0.0  # time.monotonic() when the sink thread began the flush it is in; 0 when idle

    @property
    def backlog(self) -> int:
        """Bytes accepted by :meth:`append` and not yet written."""
        return self._backlog

    def open(self) -> None:
        """Open the journal now (a worker's start), so that :meth:`digest` works; on
        JournalError the sink starts faulty and tries again later (see :meth:`ready`)."""
        self._open_tried = time.monotonic()
        try:
            self.journal.open()
        except JournalError as exc:
            self.fault = str(exc)
            raise

    async def ready(self) -> None:
        """Return once the journal is open; SinkError (the reason) when it cannot be opened.
        A journal that failed is tried again at most once a second; in between, the last
        reason is raised at once."""
        if self._closed:
            raise SinkError(_STOPPING)
        if self.journal.is_open:
            return
        if time.monotonic() - self._open_tried < _REOPEN_SECONDS and self.fault:
            raise SinkError(self.fault)
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._open_on_thread)
        except JournalError as exc:
            raise SinkError(str(exc)) from None

    def _open_on_thread(self) -> None:
        if self.journal.is_open:
            return
        self._open_tried = time.monotonic()
        try:
            self.journal.open()
        except JournalError as exc:
            self.fault = str(exc)
            log.error("%s", exc)
            raise
        self.fault = None

    async def committed_sizes(self, days: list[str]) -> dict[str, int]:
        """The sizes of the day files of ``days`` (those that exist) below which every byte is
        committed: noted under the data dir's flush lock, after recovery, so that no flush is
        half-done then and no later recovery cuts below them. SinkError when the lock or the
        journal is refused. (For the live aggregates: tiny.aggregates.)"""
        await self.ready()
        names = [layout.day_file(day) for day in days]
        try:
            # Without the flush lock when no flush is under way (Journal.committed_sizes_unlocked):
            # a reader neither waits for flushes nor holds them up. A few system calls, on the
            # loop: a thread would take the GIL from it.
            unlocked = self.journal.committed_sizes_unlocked(names)
            if unlocked is not None:
                return {day: unlocked[name] for day, name in zip(days, names, strict=True) if name in unlocked}
            return await asyncio.get_running_loop().run_in_executor(self._executor, self._committed, days)
        except (JournalError, OSError, SQLiteError) as exc:
            raise SinkError(str(exc)) from None

    def _committed(self, days: list[str]) -> dict[str, int]:
        with self.journal.locked():
            self.journal.recover()
            sizes = {}
            for day in days:
                with contextlib.suppress(FileNotFoundError):
                    sizes[day] = os.stat(layout.day_path(self.data_dir, day)).st_size
            return sizes

    def trouble(self) -> str | None:
        """Why writes fail or wait now (for /healthz), or None: a wait of more than a second
        for the flush lock (and who holds it), the reason the last flush failed, or the lock
        held by another process for more than a second, seen by a try that never waits
        (tiny.journal.lock_held_past) whether or not a request of this process waits for it."""
        waiting = self.journal.waiting_since
        if waiting and time.monotonic() - waiting > _WAIT_REPORTED_AFTER:
            return (
                f"waiting {time.monotonic() - waiting:.1f} s for the data dir's flush lock, {self.journal.waiting_for}"
            )
        return self.fault or lock_held_past(self.data_dir, _WAIT_REPORTED_AFTER)

    def digest(self, body: bytes) -> bytes:
        """The journal's digest of a body (any thread; after :meth:`ready`)."""
        return self.journal.digest(body)

    def append(self, chunks: Mapping[str, bytes], claim: Claim | None = None) -> asyncio.Future[Stored | None]:
        """Queue ``{relative_path: bytes}`` for the next flush; all or nothing.

        Returns a future that resolves to None once every chunk is on disk and ``claim`` (if
        any) recorded with them, or to the Stored digest and answer of its key when the key
        was stored before, or by an earlier append of the same flush (then nothing is
        written); or raises :class:`SinkError`. Raises :class:`BacklogFull` at once,
        queueing nothing, when the backlog would exceed ``max_backlog``, and SinkError at once
        after :meth:`close` (a request that reached a stopping worker on a kept-alive
        connection: it gets a 503 to retry elsewhere, not a flush on a closed journal).
        """
        if self._closed:
            raise SinkError(_STOPPING)
        size = sum(len(data) for data in chunks.values())
        if self._backlog and self._backlog + size > self.max_backlog:
            raise BacklogFull(f"{self._backlog} bytes are waiting for the disk")
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Stored | None] = loop.create_future()
        self._pending.append(_Append(chunks, claim, size, waiter, time.monotonic() + self.journal.lock_timeout))
        self._backlog += size
        if self._flushing is None:
            self._flushing = loop.create_task(self._flush_loop())
        return waiter

    def probe(self) -> None:
        """If the last flush failed and none is under way, try the write path once more,
        writing nothing (the journal opened, the lock taken, recovery run), at most once a
        second: a fault that went away is then cleared without waiting for a request."""
        now = time.monotonic()
        if self._closed or self.fault is None or self._flushing is not None or now - self._probed < _REOPEN_SECONDS:
            return
        self._probed = now
        self._flushing = asyncio.get_running_loop().create_task(self._flush_loop(probe=True))

    async def _flush_loop(self, probe: bool = False) -> None:
        try:
            if probe:
                await self._flush([])
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
                        # The lock was not free by the first deadline of the group: the appends
                        # whose own deadline is still ahead wait on, before anything newer.
                        self._pending[:0] = [*left, *(append for rest in queue for append in rest)]
                        break
        finally:
            self._flushing = None

    async def _flush(self, group: list[_Append]) -> list[_Append] | None:
        """Write ``group`` in one flush, all or nothing. Returns None when it failed and is
        left to retry append by append (a file failure in a group of several); the appends
        still within their lock deadline when the lock was not free by the group's first
        (they are flushed again, each waiting at most until its own); otherwise [] and every
        append of it is answered (with SinkError when it failed)."""
        size = sum(append.size for append in group)
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        left: list[_Append] | None = []
        try:
            results = await loop.run_in_executor(self._executor, self._write_group, group)
        except LockTimeout as exc:
            late = time.monotonic() + _DEADLINE_SLACK
            if late >= self.journal.give_up_at:  # stopping: no wait goes on
                late = float("inf")
            left = [append for append in group if append.deadline > late]
            log.error("flush of %d bytes (%d appends) refused: %s", size, len(group) - len(left), exc)
            self._fail([append for append in group if append.deadline <= late], str(exc))
            ok = False
        except JournalError as exc:  # the data dir as a whole: retrying each append would not help
            log.error("flush of %d bytes (%d appends) refused: %s", size, len(group), exc)
            self._fail(group, str(exc))
            ok = False
        except (OSError, SQLiteError) as exc:
            log.error("flush of %d bytes (%d appends) failed: %s", size, len(group), exc)
            reason = f"the disk refused the write: {getattr(exc, 'strerror', None) or exc}"
            self.fault = reason
            if len(group) == 1:
                self._fail(group, reason)
            else:
                left = None
            ok = False
        else:
            self.fault = None
            self._answer(group, results)
            ok = True
        if self._on_flush is not None and group:  # not for a probe
            self._on_flush(time.perf_counter() - started, size, ok)
        return left

    def _answer(self, group: list[_Append], results: list[Stored | None]) -> None:
        for append, result in zip(group, results, strict=True):
            self._backlog -= append.size
            if not append.waiter.done():
                append.waiter.set_result(result)

    def _fail(self, group: list[_Append], reason: str) -> None:
        self.fault = reason
        self.failures += len(group)
        for append in group:
            self._backlog -= append.size
            if not append.waiter.done():
                append.waiter.set_exception(SinkError(reason))

    @profile
    def _write_group(self, group: list[_Append]) -> list[Stored | None]:
        """Runs on the sink thread: one journaled flush of ``group`` under the data dir's lock.
        Returns, per append, None (written) or the Stored answer of its key (not written)."""
        self.busy_since = time.monotonic()
        try:
            if not self.journal.is_open:
                if time.monotonic() - self._open_tried < _REOPEN_SECONDS and self.fault:
                    raise JournalError(self.fault)
                self._open_on_thread()
            # Each append waits for the lock at most lock_timeout from when it was queued, whatever
            # waited before it (an earlier group, a /healthz probe, a committed-sizes read).
            timeout = min((append.deadline for append in group), default=time.monotonic() + self.journal.lock_timeout)
            try:
                with self.journal.locked(max(0.0, timeout - time.monotonic())):
                    return self._write_locked(group)
            except LockTimeout:
                raise
            except JournalError:
                self.journal.close()  # reopened, with every check, by a later flush
                self._open_tried = time.monotonic()
                raise
        finally:
            self.busy_since = 0.0

    def _write_locked(self, group: list[_Append]) -> list[Stored | None]:
        self.journal.recover()
        flush = self.journal.begin([append.claim for append in group])
        pending: dict[str, list[bytes]] = {}
        for append, decision in zip(group, flush.decisions, strict=True):
            if decision is None:
                for name, data in append.chunks.items():
                    pending.setdefault(name, []).append(data)
        opened: list[tuple[int, Intent]] = []
        try:
            try:
                self._write_files(pending, flush, opened)
                self._crash("after-writes")
                flush.confirm(opened)  # the lock, the intent and the files still this flush's
                flush.commit()
            except LockLost:
                # Another writer may hold the data dir's lock now and may have written after
                # these files: nothing is cut here; the next recovery, under that lock, does it.
                flush.abort()
                self._repair = True
                raise
            except BaseException:
                flush.abort()
                self._roll_back(opened, flush)  # before any answer: a SinkError keeps nothing
                raise
            self._crash("after-commit")  # with keys: committed, the intent still live
            try:
                if not flush.finish():
                    self._repair = True
            except OSError:
                self._roll_back(opened, flush)
                raise
            self._crash("after-finish")
        finally:
            for fd, _ in opened:
                os.close(fd)
        return flush.decisions

    def _write_files(self, pending: Mapping[str, list[bytes]], flush: Flush, opened: list[tuple[int, Intent]]) -> None:
        """Append each file's chunks with one write, after the flush records its intent. Fills
        ``opened`` with each descriptor and its intent as it goes, for the caller's roll-back."""
        writes: list[tuple[int, list[bytes]]] = []
        new_dirs: set[Path] = set()
        for name in sorted(pending):
            fd, created = self._open(name)
            size = os.fstat(fd).st_size
            opened.append((fd, Intent(name, size, size, created)))  # the size after follows
            parts = pending[name]
            if size == 0:
                parts = [self.headers.get(Path(name).suffix, b""), *parts]
            elif os.pread(fd, 1, size - 1) != b"\n":
                parts = [b"\n", *parts]  # the last row someone else wrote lacks its LF: keep it whole
            opened[-1] = (fd, Intent(name, size, size + sum(map(len, parts)), created))
            writes.append((fd, parts))
            if created:
                new_dirs.add((self.data_dir / name).parent)
        if not opened:
            return
        flush.intend([intent for _, intent in opened])
        self._crash("before-writes")
        for number, (fd, parts) in enumerate(writes):
            _write_fully(fd, parts)
            if number == 0:
                self._crash("between-writes")
        if self.fsync:
            # The ack promises the rows survive a crash: the file data, and the directory
            # entry of any file this flush created, reach the disk before the commit.
            for fd, _ in opened:
                os.fsync(fd)
            for directory in new_dirs:
                fsync_dir(directory)

    def _open(self, name: str) -> tuple[int, bool]:
        """A descriptor appending to the file ``name`` (RDWR: its last byte is read), and
        whether this call created it. An existing file, the usual case, costs one open(2);
        a new one its directory (made if missing) and an O_EXCL create, so that "created"
        (which recovery removes) is only ever a file this flush made."""
        path = os.path.join(self._data_dir, name)
        try:
            return os.open(path, _APPEND), False
        except FileNotFoundError:
            pass
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            return os.open(path, _APPEND | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:  # made meanwhile by someone outside the flush lock
            return os.open(path, _APPEND), False

    def _roll_back(self, opened: list[tuple[int, Intent]], flush: Flush) -> None:
        """Cut every file of a failed flush back and mark its intent undone; if that fails
        too, the intent stays live and the next recovery (at the latest, :meth:`close`'s)
        does it."""
        try:
            for fd, intent in opened:
                if intent.created:
                    (self.data_dir / intent.name).unlink(missing_ok=True)
                else:
                    os.ftruncate(fd, intent.size_before)
            if self.fsync:
                for fd, intent in opened:
                    if not intent.created:
                        os.fsync(fd)
            flush.abandon()
        except (OSError, SQLiteError) as exc:
            self._repair = True
            log.critical("could not roll back a failed flush (the next flush will): %s", exc)

    def _crash(self, point: str) -> None:
        """Fault injection for the crash tests: SIGKILL (or SIGSTOP) this process at ``point``."""
        if point == self._crash_point and random.random() < self._crash_chance:
            if self._crash_once:
                try:
                    os.close(os.open(self.data_dir / ".tiny" / "crash-test-once", os.O_CREAT | os.O_EXCL))
                except FileExistsError:
                    return
            log.warning(
                "crash test: %s this process %s",
                "stopping" if self._crash_signal == signal.SIGSTOP else "killing",
                point,
            )
            # To this thread, not the process: a signal sent to the process is taken by its main
            # thread, and this one went on (and finished the flush) until the stop reached it.
            signal.pthread_kill(threading.get_ident(), self._crash_signal)

    async def close(self, timeout: float = limits.DRAIN_TIMEOUT) -> bool:
        """Write everything still pending within ``timeout`` seconds (the lock waited for at
        most what is left of it), then close the journal and stop the sink thread. Returns
        True when every append was written; False when some got SinkError, or the sink thread
        is stuck in a flush (its appends are then never answered: the caller exits). Appends
        that come while it waits for the flushes are written; any after that are refused. A
        second call returns what the first did (True while the first is still under way)."""
        if self._closed:
            return self._closed_ok
        deadline = time.monotonic() + timeout
        failures = self.failures
        # Waits for the lock, the one under way included, end a little before the deadline: a
        # flush that cannot get the lock then fails (503) instead of writing after the stop.
        self.journal.give_up_at = deadline - min(0.2, timeout / 4)
        loop = asyncio.get_running_loop()
        try:
            while self._flushing is not None:
                await asyncio.wait_for(asyncio.shield(self._flushing), max(0.0, deadline - time.monotonic()))
            self._closed = True  # (no await since the last flush ended: nothing is left pending)
            if self._repair:
                await asyncio.wait_for(
                    loop.run_in_executor(self._executor, self._recover), max(0.1, deadline - time.monotonic())
                )
            await asyncio.wait_for(loop.run_in_executor(self._executor, self.journal.close), 1.0)
        except TimeoutError:
            log.error("the sink thread is stuck in a flush for %.1f s; leaving it", time.monotonic() - self.busy_since)
            self._closed = True
            self._fail(self._pending, "the server stopped before this request could be written")
            self._pending = []
            self._executor.shutdown(wait=False)
            self._closed_ok = False
            return False
        self._executor.shutdown(wait=True)
        self._closed_ok = self.failures == failures and not self._repair
        return self._closed_ok

    def _recover(self) -> None:
        try:
            if not self.journal.is_open:
                self.journal.open()
            with self.journal.locked():
                self.journal.recover()
            self._repair = False
        except (OSError, SQLiteError, JournalError) as exc:
            log.error("could not repair the last failed flush before stopping: %s", exc)

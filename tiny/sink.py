"""The daily-file sink: buffered, group-committed, journaled appends to the files under DATA_DIR.

On disk (names relative to DATA_DIR, see tiny.layout): ``YYYY-MM-DD.csv``, the CRAN log rows
of that day, opened by the CSV header exactly once; ``rejects/YYYY-MM-DD.ndjson``, one JSON
object per refused line; ``.tiny/``, the journal (tiny.journal).

Locking, journal and ack rules, which hold across every process and container sharing
DATA_DIR:

- A flush holds the data dir's flush lock from start to end (every writer takes it), so
  rows of different writers never interleave, and "is the file empty, then write the
  header" is race-free. It first lets the journal repair what a crashed flush left (each file
  cut back to exactly its size before it), then claims its appends' idempotency keys (the
  new ones are inserted in a transaction that commits only after the data), then records its
  intent (the files, their sizes, the first new key), then writes each file it touches with
  ONE ``write(2)`` on an ``O_APPEND`` descriptor, then commits the keys' transaction (if
  any) and marks its intent finished (tiny.journal). Killed at any point, a flush leaves its
  rows and keys both, or neither.
- An append whose key the journal (or an earlier append of the same flush) holds already
  writes nothing: its future resolves to the :class:`~tiny.journal.Stored` digest and answer,
  and the caller answers from them. So a retry, in any process, never writes a batch twice.
- If any write of a flush fails (disk full, EFBIG, EIO), every file of it is cut back to its
  size before, a file it created is removed, and its intent dropped. One request's failure
  never fails another's write: each append of a failed flush is written again on its own, and
  only those that fail then get SinkError.
- A file whose last byte is not an LF (a row copied in or edited by hand) gets one before
  the flush's rows: bytes the sink did not write are never removed.
- Descriptors are bounded: a flush opens at most ``max_files`` files at once (a group commit
  of appends that touch more files is split in order; one append always goes whole).
- :meth:`DailyFileSink.append` returns a future that resolves once the flush committed
  (``fsync``: after the data, the directories of new files and the commit reached the disk),
  or fails with :class:`SinkError`. A 200 is sent only then.
- Group commit: appends that arrive while a flush is in flight go out together in the next
  one. The disk work runs on one worker thread, never on the event loop; that thread is the
  only writer of this process, so flushes are ordered.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import random
import signal
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from sqlite3 import Error as SQLiteError

from tiny.journal import Intent, Journal, Stored, fsync_dir
from tiny.profiling import profile

log = logging.getLogger("tiny.sink")

Key = tuple[str, bytes, bytes]  # (idempotency key, digest of the body, the answer to store)
CRASH_POINTS = ("before-writes", "between-writes", "after-writes", "after-commit", "after-finish")


class SinkError(Exception):
    """The disk refused a flush; nothing of the requests in it was kept."""


class BacklogFull(SinkError):
    """This process already holds more unwritten bytes than it may."""


def _write_fully(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written == 0:  # pragma: no cover - write(2) returns 0 only for empty buffers
            raise OSError(errno.EIO, "write returned 0")
        view = view[written:]


class _Append:
    """One :meth:`DailyFileSink.append`: its chunks, key, size and the future that answers it."""

    __slots__ = ("chunks", "key", "size", "waiter")

    def __init__(
        self, chunks: Mapping[str, bytes], key: Key | None, size: int, waiter: asyncio.Future[Stored | None]
    ) -> None:
        self.chunks = chunks
        self.key = key
        self.size = size
        self.waiter = waiter


def _groups(appends: list[_Append], max_files: int) -> list[list[_Append]]:
    """``appends`` cut, in order, into groups that touch at most ``max_files`` files each
    (a group of one append may touch more: an append is never split)."""
    groups: list[list[_Append]] = []
    files: set[str] = set()
    for append in appends:
        if groups and len(files | append.chunks.keys()) <= max_files:
            files |= append.chunks.keys()
            groups[-1].append(append)
        else:
            files = set(append.chunks)
            groups.append([append])
    return groups


class DailyFileSink:
    """Appends byte chunks to files under ``data_dir``; see the module docstring for rules.

    ``headers`` maps a file suffix to the bytes that open every new file with that suffix.
    ``journal`` is the data dir's journal (default: one with ``fsync``); the sink opens it on
    its thread. ``on_flush(seconds, nbytes, ok)`` is called on the event loop after each flush.
    ``crash_at`` (``"point:probability"``, a point of CRASH_POINTS) makes a flush kill its own
    process there with SIGKILL, for the crash tests.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        fsync: bool = False,
        max_backlog: int = 256 * 1024**2,
        max_files: int = 32,
        headers: Mapping[str, bytes] | None = None,
        journal: Journal | None = None,
        on_flush: Callable[[float, int, bool], None] | None = None,
        crash_at: str = "",
    ) -> None:
        self.data_dir = Path(data_dir)
        self.fsync = fsync
        self.max_backlog = max_backlog
        self.max_files = max_files
        self.headers = dict(headers or {})
        self.journal = journal or Journal(self.data_dir, fsync=fsync)
        self._on_flush = on_flush
        self._crash_point, _, chance = crash_at.partition(":")
        self._crash_chance = float(chance or 1) if self._crash_point else 0.0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tiny-sink")
        self._opened = False
        self._pending: list[_Append] = []
        self._backlog = 0  # pending + in flight
        self._flushing: asyncio.Task[None] | None = None

    @property
    def backlog(self) -> int:
        """Bytes accepted by :meth:`append` and not yet written."""
        return self._backlog

    def append(self, chunks: Mapping[str, bytes], key: Key | None = None) -> asyncio.Future[Stored | None]:
        """Queue ``{relative_path: bytes}`` for the next flush; all or nothing.

        Returns a future that resolves to None once every chunk is on disk and ``key`` (if
        any) recorded with them, or to the Stored digest and answer of ``key`` when it was
        stored before (then nothing is written); or raises :class:`SinkError`. Raises
        :class:`BacklogFull` at once, queueing nothing, when the backlog would exceed
        ``max_backlog``.
        """
        size = sum(len(data) for data in chunks.values())
        if self._backlog and self._backlog + size > self.max_backlog:
            raise BacklogFull(f"{self._backlog} bytes are waiting for the disk")
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Stored | None] = loop.create_future()
        self._pending.append(_Append(chunks, key, size, waiter))
        self._backlog += size
        if self._flushing is None:
            self._flushing = loop.create_task(self._flush_loop())
        return waiter

    async def _flush_loop(self) -> None:
        try:
            while self._pending:
                pending, self._pending = self._pending, []
                for group in _groups(pending, self.max_files):
                    if not await self._flush(group) and len(group) > 1:
                        # One append's failure (a day file the disk refuses) must not fail the
                        # others: each is written on its own now, in order.
                        for append in group:
                            await self._flush([append])
        finally:
            self._flushing = None

    async def _flush(self, group: list[_Append]) -> bool:
        """Write ``group`` in one flush, all or nothing. On success its appends are answered;
        on failure only a group of one is (with SinkError): a bigger one is left to retry."""
        size = sum(append.size for append in group)
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(
                self._executor, self._write_group, [(append.chunks, append.key) for append in group]
            )
        except (OSError, SQLiteError) as exc:
            log.error("flush of %d bytes (%d appends) failed: %s", size, len(group), exc)
            if len(group) == 1:
                reason = getattr(exc, "strerror", None) or exc
                self._answer(group, [None], SinkError(f"the disk refused the write: {reason}"))
            ok = False
        else:
            self._answer(group, results, None)
            ok = True
        if self._on_flush is not None:
            self._on_flush(time.perf_counter() - started, size, ok)
        return ok

    def _answer(self, group: list[_Append], results: list[Stored | None], error: SinkError | None) -> None:
        for append, result in zip(group, results, strict=True):
            self._backlog -= append.size
            if append.waiter.done():
                continue
            if error is None:
                append.waiter.set_result(result)
            else:
                append.waiter.set_exception(error)

    @profile
    def _write_group(self, group: list[tuple[Mapping[str, bytes], Key | None]]) -> list[Stored | None]:
        """Runs on the sink thread: one journaled flush of ``group`` under the data dir's lock.
        Returns, per append, None (written) or the Stored answer of its key (not written)."""
        if not self._opened:
            self.journal.open()
            self._opened = True
        with self.journal.locked():
            self.journal.recover()
            distinct = {key[0]: key for _, key in group if key is not None}  # the first of each
            held = self.journal.claim(list(distinct.values()))
            try:
                results: list[Stored | None] = []
                pending: dict[str, list[bytes]] = {}
                first_key = None
                for chunks, key in group:
                    if key is not None:
                        if key[0] in held:  # stored before, or by an earlier append of this flush
                            results.append(held[key[0]])
                            continue
                        held[key[0]] = Stored(key[1], key[2])
                        first_key = first_key or key[0]
                    results.append(None)
                    for name, data in chunks.items():
                        pending.setdefault(name, []).append(data)
                self._write_files(pending, first_key)
                self._crash("after-writes")
                self.journal.commit()
            except BaseException:
                self.journal.rollback()
                raise
            self._crash("after-commit")  # the keys are recorded, the intent is still there
            self.journal.finish()
            self._crash("after-finish")
        return results

    def _write_files(self, pending: Mapping[str, list[bytes]], first_key: str | None) -> None:
        """Append each file's chunks with one write, after recording the intent (with the
        first key the flush will record); all or nothing."""
        opened: list[tuple[int, Intent]] = []
        new_dirs: set[Path] = set()
        try:
            for name in sorted(pending):
                path = self.data_dir / name
                path.parent.mkdir(parents=True, exist_ok=True)  # one stat when it exists
                try:
                    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
                    created = True
                except FileExistsError:
                    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)  # RDWR: the last byte is read
                    created = False
                opened.append((fd, Intent(name, os.fstat(fd).st_size, created)))
                if created:
                    new_dirs.add(path.parent)
            if opened:
                self.journal.intend([intent for _, intent in opened], first_key)
            self._crash("before-writes")
            for number, (fd, intent) in enumerate(opened):
                data = b"".join(pending[intent.name])
                if intent.size_before == 0:
                    data = self.headers.get(Path(intent.name).suffix, b"") + data
                elif os.pread(fd, 1, intent.size_before - 1) != b"\n":
                    data = b"\n" + data  # the last row someone else wrote lacks its LF: keep it whole
                _write_fully(fd, data)
                if number == 0:
                    self._crash("between-writes")
            if self.fsync:
                # The ack promises the rows survive a crash: the file data, and the directory
                # entry of any file this flush created, reach the disk before the commit.
                for fd, _ in opened:
                    os.fsync(fd)
                for directory in new_dirs:
                    fsync_dir(directory)
        except BaseException:
            self._roll_back(opened)
            raise
        finally:
            for fd, _ in opened:
                os.close(fd)

    def _roll_back(self, opened: list[tuple[int, Intent]]) -> None:
        """Cut every file of a failed flush back and drop its intent; if that fails too, the
        intent stays and the next flush's recovery does it."""
        try:
            for fd, intent in opened:
                if intent.created:
                    (self.data_dir / intent.name).unlink(missing_ok=True)
                else:
                    os.ftruncate(fd, intent.size_before)
            if opened:
                self.journal.abandon()
        except (OSError, SQLiteError) as exc:
            log.critical("could not roll back a failed flush (the next flush will): %s", exc)

    def _crash(self, point: str) -> None:
        """Fault injection for the crash tests: SIGKILL this process at ``point`` (see crash_at)."""
        if point == self._crash_point and random.random() < self._crash_chance:
            log.warning("crash test: killing this process %s", point)
            os.kill(os.getpid(), signal.SIGKILL)

    async def close(self) -> None:
        """Write everything still pending, then close the journal and stop the sink thread."""
        while self._flushing is not None:
            await self._flushing
        if self._opened:
            await asyncio.get_running_loop().run_in_executor(self._executor, self.journal.close)
        self._executor.shutdown(wait=True)

"""The daily-file sink: buffered, group-committed appends to the files under DATA_DIR.

On disk (names relative to DATA_DIR):

- ``YYYY-MM-DD.csv``: the CRAN log rows of that day. The first write to an empty file
  puts the CSV header in front of its rows, so the header is there exactly once.
- ``rejects/YYYY-MM-DD.ndjson``: one JSON object per refused line (see handlers).

Locking and ack rules, which hold across every process and container sharing DATA_DIR:

- Each flush writes each file it touches with ONE ``write(2)`` on an ``O_APPEND`` descriptor,
  under an exclusive ``flock``. Every writer takes the lock, so rows of different writers
  never interleave, and the "is the file empty, then write the header" check is race-free.
- A file that does not end in LF was left by a writer killed inside its write(2); the
  next writer cuts that partial, never-acknowledged line before appending.
- Locks are taken in sorted path order, so two flushes that touch the same files can never
  deadlock, and all locks of a flush are held until it is done: if any write fails (disk
  full, EFBIG, EIO), every file of the flush is truncated back to its size before the flush,
  and a file the flush created is removed, so no partial line, no row of a refused request
  and no empty file stays on disk. A writer that finds its locked file removed (st_nlink 0)
  opens the path again.
- One request's failure never fails another's write: when a flush of several appends fails,
  each append is written again on its own, and only those that fail then get SinkError.
- Descriptors are bounded: a flush opens at most ``max_files`` files at once (a group commit
  of appends that touch more files is split in order; one append always goes whole).
- :meth:`DailyFileSink.append` returns a future that resolves once the data is written
  (``durability="write"``: after write(2); ``"fsync"``: after fsync of each file and, for
  new files, their directory), or fails with :class:`SinkError`. A 200 is sent only then.
- Group commit: appends that arrive while a flush is in flight are buffered and go out
  together in the next flush. The disk work runs on one worker thread, never on the event
  loop; that thread is the only writer of this process, so flushes are ordered.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tiny.profiling import profile

log = logging.getLogger("tiny.sink")


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


def _repair_torn_tail(fd: int, size: int, path: Path) -> int:
    """Cut a partial last line (a writer killed inside write(2)); returns the new size.

    Called under the file's lock. A partial line was never acknowledged (acks follow the
    whole write), so dropping it loses nothing and keeps every line whole.
    """
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return size
    end = size
    while end > 0:
        start = max(0, end - 65536)
        block = os.pread(fd, end - start, start)
        cut = block.rfind(b"\n")
        if cut >= 0:
            end = start + cut + 1
            break
        end = start
    log.warning("%s ended in a partial line: cut %d bytes a killed writer left", path, size - end)
    os.ftruncate(fd, end)
    return end


class _Append:
    """One :meth:`DailyFileSink.append`: its chunks, its size and the future that answers it."""

    __slots__ = ("chunks", "size", "waiter")

    def __init__(self, chunks: Mapping[str, bytes], size: int, waiter: asyncio.Future[None]) -> None:
        self.chunks = chunks
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
    ``on_flush(seconds, nbytes, ok)`` is called on the event loop after each flush.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        fsync: bool = False,
        max_backlog: int = 256 * 1024**2,
        max_files: int = 32,
        headers: Mapping[str, bytes] | None = None,
        on_flush: Callable[[float, int, bool], None] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.fsync = fsync
        self.max_backlog = max_backlog
        self.max_files = max_files
        self.headers = dict(headers or {})
        self._on_flush = on_flush
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tiny-sink")
        self._pending: list[_Append] = []
        self._backlog = 0  # pending + in flight
        self._flushing: asyncio.Task[None] | None = None

    @property
    def backlog(self) -> int:
        """Bytes accepted by :meth:`append` and not yet written."""
        return self._backlog

    def append(self, chunks: Mapping[str, bytes]) -> asyncio.Future[None]:
        """Queue ``{relative_path: bytes}`` for the next flush; all or nothing.

        Returns a future that resolves when every chunk is on disk, or raises
        :class:`SinkError`. Raises :class:`BacklogFull` at once, queueing nothing, when
        the backlog would exceed ``max_backlog``.
        """
        size = sum(len(data) for data in chunks.values())
        if self._backlog and self._backlog + size > self.max_backlog:
            raise BacklogFull(f"{self._backlog} bytes are waiting for the disk")
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._pending.append(_Append(chunks, size, waiter))
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
        merged: dict[str, list[bytes]] = {}
        for append in group:
            for name, data in append.chunks.items():
                merged.setdefault(name, []).append(data)
        size = sum(append.size for append in group)
        started = time.perf_counter()
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._write_all, merged)
        except OSError as exc:
            log.error("flush of %d bytes (%d appends) failed: %s", size, len(group), exc)
            if len(group) == 1:
                self._answer(group, SinkError(f"the disk refused the write: {exc.strerror or exc}"))
            ok = False
        else:
            self._answer(group, None)
            ok = True
        if self._on_flush is not None:
            self._on_flush(time.perf_counter() - started, size, ok)
        return ok

    def _answer(self, group: list[_Append], error: SinkError | None) -> None:
        for append in group:
            self._backlog -= append.size
            if append.waiter.done():
                continue
            if error is None:
                append.waiter.set_result(None)
            else:
                append.waiter.set_exception(error)

    def _open_locked(self, path: Path) -> tuple[int, bool]:
        """``path`` opened for appending and exclusively flocked; whether this call created it."""
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
                created = True
            except FileExistsError:
                fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)  # RDWR: the tail check reads
                created = False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if os.fstat(fd).st_nlink:
                    return fd, created
            except BaseException:
                os.close(fd)
                raise
            # Removed while we waited for its lock (a failed flush of another writer that had
            # created it): appending there would write into a file nobody sees. Open again.
            os.close(fd)

    @profile
    def _write_all(self, pending: Mapping[str, list[bytes]]) -> None:
        """Runs on the sink thread: one locked O_APPEND write per file, all or nothing."""
        opened: list[tuple[int, int, Path | None]] = []  # (fd, size before this flush, path if created)
        new_dirs: set[Path] = set()
        try:
            for name in sorted(pending):  # sorted: one lock order for every process
                path = self.data_dir / name
                path.parent.mkdir(parents=True, exist_ok=True)  # one stat when it exists
                fd, created = self._open_locked(path)
                try:
                    size = _repair_torn_tail(fd, os.fstat(fd).st_size, path)
                except BaseException:
                    os.close(fd)
                    raise
                opened.append((fd, size, path if created else None))
                data = b"".join(pending[name])
                if size == 0:
                    data = self.headers.get(path.suffix, b"") + data
                    new_dirs.add(path.parent)
                _write_fully(fd, data)
            if self.fsync:
                # The ack promises the rows survive a crash: flush the file data, and the
                # directory entry of any file this flush created.
                for fd, _, _ in opened:
                    os.fsync(fd)
                for directory in new_dirs:
                    self._fsync_dir(directory)
        except BaseException:
            for fd, size, new_file in opened:
                try:
                    if new_file is not None:
                        new_file.unlink()  # under its lock: a waiting writer sees st_nlink 0
                    else:
                        os.ftruncate(fd, size)
                except OSError as exc:  # pragma: no cover - nothing more can be done
                    log.critical("could not roll back %s to %d bytes: %s", fd, size, exc)
            raise
        finally:
            for fd, _, _ in opened:
                os.close(fd)  # closing the descriptor releases its flock

    @staticmethod
    def _fsync_dir(directory: Path) -> None:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    async def close(self) -> None:
        """Write everything still pending, then stop the sink thread."""
        while self._flushing is not None:
            await self._flushing
        self._executor.shutdown(wait=True)

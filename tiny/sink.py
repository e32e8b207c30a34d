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
  so no partial line and no row of a refused request stays on disk.
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
        headers: Mapping[str, bytes] | None = None,
        on_flush: Callable[[float, int, bool], None] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.fsync = fsync
        self.max_backlog = max_backlog
        self.headers = dict(headers or {})
        self._on_flush = on_flush
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tiny-sink")
        self._pending: dict[str, list[bytes]] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._pending_bytes = 0
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
        for name, data in chunks.items():
            self._pending.setdefault(name, []).append(data)
        self._waiters.append(waiter)
        self._pending_bytes += size
        self._backlog += size
        if self._flushing is None:
            self._flushing = loop.create_task(self._flush_loop())
        return waiter

    async def _flush_loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._waiters:
                pending, waiters, size = self._pending, self._waiters, self._pending_bytes
                self._pending, self._waiters, self._pending_bytes = {}, [], 0
                started = time.perf_counter()
                try:
                    await loop.run_in_executor(self._executor, self._write_all, pending)
                except OSError as exc:
                    log.error("flush of %d bytes failed: %s", size, exc)
                    error = SinkError(f"the disk refused the write: {exc.strerror or exc}")
                    for waiter in waiters:
                        if not waiter.done():
                            waiter.set_exception(error)
                    ok = False
                else:
                    for waiter in waiters:
                        if not waiter.done():
                            waiter.set_result(None)
                    ok = True
                finally:
                    self._backlog -= size
                if self._on_flush is not None:
                    self._on_flush(time.perf_counter() - started, size, ok)
        finally:
            self._flushing = None

    @profile
    def _write_all(self, pending: Mapping[str, list[bytes]]) -> None:
        """Runs on the sink thread: one locked O_APPEND write per file, all or nothing."""
        opened: list[tuple[int, int]] = []  # (fd, size before this flush)
        new_dirs: set[Path] = set()
        try:
            for name in sorted(pending):  # sorted: one lock order for every process
                path = self.data_dir / name
                path.parent.mkdir(parents=True, exist_ok=True)  # one stat when it exists
                fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)  # RDWR: tail check
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    size = os.fstat(fd).st_size
                except BaseException:
                    os.close(fd)
                    raise
                size = _repair_torn_tail(fd, size, path)
                opened.append((fd, size))
                data = b"".join(pending[name])
                if size == 0:
                    data = self.headers.get(path.suffix, b"") + data
                    new_dirs.add(path.parent)
                _write_fully(fd, data)
            if self.fsync:
                # The ack promises the rows survive a crash: flush the file data, and the
                # directory entry of any file this flush created.
                for fd, _ in opened:
                    os.fsync(fd)
                for directory in new_dirs:
                    self._fsync_dir(directory)
        except BaseException:
            for fd, size in opened:
                try:
                    os.ftruncate(fd, size)
                except OSError as exc:  # pragma: no cover - nothing more can be done
                    log.critical("could not roll back %s to %d bytes: %s", fd, size, exc)
            raise
        finally:
            for fd, _ in opened:
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

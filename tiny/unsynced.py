"""A SQLite store kept without fsync, trusted only by the boot of the machine that wrote it.

The aggregate store (tiny.aggregates) is a summary of the day files: SQLite at
``synchronous=OFF`` never waits for the disk, which took ingest p99 from 1.41x to 1.19x of
itself beside the downloads API's readers (BENCHMARKS.md: the store's checkpoints fsynced on
the journal's disk). A process killed with -9 loses nothing that way (its writes are in the
kernel's page cache, which every process of the machine reads); the MACHINE stopping (power
loss, a kernel panic) may leave the file torn: pages of one transaction on disk and not those
of another, which no integrity check can tell from a good store (a count and the offset it
was counted up to disagreeing is still a valid database).

So a marker file beside the store (``aggregates.boot``) says which writes it may hold:

- this boot's id (the kernel's ``/proc/sys/kernel/random/boot_id``, shared by every process
  and container of the machine): unsynced writes of this boot, trusted by this boot only;
- ``synced``: everything written is on disk (:meth:`Marker.mark_synced`, after an fsync of the
  store under its write lock: a server's graceful stop): trusted by any boot;
- anything else, or no marker: the store may be torn; :meth:`Marker.admit` deletes it before
  it is opened, and the folds count the day files again (an upgrade from a store that had no
  marker counts once more too).

The contract, for the store's owner:

- :meth:`Marker.admit` before connecting (it holds ``aggregates.lock`` meanwhile, the store's
  opening and its set-up included, so that two processes never both judge one store);
- :meth:`Marker.before_write` inside every write transaction, before its first write: the
  marker names this boot, on disk, before any unsynced byte is written under it;
- :meth:`Marker.mark_synced` with the store's write lock held, after fsyncing its files;
- :func:`close` to close each connection: SQLite checkpoints the store when its last
  connection closes, then deletes the write-ahead log, and at ``synchronous=OFF`` nothing is
  fsynced between the two; after a sync, that could leave a torn store marked ``synced``.

Without a boot id (not Linux), nothing is marked and the store keeps ``synchronous=NORMAL``
(:data:`BOOT` is None).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from tiny.files import fsync_dir, write_durably

log = logging.getLogger("tiny.aggregates")

SYNCED = "synced"
_SIDE_FILES = ("-wal", "-shm", "-journal")


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


BOOT = _boot_id()


class Marker:
    """The marker of the store at ``store`` (its path): see the module docstring."""

    def __init__(self, store: Path) -> None:
        self.store = store
        self.path = store.with_name(store.stem + ".boot")
        self._lock = store.with_name(store.stem + ".lock")
        self._seen: tuple[int, int, int] | None = None  # (inode, size, mtime_ns) of a marker naming BOOT

    @contextlib.contextmanager
    def admit(self, timeout: float) -> Iterator[None]:
        """Hold the store's lock (waiting up to ``timeout`` seconds); delete the store if it is
        not trusted, and mark it as this boot's unless it is synced. The caller opens it
        meanwhile."""
        fd = _lock(self._lock, timeout)
        try:
            boot = BOOT
            if boot is None:
                yield
                return
            text = self._read()
            if text not in (boot, SYNCED) and any(_exists(self.store, side) for side in ("", *_SIDE_FILES)):
                log.warning(
                    "the aggregate store %s may hold writes lost when the machine stopped (its marker says %r): "
                    "deleted, the day files are counted again",
                    self.store,
                    text,
                )
                for side in ("", *_SIDE_FILES):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(f"{self.store}{side}")
            if text not in (boot, SYNCED):
                self._mark(boot)  # (a synced store stays so until its first write: before_write)
            yield
        finally:
            os.close(fd)

    def before_write(self) -> None:
        """Make sure, on disk, that the marker names this boot (a stat when it already did)."""
        boot = BOOT
        if boot is None:
            return
        try:
            stat = os.stat(self.path)
            # (A marker saying "synced" is shorter than a boot id: it never passes for one
            # seen before, even in a reused inode within one tick of the clock.)
            if (stat.st_ino, stat.st_size, stat.st_mtime_ns) == self._seen:
                return
        except FileNotFoundError:
            pass
        if self._read() != boot:
            self._mark(boot)
        else:
            self._remember()

    def mark_synced(self) -> None:
        """Say that every write of the store is on disk: call with its write lock held, after
        fsyncing its files."""
        if BOOT is not None:
            self._mark(SYNCED)

    def _read(self) -> str | None:
        try:
            return self.path.read_text().strip()
        except FileNotFoundError:
            return None

    def _mark(self, text: str) -> None:
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.{threading.get_ident()}")
        write_durably(tmp, f"{text}\n".encode())
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)
        self._seen = None
        if text == BOOT:
            self._remember()

    def _remember(self) -> None:
        stat = os.stat(self.path)
        self._seen = (stat.st_ino, stat.st_size, stat.st_mtime_ns)


def close(db: sqlite3.Connection, marker: Marker) -> None:
    """Close ``db``, a connection to the store of ``marker``, at ``synchronous=NORMAL``: a
    checkpoint on close then fsyncs the store before the write-ahead log is deleted. When the
    setting cannot be changed, the marker names this boot again first (the store is judged
    unsynced, as it may be)."""
    if BOOT is not None:
        try:
            db.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error:
            with contextlib.suppress(OSError):
                marker.before_write()
    db.close()


def fsync_files(store: Path) -> None:
    """fsync the store and its write-ahead log (the files that exist)."""
    for side in ("", "-wal"):
        try:
            fd = os.open(f"{store}{side}", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _exists(store: Path, side: str) -> bool:
    return os.path.exists(f"{store}{side}")


def _lock(path: Path, timeout: float) -> int:
    """An exclusive flock on ``path`` (created if missing), as a descriptor to close. Checked to
    be on the file now at ``path`` (one deleted meanwhile would lock nobody out)."""
    deadline = time.monotonic() + timeout
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} was replaced again and again for {timeout:.0f} s")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{path} held by another process for {timeout:.0f} s") from None
                    time.sleep(0.005)
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)

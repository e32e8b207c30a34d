"""The data dir's flush lock: two flocks every writer holds for the whole of a flush, and the holder's record.

On disk, ``.tiny/lock`` (tiny.layout): bytes 0-63, the data dir's id and an LF (written once,
when the data dir's journal is created: a lock file that lacks it was deleted or replaced);
bytes 64-191, the holder's record, ``pid host time`` padded to 127 bytes and an LF, written by
every holder with one ``pwrite`` as soon as it holds the lock, whatever it does under it (a
flush, opening the journal, a backup, a read of the committed sizes), so that whoever waits can
name it. Nothing else is ever written to it.

The lock is an exclusive ``flock`` on the lock file, then one on the intent file
(``.tiny/intent``, tiny.intent): the *fence*. A writer that still holds the intent's flock
after its lock file was replaced under it (a process or container paused mid-flush) keeps every
other writer, which took the new lock file's flock, from opening, recovering or overwriting
that flush until it ends. Both are taken in that order and released in the other (the intent's
first, so that whoever gets the lock file's next finds the intent's free). "Held" means only
that: this process holds both flocks (see :meth:`FlushLock.holding`).

Rules:

- A :class:`FlushLock` belongs to one thread; :attr:`FlushLock.waiting_since` and
  :attr:`FlushLock.waiting_for` may be read from any thread.
- Every wait is bounded: :meth:`FlushLock.holding` waits at most its timeout (and never past
  :attr:`FlushLock.give_up_at`), then raises :class:`LockTimeout` naming the holder.
- The caller owns the intent file's descriptor (:attr:`FlushLock.fence_fd`: set it once the
  intent file is open, reset it to -1 before closing it); the lock closes only its own.
- :func:`held_elsewhere` reads, without waiting, whether another process holds the lock (for
  /healthz on the event loop); it takes no part in the lock.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from tiny import layout
from tiny.commit.errors import Refused, Unavailable
from tiny.refusals import Found

HOLDER_AT = 64  # the lock file: the data dir's id on its first line, the holder's record from here
HOLDER_BYTES = 128  # the holder's record: "pid host time", padded, one pwrite
_POLL_FIRST, _POLL_MAX = 0.0002, 0.002  # seconds between two tries of a busy lock, doubling
_NOTE_EVERY = 0.5  # seconds between two readings of the holder while waiting


class LockTimeout(Unavailable):
    """Another writer held the data dir's flush lock longer than the wait allowed."""


class Holding:
    """The flush lock, held by this process: released on leaving the ``with`` block."""

    __slots__ = ("_lock",)

    def __init__(self, lock: FlushLock) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class FlushLock:
    """The flush lock of ``data_dir``; see the module docstring. :meth:`open` it first."""

    def __init__(self, data_dir: Path, lock_timeout: float) -> None:
        self.data_dir = data_dir
        self.path = layout.lock_path(data_dir)
        self.fence_path = layout.intent_path(data_dir)
        self.lock_timeout = lock_timeout
        self.fd = -1
        self.fence_fd = -1  # the intent file's descriptor (its owner's): the fence
        self.waiting_since = 0.0  # time.monotonic() since this process waits for the lock; 0 when not
        self.waiting_for = ""  # while it waits: who holds the lock (refreshed twice a second)
        self.give_up_at = float("inf")  # time.monotonic() past which no wait goes on (a stop)
        self._host = socket.gethostname().encode()[:100]

    def open(self) -> None:
        """Open (creating it if missing) the lock file; Refused when it cannot be."""
        self.fd = open_fd(self.path, os.O_RDWR | os.O_CREAT)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def holding(self, timeout: float | None = None) -> Holding:
        """Take both flocks, waiting at most ``timeout`` (default ``lock_timeout``) seconds in
        all; use as ``with lock.holding(): ...``. Records this process as the holder as soon as
        it holds the lock file's, then takes the fence, then checks that both files are still
        linked (Found otherwise: one deleted or replaced while a server ran)."""
        deadline = time.monotonic() + (self.lock_timeout if timeout is None else timeout)
        self._acquire(self.fd, deadline, fence=False)
        try:
            self.write_holder()
            self._acquire(self.fence_fd, deadline, fence=True)
            self.check_linked()
        except BaseException:
            self.release()
            raise
        return Holding(self)

    def holding_lock_file(self, timeout: float) -> Holding:
        """The lock file's flock alone, holder recorded: opening a data dir, before its intent
        file is known to be the one to fence (then :meth:`take_fence`)."""
        self._acquire(self.fd, time.monotonic() + timeout, fence=False)
        try:
            self.write_holder()
        except BaseException:
            self.release()
            raise
        return Holding(self)

    def take_fence(self, deadline: float) -> None:
        """With the lock file's flock held: the intent file's too, waiting until ``deadline``."""
        self._acquire(self.fence_fd, deadline, fence=True)

    def release(self) -> None:
        for fd in (self.fence_fd, self.fd):
            if fd >= 0:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def write_holder(self) -> None:
        """Record this process as the holder (one pwrite). Lock held."""
        record = b"%d %s %.3f" % (os.getpid(), self._host, time.time())
        os.pwrite(self.fd, record.ljust(HOLDER_BYTES - 1) + b"\n", HOLDER_AT)

    def data_dir_id(self) -> str:
        """The data dir's id, as the lock file's first line holds it ("" when it holds none)."""
        return os.pread(self.fd, HOLDER_AT, 0).strip(b"\0 \n").decode(errors="replace")

    def write_id(self, dir_id: str) -> None:
        """A new data dir's lock file: its id, then this process as the holder. Lock held."""
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, dir_id.encode().ljust(HOLDER_AT - 1) + b"\n", 0)
        self.write_holder()

    def take_new_file(self) -> None:
        """The lock file was moved aside (a fresh journal): open a new one at the path and
        hold it (new: nobody else can know it yet), then let the old one go. Lock held."""
        old = self.fd
        self.fd = open_fd(self.path, os.O_RDWR | os.O_CREAT)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        os.close(old)
        self.write_holder()

    def still_linked(self) -> bool:
        """The lock file is still at its path (deleted, or replaced by a rename, it has no link)."""
        return os.fstat(self.fd).st_nlink > 0

    def check_linked(self) -> None:
        """Found unless the lock and intent files are both still linked (one fstat each)."""
        for fd, path in ((self.fd, self.path), (self.fence_fd, self.fence_path)):
            if fd >= 0 and os.fstat(fd).st_nlink == 0:
                raise Found(f"{path} was deleted or replaced while the server ran; its writes stop")

    def holder(self) -> str:
        """Who holds (or last held) the lock, and since when, as its holder recorded it."""
        try:
            return describe_holder(os.pread(self.fd, HOLDER_BYTES, HOLDER_AT))
        except OSError:
            return "its holder is unknown"

    def _acquire(self, fd: int, deadline: float, fence: bool) -> None:
        # A blocking flock can be given no timeout (nor be interrupted on a thread that is not
        # the main one), so a busy lock is polled: every 0.2 ms at first, then every 2 ms.
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        started = noted = time.monotonic()
        pause = _POLL_FIRST
        self.waiting_for = self._waited_for(fence)
        self.waiting_since = started
        try:
            while True:
                time.sleep(max(0.0, min(pause, min(deadline, self.give_up_at) - time.monotonic())))
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return
                except BlockingIOError:
                    pass
                if time.monotonic() - noted > _NOTE_EVERY:
                    self.waiting_for, noted = self._waited_for(fence), time.monotonic()
                if time.monotonic() >= min(deadline, self.give_up_at):
                    raise LockTimeout(
                        f"the data dir's flush lock {self.path} was not free within "
                        f"{time.monotonic() - started:.1f} s: {self._waited_for(fence)}"
                    )
                pause = min(2 * pause, _POLL_MAX)
        finally:
            self.waiting_since = 0.0

    def _waited_for(self, fence: bool) -> str:
        if not fence:
            return self.holder()
        return (
            f"its intent file {self.fence_path} is held by a writer that does not hold "
            f"the lock file: the lock file was deleted or replaced while that writer was in a flush "
            f"(a paused process or container); nothing can be written until it ends ({flock_holders(self.fence_fd)})"
        )


def open_fd(path: Path, flags: int) -> int:
    """``os.open`` with O_CLOEXEC; Refused, naming the path, when it fails."""
    try:
        return os.open(path, flags | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise Refused(f"cannot open {path}: {exc.strerror or exc}") from None


def describe_holder(record: bytes) -> str:
    try:
        fields = record.split()
        pid, host, since = int(fields[0]), fields[1].decode(errors="replace"), float(fields[2])
    except (ValueError, IndexError):
        return "its holder is unknown"
    return f"held by pid {pid} on {host} since {time.time() - since:.1f} s"


def held_elsewhere(data_dir: Path, seconds: float) -> str | None:
    """Whether another process holds the data dir's flush lock now, by its holder's record for
    longer than ``seconds``, or holds the intent's flock without the lock (the fence of a
    writer whose lock file was replaced): then who and since when; else None. Never waits
    (non-blocking tries on descriptors of its own, released at once; a few system calls). A
    record of this process (its own sink in a flush) is not reported here."""
    try:
        fd = os.open(layout.lock_path(data_dir), os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None  # no lock file: the journal's own checks say so
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fields = os.pread(fd, HOLDER_BYTES, HOLDER_AT).split()
            try:
                since = float(fields[2])
            except (ValueError, IndexError):
                since = 0.0  # no record: held, by whom is not known
            mine = fields[:1] == [str(os.getpid()).encode()] and fields[1:2] == [socket.gethostname().encode()[:100]]
            if time.time() - since > seconds and not mine:
                return f"the data dir's flush lock {layout.lock_path(data_dir)} is {describe_holder(b' '.join(fields))}"
            return None
        try:
            return _fenced(data_dir)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _fenced(data_dir: Path) -> str | None:
    """With the lock file's flock held: whether someone holds the intent's (a writer whose lock
    file was replaced, still in its flush), and who; a non-blocking try, released at once."""
    try:
        fd = os.open(layout.intent_path(data_dir), os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return (
            f"the intent file {layout.intent_path(data_dir)} is held by a writer that does not hold the lock file "
            f"(it was replaced while that writer was in a flush; {flock_holders(fd)})"
        )
    finally:
        os.close(fd)  # (closing releases a flock taken on it)
    return None


def flock_holders(fd: int) -> str:
    """The pids /proc/locks names as holding a flock on the file of ``fd`` (for a message)."""
    try:
        stat = os.fstat(fd)
        device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            pids = sorted({f.split()[4] for f in locks if f.split()[1:2] == ["FLOCK"] and device in f.split()})
    except (OSError, IndexError):
        return "its pid is unknown"
    others = [pid for pid in pids if pid != str(os.getpid())]
    return f"held by pid {', '.join(others)}" if others else "its pid is unknown"

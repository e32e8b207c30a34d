"""What a host's follower tells the rest of its server, in memory shared across the fork.

Cluster mode runs one follower process per host (tiny.follower); its server's parent made
this memory before forking it and the workers, so every one of them maps the same pages (an
anonymous shared mapping: no file, no cleanup; tiny.heartbeat does the same for workers).

The follower alone writes :class:`FollowerStatus`:

- its progress, under a seqlock (a counter made odd while the fields change, even once they
  are whole; a reader tries again until it reads the same even count before and after, at
  most :data:`_TRIES` times, then gives its last whole reading: never a torn one, and never a
  wait on a writer killed in the middle of a write):
  ``applied`` (the position its files hold, committed with them: -1 until it has opened the
  data dir), ``head`` (the newest position the log had when it last looked), ``behind_since``
  (time.monotonic() since it has been behind that head; 0 when caught up), and its error
  (why it cannot follow now: no primary, the log trimmed past it, a disk that refuses its
  files...; empty when it follows) with the time it began;
- its liveness, two doubles outside the seqlock, written by its beat thread
  (:data:`tiny.heartbeat.BEAT_SECONDS`): when its process last ran, and since when its main
  thread is in one operation (0 when it waits for work). The parent (tiny.prefork) kills and
  replaces a follower that stops beating or stays in one operation past its bound.

The workers read it: a read waits until ``applied`` reaches the position it needs
(tiny.readwait), /healthz and /metrics report it (tiny.handlers.status). All times are
CLOCK_MONOTONIC, the same clock in every process.
"""

from __future__ import annotations

import mmap
import struct
import time
from dataclasses import dataclass

_PROGRESS = struct.Struct("<Qqqdd")  # seq, applied, head, behind_since, error_since
_ERROR_AT = _PROGRESS.size
_ERROR_BYTES = 512  # the error's text, UTF-8, cut to fit, NUL-padded
_LIFE_AT = _ERROR_AT + _ERROR_BYTES
_LIFE = struct.Struct("<dd")  # beat, busy_since
_SIZE = _LIFE_AT + _LIFE.size
_TRIES = 1000  # reads of a seqlock being written before the last whole reading is given again
NOT_RUNNING_AFTER = 2.0  # seconds without a beat after which the follower counts as not running
REPORTED_AFTER = 1.0  # seconds an error lasts before /healthz and the reads report it
# Seconds at least as long as any one operation of the follower but its wait for the data dir's
# lock: a read of the log (a connect, 2 s per node, the statement's 4 s, the standby's 2 s), a
# report, a look at the head, a round of retention (2 s and one statement), its flush's writes.
OPERATION_SECONDS = 30.0


def busy_bound(lock_timeout: float) -> float:
    """Seconds the follower may stay in one operation before it counts as stuck (/healthz,
    the reads); its parent replaces it after ``--stall-timeout`` more."""
    return lock_timeout + OPERATION_SECONDS


@dataclass(frozen=True, slots=True)
class Progress:
    """One consistent reading of the follower's progress."""

    applied: int  # -1: not known yet
    head: int
    behind_since: float
    error: str
    error_since: float

    def lag(self) -> int:
        """Positions the host is behind the head it last saw (0 when not known)."""
        return max(0, self.head - self.applied) if self.applied >= 0 else 0

    def lag_seconds(self, now: float | None = None) -> float:
        """Seconds the host has been behind (0 when caught up)."""
        if not self.behind_since:
            return 0.0
        return max(0.0, (time.monotonic() if now is None else now) - self.behind_since)


class FollowerStatus:
    """The shared status of one host's follower; see the module docstring."""

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, _SIZE)  # MAP_SHARED | MAP_ANONYMOUS, zeroed
        self._seq = 0
        self._last = Progress(-1, 0, 0.0, "", 0.0)  # this process's last whole reading
        self._write(-1, 0, 0.0, "", 0.0)

    # -- the follower's side ----------------------------------------------------------------

    def publish(self, applied: int, head: int, error: str = "") -> None:
        """The follower's progress (``error`` empty: it follows). ``behind_since`` and the
        error's start are kept while the state they date lasts."""
        now = time.monotonic()
        old = self.progress()
        behind = 0.0 if applied >= head else (old.behind_since or now)
        error_since = 0.0 if not error else (old.error_since if old.error else now)
        self._write(applied, head, behind, error, error_since)

    def _write(self, applied: int, head: int, behind: float, error: str, error_since: float) -> None:
        self._seq = struct.unpack_from("<Q", self._map, 0)[0] | 1  # odd: being written
        struct.pack_into("<Q", self._map, 0, self._seq)
        struct.pack_into("<qqdd", self._map, 8, applied, head, behind, error_since)
        text = error.encode("utf-8", "replace")[:_ERROR_BYTES]
        self._map[_ERROR_AT:_LIFE_AT] = text.ljust(_ERROR_BYTES, b"\0")
        struct.pack_into("<Q", self._map, 0, self._seq + 1)  # even: whole

    def beat(self, busy_since: float) -> None:
        """The follower's process runs; its main thread is in one operation since ``busy_since`` (0: idle)."""
        _LIFE.pack_into(self._map, _LIFE_AT, time.monotonic(), busy_since)

    def reset(self) -> None:
        """A follower is being started: its beat counts from now. Its progress stays what the
        last one published: the files hold that position whatever became of its process (a
        crash can cut back only a flush that was not committed, whose position was never
        published)."""
        _LIFE.pack_into(self._map, _LIFE_AT, time.monotonic(), 0.0)

    # -- the readers' side ------------------------------------------------------------------

    def progress(self) -> Progress:
        """The follower's progress, read whole (never waits for the writer)."""
        for _ in range(_TRIES):
            before, applied, head, behind, error_since = _PROGRESS.unpack_from(self._map, 0)
            text = bytes(self._map[_ERROR_AT:_LIFE_AT]).rstrip(b"\0")
            if not before & 1 and struct.unpack_from("<Q", self._map, 0)[0] == before:
                self._last = Progress(applied, head, behind, text.decode("utf-8", "replace"), error_since)
                break
        return self._last

    def applied(self) -> int:
        """The position the host's files hold (-1: not known yet)."""
        return self.progress().applied

    def life(self) -> tuple[float, float]:
        """(when the follower last beat, since when it is in one operation: 0 when idle)."""
        beat, busy = _LIFE.unpack_from(self._map, _LIFE_AT)
        return beat, busy

    def trouble(self, busy_bound: float, now: float | None = None) -> str | None:
        """Why the follower does not follow now, or None: not running (no beat for
        :data:`NOT_RUNNING_AFTER` s), in one operation for over ``busy_bound`` s, an error
        that has lasted :data:`REPORTED_AFTER` s, or its position not known yet (starting)."""
        now = time.monotonic() if now is None else now
        beat, busy = self.life()
        if now - beat > NOT_RUNNING_AFTER:
            return f"the follower is not running (no sign of it for {now - beat:.1f} s; its server restarts it)"
        if busy and now - busy > busy_bound:
            return f"the follower has been in one operation for {now - busy:.1f} s"
        progress = self.progress()
        if progress.error and now - progress.error_since >= REPORTED_AFTER:
            return f"the follower cannot follow the log: {progress.error}"
        if progress.applied < 0:
            return "the follower has not opened the data dir yet"
        return None

"""Worker liveness: a heartbeat each worker writes and its parent reads, in shared memory.

One slot per worker, two doubles on the system-wide ``CLOCK_MONOTONIC`` (the same clock in
every process): when the worker's event loop last ran its beat, and since when its sink
thread is in one flush (0 when idle). The worker's loop writes both every
:data:`BEAT_SECONDS` (:meth:`Heartbeats.beat`), so a loop that is stopped (SIGSTOP, a
debugger, a frozen cgroup) or stuck stops the first, and a sink thread stuck in a flush (a
hung disk) shows in the second while the loop goes on. The parent (tiny.prefork) reads them
(:meth:`Heartbeats.stalled`) and replaces a worker that stalled past its bound.

The memory is an anonymous shared mapping made before the fork, so it needs no file and no
cleanup; a torn read can only mix two beats of one slot, each valid.
"""

from __future__ import annotations

import mmap
import struct
import time

BEAT_SECONDS = 0.25
_SLOT = struct.Struct("dd")  # (loop beat, sink busy since)


class Heartbeats:
    """The heartbeat slots of ``count`` workers."""

    def __init__(self, count: int) -> None:
        self._map = mmap.mmap(-1, _SLOT.size * max(1, count))  # MAP_SHARED | MAP_ANONYMOUS

    def reset(self, index: int) -> None:
        """A worker is being started in slot ``index``: its beat counts from now."""
        _SLOT.pack_into(self._map, index * _SLOT.size, time.monotonic(), 0.0)

    def beat(self, index: int, busy_since: float) -> None:
        """The worker's event loop runs; its sink thread is in a flush since ``busy_since`` (0: idle)."""
        _SLOT.pack_into(self._map, index * _SLOT.size, time.monotonic(), busy_since)

    def beaten_since(self, index: int, since: float) -> bool:
        """Whether the worker in slot ``index`` beat after ``since`` (its loop ever ran)."""
        return _SLOT.unpack_from(self._map, index * _SLOT.size)[0] > since

    def stalled(
        self, index: int, loop_bound: float, sink_bound: float, *, now: float | None = None, since: float = 0.0
    ) -> str | None:
        """Why the worker in slot ``index`` counts as stalled at ``now`` (default: now), or
        None: its loop has not beaten for ``loop_bound`` seconds, or its sink thread has been
        in one flush for ``sink_bound``. Time before ``since`` is not counted: the reader
        itself was not running then (stopped, frozen), and a worker stopped with it had no
        chance to beat."""
        now = time.monotonic() if now is None else now
        loop, busy = _SLOT.unpack_from(self._map, index * _SLOT.size)
        loop = max(loop, since)
        if now - loop > loop_bound:
            return f"its event loop has not run for {now - loop:.1f} s"
        if busy and now - max(busy, since) > sink_bound:
            return f"its disk thread has been in one flush for {now - busy:.1f} s"
        return None

"""Reads paced while ingest is busy: a ceiling on the readers' share of an ingest worker's loop.

The reads (the dashboard's API and charts under ``/api``, the downloads API, ``/top``,
``/trending`` and the badges) are served by the same event loops as ``/ingest``, and each
costs a worker about 1.1 ms of CPU on its loop (a ``/healthz`` 0.23 ms; BENCHMARKS.md, "The
analytics pool and the store"). Readers ask as fast as they are answered, so however cheap the
answers, a few dashboards could take a growing share of the loop from ingest. While ingest
requests are in flight in a worker, :class:`ReadPacer` lets its reads start at most ``rate``
a second, one every 1/rate seconds (GCRA, no burst: a burst of reads is a burst of loop
time). A read waits for its turn, up to ``max_wait`` seconds; one whose turn is further away
is refused at once (:class:`Paced`: a 503 with Retry-After), so at most rate x max_wait reads
wait, each on one timer. With no ingest request in flight, reads are not paced.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Paced(RuntimeError):
    """A read whose turn is more than ``max_wait`` seconds away (503)."""

    def __init__(self, wait: float) -> None:
        super().__init__(f"reads are paced while ingest is busy; the next turn is {wait:.0f} s away")
        self.wait = wait


class ReadPacer:
    """The read pace of one worker: at most ``rate`` reads a second start while ``busy()``
    (0: no pacing)."""

    def __init__(self, rate: float, busy: Callable[[], bool], max_wait: float) -> None:
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.busy = busy
        self.max_wait = max_wait
        self._next = 0.0  # time.monotonic() of the next free turn

    def reserve(self) -> float:
        """This read's turn: the seconds to wait for it (0.0 now), the turn taken; Paced when
        it is more than ``max_wait`` away (no turn taken)."""
        if not self.interval or not self.busy():
            return 0.0
        now = time.monotonic()
        turn = max(self._next, now)
        if turn - now > self.max_wait:
            raise Paced(turn - now)
        self._next = turn + self.interval
        return turn - now

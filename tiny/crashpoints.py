"""Fault injection for the crash tests: a flush that kills (or stops) its own process at a named point.

``--crash-at`` (tiny.config, not in --help) is
``point[:probability[:kill|stop|kill-once|stop-once]]``: at ``point`` (one of
:data:`CRASH_POINTS`) a flush sends its own thread SIGKILL (or SIGSTOP, the flush lock held;
``kill-once``, ``stop-once``: only the first process of the data dir to get there, by a file
``.tiny/crash-test-once`` made with O_EXCL), with the given probability (default 1). The
signal goes to the flushing thread with ``pthread_kill``, not to the process: a signal sent to
the process is taken by its main thread, and the flush went on meanwhile.

The points of a local flush (tiny.commit.local, tiny.appender): ``before-writes`` (the intent
written, no data), ``between-writes`` (the first file written: with keys, the key log's
records), ``after-writes`` (every file written, nothing committed), ``after-commit`` (the
check before the commit point passed, the intent still live: nothing committed, since the
intent's mark commits rows and keys together), ``after-finish`` (the intent marked).
``worker-start`` is a worker that dies as it starts
(tiny.worker). A follower's flush (tiny.follower, cluster mode) reaches ``before-writes`` and
``between-writes`` too, then ``follower-after-append`` (every file written, its position not
committed: the intent live) and ``follower-after-position`` (the intent marked with its
position, not yet reported to the log).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
from pathlib import Path

from tiny import layout

log = logging.getLogger("tiny.crashpoints")

CRASH_POINTS = (
    "before-writes",
    "between-writes",
    "after-writes",
    "after-commit",
    "after-finish",
    "worker-start",
    "follower-after-append",
    "follower-after-position",
)


class CrashPoints:
    """The crash point of ``crash_at`` (empty: none) for flushes of ``data_dir``."""

    def __init__(self, crash_at: str, data_dir: Path) -> None:
        point, _, rest = crash_at.partition(":")
        chance, _, how = rest.partition(":")
        self.point = point
        self.chance = float(chance or 1) if point else 0.0
        self.signal = signal.SIGSTOP if how.startswith("stop") else signal.SIGKILL
        self.once = how.endswith("-once")
        self._once_file = layout.state_dir(data_dir) / "crash-test-once"

    def reach(self, point: str) -> None:
        """A flush got to ``point``: kill (or stop) this thread's process there, if so asked."""
        if point != self.point or random.random() >= self.chance:
            return
        if self.once:
            try:
                os.close(os.open(self._once_file, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return
        log.warning("crash test: %s this process %s", "stopping" if self.signal == signal.SIGSTOP else "killing", point)
        signal.pthread_kill(threading.get_ident(), self.signal)

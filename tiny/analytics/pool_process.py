"""What a pool process does first: ignore Ctrl-C, end with its worker, set its caches' budget.

The pool processes (tiny.analytics.service) are spawned with this module's :func:`pool_init`
as their initializer, already confined to the analytics CPU quota (tiny.analytics.cpu).
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

from tiny import affinity
from tiny.analytics import caches

_PARENT_POLL_SECONDS = 1.0
_PR_SET_PDEATHSIG = 1  # prctl(2)


def pool_init(parent: int, cache_bytes: int, cpus: frozenset[int] | None = None) -> None:
    """Runs first in each pool process (confined already: tiny.analytics.cpu.ConfinedContext):
    signals, its end with its worker's, its caches' budget of ``cache_bytes``
    (tiny.analytics.caches), and the affinity ``cpus`` its worker had before it was pinned to
    one core (tiny.affinity; None: the worker's, unchanged).

    A worker killed with -9 cannot stop its pool. On Linux the kernel does: PR_SET_PDEATHSIG
    has it SIGKILL this process when the thread that spawned it ends, and SIGKILL reaches
    even a stopped process (a pool process SIGSTOPped, then its worker killed, is gone with
    it). That thread is the worker's event loop thread (tiny.analytics.service spawns the pool
    from it), which ends only with the worker. A worker already gone before the request was
    made is seen by the parent check after it. Elsewhere, a thread polls for the parent
    (a stopped process then goes once it is continued)."""
    # Ctrl-C, a terminal's hangup and a supervisor's stop of the group (stopasgroup) reach this
    # process too: its worker decides (it drains, then ends its pool; or PDEATHSIG ends it).
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    affinity.unpin(cpus)
    caches.set_process_budget(cache_bytes)
    if _kill_me_with_my_parent():
        if os.getppid() != parent:
            os._exit(0)
    else:
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="parent-watch").start()


def _kill_me_with_my_parent() -> bool:
    """PR_SET_PDEATHSIG = SIGKILL for this process; False where that cannot be asked."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(_PARENT_POLL_SECONDS)
    os._exit(0)

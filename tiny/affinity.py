"""CPU affinity: a worker process pinned to one core, with its event loop and its disk thread.

A worker's event loop and its sink thread (tiny.sink) hand the GIL to each other around every
system call of a flush. Between threads on two cores each handoff wakes the other core (an
inter-processor interrupt, costly in a virtual machine); on one core it is a plain context
switch. Pinned, a worker measured 0.72x the CPU per 1-record request and 0.92x per 100-record
request (BENCHMARKS.md, table 9).

``--cpu-affinity``:

- ``auto`` (the default): worker ``i`` on the ``i``-th of the CPUs the server may use (its
  affinity at start, in order, wrapping), when the server runs at least one worker per such
  CPU (``--processes 0``, one per core, does); with fewer workers than CPUs none is pinned,
  so that a worker's disk and decoding threads may use the idle cores.
- ``none``: no worker is pinned.
- ``K`` (a whole number): worker ``i`` on the ``(K + i)``-th CPU, wrapping, whatever the count:
  for several servers of one worker each on one host (supervisor/supervisord.conf gives
  instance ``K`` the value ``K``).

The analytics pool's processes, forked by a pinned worker, are given back the whole affinity
the server started with (:func:`unpinned`): their work is the other cores' to share.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

log = logging.getLogger("tiny.affinity")

_unpinned: frozenset[int] | None = None  # this process's affinity before pin(); None: not pinned


def parse(text: str) -> str:
    """``auto``, ``none`` or a whole number 0-9999 (without leading zeros), from ``text``
    (ValueError otherwise)."""
    value = text.strip().lower()
    if value in ("auto", "none"):
        return value
    if value.isascii() and value.isdigit() and len(value) <= 4:
        return str(int(value))
    raise ValueError("must be 'auto', 'none' or a whole number of CPUs to start from (0 is the first)")


def worker_cpu(setting: str, index: int, workers: int, usable: Sequence[int]) -> int | None:
    """The CPU worker ``index`` of ``workers`` is pinned to by ``setting`` (see the module
    docstring), from ``usable``: the CPUs the server may use, in order; None: not pinned."""
    if not usable or setting == "none":
        return None
    if setting == "auto":
        return usable[index % len(usable)] if workers >= len(usable) else None
    return usable[(int(setting) + index) % len(usable)]


def pin(setting: str, index: int, workers: int) -> int | None:
    """Pin this process (and every thread it starts from now on) by ``setting``; returns the
    CPU, or None when it stays unpinned. Call it before the worker starts a thread."""
    global _unpinned
    usable = sorted(os.sched_getaffinity(0))
    cpu = worker_cpu(setting, index, workers, usable)
    if cpu is None:
        return None
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError as exc:  # the CPU went offline since: serve unpinned rather than fail the start
        log.warning("worker %d could not be pinned to CPU %d (%s): it runs unpinned", index, cpu, exc)
        return None
    _unpinned = frozenset(usable)
    log.info("worker %d pinned to CPU %d (--cpu-affinity %s, %d usable)", index, cpu, setting, len(usable))
    return cpu


def unpinned() -> frozenset[int] | None:
    """The affinity this process had before :func:`pin` (None: it was not pinned)."""
    return _unpinned


def unpin(cpus: frozenset[int] | None) -> None:
    """Give this process the affinity ``cpus`` (None: leave it): a pool process of a pinned worker."""
    if cpus:
        os.sched_setaffinity(0, cpus)

"""CPU affinity: a worker process pinned to one core, with its event loop and its disk thread.

A worker's event loop and its sink thread (tiny.sink) hand the GIL to each other around every
system call of a flush. Between threads on two cores each handoff wakes the other core (an
inter-processor interrupt, costly in a virtual machine); on one core it is a plain context
switch. Pinned, a worker measured 0.72x the CPU per 1-record request and 0.77x per 100-record
request (BENCHMARKS.md, table 9).

``--cpu-affinity``:

- ``auto`` (the default): worker ``i`` on the ``i``-th of the CPUs the server may use (its
  affinity at start, in order, wrapping), when the workers are a whole multiple of those CPUs,
  so that every CPU gets as many (``--processes 0``, one per core, without a CPU quota, is);
  otherwise none is pinned: a worker's disk and decoding threads may then use the idle cores.
- ``none``: no worker is pinned.
- ``K`` (a whole number): worker ``i`` on the ``(K + i)``-th CPU, wrapping, whatever the count:
  for several servers of one worker each on one host (supervisor/supervisord.conf gives
  instance ``K`` the value ``K``).

The parent plans the CPUs once (:func:`plan`), from its affinity at start, and a worker it
forks, or forks again, pins itself to its CPU first thing (:func:`pin`). The analytics pool's
processes, spawned by a pinned worker, are given back the whole affinity the server started
with (:func:`unpinned`, :func:`unpin`): their work is the other cores' to share.
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
        return usable[index % len(usable)] if workers and workers % len(usable) == 0 else None
    return usable[(int(setting) + index) % len(usable)]


def plan(setting: str, workers: int) -> list[int | None]:
    """Each worker's CPU by ``setting``, from this process's affinity now (the parent's, at start)."""
    usable = sorted(os.sched_getaffinity(0))
    return [worker_cpu(setting, index, workers, usable) for index in range(workers)]


def pin(cpu: int | None, index: int) -> None:
    """Pin this process, worker ``index``, and every thread it starts from now on, to ``cpu``
    (None: leave it). Call it before the worker starts a thread. A CPU that cannot be had
    (taken offline, or out of a cpuset changed since the plan) leaves the worker unpinned."""
    global _unpinned
    if cpu is None:
        return
    before = frozenset(os.sched_getaffinity(0))
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError as exc:
        log.warning("worker %d could not be pinned to CPU %d (%s): it runs unpinned", index, cpu, exc)
        return
    _unpinned = before
    log.info("worker %d pinned to CPU %d of %d usable", index, cpu, len(before))


def unpinned() -> frozenset[int] | None:
    """The affinity this process had before :func:`pin` (None: it was not pinned)."""
    return _unpinned


def unpin(cpus: frozenset[int] | None) -> None:
    """Give this process the affinity ``cpus`` (None: leave it): a pool process of a pinned
    worker. CPUs no longer available (a cpuset changed since) are left out; with none left,
    the process keeps the affinity it has."""
    if not cpus:
        return
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:
        log.warning("an analytics pool process keeps its worker's CPU (%s)", exc)

"""A CPU budget for the analytics pool processes of a server: a cgroup with a CPU quota.

Idle priority alone does not shield ingest on a machine of 2 vCPUs (measured: two busy
loops at SCHED_IDLE cut ingest to 0.60x), so the pool processes of every worker of one
server share one cgroup whose quota is ``--analytics-cpu`` CPUs (by default 0.1: a tenth of
one CPU, every 100 ms period). :func:`prepare` makes it, once, in the server's main process
before the workers fork; the worker that spawns a pool process puts it there (:func:`confine`);
:func:`remove` deletes it when the server stops. A server killed with -9 leaves its empty
group behind; the next server to start removes the groups of servers that are gone.

Where: cgroup v2 (``cpu.max``) when the server's own cgroup delegates the cpu controller
to its children (``cgroup.subtree_control`` holds ``cpu``), else cgroup v1's cpu
controller (``cpu.cfs_quota_us``) when it is mounted and writable. When neither is allowed
(an unprivileged container), the pool runs without a quota, at SCHED_IDLE alone, and
:data:`MODE` says so (in the start's log).

A pool process is confined (its lane's group, SCHED_IDLE) by the worker that spawns it, the
moment it exists (:class:`ConfinedContext`), not by itself once started: a spawned
interpreter first imports the ``__main__`` script again and then its own modules, and a pool
started by the first reads beside a busy ingest would take that at full priority, outside the
quota. A pool process starts in 0.03-0.05 CPU-s: the ``__main__`` script (app.py, tiny.main)
leaves the server's modules to main(), which a pool process never runs (tests/test_api.py
holds that); an import of the whole server would be 0.16-0.24 CPU-s a process.

The group is also made idle as a whole (``cpu.idle``, or the least ``cpu.shares`` /
``cpu.weight`` on kernels without it): the pool's own SCHED_IDLE ranks its processes only
among themselves once they are in a group, and the group would otherwise take full time
slices from the ingest workers whenever it runs (measured: ingest p99 doubled).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from multiprocessing.context import SpawnContext, SpawnProcess
from pathlib import Path
from typing import Any

log = logging.getLogger("tiny.analytics")

PERIOD_US = 100_000
PREFIX = "tiny-analytics-"  # a server's group: PREFIX and its main process's pid
LANES = ("answers", "rows")  # tiny.analytics.service's lanes, the second idle within the group
_ROOT = Path("/sys/fs/cgroup")
_LEAST_WEIGHT = {"v2": ("cpu.weight", "1"), "v1": ("cpu.shares", "2")}  # a group's lowest share of its parent
_REMOVE_WAIT = 1.0  # seconds remove() waits for a group's last processes to leave it (EBUSY)

CGROUP: Path | None = None  # set by prepare() in the main process, inherited by the forked workers
MODE = "no quota: SCHED_IDLE only"


def _own_path(controller: str) -> str | None:
    """This process's cgroup path for ``controller`` ("" for the v2 unified hierarchy)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        number, controllers, path = line.split(":", 2)
        if (controller == "" and number == "0") or controller in controllers.split(","):
            return path
    return None


def _v2_parent(root: Path) -> Path | None:
    path = _own_path("")
    if path is None or not (root / "cgroup.controllers").exists():
        return None
    parent = root / path.lstrip("/")
    try:
        if "cpu" in (parent / "cgroup.subtree_control").read_text().split():
            return parent
    except OSError:
        pass
    return None


def _v1_parent(root: Path) -> Path | None:
    path = _own_path("cpu")
    for mount in (root / "cpu", root / "cpu,cpuacct"):
        if path is not None and (mount / path.lstrip("/") / "cpu.cfs_quota_us").exists():
            return mount / path.lstrip("/")
    return None


def prepare(cpus: float, name: str, root: Path = _ROOT) -> Path | None:
    """Make the cgroup ``name`` with a quota of ``cpus`` CPUs (0: none) under the cgroup file
    system mounted at ``root``; sets CGROUP and MODE. Where no group can be made (a read-only
    cgroup file system, no permission), it gives up at once: one warning, no quota."""
    global CGROUP, MODE
    if cpus <= 0:
        MODE = "no quota (--analytics-cpu 0): SCHED_IDLE only"
        return None
    for version, parent in (("v2", _v2_parent(root)), ("v1", _v1_parent(root))):
        if parent is None:
            continue
        _remove_stale(parent)
        group = parent / name
        try:
            group.mkdir(exist_ok=True)
            quota = set_quota(group, version, cpus)
            if _make_idle(group, version):
                idle = "the group idle (cpu.idle 1), the row reads idle within it"
            else:
                idle = "the group at the least weight, the row reads least within it"
            _make_lanes(group, version)
        except OSError as exc:
            log.warning("no analytics CPU quota in %s (%s)", group, exc.strerror or exc)
            if group.is_dir():  # made, then refused its settings
                remove(group)
            continue
        CGROUP = group
        MODE = f"cgroup {version} {group}: {quota / PERIOD_US:g} CPU, {idle}"
        return group
    MODE = "no quota (no writable cgroup cpu controller here): SCHED_IDLE only"
    return None


def set_quota(group: Path, version: str, cpus: float) -> int:
    """Give the cgroup ``group`` (``version`` "v1" or "v2") a quota of ``cpus`` CPUs every
    PERIOD_US, at least the kernel's least (1 ms); returns the quota in µs."""
    quota = max(1000, round(cpus * PERIOD_US))
    if version == "v2":
        (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
    else:
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(quota))
    return quota


def _remove_stale(parent: Path) -> None:
    """Remove the groups of servers that are gone (killed with -9: they could not remove theirs),
    so that restarts never pile them up. A group is named for its server's pid (PREFIX<pid>).
    None is waited for (one still busy is tried again at the next start), and none is tried
    where nothing can be removed (a read-only cgroup file system: prepare() says so once)."""
    if not os.access(parent, os.W_OK):
        return
    for group in parent.glob(f"{PREFIX}*"):
        pid = group.name[len(PREFIX) :]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            remove(group, wait=0.0)


def _make_idle(group: Path, version: str) -> bool:
    """Make ``group`` idle against its siblings (cpu.idle, Linux 5.15+; True), else give it the
    least weight (False): SCHED_IDLE inside a group only ranks its tasks among themselves,
    while the group itself would compete with its siblings as one normal task. (An idle group's
    own weight is not used while it is idle.)"""
    try:
        (group / "cpu.idle").write_text("1")
    except OSError:
        name, least = _LEAST_WEIGHT[version]
        (group / name).write_text(least)
        return False
    return True


def _make_lanes(group: Path, version: str) -> None:
    """One child group per lane of the pool (tiny.analytics.service): within the quota, the
    answers from the aggregates and their charts (milliseconds) run before the row reads (seconds),
    which only take what the answers leave; a lane that used the quota up would otherwise
    make the other wait for the next period."""
    if version == "v2":
        (group / "cgroup.subtree_control").write_text("+cpu")
    for lane in LANES:
        (group / lane).mkdir(exist_ok=True)
    _make_idle(group / LANES[1], version)


def confine(pid: int, group: Path | None, lane: str, niceness: str) -> None:
    """Move process ``pid`` into the ``lane`` child of ``group`` (none: no quota) and set its
    priority: ``niceness`` "idle" is nice 19 and SCHED_IDLE (it runs only when no normal task
    wants the CPU, and a waking ingest worker preempts it at once), else that much nicer
    than the caller. Best effort: a refusal is logged (cgroup), or left (a seccomp profile
    may refuse SCHED_IDLE: nice 19 is close)."""
    if group is not None:
        try:
            (group / lane / "cgroup.procs").write_text(str(pid))
        except OSError as exc:  # removed meanwhile, not ours, or the process is gone
            log.warning("the analytics process %d could not join %s: %s", pid, group / lane, exc)
    with contextlib.suppress(OSError):  # (ProcessLookupError: gone already)
        if niceness == "idle":
            os.setpriority(os.PRIO_PROCESS, pid, 19)
            os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
        elif int(niceness):
            os.setpriority(os.PRIO_PROCESS, pid, min(19, os.getpriority(os.PRIO_PROCESS, 0) + int(niceness)))


class ConfinedProcess(SpawnProcess):
    """A spawned process that :func:`confine` puts in its place as soon as it is started, while
    the new interpreter is still starting (one thread: the threads it starts later inherit its
    priority)."""

    confinement: tuple[Path | None, str, str] = (None, LANES[1], "idle")  # confine's arguments

    def start(self) -> None:
        super().start()
        assert self.pid is not None
        confine(self.pid, *self.confinement)


class ConfinedContext(SpawnContext):
    """multiprocessing's "spawn" context whose processes are :class:`ConfinedProcess` es in
    ``lane`` of ``group`` at ``niceness`` (for a ``ProcessPoolExecutor``'s ``mp_context``)."""

    def __init__(self, group: Path | None, lane: str, niceness: str) -> None:
        super().__init__()
        self.confinement = (group, lane, niceness)

    # A method in place of the class: a ProcessPoolExecutor only calls its context's Process.
    def Process(self, *args: Any, **kwargs: Any) -> ConfinedProcess:  # type: ignore[override]
        process = ConfinedProcess(*args, **kwargs)
        process.confinement = self.confinement
        return process


def remove(group: Path | None, wait: float = _REMOVE_WAIT) -> bool:
    """Delete ``group`` and its lanes; True when they are gone. Every child group goes, not
    only today's LANES: a group left by an older version had other lane names.

    A group is busy (EBUSY) until its processes are gone, and they exit with their workers:
    that is waited for, up to ``wait`` seconds in all. Any other refusal (a read-only cgroup
    file system, EPERM, EACCES) cannot change by waiting: the group is left at once, with
    one warning."""
    if group is None:
        return True
    try:
        children = [path for path in group.iterdir() if path.is_dir()]
    except OSError:
        children = []
    deadline = time.monotonic() + wait
    return all(_rmdir(path, deadline) for path in [*children, group])


def _rmdir(path: Path, deadline: float) -> bool:
    """Remove the empty cgroup ``path``, trying again while it is busy until ``deadline``."""
    while True:
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                log.warning("the analytics cgroup %s is left behind: %s", path, exc.strerror or exc)
                return False
        time.sleep(0.05)

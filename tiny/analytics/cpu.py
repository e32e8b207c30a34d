"""A CPU budget for the analytics pool processes of a server: a cgroup with a CPU quota.

Idle priority alone does not shield ingest on a machine of 2 vCPUs (measured: two busy
loops at SCHED_IDLE cut ingest to 0.60x), so the pool processes of every worker of one
server share one cgroup whose quota is ``--analytics-cpu`` CPUs (0.25: a quarter of one
CPU, every 100 ms period). :func:`prepare` makes it, once, in the server's main process
before the workers fork; each pool process joins it in its initializer (:func:`join`);
:func:`remove` deletes it when the server stops (a server killed with -9 leaves an empty
cgroup behind: harmless, and removable with rmdir).

Where: cgroup v2 (``cpu.max``) when the server's own cgroup delegates the cpu controller
to its children (``cgroup.subtree_control`` holds ``cpu``), else cgroup v1's cpu
controller (``cpu.cfs_quota_us``) when it is mounted and writable. When neither is allowed
(an unprivileged container), the pool runs without a quota, at SCHED_IDLE as before, and
:data:`MODE` says so (in /healthz and the log).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

log = logging.getLogger("tiny.analytics")

PERIOD_US = 100_000
_ROOT = Path("/sys/fs/cgroup")

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


def _v2_parent() -> Path | None:
    path = _own_path("")
    if path is None or not (_ROOT / "cgroup.controllers").exists():
        return None
    parent = _ROOT / path.lstrip("/")
    try:
        if "cpu" in (parent / "cgroup.subtree_control").read_text().split():
            return parent
    except OSError:
        pass
    return None


def _v1_parent() -> Path | None:
    path = _own_path("cpu")
    for mount in (_ROOT / "cpu", _ROOT / "cpu,cpuacct"):
        if path is not None and (mount / path.lstrip("/") / "cpu.cfs_quota_us").exists():
            return mount / path.lstrip("/")
    return None


def prepare(cpus: float, name: str) -> Path | None:
    """Make the cgroup ``name`` with a quota of ``cpus`` CPUs (0: none); sets CGROUP and MODE."""
    global CGROUP, MODE
    if cpus <= 0:
        MODE = "no quota (--analytics-cpu 0): SCHED_IDLE only"
        return None
    quota = max(1000, round(cpus * PERIOD_US))
    for version, parent in (("v2", _v2_parent()), ("v1", _v1_parent())):
        if parent is None:
            continue
        group = parent / name
        try:
            group.mkdir(exist_ok=True)
            if version == "v2":
                (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
            else:
                (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (group / "cpu.cfs_quota_us").write_text(str(quota))
        except OSError as exc:
            log.warning("no analytics CPU quota in %s (%s)", group, exc)
            with contextlib.suppress(OSError):
                group.rmdir()
            continue
        CGROUP = group
        MODE = f"cgroup {version} {group}: {quota / PERIOD_US:g} CPU, SCHED_IDLE within it"
        return group
    MODE = "no quota (no writable cgroup cpu controller here): SCHED_IDLE only"
    return None


def join(group: Path | None) -> None:
    """Move the calling process into ``group`` (in a pool process's initializer)."""
    if group is None:
        return
    try:
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as exc:  # removed meanwhile, or not ours: the process still runs at SCHED_IDLE
        log.warning("the analytics process could not join %s: %s", group, exc)


def remove(group: Path | None) -> None:
    """Delete ``group`` once its processes are gone (they exit with their workers: waited for
    up to a second; best effort)."""
    if group is None:
        return
    for _ in range(20):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)

"""The one /proc reader of the benchmarks: process trees, CPU-seconds per process and of the
whole machine, resident memory, the load average, the CPU model, and what a data dir's key store
(the journal) holds."""

from __future__ import annotations

import os
import resource
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiny.testing import memory

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # fields 3.. of proc(5); comm may hold spaces


def _parents() -> dict[int, int]:
    """pid -> ppid of every process visible now."""
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None:
                parents[int(entry.name)] = int(fields[1])
    return parents


def process_tree(roots: Sequence[int]) -> list[int]:
    """``roots`` and all their live descendants."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    todo = [pid for pid in roots if Path(f"/proc/{pid}").exists()]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def cpu_seconds(roots: Sequence[int]) -> dict[int, float]:
    """CPU-seconds per process of the trees under ``roots``: utime + stime of all its threads,
    plus cutime + cstime (children it already reaped, e.g. a restarted worker)."""
    times: dict[int, float] = {}
    for pid in process_tree(roots):
        fields = _stat_fields(pid)
        if fields is not None:
            times[pid] = sum(int(value) for value in fields[11:15]) / _CLK_TCK
    return times


def system_cpu_seconds() -> tuple[float, float]:
    """(busy, total) CPU-seconds of the whole machine since boot (all cores, /proc/stat): user
    to steal; guest time is already counted in user and nice, idle and iowait are not busy."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])
    return (total - idle) / _CLK_TCK, total / _CLK_TCK


def system_busy_seconds() -> float:
    """CPU-seconds the whole machine spent busy since boot (all cores, /proc/stat)."""
    return system_cpu_seconds()[0]


def children_cpu_seconds() -> float:
    """CPU-seconds of this process's reaped children (the load drivers it ran)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class CpuSnapshot:
    """The CPU counters a point reads before and after its load."""

    processes: dict[int, float]  # cpu_seconds() of the servers' trees
    busy: float  # system_busy_seconds()
    children: float  # children_cpu_seconds(): the load drivers

    @classmethod
    def take(cls, roots: Sequence[int]) -> CpuSnapshot:
        return cls(cpu_seconds(roots), system_busy_seconds(), children_cpu_seconds())


def rss_kb(pid: int) -> int:
    """Resident memory of ``pid`` in KiB (0 once it is gone)."""
    try:
        return memory(pid) // 1024
    except (OSError, ValueError):
        return 0


def tree_rss_kb(roots: Sequence[int]) -> int:
    """Resident memory of the trees under ``roots`` in KiB, summed."""
    return sum(rss_kb(pid) for pid in process_tree(roots))


def loadavg() -> list[str]:
    """The 1, 5 and 15 minute load averages, as /proc/loadavg writes them."""
    return Path("/proc/loadavg").read_text().split()[:3]


def cpu_model(default: str = "") -> str:
    """The first ``model name`` of /proc/cpuinfo, or ``default``."""
    return next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        default,
    )


def key_store(data_dir: Path) -> dict[str, Any]:
    """What a data dir's journal holds: its keys (the records of its key log, tiny.keylog), the
    log's bytes per key, and the files of ``.tiny/`` as they are."""
    from tiny.keylog import records

    journal = data_dir / ".tiny"
    files = {f.name: f.stat().st_size for f in journal.iterdir() if f.is_file()} if journal.is_dir() else {}
    keys, database_bytes = 0, 0
    for segment in sorted((journal / "keys").glob("*.log")) if (journal / "keys").is_dir() else []:
        data = segment.read_bytes()
        keys += sum(1 for _ in records(data))
        database_bytes += len(data)
    return {
        "keys": keys,
        "database_bytes": database_bytes,
        "bytes_per_key": round(database_bytes / keys, 1) if keys else None,
        "files": files,
    }

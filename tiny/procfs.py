"""Processes read from /proc, for the test harnesses that start servers (tiny.testing,
tiny.testing_pg): a process's stat, children and command line, every live process, a bounded
wait for pids to go, and signals that ignore processes already gone; and for tiny-admin, the
processes that hold a file open. Linux only."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


def unreaped(proc: subprocess.Popen[bytes] | None) -> int:
    """The pid of our child ``proc`` while it is not reaped (alive or a zombie: its pid, and so
    its process group and session ids, cannot be another process's yet), else -1. A reaped
    child's pid may belong to anyone by now (pid_max is 32768 here): never signal it."""
    return proc.pid if proc is not None and proc.poll() is None else -1


@dataclass(frozen=True, slots=True)
class Proc:
    pid: int
    ppid: int
    session: int
    comm: str


def children(pid: int) -> list[int]:
    """The pids of the children of ``pid``'s main thread (none when it is gone)."""
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def stat(pid: int) -> Proc | None:
    """A live process from /proc/PID/stat; None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    comm_end = text.rindex(b")")
    fields = text[comm_end + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return Proc(pid, int(fields[1]), int(fields[3]), text[text.index(b"(") + 1 : comm_end].decode(errors="replace"))


def processes() -> list[Proc]:
    """Every live process, now."""
    return [proc for entry in os.listdir("/proc") if entry.isdigit() and (proc := stat(int(entry))) is not None]


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace") + " "
    except OSError:
        return ""


def holders(paths: set[Path]) -> list[int]:
    """The pids of the live processes (but this one) that hold one of ``paths`` open, among
    those whose descriptors this user may read (/proc/PID/fd)."""
    wanted = {str(path.resolve()) for path in paths}
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to read
            if any(os.readlink(fd.path) in wanted for fd in os.scandir(f"{entry.path}/fd")):
                found.append(int(entry.name))
    return sorted(found)


def send_signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)


def wait_gone(pids: set[int], timeout: float, children: list[subprocess.Popen[bytes]]) -> set[int]:
    """Wait until none of ``pids`` lives (reaping ``children``: a zombie is gone); those left."""
    deadline = time.monotonic() + timeout
    while True:
        for child in children:
            child.poll()
        pids = {pid for pid in pids if stat(pid) is not None}
        if not pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.02)

"""The analytics pool's CPU budget (tiny.analytics.cpu) where no cgroup can be made or removed.

The read-only cgroup file system is a real one: a directory laid out as a cgroup hierarchy,
bind-mounted read-only (as a container's /sys/fs/cgroup often is), so that every mkdir and
rmdir under it fails with the kernel's own EROFS. Needs root (mount).
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tiny.analytics import cpu

_FINDING = "third 16: a read-only cgroup file system added 1 s to the start (rmdir retried on EROFS)"
_DEAD_PID = "999999999"  # above pid_max (at most 2**22): no such process, ever


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A directory to lay out, and the same directory bind-mounted read-only (the proof: a
    mkdir there fails with EROFS)."""
    source, view = tmp_path / "source", tmp_path / "view"
    source.mkdir()
    view.mkdir()
    mounted = subprocess.run(["mount", "--bind", str(source), str(view)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot bind-mount here (not root?): {mounted.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True, capture_output=True)
        with pytest.raises(OSError) as refused:
            (view / "probe").mkdir()
        assert refused.value.errno == errno.EROFS
        yield source, view
    finally:
        subprocess.run(["umount", str(view)], check=True)


def _group(under: Path, name: str) -> Path:
    """A server's group with its lanes, as prepare() leaves them."""
    for lane in cpu.LANES:
        (under / name / lane).mkdir(parents=True)
    return under / name


@pytest.mark.hardening(_FINDING)
def test_a_group_on_a_read_only_file_system_is_left_at_once_with_one_warning(
    read_only: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    source, view = read_only
    _group(source, cpu.PREFIX + "1")
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, "tiny.analytics"):
        removed = cpu.remove(view / (cpu.PREFIX + "1"))
    took = time.monotonic() - started
    assert not removed and took < 0.2, f"took {took:.2f} s"
    (warning,) = [record.getMessage() for record in caplog.records]
    assert warning.startswith(f"the analytics cgroup {view / (cpu.PREFIX + '1')}/")
    assert warning.endswith("is left behind: Read-only file system")
    assert sorted(os.listdir(source / (cpu.PREFIX + "1"))) == sorted(cpu.LANES)


@pytest.mark.hardening(_FINDING)
@pytest.mark.skipif(cpu._own_path("") is None, reason="this process is in no cgroup v2 hierarchy")
def test_a_start_on_a_read_only_cgroup_file_system_gives_up_at_once_without_a_quota(
    read_only: tuple[Path, Path], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cgroup v2 hierarchy whose server's group delegates cpu, holding a dead server's
    group, all read-only: prepare() falls back to no quota at once, with one warning (it
    tried each rmdir 20 times, 50 ms apart: 1 s for each group and lane, 4 s here)."""
    source, view = read_only
    own = source / (cpu._own_path("") or "/").lstrip("/")
    own.mkdir(parents=True, exist_ok=True)
    (source / "cgroup.controllers").write_text("cpu io memory\n")
    (own / "cgroup.subtree_control").write_text("cpu\n")
    _group(own, cpu.PREFIX + _DEAD_PID)
    monkeypatch.setattr(cpu, "MODE", cpu.MODE)  # restored after: prepare() sets it for the process
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, "tiny.analytics"):
        group = cpu.prepare(0.1, cpu.PREFIX + "test", root=view)
    took = time.monotonic() - started
    assert group is None and cpu.MODE.startswith("no quota (no writable cgroup cpu controller here)")
    assert took < 0.3, f"took {took:.2f} s"
    (warning,) = [record.getMessage() for record in caplog.records]
    ours = view / own.relative_to(source) / (cpu.PREFIX + "test")
    assert warning == f"no analytics CPU quota in {ours} (Read-only file system)"
    assert (own / (cpu.PREFIX + _DEAD_PID) / cpu.LANES[0]).is_dir()  # left: it cannot be removed


def test_a_refusal_other_than_busy_is_not_waited_for(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A directory that is not empty for another reason (ENOTEMPTY) cannot change by waiting."""
    group = _group(tmp_path, cpu.PREFIX + "1")
    (group / "answers" / "a file").write_text("")
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, "tiny.analytics"):
        assert not cpu.remove(group, wait=5.0)
    assert time.monotonic() - started < 0.2
    assert "left behind: Directory not empty" in caplog.text
    (group / "answers" / "a file").unlink()
    assert cpu.remove(group) and not group.exists()


def _writable_cgroup_parent() -> Path | None:
    parent = cpu._v2_parent(cpu._ROOT) or cpu._v1_parent(cpu._ROOT)
    return parent if parent is not None and os.access(parent, os.W_OK) else None


@pytest.mark.skipif(_writable_cgroup_parent() is None, reason="no writable cgroup cpu controller here")
def test_a_group_busy_with_a_process_is_waited_for_until_it_leaves_within_the_bound(tmp_path: Path) -> None:
    """A real cgroup: EBUSY while a process is in it, tried again until ``wait`` runs out;
    removed as soon as the process is gone."""
    parent = _writable_cgroup_parent()
    assert parent is not None
    group = parent / f"{cpu.PREFIX}test-busy-{os.getpid()}"
    group.mkdir()
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        (group / "cgroup.procs").write_text(str(sleeper.pid))
        started = time.monotonic()
        assert not cpu.remove(group, wait=0.5)
        assert 0.5 <= time.monotonic() - started < 1.0
        sleeper.kill()
        sleeper.wait()
        started = time.monotonic()
        assert cpu.remove(group, wait=5.0) and not group.exists()
        assert time.monotonic() - started < 1.0
    finally:
        sleeper.kill()
        sleeper.wait()
        if group.exists():
            group.rmdir()

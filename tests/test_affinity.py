"""--cpu-affinity: which worker is pinned to which core, on a real server's processes and threads."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from tests.support import Server, record, wait_for
from tiny import affinity, config, procfs

USABLE = sorted(os.sched_getaffinity(0))
needs_two_cpus = pytest.mark.skipif(len(USABLE) < 2, reason="pinning is seen only with two usable CPUs or more")


def allowed(pid: int, tid: int | None = None) -> set[int]:
    """The CPUs /proc says a process (or one of its threads) may run on."""
    where = f"/proc/{pid}/task/{tid}/status" if tid is not None else f"/proc/{pid}/status"
    for line in Path(where).read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            cpus: set[int] = set()
            for part in line.split(":", 1)[1].strip().split(","):
                first, _, last = part.partition("-")
                cpus.update(range(int(first), int(last or first) + 1))
            return cpus
    raise AssertionError(f"no Cpus_allowed_list in {where}")


def thread_cpus(pid: int) -> set[frozenset[int]]:
    """The CPU sets the threads of ``pid`` may run on (a thread that ended meanwhile, such as
    the key log's reader, left out)."""
    found = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            found.add(frozenset(allowed(pid, int(tid))))
        except FileNotFoundError:
            continue
    return found


def spawned_by_pool(pid: int) -> bool:
    """Whether ``pid`` is an analytics pool process (multiprocessing's spawn), False once gone."""
    try:
        return b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_auto_pins_worker_i_to_the_i_th_cpu_when_there_is_a_worker_per_cpu() -> None:
    assert [affinity.worker_cpu("auto", i, 4, [0, 1, 2, 3]) for i in range(4)] == [0, 1, 2, 3]
    assert [affinity.worker_cpu("auto", i, 4, [2, 5]) for i in range(4)] == [2, 5, 2, 5]


def test_auto_pins_nothing_with_fewer_workers_than_cpus() -> None:
    assert affinity.worker_cpu("auto", 0, 1, [0, 1]) is None


def test_auto_pins_nothing_when_the_cpus_would_get_unequal_shares() -> None:
    """Three workers on two CPUs: one CPU would serve two thirds of the connections."""
    assert [affinity.worker_cpu("auto", i, 3, [0, 1]) for i in range(3)] == [None, None, None]


def test_the_parent_plans_from_the_affinity_it_has() -> None:
    assert affinity.plan("auto", len(USABLE)) == (USABLE if len(USABLE) > 1 else [USABLE[0]])
    assert affinity.plan("none", 2) == [None, None]


def test_a_number_starts_there_and_wraps_whatever_the_count() -> None:
    assert [affinity.worker_cpu("3", i, 1, [0, 1]) for i in range(3)] == [1, 0, 1]
    assert affinity.worker_cpu("0", 0, 1, [4, 6]) == 4


def test_none_pins_nothing() -> None:
    assert affinity.worker_cpu("none", 0, 8, [0, 1]) is None


@pytest.mark.parametrize("text", ["", "all", "-1", "1.5", "0x1", "12345", "1,2", "١"])
def test_a_setting_that_is_not_auto_none_or_a_small_whole_number_is_refused(text: str) -> None:
    with pytest.raises(SystemExit) as stopped:
        config.parse(["--cpu-affinity", text], {})
    assert stopped.value.code == 2


def test_the_setting_comes_from_the_flag_or_the_environment() -> None:
    assert config.parse([], {}).cpu_affinity == "auto"
    assert config.parse([], {"TINY_CPU_AFFINITY": "None"}).cpu_affinity == "none"
    assert config.parse(["--cpu-affinity", "2"], {"TINY_CPU_AFFINITY": "none"}).cpu_affinity == "2"


@needs_two_cpus
def test_a_worker_per_cpu_puts_each_worker_and_all_its_threads_on_its_own_cpu(tmp_path: Path) -> None:
    with Server(tmp_path / "data", processes=len(USABLE)) as server:
        assert server.ingest(orjson.dumps(record()) + b"\n").status == 200  # the sink thread is running
        assert wait_for(lambda: len(server.worker_pids()) == len(USABLE), 10)
        pinned = []
        for pid in server.worker_pids():
            cpus = thread_cpus(pid)
            assert len(cpus) == 1 and len(next(iter(cpus))) == 1, f"worker {pid}'s threads: {cpus}"
            pinned.append(next(iter(next(iter(cpus)))))
        assert sorted(pinned) == USABLE
        assert allowed(server.pid) == set(USABLE)  # the parent, which forks the workers, stays free
        assert "pinned to CPU" in server.log()


@needs_two_cpus
def test_a_pinned_workers_analytics_pool_may_use_every_cpu(tmp_path: Path) -> None:
    with Server(tmp_path / "data", processes=len(USABLE)) as server:
        pools: list[int] = []

        def pool_started() -> bool:
            pools[:] = [child for pid in server.worker_pids() for child in procfs.children(pid)]
            return any(spawned_by_pool(pid) for pid in pools)

        assert wait_for(pool_started, 10)  # the answers lane's pool starts with its worker
        spawned = [pid for pid in pools if spawned_by_pool(pid)]
        assert spawned, f"no pool process among the workers' children {pools}"
        for pid in spawned:
            assert wait_for(lambda pid=pid: allowed(pid) == set(USABLE), 15), f"pool process {pid}: {allowed(pid)}"


@needs_two_cpus
def test_one_worker_on_several_cpus_is_not_pinned_by_default(tmp_path: Path) -> None:
    with Server(tmp_path / "data", processes=1) as server:
        assert allowed(server.worker_pid()) == set(USABLE)
        assert "pinned to CPU" not in server.log()


@needs_two_cpus
def test_a_number_pins_even_one_worker(tmp_path: Path) -> None:
    with Server(tmp_path / "data", "--cpu-affinity", "1", processes=1) as server:
        assert allowed(server.worker_pid()) == {USABLE[1]}


@needs_two_cpus
def test_none_leaves_a_worker_per_cpu_unpinned(tmp_path: Path) -> None:
    with Server(tmp_path / "data", "--cpu-affinity", "none", processes=len(USABLE)) as server:
        assert wait_for(lambda: len(server.worker_pids()) == len(USABLE), 10)
        assert all(allowed(pid) == set(USABLE) for pid in server.worker_pids())

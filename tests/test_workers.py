"""Processes: a dead worker is replaced, orphans stop, the port is free again at once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import orjson

from tests.support import Server, record


def worker_pids(server: Server) -> set[int]:
    children = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()
    return {int(pid) for pid in children}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.split(")")[1].split()[0] != "Z"


def wait_for(predicate: object, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_a_killed_worker_is_replaced_within_a_second(tmp_path: Path) -> None:
    with Server(tmp_path / "data", processes=2) as server:
        before = worker_pids(server)
        victim = min(before)
        os.kill(victim, signal.SIGKILL)
        assert wait_for(lambda: len(worker_pids(server)) == 2 and victim not in worker_pids(server), 3.0)
        line = orjson.dumps(record()) + b"\n"
        assert all(server.ingest(line).status == 200 for _ in range(20))
        assert "restarting it" in server.log()


def test_workers_of_a_killed_parent_exit_and_the_port_is_free_again(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", processes=2).start()
    try:
        workers = worker_pids(server)
        port = server.port
        os.kill(server.pid, signal.SIGKILL)
        assert wait_for(lambda: not any(alive(pid) for pid in workers), 5.0), "orphaned workers kept serving"
    finally:
        server.kill()
        server.close()
    with Server(tmp_path / "data", processes=2, port=port) as again:
        assert again.port == port
        assert again.ingest(orjson.dumps(record())).status == 200


def test_sigint_stops_like_sigterm(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", processes=2).start()
    try:
        assert server.stop(signal.SIGINT) == 0
    finally:
        server.close()

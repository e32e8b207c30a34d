"""The parent of the workers: its own pause (SIGSTOP of the whole server, ``docker pause``)
is not counted against its workers; a worker stopped alone is still replaced.

A real server, really stopped: SIGSTOP to its process group, every process of the group
seen stopped (state T) before the pause is timed. The parent may be continued before its
workers (a freezer thaws processes in no set order): that is the order in which a parent
that counts its own pause kills every worker at once.
"""

from __future__ import annotations

import http.client
import os
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import orjson
import pytest

from tests.support import Server, record, wait_for

STALL = 2.0  # --stall-timeout of these servers
LOCK = 1.0  # --lock-timeout: a young worker's first bound is STALL + LOCK
PAUSE = 2 * (STALL + LOCK)  # longer than any bound the parent holds a worker to

_FINDING = "third 14: a whole server paused past --stall-timeout had its workers killed"


def group_states(pgid: int) -> dict[int, str]:
    """pid -> state (R, S, T...) of every process in process group ``pgid`` (/proc/PID/stat)."""
    states = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # gone meanwhile
            if int(fields[2]) == pgid:  # state, ppid, pgrp
                states[int(entry.name)] = fields[0]
    return states


def stop_the_group(server: Server) -> float:
    """SIGSTOP every process of the server; returns when all are seen stopped."""
    os.killpg(server.pid, signal.SIGSTOP)
    members = group_states(server.pid)
    assert len(members) >= 1 + server.processes  # the parent, its workers (and their pool processes)
    assert wait_for(lambda: set(group_states(server.pid).values()) == {"T"}), group_states(server.pid)
    return time.monotonic()


def continue_the_group(server: Server, parent_first: bool) -> None:
    if parent_first:
        os.kill(server.pid, signal.SIGCONT)
        assert wait_for(lambda: group_states(server.pid)[server.pid] != "T")
        time.sleep(2 * 0.25)  # two turns of the parent's loop, its workers still stopped
    os.killpg(server.pid, signal.SIGCONT)


@contextmanager
def connection_to_every_worker(server: Server) -> Iterator[dict[int, http.client.HTTPConnection]]:
    """worker pid -> a keep-alive connection that worker serves (its /healthz names its pid)."""
    with ExitStack() as stack:
        found: dict[int, http.client.HTTPConnection] = {}
        for _ in range(60):
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            stack.callback(conn.close)
            conn.request("GET", "/healthz")
            pid = int(orjson.loads(conn.getresponse().read())["instance"].rsplit("/", 1)[1])
            found.setdefault(pid, conn)
            if len(found) == server.processes:
                break
        assert set(found) == server.worker_pids()
        yield found


def send_half(conn: http.client.HTTPConnection, body: bytes) -> bytes:
    """Send the head and the first half of a POST /ingest of ``body``; returns the rest."""
    conn.putrequest("POST", "/ingest")
    conn.putheader("Content-Type", "application/x-ndjson")
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body[: len(body) // 2])
    return body[len(body) // 2 :]


@pytest.mark.hardening(_FINDING)
@pytest.mark.parametrize("parent_first", [False, True], ids=["continued-together", "parent-continued-first"])
def test_a_whole_server_paused_past_its_stall_timeout_keeps_its_workers_and_their_requests(
    tmp_path: Path, parent_first: bool, figures: dict[str, object]
) -> None:
    data = tmp_path / "data"
    args = ("--stall-timeout", str(STALL), "--lock-timeout", str(LOCK))
    with Server(data, *args, processes=2) as server, connection_to_every_worker(server) as conns:
        workers = server.worker_pids()
        bodies = {pid: orjson.dumps(record(ip_id=pid)) + b"\n" for pid in conns}
        rests = {pid: send_half(conn, bodies[pid]) for pid, conn in conns.items()}
        time.sleep(0.3)  # the halves reach the workers, which wait for the rest
        stopped = stop_the_group(server)
        time.sleep(PAUSE)
        paused = time.monotonic() - stopped
        continue_the_group(server, parent_first)
        for pid, conn in conns.items():
            conn.send(rests[pid])
        statuses = {pid: conn.getresponse().status for pid, conn in conns.items()}
        time.sleep(STALL + 0.5)  # a kill postponed rather than spared would show now
        after = server.worker_pids()
        log = server.log()
    assert paused > STALL + LOCK
    assert statuses == {pid: 200 for pid in workers}
    assert after == workers and "stalled" not in log
    assert "this process did not run for" in log  # the parent saw its own pause
    rows = (data / "2014-05-04.csv").read_bytes().splitlines()[1:]
    assert len(rows) == len(workers)
    figures.update(paused_seconds=round(paused, 1), stall_timeout=STALL, workers_kept=len(after & workers))


@pytest.mark.hardening(_FINDING)
def test_a_server_paused_while_it_drains_is_not_killed_for_its_pause(tmp_path: Path) -> None:
    """SIGTERM, then the whole server stopped past its drain deadline (--drain-timeout + 2 s):
    continued, its worker finishes draining and the server exits 0, not killed as late."""
    server = Server(tmp_path / "data", "--drain-timeout", "2", processes=1).start()
    try:
        with connection_to_every_worker(server) as conns:
            (conn,) = conns.values()
            send_half(conn, orjson.dumps(record()) + b"\n")  # keeps the worker draining
            time.sleep(0.3)
            assert server.proc is not None
            server.proc.send_signal(signal.SIGTERM)
            assert wait_for(lambda: "draining 1 worker(s)" in server.log())
            stopped = stop_the_group(server)
            time.sleep(2 + 2 + 2)
            paused = time.monotonic() - stopped
            continue_the_group(server, parent_first=True)
            code = server.proc.wait(15)  # not server.stop(): a second SIGTERM means "kill them now"
    finally:
        server.kill()
    assert paused > 2 + 2
    assert "did not stop in time" not in server.log()
    assert code == 0


def test_a_worker_stopped_alone_is_still_replaced(tmp_path: Path) -> None:
    """The parent runs on: the stopped worker's silence counts, and its socket goes to a new one."""
    with Server(tmp_path / "data", "--stall-timeout", str(STALL), "--lock-timeout", str(LOCK), processes=2) as server:
        victim = min(server.worker_pids())
        os.kill(victim, signal.SIGSTOP)
        stopped = time.monotonic()
        assert wait_for(lambda: victim not in server.worker_pids() and len(server.worker_pids()) == 2, 15)
        took = time.monotonic() - stopped
        line = orjson.dumps(record()) + b"\n"
        assert all(server.ingest(line).status == 200 for _ in range(10))
        log = server.log()
    assert f"(pid {victim}) stalled: its event loop has not run for" in log
    assert "this process did not run" not in log
    assert took < STALL + LOCK + 2

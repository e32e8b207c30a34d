"""Faults under load: killed workers and parents, full disks, slow clients, hostile paths.

Every run is bounded (TINY_RELIABILITY_SCALE stretches them for `make reliability`) and
records its figures for docs/reliability.md.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import SCALE
from tests.support import Load, Server, alive, body_of, needs_root, record, tmpfs, wait_for

pytestmark = pytest.mark.reliability  # `make reliability` runs these longer


def test_kill9_of_a_worker_under_load_loses_no_acked_row(tmp_path: Path, figures: dict[str, Any]) -> None:
    """kill -9 of one of 2 forked workers while 8 clients post 200-record batches."""
    with Server(tmp_path / "data", processes=2) as server:
        load = Load(server.port, "2014-05-04", clients=8, size=200).start()
        time.sleep(1.0 * SCALE)
        victim = min(server.worker_pids())
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        assert wait_for(lambda: victim not in server.worker_pids() and len(server.worker_pids()) == 2, 3.0)
        restarted = time.monotonic() - killed
        time.sleep(1.5 * SCALE)
        load.stop()
    counts = load.check_day_file(tmp_path / "data")
    figures.update(
        case="kill -9 of one worker (2 workers, 8 clients)",
        requests=len(load.requests),
        statuses=load.statuses(),
        restart_seconds=round(restarted, 3),
        **counts,
    )
    assert restarted < 1.0
    assert load.statuses().get("200", 0) > 0


def test_sigterm_under_load_exits_zero_in_time(tmp_path: Path, figures: dict[str, Any]) -> None:
    """SIGTERM of the whole server while 8 clients post."""
    server = Server(tmp_path / "data", processes=2).start()
    load = Load(server.port, "2014-05-04", clients=8, size=200).start()
    try:
        time.sleep(1.5 * SCALE)
        started = time.monotonic()
        code = server.stop(signal.SIGTERM)
        took = time.monotonic() - started
    finally:
        load.stop()
        server.kill()
        server.kill()
    counts = load.check_day_file(tmp_path / "data")
    figures.update(
        case="SIGTERM under load (2 workers, 8 clients)",
        requests=len(load.requests),
        statuses=load.statuses(),
        exit_code=code,
        stop_seconds=round(took, 3),
        **counts,
    )
    assert code == 0 and took < 10


def test_sighup_drains_and_exits_zero_as_sigterm_does(tmp_path: Path) -> None:
    """A terminal that hangs up sends SIGHUP to the whole process group, the workers too: the
    server drains as it does for SIGTERM, each acknowledged row kept, instead of dying unlogged."""
    with Server(tmp_path / "data", processes=2) as server:
        assert server.ingest(body_of(1)).status == 200
        os.killpg(server.proc.pid, signal.SIGHUP)  # the process group, as a terminal's hangup
        assert server.proc is not None and server.proc.wait(15) == 0
        assert "got SIGHUP; draining" in server.log(), server.log()[-3000:]
    assert (tmp_path / "data" / "2014-05-04.csv").read_bytes().count(b"\n") == 21  # the header and 20 rows


def test_a_path_of_900_kb_is_a_small_404_and_a_short_log_line(tmp_path: Path) -> None:
    """The path was echoed whole in the 404 and logged twice: 1.7 MB of log a request."""
    with Server(tmp_path / "data") as server:
        before = len(server.log())
        response = server.request("GET", "/" + "a" * 900_000)
        assert response.status == 404 and len(response.body) < 1000, len(response.body)
        assert "900,001 characters" in response.json()["error"]["message"]
        assert wait_for(lambda: "404 GET /aaa" in server.log()[before:])
        assert len(server.log()) - before < 2000, server.log()[before : before + 500]


def test_a_write_the_disk_refuses_for_one_file_names_that_file(tmp_path: Path) -> None:
    """ "the disk refused the write: Permission denied" left the operator to guess which file."""
    day = tmp_path / "data" / "2014-05-04.csv"
    day.mkdir(parents=True)  # refused as root too (EISDIR), as a file of mode 000 is for others
    with Server(tmp_path / "data") as server:
        response = server.ingest(body_of(1))
        assert response.status == 503, response.body
        assert f"Is a directory ({day})" in response.json()["error"]["message"]
        assert f"Is a directory ({day})" in server.request("GET", "/healthz").json()["reason"]


def test_kill9_of_the_parent_leaves_no_orphan_and_the_port_restarts(tmp_path: Path, figures: dict[str, Any]) -> None:
    """kill -9 of the parent while 4 clients post; then a new server on the same port."""
    server = Server(tmp_path / "data", processes=2).start()
    load = Load(server.port, "2014-05-04", clients=4, size=200).start()
    try:
        time.sleep(1.0 * SCALE)
        workers, port = server.worker_pids(), server.port
        os.kill(server.pid, signal.SIGKILL)
        killed = time.monotonic()
        assert wait_for(lambda: not any(alive(pid) for pid in workers), 5.0), "orphaned workers kept serving"
        gone = time.monotonic() - killed
    finally:
        load.stop()
        server.kill()
        server.kill()
    counts = load.check_day_file(tmp_path / "data")
    with Server(tmp_path / "data", processes=2, port=port) as again:
        restarted_ok = again.ingest(orjson.dumps(record())).status == 200
    figures.update(
        case="kill -9 of the parent (2 workers, 4 clients)",
        requests=len(load.requests),
        statuses=load.statuses(),
        orphans_gone_seconds=round(gone, 3),
        same_port_restart=restarted_ok,
        **counts,
    )
    assert restarted_ok


def _limit_file_size(limit: int) -> None:
    # soft limit only: the test may lift it again without privileges
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))


def _post_until_refused(server: Server, load: Load, attempts: int) -> dict[str, int]:
    statuses: dict[str, int] = {}
    for number in range(attempts):
        response = server.ingest(b"\n".join(load.batch(0, number)))
        statuses[str(response.status)] = statuses.get(str(response.status), 0) + 1
        load.note(load.batch(0, number), response.status)
        if response.status != 200:
            assert response.status == 503, response.body
            assert "disk refused" in response.json()["error"]["message"]
            assert response.headers["retry-after"].isdigit()
    return statuses


def test_file_size_limit_gets_503_keeps_lines_whole_and_recovers(tmp_path: Path, figures: dict[str, Any]) -> None:
    """RLIMIT_FSIZE of 100 KB on the server: writes past it fail with EFBIG."""
    limit = 100_000
    server = Server(tmp_path / "data")
    server.preexec = lambda: _limit_file_size(limit)  # type: ignore[attr-defined]
    with server:
        load = Load(server.port, "2014-05-04", size=100)
        statuses = _post_until_refused(server, load, 15)
        day = tmp_path / "data" / "2014-05-04.csv"
        assert day.stat().st_size <= limit
        counts = load.check_day_file(day.parent)
        health = server.request("GET", "/healthz")  # still running, and it says writes fail
        assert health.status == 503 and "File too large" in health.json()["reason"], health.body
        resource.prlimit(server.worker_pid(), resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        recovered = server.ingest(b"\n".join(load.batch(1, 0)))
        assert recovered.status == 200
        assert server.request("GET", "/healthz").status == 200
        load.note(load.batch(1, 0), 200)
        counts = load.check_day_file(day.parent)
    figures.update(
        case="file size limit (RLIMIT_FSIZE 100 KB, 100-record batches)",
        statuses=statuses,
        accepted_after_limit_lifted=True,
        **counts,
    )
    assert statuses.get("503", 0) > 0 and statuses.get("200", 0) > 0


@needs_root
def test_full_tmpfs_gets_503_and_accepts_again_when_space_is_back(tmp_path: Path, figures: dict[str, Any]) -> None:
    """DATA_DIR on a 256 KB tmpfs: ENOSPC, then the tmpfs is grown."""
    with tmpfs(tmp_path / "data", "256k") as data, Server(data) as server:
        load = Load(server.port, "2014-05-04", size=100)
        statuses = _post_until_refused(server, load, 40)
        day = data / "2014-05-04.csv"
        counts = load.check_day_file(day.parent)
        subprocess.run(["mount", "-o", "remount,size=4m", str(data)], check=True)
        assert server.ingest(b"\n".join(load.batch(1, 0))).status == 200
        load.note(load.batch(1, 0), 200)
        counts = load.check_day_file(day.parent)
    figures.update(
        case="disk full (tmpfs 256 KB, 100-record batches)", statuses=statuses, accepted_after_space_back=True, **counts
    )
    assert statuses.get("503", 0) > 0


@needs_root
def test_a_full_disk_keeps_healthz_failing_until_space_is_back_then_clears_without_a_write(tmp_path: Path) -> None:
    """/healthz probes the write path once a second; a probe writes nothing, so after the disk
    refused a flush it also asks for room for that flush's bytes: it fails while the disk is
    full (never "ok" to a balancer while every write gets 503) and clears once there is room."""
    with tmpfs(tmp_path / "data", "256k") as data, Server(data) as server:
        load = Load(server.port, "2014-05-04", size=100)
        assert _post_until_refused(server, load, 40).get("503", 0) > 0  # precondition: the disk is full
        answers = []
        deadline = time.monotonic() + 3.5  # three probes and more
        while time.monotonic() < deadline:
            answers.append(server.request("GET", "/healthz"))
            time.sleep(0.25)
        assert [a.status for a in answers] == [503] * len(answers), [a.body for a in answers if a.status != 503]
        assert "bytes free" in answers[-1].json()["reason"], answers[-1].body
        subprocess.run(["mount", "-o", "remount,size=4m", str(data)], check=True)
        assert wait_for(lambda: server.request("GET", "/healthz").status == 200, timeout=5.0)
        assert server.ingest(b"\n".join(load.batch(1, 0))).status == 200


def _slow_client(port: int, payload: bytes, pause: float, until: float) -> tuple[bool, float]:
    """Send ``payload`` a byte at a time; return (closed by the server, seconds until then)."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=until) as sock:
        try:
            for byte in payload:
                sock.sendall(bytes([byte]))
                time.sleep(pause)
                if time.monotonic() - started > until:
                    return False, time.monotonic() - started
            sock.settimeout(until)
            closed = sock.recv(1024) == b""
        except (ConnectionResetError, BrokenPipeError):
            closed = True
        return closed, time.monotonic() - started


def test_slow_and_idle_clients_are_cut_off_while_fast_ones_are_served(tmp_path: Path, figures: dict[str, Any]) -> None:
    """slowloris headers, a body trickling byte by byte, 200 idle connections; timeouts of 1 s."""
    with Server(tmp_path / "data", "--idle-timeout", "1", "--body-timeout", "1") as server:
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(200)]
        results: dict[str, tuple[bool, float]] = {}
        head = b"POST /ingest HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n"
        body = orjson.dumps(record()) * 5
        trickle_head = b"POST /ingest HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
        threads = [
            threading.Thread(target=lambda: results.__setitem__("headers", _slow_client(server.port, head, 0.05, 10))),
            threading.Thread(
                target=lambda: results.__setitem__("body", _slow_client(server.port, trickle_head + body, 0.05, 10))
            ),
        ]
        for thread in threads:
            thread.start()
        latencies = []
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            started = time.monotonic()
            assert server.ingest(orjson.dumps(record())).status == 200
            latencies.append(time.monotonic() - started)
        for thread in threads:
            thread.join(15)
        time.sleep(0.5)
        idle_closed = 0
        for sock in idle:
            sock.settimeout(2)
            try:
                idle_closed += sock.recv(1) == b""
            except (TimeoutError, ConnectionResetError):
                pass
            sock.close()
    latencies.sort()
    figures.update(
        case="slow headers, trickled body, 200 idle connections (timeouts 1 s)",
        slow_headers_cut_after_s=round(results["headers"][1], 2),
        trickled_body_cut_after_s=round(results["body"][1], 2),
        idle_closed=idle_closed,
        fast_requests=len(latencies),
        fast_p99_ms=round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 1),
    )
    assert results["headers"][0] and results["headers"][1] < 3
    assert results["body"][0] and results["body"][1] < 4
    assert idle_closed == 200
    assert latencies[-1] < 1.0


@pytest.mark.parametrize(
    "date",
    [
        "../../../tmp/escape",
        "/etc/passwd",
        "2014-05-04/../../x",
        "2014-05-04\x00",
        "..",
        "2014-05-04.csv",
        " 2014-05-04",
    ],
)
def test_a_date_can_never_name_a_file_outside_the_data_dir(tmp_path: Path, date: str) -> None:
    data = tmp_path / "a" / "data"
    with Server(data) as server:
        answer = server.ingest(orjson.dumps(record(date=date))).json()
        assert answer["result"]["stats"]["records"]["invalid"] == 1
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert all(p.startswith(("a/data/rejects/", "a/data/.tiny/", "a/data/.tiny-id")) for p in written), written


def _nofile(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


def _closed_soon(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def _exchange(conn: socket.socket, request: bytes) -> bytes:
    """One request on a kept-alive raw connection; the answer's head and body."""
    conn.sendall(request)
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += conn.recv(65536)
    head, _, body = answer.partition(b"\r\n\r\n")
    length = int(re.search(rb"Content-Length: (\d+)", head, re.I).group(1))  # type: ignore[union-attr]
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


@pytest.mark.hardening("ingest 6: idle connections exhausted the file descriptors")
def test_idle_connections_cannot_take_the_descriptors_an_accepted_batch_needs(
    tmp_path: Path, figures: dict[str, Any]
) -> None:
    """Under `ulimit -n 128`, 200 idle connections: those past the cap are closed at once, and a
    batch on an accepted connection is written (before: 503 "Too many open files"). (A bound of
    1,000 keys: the default's key log may span 388 segments, a descriptor each, more than 128.)"""
    server = Server(tmp_path / "data", "--idempotency-max-keys", "1000", preexec=lambda: _nofile(128))
    with server:
        cap = int(re.search(r"at most (\d+) connections per worker", server.log()).group(1))  # type: ignore[union-attr]
        first = socket.create_connection(("127.0.0.1", server.port))
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(200)]
        open_ones, deadline = list(idle), time.monotonic() + 5
        while len(open_ones) > cap - 1 and time.monotonic() < deadline:  # the server accepts, closes
            open_ones = [sock for sock in open_ones if not _closed_soon(sock, 0.01)]
        closed = len(idle) - len(open_ones)
        body = b"".join(orjson.dumps(record(date=f"2014-05-{day:02d}")) + b"\n" for day in range(1, 17))
        answer = _exchange(
            first, b"POST /ingest HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        metrics = _exchange(first, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").decode()
        for sock in [first, *idle]:
            sock.close()
    gauge = float(re.search(r"^tiny_open_connections (\S+)$", metrics, re.M).group(1))  # type: ignore[union-attr]
    figures.update(
        case="200 idle connections under ulimit -n 128",
        connection_cap=cap,
        closed_at_once=closed,
        batch_of_16_days=answer.split(b"\r\n", 1)[0].decode(),
        open_connections_gauge=gauge,
    )
    assert answer.startswith(b"HTTP/1.1 200 ") and b'"valid":16' in answer
    assert 0 < cap < 128 and closed == 201 - cap and gauge == cap
    assert len(list((tmp_path / "data").glob("*.csv"))) == 16


@pytest.mark.hardening("ingest 6: idle connections exhausted the file descriptors")
def test_accept_errors_back_off_instead_of_spinning(tmp_path: Path) -> None:
    """When accept() runs out of descriptors (the limit lowered under a running worker), the
    worker logs about once a second and pauses, instead of a traceback per try at 100% CPU."""
    with Server(tmp_path / "data") as server:
        worker = server.worker_pid()
        in_use = len(os.listdir(f"/proc/{worker}/fd"))
        soft, hard = resource.prlimit(worker, resource.RLIMIT_NOFILE)
        resource.prlimit(worker, resource.RLIMIT_NOFILE, (in_use, hard))
        cpu_before = _cpu_seconds(worker)
        waiting = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(5)]
        time.sleep(2.5)
        cpu = _cpu_seconds(worker) - cpu_before
        errors = server.log().count("accept() failed")
        resource.prlimit(worker, resource.RLIMIT_NOFILE, (soft, hard))
        answer = _exchange(waiting[0], b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        for sock in waiting:
            sock.close()
    assert 1 <= errors <= 4, f"{errors} accept errors logged in 2.5 s"
    assert "Traceback" not in server.log()
    assert cpu < 0.5, f"the worker spent {cpu:.2f} CPU-s in 2.5 s"
    assert answer.startswith(b"HTTP/1.1 200 ")  # the queued connection is served once descriptors are back


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

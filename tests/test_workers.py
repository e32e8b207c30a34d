"""Processes: a dead worker is replaced, orphans stop, the port is free again at once."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from tests.support import ROOT, Server, record, wait_for
from tiny.testing import server_env


def test_a_killed_worker_is_replaced_within_a_second(tmp_path: Path) -> None:
    """(A worker that dies within a second of its own start is restarted after a second's
    back-off instead: this one has served for longer.)"""
    with Server(tmp_path / "data", processes=2) as server:
        time.sleep(1.1)
        victim = min(server.worker_pids())
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        assert wait_for(lambda: len(server.worker_pids()) == 2 and victim not in server.worker_pids(), 3.0)
        assert time.monotonic() - killed < 1.0
        line = orjson.dumps(record()) + b"\n"
        assert all(server.ingest(line).status == 200 for _ in range(20))
        assert "restarting it" in server.log()


def test_sigint_stops_like_sigterm(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", processes=2).start()
    try:
        assert server.stop(signal.SIGINT) == 0
    finally:
        server.kill()


def _start_on(port: int, data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``app.py`` on ``port``, expected to give up at once: its exit status and output."""
    argv = [sys.executable, str(ROOT / "app.py"), "--port", str(port), "--data-dir", str(data), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=20, env=server_env())


@pytest.mark.hardening("ingest 5: a second server on a port in use started and took traffic")
def test_a_second_server_on_a_port_in_use_fails_at_once_and_takes_no_traffic(tmp_path: Path) -> None:
    """Without the check, SO_REUSEPORT let a second server (here without the first's token)
    join the port and the kernel sent it about half of the connections."""
    with Server(tmp_path / "first", processes=2, env={"TINY_TOKEN": "s3cret"}) as first:
        started = time.monotonic()
        second = _start_on(first.port, tmp_path / "second", "--processes", "2")
        assert second.returncode == 1 and time.monotonic() - started < 10
        assert "address already in use" in second.stdout + second.stderr
        statuses = [first.ingest(orjson.dumps(record())).status for _ in range(40)]
    assert statuses == [401] * 40  # every connection reached the server that has the token
    assert not list((tmp_path / "second").glob("*.csv"))


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--data-dir", "{file}"], "the data dir {file} cannot be made: File exists"),
        (["--address", "no-such-host.invalid"], "cannot listen on no-such-host.invalid:0"),
        (["--address", "192.0.2.1"], "cannot listen on 192.0.2.1:0: Cannot assign requested address"),
    ],
)
def test_a_data_dir_or_address_that_cannot_be_used_stops_the_start_with_a_message(
    tmp_path: Path, args: list[str], said: str
) -> None:
    """A file where the data dir goes, a name that does not resolve, an address not of this
    host: exit 1 with one line saying so, not a traceback."""
    (tmp_path / "file").write_text("")
    argv = [part.format(file=tmp_path / "file") for part in args]
    done = _start_on(0, tmp_path / "data", *argv)
    output = done.stdout + done.stderr
    assert done.returncode == 1 and said.format(file=tmp_path / "file") in output, output
    assert "Traceback" not in output


@pytest.mark.hardening("ingest 5: a second server on a port in use started and took traffic")
def test_a_foreign_reuseport_listener_on_the_port_is_refused_too(tmp_path: Path) -> None:
    with socket.socket() as other:  # another program that allows port sharing
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", 0))
        other.listen()
        done = _start_on(other.getsockname()[1], tmp_path / "data")
    assert done.returncode == 1 and "address already in use" in done.stdout + done.stderr


@pytest.mark.hardening("ingest 5: a second server on a port in use started and took traffic")
def test_a_restart_right_after_a_clean_stop_gets_the_same_port(tmp_path: Path) -> None:
    with Server(tmp_path / "data", processes=2) as server:
        port = server.port
        for _ in range(20):  # connections the server closes first are left in TIME_WAIT
            server.ingest(orjson.dumps(record()))
    with Server(tmp_path / "data", processes=2, port=port) as again:
        assert again.ingest(orjson.dumps(record())).status == 200

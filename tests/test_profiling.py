"""``kernprof -l app.py``, as users run it (tiny.profiling): the server serves in the profiled
process, every connection is answered, and Ctrl-C writes the profile."""

from __future__ import annotations

import http.client
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson

from tests.support import record
from tiny.testing import APP, free_port, server_env


def test_kernprof_without_flags_serves_every_connection_and_writes_the_profile(tmp_path: Path) -> None:
    """Without --processes 1 the server bound a socket per core and served one: the
    connections the kernel gave the others waited for ever."""
    port = free_port()
    log_path = tmp_path / "server.log"
    command = [sys.executable, "-m", "kernprof", "-l", "-o", str(tmp_path / "app.py.lprof"), str(APP)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*command, "--port", str(port), "--data-dir", str(tmp_path / "data")],
            cwd=tmp_path,
            env=server_env(None),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 30
        while "ready" not in log_path.read_text() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        body = orjson.dumps(record()) + b"\n"
        for _ in range(24):  # each a new connection: SO_REUSEPORT spreads them over the sockets
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("POST", "/ingest", body)
            assert conn.getresponse().status == 200, log_path.read_text()
            conn.close()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0, log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "1 worker process(es) in this process" in log_path.read_text()
    assert (tmp_path / "app.py.lprof").stat().st_size > 0
    assert len((tmp_path / "data" / "2014-05-04.csv").read_bytes().splitlines()) == 1 + 24

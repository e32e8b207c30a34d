"""Test support: start the real server as a subprocess and talk to it over real sockets."""

from __future__ import annotations

import gzip
import http.client
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DAY = ROOT.parent / "shared" / "data" / "cran-logs" / "2014-05-04.csv.gz"
_LISTENING = re.compile(r"listening on http://([^:]+):(\d+)")


@cache
def sample_csv() -> bytes:
    """The real public file of 2014-05-04, uncompressed."""
    return gzip.decompress(SAMPLE_DAY.read_bytes())


@cache
def sample_lines() -> tuple[bytes, ...]:
    """The sample day as NDJSON lines (LF-terminated), in file order."""
    from tiny.cranlog import ndjson_lines

    return tuple(ndjson_lines(SAMPLE_DAY))


def batches(lines: tuple[bytes, ...], size: int) -> Iterator[bytes]:
    """Consecutive bodies of ``size`` lines each."""
    it = iter(lines)
    while chunk := list(itertools.islice(it, size)):
        yield b"".join(chunk)


def record(**fields: Any) -> dict[str, Any]:
    """A valid record, with ``fields`` overriding (a value of ... removes the key)."""
    base: dict[str, Any] = {
        "date": "2014-05-04",
        "time": "00:50:55",
        "size": 695181,
        "r_version": "3.0.2",
        "r_arch": "x86_64",
        "r_os": "linux-gnu",
        "package": "caret",
        "version": "6.0-24",
        "country": "MX",
        "ip_id": 1,
    }
    base.update(fields)
    return {k: v for k, v in base.items() if v is not ...}


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


class Server:
    """``python app.py`` in a subprocess on 127.0.0.1 and a free port, for one test.

    The port comes from the server's own start-up line (``--port 0``), so tests never race
    for ports. ``stop()`` sends SIGTERM and returns the exit code; the context manager
    always leaves no process behind.
    """

    def __init__(
        self, data_dir: Path, *args: str, processes: int = 1, env: dict[str, str] | None = None, port: int = 0
    ) -> None:
        self.data_dir = data_dir
        self.processes = processes
        self.args = ["--port", str(port), "--processes", str(processes), "--data-dir", str(data_dir), *args]
        scratch = data_dir.parent / "tmp"  # the metrics dir a kill -9'd server cannot remove lands here
        scratch.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(scratch), **(env or {})}
        self.output: list[str] = []
        self.preexec: Callable[[], None] | None = None  # runs in the child before exec
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0

    def start(self, timeout: float = 15.0) -> Server:
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "app.py"), *self.args],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            preexec_fn=self.preexec,
        )
        listening = threading.Event()

        def read() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                self.output.append(line)
                match = _LISTENING.search(line)
                if match:
                    self.port = int(match.group(2))
                    listening.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        if not listening.wait(timeout):
            self.kill()
            raise RuntimeError("server did not start:\n" + self.log())
        deadline = time.monotonic() + timeout
        while self.log().count(" ready (codec ") < self.processes and time.monotonic() < deadline:
            time.sleep(0.02)  # every worker has its signal handlers and serves
        while time.monotonic() < deadline:
            try:
                if self.request("GET", "/healthz").status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError("server never became healthy:\n" + self.log())

    def log(self) -> str:
        return "".join(self.output)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> Response:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
        finally:
            conn.close()

    def ingest(self, body: bytes, headers: dict[str, str] | None = None) -> Response:
        return self.request("POST", "/ingest", body, headers)

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(5)
            self.close()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.stop()
            finally:
                self.kill()
        self.close()

    def close(self) -> None:
        """Kill anything left in the server's session and release the output pipe."""
        if self.proc is None:
            return
        try:  # workers are in the server's session: none may outlive the test
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def rows_of(path: Path) -> list[bytes]:
    """The lines of a day file (each with its LF)."""
    return path.read_bytes().splitlines(keepends=True)


class TaggedLoad:
    """Client threads posting batches whose rows are unique and traceable, until stopped.

    Keeps every acknowledged batch (its NDJSON lines), the statuses seen and the requests
    that got no answer, so a test can check the day file against what was acked.
    """

    def __init__(self, server: Server, clients: int = 8, size: int = 200) -> None:
        self.server = server
        self.clients = clients
        self.size = size
        self.acked: list[list[bytes]] = []
        self.statuses: dict[str, int] = {}
        self.sent = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(n,), daemon=True) for n in range(clients)]
        self._lock = threading.Lock()

    def batch(self, client: int, number: int) -> list[bytes]:
        tag = f"c{client}b{number}"
        return [
            json.dumps(record(ip_id=client * 10**7 + number * 10**3 + i + 1, package=tag)).encode()
            for i in range(self.size)
        ]

    def _client(self, client: int) -> None:
        number = 0
        conn: http.client.HTTPConnection | None = None
        while not self._stop.is_set():
            lines = self.batch(client, number)
            number += 1
            try:
                conn = conn or http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
                conn.request("POST", "/ingest", b"\n".join(lines))
                response = conn.getresponse()
                response.read()
                status = str(response.status)
            except (OSError, http.client.HTTPException):
                status = "no answer"
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.01)
            with self._lock:
                self.sent += 1
                self.statuses[status] = self.statuses.get(status, 0) + 1
                if status == "200":
                    self.acked.append(lines)
        if conn is not None:
            conn.close()

    def start(self) -> TaggedLoad:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def check_day_file(self, path: Path) -> dict[str, int]:
        """Assert the day file holds every acked row once, each batch whole and in order,
        and no torn line; return the counts for the figures."""
        from tiny.codec import HEADER, encode_reference
        from tiny.cranlog import parse_row

        lines = path.read_bytes().split(b"\n")
        assert lines[-1] == b"", "the file does not end with LF"
        rows = lines[1:-1]
        assert lines[0] + b"\n" == HEADER and HEADER.rstrip(b"\n") not in rows
        for row in rows:
            parse_row(row.decode())  # raises on a torn or interleaved line
        position = {row: i for i, row in enumerate(rows)}
        assert len(position) == len(rows), "a row is on disk twice"
        lost = 0
        for batch in self.acked:
            expected = encode_reference(b"\n".join(batch)).days["2014-05-04"].rstrip(b"\n").split(b"\n")
            places = [position.get(row) for row in expected]
            if None in places:
                lost += sum(p is None for p in places)
                continue
            assert places == list(range(places[0], places[0] + len(places))), "a batch is not contiguous"
        assert lost == 0, f"{lost} acknowledged rows are missing"
        acked_rows = len(self.acked) * self.size
        return {
            "rows_on_disk": len(rows),
            "acked_rows": acked_rows,
            "unacked_rows_on_disk": len(rows) - acked_rows,
            "lost": lost,
            "torn": 0,
        }

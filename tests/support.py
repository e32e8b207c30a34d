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


REQUEST_TIMEOUT = 10.0  # seconds for any one HTTP request of a Load


def http_get(port: int, path: str, timeout: float = REQUEST_TIMEOUT) -> tuple[int, dict[str, str], bytes]:
    """GET 127.0.0.1:port/path on a new connection: (status, lower-cased headers, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def is_json_error(content_type: str, body: bytes) -> bool:
    """True for the JSON error shape {"error": {..., "message": "..."}}."""
    try:
        return content_type.startswith("application/json") and bool(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return False


class Load:
    """Client threads posting unique, traceable batches of one day through nginx until stopped.

    Records each request's start time, duration and status, and the lines of every
    acknowledged batch. ``no answer``: the connection failed or closed before any answer.
    """

    def __init__(self, port: int, day: str, clients: int = 6, size: int = 100, max_seconds: float = 60.0) -> None:
        self.port = port
        self.day = day
        self.clients = clients
        self.size = size
        self.deadline = time.monotonic() + max_seconds
        self.requests: list[tuple[float, float, str, list[bytes]]] = []  # (started, seconds, status, lines)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, args=(n,), daemon=True) for n in range(clients)]

    def batch(self, client: int, number: int) -> list[bytes]:
        return [
            json.dumps(record(date=self.day, ip_id=client * 10**7 + number * 10**3 + i + 1)).encode()
            for i in range(self.size)
        ]

    def _client(self, client: int) -> None:
        conn: http.client.HTTPConnection | None = None
        number = 0
        while not self._stop.is_set() and time.monotonic() < self.deadline:
            lines = self.batch(client, number)
            number += 1
            started = time.monotonic()
            try:
                conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_TIMEOUT)
                conn.request("POST", "/ingest", b"\n".join(lines), {"Content-Type": "application/x-ndjson"})
                response = conn.getresponse()
                body = response.read()
                status = str(response.status)
                if status != "200" and not is_json_error(response.getheader("Content-Type", ""), body):
                    status += " (not the JSON error shape)"
            except (OSError, http.client.HTTPException):
                status = "no answer"
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.01)
            with self._lock:
                self.requests.append((started, time.monotonic() - started, status, lines))
        if conn is not None:
            conn.close()

    def note(self, lines: list[bytes], status: int) -> None:
        """Record a batch the test posted itself, so check_day_file counts it too."""
        with self._lock:
            self.requests.append((time.monotonic(), 0.0, str(status), lines))

    def start(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def wait_acked(self, count: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked()) < count:
            assert time.monotonic() < deadline, f"only {len(self.acked())} batches acked: {self.statuses()}"
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(REQUEST_TIMEOUT + 5)

    def acked(self) -> list[list[bytes]]:
        with self._lock:
            return [lines for _, _, status, lines in self.requests if status == "200"]

    def statuses(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        with self._lock:
            for _, _, status, _ in self.requests:
                counts[status] = counts.get(status, 0) + 1
        return counts

    def check_day_file(self, data: Path) -> dict[str, int]:
        """Every acked row on disk exactly once and each batch whole; no row twice; no torn line."""
        from tiny.codec import HEADER, encode_reference
        from tiny.cranlog import parse_row

        lines = (data / f"{self.day}.csv").read_bytes().split(b"\n")
        assert lines[0] + b"\n" == HEADER and lines[-1] == b""
        rows = lines[1:-1]
        for row in rows:
            parse_row(row.decode())  # raises on a torn or interleaved line
        position = {row: i for i, row in enumerate(rows)}
        assert len(position) == len(rows), "a row is on disk twice: a POST was replayed"
        lost = 0
        acked = self.acked()
        for batch in acked:
            expected = encode_reference(b"\n".join(batch)).days[self.day].rstrip(b"\n").split(b"\n")
            places = [position.get(row) for row in expected]
            lost += sum(place is None for place in places)
            first = places[0]
            if first is not None and None not in places:
                assert places == list(range(first, first + len(places))), "a batch is not contiguous"
        assert lost == 0, f"{lost} acknowledged rows are missing"
        return {
            "rows_on_disk": len(rows),
            "acked_rows": len(acked) * self.size,
            "unacked_rows_on_disk": len(rows) - len(acked) * self.size,
            "lost": lost,
            "torn": 0,
        }

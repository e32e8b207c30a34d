"""The harness tests/ and bench/ share: the real server in a subprocess, free ports, the sample day, compose.

Like ``tornado.testing``, it ships in the package but the server never imports it. Servers
run on 127.0.0.1 with ``--port 0`` (the port is read back from the start-up line), in
their own session so that nothing outlives a test, with their output in a log file.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from tiny import procfs

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app.py"
SAMPLE_DAY = ROOT.parent / "shared" / "data" / "cran-logs" / "2014-05-04.csv.gz"
_LISTENING = re.compile(r"listening on http://([^:\s]+):(\d+)")
_READY = " ready (codec "  # one line per tiny worker that serves


@cache
def sample_csv() -> bytes:
    """The real public file of 2014-05-04, uncompressed (77,107 rows)."""
    return gzip.decompress(SAMPLE_DAY.read_bytes())


@cache
def sample_lines() -> tuple[bytes, ...]:
    """The sample day as NDJSON lines (LF-terminated), in file order."""
    from tiny.cranlog import ndjson_lines

    return tuple(ndjson_lines(SAMPLE_DAY))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for servers that need a fixed port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port_block(count: int) -> int:
    """A base port B (a multiple of 10) with B .. B+count-1 all free on 127.0.0.1, below the
    kernel's range of ephemeral ports: a port in it may be taken, between this check and the
    server's bind, as the local port of some outgoing connection (a proxy's to its upstream)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        base = random.randrange(10000, max(10010, low - count), 10)
        try:
            for port in range(base, base + count):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no free block of {count} ports")


COMPOSE_V2_CONFIG = ROOT / "build" / "docker-config"  # `make compose-v2` puts the v2 plugin here


def compose_variants() -> dict[str, tuple[list[str], dict[str, str]]]:
    """Every docker compose that works here, v2 first: name -> (command, environment to add).

    v2 is ``docker compose`` as installed, or the plugin `make compose-v2` put under
    build/docker-config (for tests only: see mk/scaleout.mk); v1 is ``docker-compose``.
    """
    found: dict[str, tuple[list[str], dict[str, str]]] = {}
    for env in ({}, {"DOCKER_CONFIG": str(COMPOSE_V2_CONFIG)}):
        try:
            done = subprocess.run(
                ["docker", "compose", "version"], capture_output=True, timeout=30, env={**os.environ, **env}
            )
        except (OSError, subprocess.TimeoutExpired):
            break
        if done.returncode == 0:
            found["v2"] = (["docker", "compose"], env)
            break
    if shutil.which("docker-compose"):
        found["v1"] = (["docker-compose"], {})
    return found


def compose_command() -> list[str] | None:
    """``docker compose`` (v2) when it works as installed, else ``docker-compose`` (v1), else None."""
    for command, env in compose_variants().values():
        if not env:
            return command
    return None


def docker_unavailable() -> str | None:
    """Why docker compose cannot run here, or None when it can."""
    if shutil.which("docker") is None:
        return "no docker command"
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`docker info` failed: {exc}"
    if info.returncode != 0:
        return "`docker info` failed: " + (info.stderr.strip().splitlines() or ["?"])[-1]
    if compose_command() is None:
        return "neither `docker compose` nor `docker-compose` works"
    return None


def server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a server under test: ours without TINY_* settings (a user's
    TINY_TOKEN would 401 every request), except TINY_CODEC (the suite's Python-codec run
    sets it), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TINY_") or k == "TINY_CODEC"}
    env["PYTHONUNBUFFERED"] = "1"
    return {**env, **(extra or {})}


class Response:
    """An HTTP answer: status, lower-cased headers, body."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


def request(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> Response:
    """One request to 127.0.0.1:port on a new connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def raw_exchange(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    """Send raw bytes to 127.0.0.1:port; everything sent back before the close or ``timeout`` of quiet."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        out = b""
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return out


def memory(pid: int, field: str = "VmRSS") -> int:
    """A process's memory figure from /proc/PID/status (VmRSS, or VmHWM: its peak), in bytes."""
    for entry in Path(f"/proc/{pid}/status").read_text().splitlines():
        if entry.startswith(field + ":"):
            return int(entry.split()[1]) * 1024
    raise ValueError(f"no {field} for process {pid}")


def http_get(port: int, path: str, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """GET 127.0.0.1:port/path on a new connection: (status, lower-cased headers, body)."""
    response = request(port, "GET", path, timeout=timeout)
    return response.status, response.headers, response.body


class _Client:
    """Requests to a server on 127.0.0.1 at ``self.port``."""

    port: int

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> Response:
        return request(self.port, method, path, body, headers, timeout)

    def ingest(self, body: bytes, headers: dict[str, str] | None = None) -> Response:
        return self.request("POST", "/ingest", body, headers)


class Server(_Client):
    """``python app.py`` (or another server script) in a subprocess on 127.0.0.1, for one test or run.

    ``args`` are extra flags; ``processes`` and ``data_dir`` become ``--processes`` and
    ``--data-dir`` (data_dir None: none, for scripts without one). The port comes from the
    server's own start-up line (``--port 0`` unless ``port`` is given). Output goes to
    ``log_path``, or to a temp file that :meth:`kill` reads back into memory and removes
    (:meth:`log` answers either way). ``preexec`` runs in the child
    before exec (rlimits). :meth:`stop` signals the server and returns its exit code; the
    context manager always leaves no process of its session behind.
    """

    def __init__(
        self,
        data_dir: Path | None,
        *args: str,
        processes: int = 1,
        env: dict[str, str] | None = None,
        port: int = 0,
        script: Path = APP,
        log_path: Path | None = None,
        preexec: Callable[[], None] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.processes = processes
        self.script = script
        self.args = ["--port", str(port), "--processes", str(processes), *args]
        if data_dir is not None:
            self.args += ["--data-dir", str(data_dir)]
            scratch = data_dir.parent / "tmp"  # the metrics dir a kill -9'd server cannot remove lands here
            scratch.mkdir(parents=True, exist_ok=True)
            env = {"TMPDIR": str(scratch), **(env or {})}
        self.env = server_env(env)
        self._own_log = log_path is None
        if log_path is None:
            handle, name = tempfile.mkstemp(prefix="tiny-server-", suffix=".log")
            os.close(handle)
            log_path = Path(name)
        self.log_path = log_path
        self._log_text: str | None = None  # the temp log's last contents, once it is removed
        self.preexec = preexec
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self, timeout: float = 15.0) -> Server:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(self.script), *self.args],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=self.preexec,
            )
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.kill()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.port:
            match = _LISTENING.search(self.log())
            if match:
                self.port = int(match.group(2))
            elif time.monotonic() > deadline or self.exited():
                raise RuntimeError("server did not start:\n" + self.log())
            else:
                time.sleep(0.02)
        if self.script == APP:  # every worker has its signal handlers and serves
            while self.log().count(_READY) < self.processes and time.monotonic() < deadline and not self.exited():
                time.sleep(0.02)
        while time.monotonic() < deadline and not self.exited():
            with contextlib.suppress(OSError):
                if self.request("GET", "/healthz").status == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError("server never became healthy:\n" + self.log())

    def exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def log(self) -> str:
        if self._log_text is not None:
            return self._log_text
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    @property
    def pid(self) -> int:
        """The server's own process: the parent of its workers (or, with --no-fork, the worker)."""
        assert self.proc is not None
        return self.proc.pid

    def worker_pids(self) -> set[int]:
        """The pids of the server's workers: its parent's children (a worker's own children,
        the analytics pool, are not among them)."""
        return set(procfs.children(self.pid))

    def worker_pid(self, timeout: float = 5.0) -> int:
        """The pid of the one worker of a one-worker server (waiting for it to run)."""
        deadline = time.monotonic() + timeout
        while not (pids := self.worker_pids()) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(pids) == 1, f"expected one worker, found {sorted(pids)}"
        return pids.pop()

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        """Send ``signum`` to the server process and wait for it; its exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL everything left in the server's session (its forked workers too)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        if self._own_log and self.proc.poll() is not None and self._log_text is None:
            self._log_text = self.log()
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.stop()
        finally:
            self.kill()


class InProcessServer(_Client):
    """One worker's app, built from its dependencies as tiny.worker builds them, served by its
    HTTP server on 127.0.0.1 from an event loop on a thread of this process: the HTTP contract
    over real sockets and real files, without a subprocess (tests that need processes,
    signals or a crash use :class:`Server`). ``args`` are flags, parsed as the server's.

    The same surface as :class:`Server`: ``port``, :meth:`request`, :meth:`ingest`, and a
    context manager that stops it (the sink flushed and closed).
    """

    _metrics_dir: str | None = None  # this process's, set up once (tiny.metrics.setup)

    def __init__(self, data_dir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        from tiny import config

        self.config = config.parse(["--data-dir", str(data_dir), "--processes", "1", *args], env or {})
        self.data_dir = self.config.data_dir
        self.port = 0
        self._loop: Any = None
        self._thread: Any = None
        self._server: Any = None
        self.deps: Any = None

    def start(self) -> InProcessServer:
        import asyncio
        import threading

        from tiny import metrics, worker
        from tiny.commit.local import LocalCommit

        if InProcessServer._metrics_dir is None:
            InProcessServer._metrics_dir = tempfile.mkdtemp(prefix="tiny-test-metrics-")
            metrics.setup(InProcessServer._metrics_dir)
        journal = LocalCommit(self.config.data_dir, mode=self.config.journal_mode)
        journal.open(keys=False)  # as tiny.prefork does before any worker: the first journal of a data dir
        journal.close()
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            try:
                sock = socket.socket()
                sock.bind(("127.0.0.1", 0))
                sock.listen(128)
                sock.setblocking(False)
                self.port = sock.getsockname()[1]
                self.deps = worker.make_deps(self.config, self.port)
                self._server = worker.make_server(self.deps)
                self._server.add_sockets([sock])
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="in-process-server", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure:
            raise failure[0]
        return self

    def call(self, make: Callable[[], Any], timeout: float = 30.0) -> Any:
        """Run the coroutine ``make()`` on the server's loop and return its result."""
        import asyncio

        return asyncio.run_coroutine_threadsafe(make(), self._loop).result(timeout)

    def stop(self) -> None:
        """Stop accepting, write what the sink holds, close every connection, end the loop."""
        if self._loop is None:
            return
        server, deps = self._server, self.deps

        async def close() -> None:
            server.stop()
            await deps.sink.close()
            deps.analytics.close()
            await server.close_all_connections()

        self.call(close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self._loop = None

    def __enter__(self) -> InProcessServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

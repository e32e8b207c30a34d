"""The benchmark sweep behind BENCHMARKS.md: real servers on 127.0.0.1, driven by ab.

Usage:
    python bench/run.py                       # everything but docker (about 20 minutes on 2 cores)
    python bench/run.py --quick               # smoke test: few points, small -n, into bench/results/quick/
    python bench/run.py --experiments key     # only the 10x ratio: seed-1 vs tiny-1, c=8 -k, 3 rounds
    python bench/run.py --experiments sweep --configs tiny-1,seed-1 --merge   # re-run two, keep the rest
    python bench/run.py --docker              # also docker compose with 1 and 4 replicas
    python bench/run.py --list                # configurations and experiments, then exit

What it does:

1. Bodies from the sample day (../shared/data/cran-logs/2014-05-04.csv.gz, read in place) into
   bench/results/bodies/: the first 1,600 and 16,000 records as NDJSON, the same with the keys
   of every line shuffled (real clients differ), and gzip-compressed ones.
2. Starts each server configuration itself (port 0 or a free port on 127.0.0.1, a scratch data
   dir under bench/results/work/ emptied after every point), warms it up, then runs
   ``ab -t T -n N -c C [-k] -s 20 -l -r -p BODY -T application/x-ndjson URL`` for c = 1, 2, 4,
   8, 16, with and without keep-alive. N is sized from the last measured rate so that a point
   takes about ``--seconds``; -t, -s and a subprocess timeout bound it when the server stalls.
3. Per point: requests/s and records/s (records per body x successful requests / time), the
   mean and p50/p90/p99/max latency (ab -e, exact to the microsecond from 51 requests on; ab's
   integer-ms table below that), failed and non-2xx requests, and the servers' CPU: utime +
   stime from /proc/<pid>/stat of every process of the configuration (parents, forked
   workers, nginx) before and after ab, as CPU-seconds per million records, with the share of
   the busiest process (one forked worker doing all the work shows as ~1.0). The machine's
   other load during the point (busy CPU from /proc/stat minus the servers and ab) is kept
   too: other engineers share these 2 cores.
4. Headline experiments run their arms alternately, round after round (order reversed every
   other round), with all their servers up at once, so slow drift hits every arm alike; the
   report takes medians.
5. Writes bench/results/results.json (machine, versions, every point with its exact ab command
   line) and results.csv; raw ab outputs go to bench/results/ab/, server logs to
   bench/results/logs/. bench/sink_bench.py's figures land in results.json too. Then
   ``python bench/charts.py`` and ``python bench/report.py`` turn them into images/ and tables.

Every server started here is stopped on the way out, also after an error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gzip
import http.client
import itertools
import json
import os
import platform
import random
import re
import resource
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tiny.config import usable_cpus  # noqa: E402
from tiny.cranlog import ndjson_lines  # noqa: E402
from tiny.testing import (  # noqa: E402
    SAMPLE_DAY,
    Server,
    compose_command,
    docker_unavailable,
    free_port,
    memory,
    request,
    server_env,
)

RESULTS = ROOT / "bench" / "results"
PYTHON = sys.executable
CORES = usable_cpus()
CONCURRENCY = (1, 2, 4, 8, 16)
_CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- bodies


@dataclass(frozen=True)
class Body:
    """One request body file that ab posts."""

    name: str
    path: Path
    records: int
    gzip: bool = False

    @property
    def size(self) -> int:
        return self.path.stat().st_size


def _shuffled(line: bytes, rng: random.Random) -> bytes:
    items = list(orjson.loads(line).items())
    rng.shuffle(items)
    return orjson.dumps(dict(items)) + b"\n"


def make_bodies(out_dir: Path, sizes: Sequence[int] = (1600, 16000)) -> dict[str, Body]:
    """Write the bench bodies from the sample day; returns them by name.

    For each size S: ``S`` (the first S records, keys in file order), ``S-shuffled`` (keys in
    a random order per line, seeded), ``S-gzip`` (``S``, gzip level 6).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = list(itertools.islice(ndjson_lines(SAMPLE_DAY), max(sizes)))
    rng = random.Random(20140504)
    bodies: dict[str, Body] = {}
    for size in sizes:
        plain = b"".join(lines[:size])
        variants = {
            f"{size}": (plain, False),
            f"{size}-shuffled": (b"".join(_shuffled(line, rng) for line in lines[:size]), False),
            f"{size}-gzip": (gzip.compress(plain, 6), True),
        }
        for name, (data, compressed) in variants.items():
            path = out_dir / (f"{name}.ndjson.gz" if compressed else f"{name}.ndjson")
            if not path.exists() or path.read_bytes() != data:
                path.write_bytes(data)
            bodies[name] = Body(name, path, size, compressed)
    return bodies


# --------------------------------------------------------------------------- CPU accounting


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # fields 3.. of proc(5); comm may hold spaces


def _parents() -> dict[int, int]:
    """pid -> ppid of every process visible now."""
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None:
                parents[int(entry.name)] = int(fields[1])
    return parents


def process_tree(roots: Sequence[int]) -> list[int]:
    """``roots`` and all their live descendants."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    todo = [pid for pid in roots if Path(f"/proc/{pid}").exists()]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def cpu_seconds(roots: Sequence[int]) -> dict[int, float]:
    """CPU-seconds per process of the trees under ``roots``: utime + stime of all its threads,
    plus cutime + cstime (children it already reaped, e.g. a restarted worker)."""
    times: dict[int, float] = {}
    for pid in process_tree(roots):
        fields = _stat_fields(pid)
        if fields is not None:
            times[pid] = sum(int(value) for value in fields[11:15]) / _CLK_TCK
    return times


def system_busy_seconds() -> float:
    """CPU-seconds the whole machine spent busy since boot (all cores, /proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return (sum(values[:8]) - idle) / _CLK_TCK


def _rss_kb(pid: int) -> int:
    """Resident memory of ``pid`` in KiB (0 once it is gone)."""
    try:
        return memory(pid) // 1024
    except (OSError, ValueError):
        return 0


def key_store(data_dir: Path) -> dict[str, Any]:
    """What a data dir's journal holds: its keys, the database's logical size (its pages, WAL
    frames included) per key, and the files of ``.tiny/`` as they are (the WAL is reused after
    each checkpoint, so its size is bounded, not per key)."""
    journal = data_dir / ".tiny"
    files = {f.name: f.stat().st_size for f in journal.iterdir() if f.is_file()} if journal.is_dir() else {}
    keys, database_bytes = 0, 0
    path = journal / "journal.sqlite3"
    if path.exists():
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)) as db:
            keys = db.execute("SELECT count(*) FROM idempotency_keys").fetchone()[0]
            database_bytes = (
                db.execute("PRAGMA page_count").fetchone()[0] * db.execute("PRAGMA page_size").fetchone()[0]
            )
    return {
        "keys": keys,
        "database_bytes": database_bytes,
        "bytes_per_key": round(database_bytes / keys, 1) if keys else None,
        "files": files,
    }


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# --------------------------------------------------------------------------- processes


def healthz(port: int, timeout: float = 2.0) -> tuple[int, dict[str, Any]]:
    """GET /healthz: (status, decoded body); raises OSError when nothing answers."""
    try:
        response = request(port, "GET", "/healthz", timeout=timeout)
    except http.client.HTTPException as exc:
        raise OSError(str(exc)) from exc
    try:
        return response.status, json.loads(response.body or b"{}")
    except ValueError:
        return response.status, {}


class Service:
    """A running server configuration: a URL to post to and the pids whose CPU counts."""

    url: str = ""
    data_dir: Path | None = None
    info: dict[str, Any]

    def roots(self) -> list[int]:
        raise NotImplementedError

    def roles(self) -> dict[str, list[int]]:
        """Process roots by role (for the CPU split), e.g. {"app": [...], "nginx": [...]}."""
        return {"app": self.roots()}

    def stop(self) -> None:
        raise NotImplementedError


class LocalServer(Service):
    """One ``app.py``, ``bench/seed_server.py`` or ``bench/floor_server.py`` on 127.0.0.1 (tiny.testing.Server)."""

    def __init__(
        self,
        name: str,
        script: str,
        processes: int,
        data_dir: Path | None,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        logs: Path = RESULTS / "logs",
    ) -> None:
        self.server = Server(
            data_dir, *args, processes=processes, env=env, script=ROOT / script, log_path=logs / f"{name}.log"
        )
        self.name = name
        self.processes = processes
        self.data_dir = data_dir
        self.tiny = script == "app.py"
        self.info = {}

    def start(self, timeout: float = 30.0) -> LocalServer:
        self.server.start(timeout)
        self.url = f"http://127.0.0.1:{self.server.port}/ingest"
        self.info = {"codec": healthz(self.server.port)[1].get("codec")}
        time.sleep(0.2 if self.processes == 1 else 0.5)  # forked children: all of them accepting
        return self

    def roots(self) -> list[int]:
        return [self.server.pid]

    def stop(self) -> None:
        try:
            code = self.server.stop() if self.server.proc is not None else None
        except subprocess.TimeoutExpired:
            code = None
        self.server.kill()  # the seed's and floor's forked children too
        if self.tiny and code not in (0, None):
            print(f"  note: {self.name} exited with {code} on SIGTERM (see {self.server.log_path})", file=sys.stderr)


_NGINX_CONF = """# Generated by bench/run.py for one benchmark run; not a deployment file (see nginx/).
daemon off;
worker_processes {workers};
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
{user}
events {{ worker_connections 1024; }}

http {{
    default_type application/json;
    access_log off;
    client_body_temp_path {prefix}/client_body_temp;
    proxy_temp_path {prefix}/proxy_temp;
    fastcgi_temp_path {prefix}/fastcgi_temp;
    uwsgi_temp_path {prefix}/uwsgi_temp;
    scgi_temp_path {prefix}/scgi_temp;

    upstream tiny {{
{servers}
        keepalive 32;
        keepalive_timeout 30s;
    }}

    server {{
        listen 127.0.0.1:{port};
{proxy}
    }}
}}
"""


def nginx_config(prefix: Path, port: int, upstreams: Sequence[int], workers: int, buffering: bool) -> str:
    """nginx.conf for the bench: ``upstream tiny`` over ``upstreams``, nginx/proxy.conf included
    (a copy with ``proxy_request_buffering off`` for buffering=False)."""
    text = (ROOT / "nginx" / "proxy.conf").read_text()
    if not buffering:
        text, count = re.subn(r"(?m)^(\s*proxy_request_buffering\s+)on;", r"\1off;", text)
        assert count == 1, "nginx/proxy.conf no longer says proxy_request_buffering on"
    copy = prefix / "proxy.conf"
    copy.write_text(text)
    proxy = f"        include {copy};"
    servers = "\n".join(f"        server 127.0.0.1:{p} max_fails=0;" for p in upstreams)
    user = "user root root;" if os.geteuid() == 0 else ""  # workers must read the 0700 scratch dir
    return _NGINX_CONF.format(workers=workers, prefix=prefix, user=user, servers=servers, port=port, proxy=proxy)


class NginxFront(Service):
    """nginx on a free port over ``instances`` single-process tiny servers sharing one data dir."""

    def __init__(
        self,
        name: str,
        instances: int,
        data_dir: Path,
        workers: int,
        buffering: bool,
        env: dict[str, str] | None = None,
        logs: Path = RESULTS / "logs",
    ) -> None:
        self.name = name
        self.data_dir = data_dir
        self.scratch = data_dir.parent
        self.apps = [LocalServer(f"{name}-app{i}", "app.py", 1, data_dir, env=env, logs=logs) for i in range(instances)]
        self.workers = workers
        self.buffering = buffering
        self.logs = logs
        self.nginx: subprocess.Popen[bytes] | None = None
        self.prefix: Path | None = None
        self.info = {}

    def start(self) -> NginxFront:
        try:
            for app in self.apps:
                app.start()
            self.prefix = Path(tempfile.mkdtemp(prefix="nginx-", dir=self.scratch))
            port = free_port()
            upstreams = [int(app.url.split(":")[2].split("/")[0]) for app in self.apps]
            conf = self.prefix / "nginx.conf"
            conf.write_text(nginx_config(self.prefix, port, upstreams, self.workers, self.buffering))
            argv = ["nginx", "-p", str(self.prefix), "-c", str(conf), "-e", str(self.prefix / "error.log")]
            self.logs.mkdir(parents=True, exist_ok=True)
            with open(self.logs / f"{self.name}-nginx.log", "wb") as log:
                self.nginx = subprocess.Popen(
                    argv,
                    cwd=ROOT,
                    env=server_env(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            self.url = f"http://127.0.0.1:{port}/ingest"
            self._wait(port)
        except BaseException:
            self.stop()
            raise
        self.info = {**self.apps[0].info, "nginx_conf": conf.read_text(), "upstreams": upstreams}
        return self

    def _wait(self, port: int, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.nginx is not None
            if self.nginx.poll() is not None:
                break
            with contextlib.suppress(OSError):
                if healthz(port)[0] == 200:
                    return
            time.sleep(0.05)
        error_log = self.prefix / "error.log" if self.prefix else None
        errors = error_log.read_text() if error_log and error_log.exists() else ""
        raise RuntimeError(f"nginx did not start: {errors}")

    def roots(self) -> list[int]:
        return [pid for pids in self.roles().values() for pid in pids]

    def roles(self) -> dict[str, list[int]]:
        return {"nginx": [self.nginx.pid] if self.nginx else [], "app": [app.server.pid for app in self.apps]}

    def stop(self) -> None:
        if self.nginx is not None:
            with contextlib.suppress(ProcessLookupError):
                self.nginx.send_signal(signal.SIGQUIT)  # graceful: requests in flight finish
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.nginx.wait(15)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.nginx.pid, signal.SIGKILL)
            self.nginx.wait()
        for app in self.apps:
            app.stop()
        if self.prefix is not None:
            shutil.rmtree(self.prefix, ignore_errors=True)


class ComposeFront(Service):
    """``docker compose up --scale tiny=R`` (docker-compose.yml) under its own project name.

    Uses the images already built (``--no-build``; `make images-offline` builds them without
    a registry). CPU: the trees of every container's main process, as the host sees them.
    """

    def __init__(self, name: str, replicas: int, data_dir: Path, processes: int) -> None:
        self.name = name
        self.replicas = replicas
        self.data_dir = data_dir
        self.project = f"tinybench{os.getpid()}{replicas}"
        self.compose = compose_command() or ["docker-compose"]
        self.port = free_port()
        self.env = {
            **server_env(),
            "TINY_HTTP_PORT": str(self.port),
            "TINY_DATA_DIR": str(data_dir),
            "TINY_PROCESSES": str(processes),
            "TINY_HEALTH_INTERVAL": "1s",
        }
        self.up = False
        self.info = {"replicas": replicas, "processes_per_replica": processes}

    def _run(self, *args: str, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.compose, "-p", self.project, "-f", str(ROOT / "docker-compose.yml"), *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self) -> ComposeFront:
        self.up = True
        done = self._run("up", "-d", "--no-build", "--scale", f"tiny={self.replicas}")
        if done.returncode != 0:
            self.stop()
            raise RuntimeError(f"docker compose up failed: {done.stderr[-2000:]}")
        self.url = f"http://127.0.0.1:{self.port}/ingest"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                status, body = healthz(self.port)
                if status == 200:
                    self.info["codec"] = body.get("codec")
                    return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError("docker compose front never answered /healthz")

    def roles(self) -> dict[str, list[int]]:
        roles: dict[str, list[int]] = {}
        for service in ("tiny", "nginx"):
            ids = self._run("ps", "-q", service, timeout=30).stdout.split()
            for cid in ids:
                pid = subprocess.run(
                    ["docker", "inspect", "-f", "{{.State.Pid}}", cid], capture_output=True, text=True, timeout=30
                ).stdout.strip()
                if pid.isdigit() and pid != "0":
                    roles.setdefault("app" if service == "tiny" else "nginx", []).append(int(pid))
        return roles

    def roots(self) -> list[int]:
        return [pid for pids in self.roles().values() for pid in pids]

    def stop(self) -> None:
        if self.up:
            self.up = False
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._run("down", "-t", "20", timeout=120)


# --------------------------------------------------------------------------- configurations


@dataclass(frozen=True)
class Config:
    """A server configuration of the sweep."""

    name: str
    what: str
    bodies: tuple[str, ...]
    make: Callable[[Path, Path], Service]  # (data dir, logs dir) -> a started service
    processes: int = 1
    docker: bool = False


def _tiny(
    name: str, processes: int, args: Sequence[str] = (), env: dict[str, str] | None = None
) -> Callable[[Path, Path], Service]:
    return lambda data, logs: LocalServer(name, "app.py", processes, data, args, env, logs).start()


def configurations(cores: int = CORES, nginx_workers: int | None = None) -> dict[str, Config]:
    """Every configuration the harness knows, by name (``-N`` means ``cores`` processes)."""
    n = cores
    workers = nginx_workers or cores
    seed = "bench/seed_server.py"
    floor = "bench/floor_server.py"
    configs = [
        Config(
            "seed-1",
            "seed's approach, 1 process",
            ("1600", "16000", "1600-shuffled"),
            lambda data, logs: LocalServer("seed-1", seed, 1, data, logs=logs).start(),
        ),
        Config(
            f"seed-{n}",
            f"seed's approach, {n} processes (fork_processes, one shared socket)",
            ("1600",),
            lambda data, logs: LocalServer(f"seed-{n}", seed, n, data, logs=logs).start(),
            processes=n,
        ),
        Config(
            "floor-1",
            "HTTP floor (read and discard the body), 1 process",
            ("1600", "16000"),
            lambda data, logs: LocalServer("floor-1", floor, 1, None, logs=logs).start(),
        ),
        Config(
            f"floor-{n}",
            f"HTTP floor, {n} processes (one shared socket)",
            ("1600",),
            lambda data, logs: LocalServer(f"floor-{n}", floor, n, None, logs=logs).start(),
            processes=n,
        ),
        Config(
            "tiny-1",
            "tiny, 1 process, codec as installed",
            ("1600", "16000", "1600-shuffled", "16000-shuffled", "1600-gzip"),
            _tiny("tiny-1", 1),
        ),
        Config(
            f"tiny-{n}",
            f"tiny, {n} processes (SO_REUSEPORT), codec as installed",
            ("1600", "16000", "1600-gzip"),
            _tiny(f"tiny-{n}", n),
            processes=n,
        ),
        Config(
            "tiny-1-python",
            "tiny, 1 process, TINY_CODEC=python (reference codec)",
            ("1600",),
            _tiny("tiny-1-python", 1, env={"TINY_CODEC": "python"}),
        ),
        Config(
            "tiny-1-fsync",
            "tiny, 1 process, --durability fsync",
            ("1600",),
            _tiny("tiny-1-fsync", 1, ("--durability", "fsync")),
        ),
        Config(
            f"nginx-{n}",
            f"nginx over {n} single-process tiny instances (proxy_request_buffering on)",
            ("1600", "16000"),
            lambda data, logs: NginxFront(f"nginx-{n}", n, data, workers, True, logs=logs).start(),
            processes=n,
        ),
        Config(
            f"nginx-{n}-nobuf",
            f"nginx over {n} tiny instances, proxy_request_buffering off",
            ("1600", "16000"),
            lambda data, logs: NginxFront(f"nginx-{n}-nobuf", n, data, workers, False, logs=logs).start(),
            processes=n,
        ),
        Config(
            "docker-1",
            "docker compose, 1 replica (1 process) behind its nginx",
            ("1600",),
            lambda data, logs: ComposeFront("docker-1", 1, data, 1).start(),
            docker=True,
        ),
        Config(
            "docker-4",
            "docker compose, 4 replicas (1 process each) behind its nginx",
            ("1600",),
            lambda data, logs: ComposeFront("docker-4", 4, data, 1).start(),
            processes=4,
            docker=True,
        ),
    ]
    return {config.name: config for config in configs}


@dataclass(frozen=True)
class Arm:
    """One side of an interleaved comparison."""

    config: str
    body: str
    concurrency: int
    keepalive: bool
    driver: str = "ab"  # or "post": bench/post_load.py, which can send a different header per request
    keys: bool = False  # a fresh Idempotency-Key with every request (driver "post" only)
    label: str = ""  # the name its points carry (default: the config's), when two arms share a server

    @property
    def name(self) -> str:
        return self.label or self.config


def experiments(cores: int = CORES) -> dict[str, tuple[str, list[Arm]]]:
    """The headline comparisons, run interleaved: name -> (what it answers, arms)."""
    n = cores
    return {
        "key": (
            "tiny-1 vs seed-1 records/s at c=8 -k, 1,600-record bodies (target 10x); floor for reference",
            [Arm("seed-1", "1600", 8, True), Arm("tiny-1", "1600", 8, True), Arm("floor-1", "1600", 8, True)],
        ),
        "scale": (
            f"tiny-{n} vs tiny-1 at c=16 -k (target 1.8x); seed-{n} shows the shared socket",
            [Arm("tiny-1", "1600", 16, True), Arm(f"tiny-{n}", "1600", 16, True), Arm(f"seed-{n}", "1600", 16, True)],
        ),
        "nginx": (
            f"nginx over {n} instances vs tiny-{n} at c=16 -k (target within 10%), buffering on/off",
            [
                Arm(f"tiny-{n}", "1600", 16, True),
                Arm(f"nginx-{n}", "1600", 16, True),
                Arm(f"nginx-{n}-nobuf", "1600", 16, True),
            ],
        ),
        "python": (
            "tiny-1 on the pure-Python reference codec vs seed-1 at c=8 -k, 1,600-record bodies (target 2x)",
            [
                Arm("seed-1", "1600", 8, True),
                Arm("tiny-1-python", "1600", 8, True),
                Arm("tiny-1", "1600", 8, True),
            ],
        ),
        "keys": (
            "tiny-1 with a fresh Idempotency-Key per request vs without (target: CPU per record within 5%), "
            "and vs seed-1 (the 10x bar), c=8 keep-alive, 1,600-record bodies; all arms driven by bench/post_load.py",
            [
                Arm("seed-1", "1600", 8, True, "post"),
                Arm("tiny-1", "1600", 8, True, "post"),
                Arm("tiny-1", "1600", 8, True, "post", keys=True, label="tiny-1-keys"),
            ],
        ),
        "latency": (
            f"p99 at c=16 without -k (the seed's mean was 23.4 ms on 8 cores): tiny-{n} and tiny-1",
            [Arm(f"tiny-{n}", "1600", 16, False), Arm("tiny-1", "1600", 16, False)],
        ),
    }


# --------------------------------------------------------------------------- ab


def ab_command(
    url: str, body: Body, concurrency: int, keepalive: bool, requests: int, time_limit: float, percentiles: Path
) -> list[str]:
    """The exact ab command line of one point. -t comes before -n: ab's -t resets -n."""
    command = [
        "ab",
        "-t",
        str(max(1, round(time_limit))),
        "-n",
        str(requests),
        "-c",
        str(concurrency),
        "-s",
        "20",
        "-l",
        "-r",
        "-q",
        "-e",
        str(percentiles),
        "-p",
        str(body.path),
        "-T",
        "application/x-ndjson",
    ]
    if body.gzip:
        command += ["-H", "Content-Encoding: gzip"]
    if keepalive:
        command.append("-k")
    return [*command, url]


def _number(pattern: str, text: str, default: float = 0.0) -> float:
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else default


def parse_ab(text: str, percentiles: Path | None = None) -> dict[str, Any]:
    """The figures of one ab run: counts, rate, latency (ms)."""
    result: dict[str, Any] = {
        "complete": int(_number(r"^Complete requests:\s+(\d+)", text)),
        "failed": int(_number(r"^Failed requests:\s+(\d+)", text)),
        "non2xx": int(_number(r"^Non-2xx responses:\s+(\d+)", text)),
        "keepalive_requests": int(_number(r"^Keep-Alive requests:\s+(\d+)", text)),
        "seconds": _number(r"^Time taken for tests:\s+([\d.]+)", text),
        "rps": _number(r"^Requests per second:\s+([\d.]+)", text),
        "mean_ms": _number(r"^Time per request:\s+([\d.]+) \[ms\] \(mean\)$", text),
    }
    table = {int(p): float(ms) for p, ms in re.findall(r"^\s+(\d+)%\s+(\d+)", text, re.MULTILINE)}
    exact: dict[int, float] = {}
    # ab -e reads past its array for the 99th percentile when it completed 50 requests or fewer
    if percentiles is not None and percentiles.exists() and result["complete"] > 50:
        for row in percentiles.read_text().splitlines()[1:]:
            percent, ms = row.split(",")
            exact[int(percent)] = float(ms)
    for p in (50, 90, 99):
        result[f"p{p}_ms"] = exact.get(p, table.get(p))
    result["max_ms"] = table.get(100)
    result["latency_source"] = "ab -e" if exact else "ab table (integer ms)"
    return result


# --------------------------------------------------------------------------- post_load


def post_load_command(url: str, body: Body, concurrency: int, seconds: float, key_prefix: str | None) -> list[str]:
    """The exact bench/post_load.py command of one point (keep-alive; a fresh key per request
    with ``key_prefix``). ab cannot vary a header per request, and wrk copies the body for each
    request whose headers change (3x its CPU), so the keys experiment uses this one for both arms."""
    command = [PYTHON, str(ROOT / "bench" / "post_load.py"), url, str(body.path)]
    command += ["--concurrency", str(concurrency), "--seconds", f"{seconds:g}"]
    if key_prefix:
        command += ["--key-prefix", key_prefix]
    if body.gzip:
        command.append("--gzip")
    return command


def parse_post_load(text: str) -> dict[str, Any]:
    """The figures of one post_load run, in parse_ab's shape."""
    match = re.search(r"^LOAD (\{.*\})$", text, re.MULTILINE)
    figures = json.loads(match.group(1)) if match else {}
    requests, seconds = figures.get("requests", 0), figures.get("seconds", 0.0)
    return {
        "complete": requests + figures.get("failed", 0),
        "failed": figures.get("failed", 0),
        "non2xx": figures.get("non2xx", 0),
        "keepalive_requests": requests,
        "seconds": seconds,
        "rps": round(requests / seconds, 2) if seconds else 0.0,
        **{key: figures.get(key) for key in ("mean_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms")},
        "latency_source": "bench/post_load.py",
    }


@dataclass
class Runner:
    """Runs ab points against services and keeps every point."""

    seconds: float
    min_requests: int
    max_requests: int
    raw_dir: Path
    points: list[dict[str, Any]] = field(default_factory=list)
    rates: dict[tuple[str, str], float] = field(default_factory=dict)  # (config, body) -> last req/s
    stores: dict[str, dict[str, Any]] = field(default_factory=dict)  # "experiment/config" -> key_store()

    def requests_for(self, config: str, body: Body, concurrency: int) -> int:
        rate = self.rates.get((config, body.name), 20.0)
        return max(self.min_requests, 2 * concurrency, min(self.max_requests, int(rate * self.seconds)))

    def warm_up(self, config: str, service: Service, body: Body) -> None:
        """A probe, then about a second of load at c=2 -k; the rate sizes the first point."""
        key = (config, body.name)
        probe = self.point(config, service, body, 2, True, experiment="warmup", requests=8, keep=False)
        rate = probe.get("rps") or self.rates.get(key, 20.0)
        count = max(self.min_requests, min(self.max_requests, int(rate * min(1.0, max(0.25, self.seconds / 2)))))
        warm = self.point(config, service, body, 2, True, experiment="warmup", requests=count, keep=False)
        self.rates[key] = warm.get("rps") or rate

    def point(
        self,
        config: str,
        service: Service,
        body: Body,
        concurrency: int,
        keepalive: bool,
        *,
        experiment: str,
        requests: int | None = None,
        round_: int = 0,
        keep: bool = True,
        driver: str = "ab",
        keys: bool = False,
    ) -> dict[str, Any]:
        """Run ab (or bench/post_load.py: ``seconds``, keep-alive; ``keys``: a fresh key per request) once and
        return (and keep) the point's figures."""
        requests = requests or self.requests_for(config, body, concurrency)
        tag = f"{len(self.points):04d}-{experiment}-{config}-{body.name}-c{concurrency}{'-k' if keepalive else ''}"
        percentiles = self.raw_dir / f"{tag}.pct.csv"
        self.raw_dir.mkdir(parents=True, exist_ok=True)
        if driver == "post":
            seconds = self.seconds if keep else max(0.5, requests / max(self.rates.get((config, body.name), 20.0), 1))
            prefix = f"{tag}-{time.time_ns()}" if keys else None
            command = post_load_command(service.url, body, concurrency, seconds, prefix)
        else:
            command = ab_command(service.url, body, concurrency, keepalive, requests, self.seconds * 5 + 5, percentiles)
        roles = service.roles()
        roots = [pid for pids in roles.values() for pid in pids]
        load = Path("/proc/loadavg").read_text().split()[0]
        cpu_before, busy_before, ab_before = cpu_seconds(roots), system_busy_seconds(), _children_cpu()
        started = time.monotonic()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=self.seconds * 5 + 40)
            output, code = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired as exc:
            output, code = f"ab timed out: {exc}", -1
        wall = time.monotonic() - started
        time.sleep(0.05)  # the last answers' bookkeeping (metrics, flush callback) lands in this point
        cpu_after, busy_after, ab_after = cpu_seconds(roots), system_busy_seconds(), _children_cpu()
        if keep:
            (self.raw_dir / f"{tag}.txt").write_text(shlex.join(command) + "\n\n" + output)
        result = parse_post_load(output) if driver == "post" else parse_ab(output, percentiles)
        good = max(0, result["complete"] - result["failed"] - result["non2xx"])
        records = good * body.records
        per_process = {pid: cpu_after[pid] - cpu_before.get(pid, 0.0) for pid in cpu_after}
        server_cpu = sum(cpu_after.values()) - sum(cpu_before.get(pid, 0.0) for pid in cpu_after)
        role_cpu = {
            role: round(sum(per_process.get(p, 0.0) for p in process_tree(pids)), 3) for role, pids in roles.items()
        }
        ab_cpu = ab_after - ab_before
        app = process_tree(roles.get("app", roots))  # the busiest worker among the app's processes
        app_cpu = sum(per_process.get(pid, 0.0) for pid in app)
        busiest = max((per_process.get(pid, 0.0) for pid in app), default=0.0)
        point: dict[str, Any] = {
            "experiment": experiment,
            "round": round_,
            "config": config,
            "body": body.name,
            "records_per_body": body.records,
            "body_bytes": body.size,
            "gzip": body.gzip,
            "concurrency": concurrency,
            "keepalive": keepalive,
            "requests": requests,
            "ab_exit": code,
            **result,
            "records_per_s": round(records / result["seconds"]) if result["seconds"] else 0,
            "server_cpu_s": round(server_cpu, 3),
            "cpu_s_per_million": round(server_cpu / records * 1e6, 3) if records else None,
            "cpu_by_role": role_cpu,
            "cpu_per_process": sorted((round(v, 3) for v in per_process.values()), reverse=True),
            "busiest_process_share": round(busiest / app_cpu, 3) if app_cpu > 0 else None,
            "ab_cpu_s": round(ab_cpu, 3),
            "other_cpu_s": round(max(0.0, busy_after - busy_before - server_cpu - ab_cpu), 3),
            "wall_s": round(wall, 3),
            "loadavg_1m_before": float(load),
            "codec": service.info.get("codec"),
            "driver": driver,
            "idempotency_keys": keys,
            "server_rss_kb": sum(_rss_kb(pid) for pid in process_tree(roots)),
            "ab_command": shlex.join(command),
        }
        if code != 0:
            point["error"] = output.strip().splitlines()[-1] if output.strip() else f"ab exited {code}"
        if keep:
            self.points.append(point)
            if result["rps"]:
                self.rates[(config, body.name)] = result["rps"]
            _print_point(point)
        with contextlib.suppress(FileNotFoundError):
            percentiles.unlink()
        if service.data_dir is not None:
            clear_dir(service.data_dir)
        return point


def _print_point(point: dict[str, Any]) -> None:
    p99 = point["p99_ms"]
    cost = point["cpu_s_per_million"]
    print(
        f"  {point['experiment']:<7} {point['config']:<16} {point['body']:<15} c={point['concurrency']:<2} "
        f"{'-k' if point['keepalive'] else '  '} n={point['complete']:<6} {point['records_per_s']:>11,} rec/s "
        f"p50 {point['p50_ms'] or 0:7.1f} p99 {p99 or 0:7.1f} ms  "
        f"{(cost or 0):6.2f} cpu-s/M  busiest {point['busiest_process_share'] or 0:.2f}  "
        f"other {point['other_cpu_s']:.2f}s failed {point['failed'] + point['non2xx']}"
        + (f"  ERROR {point['error']}" if "error" in point else ""),
        flush=True,
    )


def clear_dir(path: Path) -> None:
    """Remove the files under ``path`` (the day files a point wrote), keeping the directories and
    the journal (``.tiny/``)."""
    for root, dirs, files in os.walk(path):
        if ".tiny" in dirs:  # the journal and its keys, open in the server: they grow as in real use
            dirs.remove(".tiny")
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(root, name))


# --------------------------------------------------------------------------- experiments


@contextlib.contextmanager
def running(config: Config, work: Path, logs: Path) -> Iterator[Service]:
    """Start ``config`` with a fresh data dir; always stop it."""
    data = Path(tempfile.mkdtemp(prefix=f"{config.name}-", dir=work))
    data.chmod(0o755)
    service: Service | None = None
    try:
        service = config.make(data, logs)
        yield service
    finally:
        if service is not None:
            service.stop()
        shutil.rmtree(data, ignore_errors=True)


def sweep(
    runner: Runner,
    config: Config,
    bodies: dict[str, Body],
    concurrency: Sequence[int],
    work: Path,
    logs: Path,
    only_first_body: bool,
) -> None:
    """Every body of ``config``, with and without -k, at every concurrency."""
    names = config.bodies[:1] if only_first_body else config.bodies
    print(f"{config.name}: {config.what}", flush=True)
    with running(config, work, logs) as service:
        print(f"  up at {service.url} (codec {service.info.get('codec')})", flush=True)
        for name in names:
            body = bodies[name]
            runner.warm_up(config.name, service, body)
            for keepalive, c in itertools.product((True, False), concurrency):
                runner.point(config.name, service, body, c, keepalive, experiment="sweep")


def interleaved(
    runner: Runner,
    name: str,
    what: str,
    arms: Sequence[Arm],
    configs: dict[str, Config],
    bodies: dict[str, Body],
    rounds: int,
    work: Path,
    logs: Path,
) -> None:
    """Run ``arms`` alternately ``rounds`` times, every server up at once."""
    print(f"{name}: {what} ({rounds} rounds)", flush=True)
    with contextlib.ExitStack() as stack:
        services = {
            config: stack.enter_context(running(configs[config], work, logs))
            for config in dict.fromkeys(arm.config for arm in arms)
        }
        for arm in arms:
            runner.warm_up(arm.name, services[arm.config], bodies[arm.body])
        for round_ in range(rounds):
            order = arms if round_ % 2 == 0 else list(reversed(arms))
            for arm in order:
                runner.point(
                    arm.name,
                    services[arm.config],
                    bodies[arm.body],
                    arm.concurrency,
                    arm.keepalive,
                    experiment=name,
                    round_=round_ + 1,
                    driver=arm.driver,
                    keys=arm.keys,
                )
        for config in dict.fromkeys(arm.config for arm in arms if arm.keys):
            service = services[config]
            if service.data_dir is not None:
                store = key_store(service.data_dir) | {
                    "server_rss_kb": sum(_rss_kb(pid) for pid in process_tree(service.roots()))
                }
                runner.stores[f"{name}/{config}"] = store
                print(f"  {config}: journal {store}", flush=True)


# --------------------------------------------------------------------------- output


def _version(command: list[str]) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return "absent"
    return (done.stdout + done.stderr).strip().splitlines()[0] if (done.stdout + done.stderr).strip() else "?"


def machine() -> dict[str, Any]:
    """What ran the benchmark: hardware, load, versions."""
    import tornado

    from tiny import codec

    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "usable_cores": CORES,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "tornado": tornado.version,
        "orjson": orjson.__version__,
        "codec_installed": codec.CODEC,
        "ab": _version(["ab", "-V"]).replace("This is ApacheBench, ", "ab ").replace(" <$Revision$>", ""),
        "nginx": _version(["nginx", "-v"]),
        "git_commit": commit.stdout.strip(),
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


_CSV_COLUMNS = (
    "experiment",
    "round",
    "config",
    "body",
    "records_per_body",
    "body_bytes",
    "gzip",
    "concurrency",
    "keepalive",
    "requests",
    "complete",
    "failed",
    "non2xx",
    "seconds",
    "rps",
    "records_per_s",
    "mean_ms",
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "max_ms",
    "server_cpu_s",
    "cpu_s_per_million",
    "busiest_process_share",
    "cpu_per_process",
    "ab_cpu_s",
    "other_cpu_s",
    "loadavg_1m_before",
    "codec",
    "ab_exit",
    "error",
    "ab_command",
)


def write_results(results: dict[str, Any], directory: Path) -> None:
    """results.json (everything) and results.csv (one row per point)."""
    (directory / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    with open(directory / "results.csv", "w", newline="") as out:
        writer = csv.DictWriter(out, _CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for point in results["points"]:
            writer.writerow({**point, "cpu_per_process": ";".join(map(str, point.get("cpu_per_process", [])))})


def merged(previous: Path, fresh: dict[str, Any]) -> dict[str, Any]:
    """``fresh`` plus the points of ``previous`` whose (experiment, config) were not re-run."""
    try:
        old = json.loads(previous.read_text())
    except (OSError, ValueError):
        return fresh
    rerun = {(p["experiment"], p["config"]) for p in fresh["points"]}
    kept = [p for p in old.get("points", []) if (p["experiment"], p["config"]) not in rerun]
    sink = fresh.get("sink") or old.get("sink")
    later = {"machine": fresh["machine"], "args": fresh["args"], "redone": sorted(map(list, rerun))}
    # the first run's description stays; each merged run is listed after it
    stores = old.get("key_stores", {}) | fresh.get("key_stores", {})
    return {
        **old,
        "points": kept + fresh["points"],
        "sink": sink,
        "key_stores": stores,
        "merged_runs": [*old.get("merged_runs", []), later],
    }


def run_sink_bench(quick: bool, out: Path) -> dict[str, Any] | None:
    """bench/sink_bench.py in its own interpreter; its JSON, or None if it failed."""
    command = [PYTHON, str(ROOT / "bench" / "sink_bench.py"), "--json", str(out), *(["--quick"] if quick else [])]
    print("sink: " + shlex.join(command), flush=True)
    try:
        done = subprocess.run(command, cwd=ROOT, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        print("  sink bench timed out", file=sys.stderr)
        return None
    if done.returncode != 0 or not out.exists():
        print(f"  sink bench failed ({done.returncode})", file=sys.stderr)
        return None
    return dict(json.loads(out.read_text()))


# --------------------------------------------------------------------------- main


def _parse(argv: Sequence[str] | None, configs: dict[str, Config]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke test: c=1,8, first body only, 1 round, short")
    parser.add_argument("--configs", help="comma-separated sweep configurations (default: all but docker)")
    parser.add_argument("--skip", default="", help="comma-separated configurations to leave out")
    parser.add_argument(
        "--experiments",
        default="key,scale,nginx,latency,sweep,sink",
        help="comma-separated: key, scale, nginx, latency (interleaved), sweep, sink",
    )
    parser.add_argument("--concurrency", help="comma-separated levels (default 1,2,4,8,16; quick: 1,8)")
    parser.add_argument("--seconds", type=float, help="target seconds per point (default 3; quick 0.5)")
    parser.add_argument("--rounds", type=int, help="rounds of the interleaved experiments (default 3; quick 1)")
    parser.add_argument("--max-requests", type=int, default=200_000, help="upper bound of ab -n")
    parser.add_argument("--docker", action="store_true", help="also docker compose with 1 and 4 replicas")
    parser.add_argument("--nginx-workers", type=int, help=f"nginx worker_processes (default {CORES}, the cores)")
    parser.add_argument(
        "--merge", action="store_true", help="keep the points of results.json that this run does not redo"
    )
    parser.add_argument(
        "--results", type=Path, help="output directory (default bench/results; bench/results/quick with --quick)"
    )
    parser.add_argument("--list", action="store_true", help="print configurations and experiments, then exit")
    args = parser.parse_args(argv)
    unknown = {c for c in (args.configs or "").split(",") + args.skip.split(",") if c} - set(configs)
    if unknown:
        parser.error(f"unknown configurations: {', '.join(sorted(unknown))} (see --list)")
    return args


def _selected(args: argparse.Namespace, configs: dict[str, Config]) -> list[Config]:
    skip = set(filter(None, args.skip.split(",")))
    if args.configs:
        chosen = [configs[name] for name in args.configs.split(",") if name]
    else:
        chosen = [c for c in configs.values() if not c.docker or args.docker]
    return [c for c in chosen if c.name not in skip]


def _check_tools() -> None:
    missing = [tool for tool in ("ab", "nginx") if shutil.which(tool) is None]
    if missing:
        sys.exit(f"missing tools: {', '.join(missing)} (make sysdeps installs them)")
    if not SAMPLE_DAY.exists():
        sys.exit(f"the sample day is missing: {SAMPLE_DAY}")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the run like Ctrl-C: every server is stopped on the way out


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv, configurations())
    configs = configurations(nginx_workers=args.nginx_workers)
    if args.list:
        for config in configs.values():
            print(f"{config.name:<16} {config.what}; bodies {', '.join(config.bodies)}")
        for name, (what, _arms) in experiments().items():
            print(f"{name:<16} (interleaved) {what}")
        return 0
    _check_tools()
    chosen_experiments = set(filter(None, args.experiments.split(",")))
    seconds = args.seconds or (0.5 if args.quick else 3.0)
    rounds = args.rounds or (1 if args.quick else 3)
    concurrency = (
        [int(c) for c in args.concurrency.split(",")]
        if args.concurrency
        else ([1, 8] if args.quick else list(CONCURRENCY))
    )
    results_dir: Path = args.results or (RESULTS / "quick" if args.quick else RESULTS)
    results_dir.mkdir(parents=True, exist_ok=True)
    work = results_dir / "work"
    logs = results_dir / "logs"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)  # also when started in the background, where SIGINT is ignored

    selected = _selected(args, configs)
    if any(c.docker for c in selected):
        reason = docker_unavailable()
        if reason:
            print(f"skipping docker configurations: {reason}", flush=True)
            selected = [c for c in selected if not c.docker]
    elif not args.docker and not args.configs:
        print("skipping docker-1 and docker-4: pass --docker (needs the images: make images-offline)", flush=True)

    bodies = make_bodies(results_dir / "bodies")
    runner = Runner(seconds, 20 if args.quick else 50, 2_000 if args.quick else args.max_requests, results_dir / "ab")
    shutil.rmtree(runner.raw_dir, ignore_errors=True)
    info = machine()
    print(
        f"machine: {info['cpu']}, {info['usable_cores']} usable cores, load {' '.join(info['loadavg'])}, "
        f"codec {info['codec_installed']}",
        flush=True,
    )
    results: dict[str, Any] = {
        "machine": info,
        "args": vars(args) | {"results": str(results_dir)},
        "seconds_per_point": seconds,
        "rounds": rounds,
        "concurrency": concurrency,
        "cores": CORES,
        "bodies": {name: {"records": b.records, "bytes": b.size, "gzip": b.gzip} for name, b in bodies.items()},
        "configs": {c.name: {"what": c.what, "processes": c.processes} for c in configs.values()},
        "experiments": {name: what for name, (what, _arms) in experiments().items()},
        "points": runner.points,
        "key_stores": runner.stores,
        "sink": None,
    }
    interrupted = False
    try:
        for name, (what, arms) in experiments().items():
            if name in chosen_experiments:
                interleaved(runner, name, what, arms, configs, bodies, rounds, work, logs)
        if "sweep" in chosen_experiments:
            for config in selected:
                try:
                    sweep(runner, config, bodies, concurrency, work, logs, args.quick)
                except RuntimeError as exc:
                    print(f"  {config.name} failed: {exc}", file=sys.stderr, flush=True)
        if "sink" in chosen_experiments:
            results["sink"] = run_sink_bench(args.quick, results_dir / "sink.json")
    except KeyboardInterrupt:
        interrupted = True
        print("interrupted: servers stopped, writing what was measured", file=sys.stderr)
    finally:
        results["machine"]["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
        if args.merge:
            results = merged(results_dir / "results.json", results)
        write_results(results, results_dir)
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"wrote {results_dir / 'results.json'} and results.csv ({len(results['points'])} points); next: "
        "python bench/charts.py && python bench/report.py",
        flush=True,
    )
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())

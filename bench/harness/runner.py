"""Measuring points: one run of a load driver against a running service, with the servers' CPU
from /proc before and after; a sweep of one configuration, and the interleaved experiments."""

from __future__ import annotations

import contextlib
import itertools
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness.bodies import Body
from bench.harness.drivers import ab_command, parse_ab, parse_post_load, post_load_command, run_driver
from bench.harness.plans import Arm, Config
from bench.harness.proc import CpuSnapshot, key_store, loadavg, process_tree, tree_rss_kb
from bench.harness.services import Service
from tiny.admin import forget
from tiny.layout import IDENTITY_FILE, STATE_DIR, is_data_file


@dataclass(frozen=True)
class PointSpec:
    """What one point measures and where it belongs.

    ``config`` is the name its figures carry (the configuration's, or an arm's label when two arms
    share a server); ``driver`` is "ab" or "post" (bench/post_load.py: ``Runner.seconds`` of
    keep-alive load; with ``keys``, a fresh Idempotency-Key per request).
    """

    config: str
    body: Body
    concurrency: int
    keepalive: bool = True
    driver: str = "ab"
    keys: bool = False
    experiment: str = "sweep"
    round_: int = 0

    @classmethod
    def of(cls, arm: Arm, body: Body, experiment: str, round_: int) -> PointSpec:
        return cls(arm.name, body, arm.concurrency, arm.keepalive, arm.driver, arm.keys, experiment, round_)

    @property
    def rate_key(self) -> tuple[str, str]:
        return self.config, self.body.name

    def tag(self, number: int) -> str:
        """The name of its raw files: ``NNNN-experiment-config-body-cC[-k]``."""
        keepalive = "-k" if self.keepalive else ""
        return f"{number:04d}-{self.experiment}-{self.config}-{self.body.name}-c{self.concurrency}{keepalive}"


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

    def requests_for(self, spec: PointSpec) -> int:
        rate = self.rates.get(spec.rate_key, 20.0)
        return max(self.min_requests, 2 * spec.concurrency, min(self.max_requests, int(rate * self.seconds)))

    def warm_up(self, config: str, service: Service, body: Body) -> None:
        """A probe, then about a second of load at c=2 -k; the rate sizes the first point."""
        spec = PointSpec(config, body, 2, True, experiment="warmup")
        probe = self.point(spec, service, requests=8, keep=False)
        rate = probe.get("rps") or self.rates.get(spec.rate_key, 20.0)
        count = max(self.min_requests, min(self.max_requests, int(rate * min(1.0, max(0.25, self.seconds / 2)))))
        warm = self.point(spec, service, requests=count, keep=False)
        self.rates[spec.rate_key] = warm.get("rps") or rate

    def point(
        self, spec: PointSpec, service: Service, requests: int | None = None, keep: bool = True
    ) -> dict[str, Any]:
        """Run the spec's driver once against ``service`` and return the point's figures; keep them (and the
        driver's output, in ``raw_dir``) unless ``keep`` is false (warm-ups)."""
        requests = requests or self.requests_for(spec)
        tag = spec.tag(len(self.points))
        percentiles = self.raw_dir / f"{tag}.pct.csv"
        self.raw_dir.mkdir(parents=True, exist_ok=True)
        command = self._command(spec, service.url, requests, keep, tag, percentiles)
        run = _Run.measure(command, service.roles(), self.seconds * 5 + 40)
        if keep:
            (self.raw_dir / f"{tag}.txt").write_text(shlex.join(command) + "\n\n" + run.output)
        result = parse_post_load(run.output) if spec.driver == "post" else parse_ab(run.output, percentiles)
        point = _figures(spec, service, requests, run, result)
        if keep:
            self.points.append(point)
            if result["rps"]:
                self.rates[spec.rate_key] = result["rps"]
            print_point(point)
        with contextlib.suppress(FileNotFoundError):
            percentiles.unlink()
        if service.data_dir is not None:
            clear_dir(service.data_dir, service.tree)
        return point

    def _command(self, spec: PointSpec, url: str, requests: int, keep: bool, tag: str, percentiles: Path) -> list[str]:
        """ab with ``requests`` (bounded by time), or bench/post_load.py for ``Runner.seconds`` (warm-ups: about
        ``requests`` at the last rate)."""
        if spec.driver == "post":
            rate = self.rates.get(spec.rate_key, 20.0)
            seconds = self.seconds if keep else max(0.5, requests / max(rate, 1))
            prefix = f"{tag}-{time.time_ns()}" if spec.keys else None
            return post_load_command(url, spec.body, spec.concurrency, seconds, prefix)
        body = spec.body
        return ab_command(url, body, spec.concurrency, spec.keepalive, requests, self.seconds * 5 + 5, percentiles)


@dataclass(frozen=True)
class _Run:
    """One run of a load driver: its output and exit status, and the counters around it."""

    command: list[str]
    roles: dict[str, list[int]]  # the service's process roots by role
    output: str
    code: int
    wall: float
    load: float  # the 1-minute load average before
    before: CpuSnapshot
    after: CpuSnapshot

    @property
    def roots(self) -> list[int]:
        return [pid for pids in self.roles.values() for pid in pids]

    @classmethod
    def measure(cls, command: list[str], roles: dict[str, list[int]], timeout: float) -> _Run:
        roots = [pid for pids in roles.values() for pid in pids]
        load = float(loadavg()[0])
        before, started = CpuSnapshot.take(roots), time.monotonic()
        output, code = run_driver(command, timeout)
        wall = time.monotonic() - started
        time.sleep(0.05)  # the last answers' bookkeeping (metrics, flush callback) lands in this point
        return cls(command, roles, output, code, wall, load, before, CpuSnapshot.take(roots))


def _figures(spec: PointSpec, service: Service, requests: int, run: _Run, result: dict[str, Any]) -> dict[str, Any]:
    """A point's fields, in the order results.json has them: what ran, the driver's figures, the CPU."""
    records = max(0, result["complete"] - result["failed"] - result["non2xx"]) * spec.body.records
    point: dict[str, Any] = {
        "experiment": spec.experiment,
        "round": spec.round_,
        "config": spec.config,
        "body": spec.body.name,
        "records_per_body": spec.body.records,
        "body_bytes": spec.body.size,
        "gzip": spec.body.gzip,
        "concurrency": spec.concurrency,
        "keepalive": spec.keepalive,
        "requests": requests,
        "ab_exit": run.code,
        **result,
        "records_per_s": round(records / result["seconds"]) if result["seconds"] else 0,
        **_cpu_figures(run, records),
        "wall_s": round(run.wall, 3),
        "loadavg_1m_before": run.load,
        "codec": service.info.get("codec"),
        "driver": spec.driver,
        "idempotency_keys": spec.keys,
        "server_rss_kb": tree_rss_kb(run.roots),
        "ab_command": shlex.join(run.command),
    }
    if run.code != 0:
        point["error"] = run.output.strip().splitlines()[-1] if run.output.strip() else f"ab exited {run.code}"
    return point


def _cpu_figures(run: _Run, records: int) -> dict[str, Any]:
    """The servers' CPU during a point (in all, per million records, per role, per process, the busiest
    process's share of the app's), the load driver's, and the rest of the machine's."""
    before, after, roles = run.before, run.after, run.roles
    per_process = {pid: after.processes[pid] - before.processes.get(pid, 0.0) for pid in after.processes}
    server_cpu = sum(after.processes.values()) - sum(before.processes.get(pid, 0.0) for pid in after.processes)
    role_cpu = {
        role: round(sum(per_process.get(p, 0.0) for p in process_tree(pids)), 3) for role, pids in roles.items()
    }
    driver_cpu = after.children - before.children
    app = process_tree(roles.get("app", run.roots))  # the busiest worker among the app's processes
    app_cpu = sum(per_process.get(pid, 0.0) for pid in app)
    busiest = max((per_process.get(pid, 0.0) for pid in app), default=0.0)
    return {
        "server_cpu_s": round(server_cpu, 3),
        "cpu_s_per_million": round(server_cpu / records * 1e6, 3) if records else None,
        "cpu_by_role": role_cpu,
        "cpu_per_process": sorted((round(v, 3) for v in per_process.values()), reverse=True),
        "busiest_process_share": round(busiest / app_cpu, 3) if app_cpu > 0 else None,
        "ab_cpu_s": round(driver_cpu, 3),
        "other_cpu_s": round(max(0.0, after.busy - before.busy - server_cpu - driver_cpu), 3),
    }


def print_point(point: dict[str, Any]) -> None:
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


def clear_dir(path: Path, tree: Path | None = None) -> None:
    """Remove the files under ``path`` (the day files a point wrote), keeping the directories, the
    journal (``.tiny/``) and the data dir's identity (``.tiny-id``). A Tiny data dir's day and
    rejects files go through ``tiny-admin forget --remove`` (under the running server's flush
    lock): removed behind the journal's back, the next write would be refused as data loss.
    ``tree``: the server is another tree's, whose own tiny-admin does it (its journal may be of
    another format)."""
    data_files: list[str] = []
    for root, dirs, files in os.walk(path):
        if STATE_DIR in dirs:  # the journal and its keys, open in the server: they grow as in real use
            dirs.remove(STATE_DIR)
        for name in files:
            relative = os.path.relpath(os.path.join(root, name), path)
            if name == IDENTITY_FILE and root == str(path):
                continue
            if (path / STATE_DIR).is_dir() and is_data_file(relative):
                data_files.append(relative)
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(root, name))
    if data_files and tree is not None:
        program = f"import sys; sys.path.insert(0, {str(tree)!r}); from tiny.admin import main; sys.exit(main())"
        subprocess.run([sys.executable, "-c", program, "forget", str(path), *data_files, "--remove"], check=True)
    elif data_files:
        forget(path, data_files, remove=True)


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
                runner.point(PointSpec(config.name, body, c, keepalive, experiment="sweep"), service)


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
                runner.point(PointSpec.of(arm, bodies[arm.body], name, round_ + 1), services[arm.config])
        for config in dict.fromkeys(arm.config for arm in arms if arm.keys):
            service = services[config]
            if service.data_dir is not None:
                store = key_store(service.data_dir) | {"server_rss_kb": tree_rss_kb(service.roots())}
                runner.stores[f"{name}/{config}"] = store
                print(f"  {config}: journal {store}", flush=True)

"""What the harness runs: the server configurations of the sweep, by name, and the headline
experiments, whose arms run interleaved."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.harness.services import ComposeFront, LocalServer, NginxFront, Service
from tiny.config import usable_cpus

CORES = usable_cpus()
CONCURRENCY = (1, 2, 4, 8, 16)
SIZES = ("1", "10", "100", "1600", "16000")  # the body sizes of the speed issue's table (records)


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
            "nginx-1",
            "nginx over 1 single-process tiny instance (nginx/proxy.conf: every POST keyed by nginx)",
            ("1600",),
            lambda data, logs: NginxFront("nginx-1", 1, data, workers, True, logs=logs).start(),
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
        "lean": (
            "the speed issue's table: tiny-1 vs seed-1 and the HTTP floor at every body size, c=8 -k "
            "(targets: 1.2x the seed at every size, 0.85x the floor at 1-100 records, 15x the seed at 1,600)",
            [Arm(config, body, 8, True) for body in SIZES for config in ("seed-1", "floor-1", "tiny-1")],
        ),
        "lean-keys": (
            "the cost of a fresh Idempotency-Key per request (targets: 10% at 1 record, 5% at 100) and of nginx "
            "in front (every POST keyed by nginx; target: 10% of CPU per record at 1,600 over a keyed tiny-1), "
            "c=8 keep-alive, all tiny arms driven by bench/post_load.py",
            [
                *(
                    arm
                    for body in SIZES[:-1]
                    for arm in (
                        Arm("tiny-1", body, 8, True, "post", label=f"tiny-1-post-{body}"),
                        Arm("tiny-1", body, 8, True, "post", keys=True, label=f"tiny-1-keys-{body}"),
                    )
                ),
                Arm("nginx-1", "1600", 8, True, "post", label="nginx-1-1600"),
            ],
        ),
        "latency": (
            f"p99 at c=16 without -k (the seed's mean was 23.4 ms on 8 cores): tiny-{n} and tiny-1",
            [Arm(f"tiny-{n}", "1600", 16, False), Arm("tiny-1", "1600", 16, False)],
        ),
    }

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
import shutil
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import RESULTS  # noqa: E402
from bench.harness.bodies import make_bodies  # noqa: E402
from bench.harness.output import machine, merged, run_sink_bench, write_results  # noqa: E402
from bench.harness.plans import CONCURRENCY, CORES, Config, configurations, experiments  # noqa: E402
from bench.harness.proc import loadavg  # noqa: E402
from bench.harness.runner import Runner, interleaved, sweep  # noqa: E402
from tiny.testing import SAMPLE_DAY, docker_unavailable  # noqa: E402


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
    # absolute: nginx -p takes it as its prefix
    results_dir: Path = (args.results or (RESULTS / "quick" if args.quick else RESULTS)).resolve()
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
        results["machine"]["loadavg_end"] = loadavg()
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

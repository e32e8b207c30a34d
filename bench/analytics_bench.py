"""Analytics: query latency (cold and cached, per endpoint), the engine choice, and ingest p99 under analytics load.

Usage:
    python bench/analytics_bench.py               # everything, about 7 minutes on 2 cores
    python bench/analytics_bench.py --quick       # smoke test: 1 round, short ab runs (about 1.5 minutes)
    python bench/analytics_bench.py --rounds 5 --seconds 15 --load-threads 3
    python bench/analytics_bench.py --only engines|queries|ingest|big

What it does, on the sample day (../shared/data/cran-logs/2014-05-04.csv.gz, read in place):

1. Engines, each in a fresh interpreter (so POLARS_MAX_THREADS applies): polars as tiny.analytics
   uses it (1 and 2 threads), tiny.analytics' exact fallback (tiny.cranlog.parse_row into polars),
   and pure Python (the csv module + Counter). "cold" = read the 6.5 MB file + parse + compute the
   day's aggregate (totals, hourly, top-100 whales with countries and hourly counts); "cached" =
   the aggregate again from the already parsed frame/rows. Medians of several runs.
2. Query latency over HTTP against a real server (1 worker process, so one pool): the first query
   after start (the pool process starts and imports polars), then per endpoint "cold" (the day
   file's mtime is bumped first: a new version, so nothing is cached in the worker or the pool)
   and "cached" (the same request again). Medians and p90 over the repetitions.
3. Ingest p99: `ab -k -c 8` posting 1,600-record bodies from the sample day (dated 2014-05-05, so
   the analytics day stays put) to a fresh server with one worker per core, alone ("baseline")
   and while --load-threads threads send analytics requests back to back ("analytics"): half of
   them cache-friendly (summary, whales, hourly, a chart), half not (charts with a random N or
   whale, downloads of a random ip_id, /api/days counting the growing ingest file; and every 5 s
   a bumped mtime forces a full re-parse). Their rate alone (3 s before ab starts) and during ab
   are recorded. Variants of the pool process: SCHED_IDLE with 1 polars thread (the default),
   SCHED_IDLE with 2, nice 10, nice 0. Rounds alternate the arms (order
   reversed every other round); the report takes medians, and the median over rounds of each
   arm's p99 divided by the baseline's p99 of the same round (robust to the slow drift of the
   machine's other load). The target: analytics p99 within 20% of baseline.

4. Big answers (``--only big``): the same ingest p99, baseline against 3 threads asking for the
   downloads of the day's top whales with ``limit=100000-i`` (a new limit each time, so never
   cached: answers of megabytes) on a day of 1.54M rows (the sample day 20 times over), as the
   review of the analytics cache did. The target is again 1.2x.

Writes bench/results/analytics.json and images/analytics_p99.png. Other engineers may share the
machine: everything measured runs at nice -10 when permitted (--nice), and the busy CPU of the
whole machine during each ab run is recorded next to it.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import itertools
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness.bodies import Body  # noqa: E402
from bench.harness.drivers import ab_command, parse_ab, run_driver  # noqa: E402
from bench.harness.proc import system_cpu_seconds  # noqa: E402
from tiny.layout import day_path  # noqa: E402
from tiny.testing import SAMPLE_DAY, Server, request, sample_csv, sample_lines  # noqa: E402

DAY = "2014-05-04"
INGEST_DAY = "2014-05-05"
RESULTS = ROOT / "bench" / "results" / "analytics.json"
CHART = ROOT / "images" / "analytics_p99.png"
BODY_RECORDS = 1600
BIG_ARM = "big answers, 1.54M-row day (default pool)"
BIG_COPIES = 20  # the sample day's rows this many times over: 1.54M rows
VARIANTS = {  # the analytics pool's CPU priority and polars threads (tiny.analytics reads these)
    "SCHED_IDLE, 1 thread (default)": {"TINY_ANALYTICS_NICE": "idle", "TINY_ANALYTICS_THREADS": "1"},
    "SCHED_IDLE, 2 threads": {"TINY_ANALYTICS_NICE": "idle", "TINY_ANALYTICS_THREADS": "2"},
    "nice 10, 1 thread": {"TINY_ANALYTICS_NICE": "10", "TINY_ANALYTICS_THREADS": "1"},
    "nice 0, 1 thread": {"TINY_ANALYTICS_NICE": "0", "TINY_ANALYTICS_THREADS": "1"},
}


# ---------------------------------------------------------------------------------------------
# 1. Engines (each in its own interpreter: `analytics_bench.py --engine NAME`)


def _python_aggregate(rows: list[list[str]]) -> dict[str, Any]:
    """The day's aggregate from csv-module rows, as tiny.analytics.aggregate_frame computes it."""
    per_ip: Counter[str] = Counter()
    size_ip: Counter[str] = Counter()
    hourly: Counter[str] = Counter()
    total = 0
    for row in rows:
        per_ip[row[9]] += 1
        size_ip[row[9]] += int(row[2])
        hourly[row[1][:2]] += 1
        total += int(row[2])
    top = sorted(per_ip.items(), key=lambda kv: (-kv[1], int(kv[0])))[:100]
    ids = {ip for ip, _ in top}
    countries: dict[str, Counter[str]] = defaultdict(Counter)
    ip_hourly: Counter[tuple[str, str]] = Counter()
    for row in rows:
        if row[9] in ids:
            countries[row[9]][row[8]] += 1
            ip_hourly[row[9], row[1][:2]] += 1
    return {
        "downloads": len(rows),
        "bytes": total,
        "downloaders": len(per_ip),
        "hourly": [hourly[f"{h:02d}"] for h in range(24)],
        "whales": [
            {
                "ip_id": int(ip),
                "downloads": n,
                "bytes": size_ip[ip],
                "country": min(countries[ip], key=lambda c: (-countries[ip][c], c)),
                "hourly": [ip_hourly[ip, f"{h:02d}"] for h in range(24)],
            }
            for ip, n in top
        ],
    }


def _engine(name: str, path: Path, runs: int) -> dict[str, Any]:
    """Times one engine in this process; returns medians in seconds."""
    from tiny.analytics import compute as analytics

    size = path.stat().st_size
    if name == "python-csv":

        def parse() -> Any:
            data = analytics.read_complete_lines(str(path), size).decode()
            return list(csv.reader(io.StringIO(data)))[1:]

        def aggregate(rows: Any) -> Any:
            return _python_aggregate(rows)
    else:
        import polars as pl

        parser = analytics.parse_exact if name == "exact-fallback" else analytics.parse_fast

        def parse() -> Any:
            frame = parser(analytics.read_complete_lines(str(path), size))
            return frame.with_columns(hour=pl.col("time").str.slice(0, 2).cast(pl.Int32, strict=False))

        def aggregate(frame: Any) -> Any:
            return analytics.aggregate_frame(frame, DAY)

    cold, cached = [], []
    started = time.perf_counter()
    parsed = parse()
    first = time.perf_counter() - started  # includes importing polars / first-use setup
    for _ in range(runs):
        started = time.perf_counter()
        parsed = parse()
        result = aggregate(parsed)
        cold.append(time.perf_counter() - started)
    for _ in range(runs * 3):
        started = time.perf_counter()
        aggregate(parsed)
        cached.append(time.perf_counter() - started)
    top = result["whales"][0]
    return {
        "first_parse_s": first,
        "cold_s": statistics.median(cold),
        "cached_s": statistics.median(cached),
        "runs": runs,
        "check": {"downloads": result["downloads"], "top_ip_id": top["ip_id"], "top_downloads": top["downloads"]},
    }


def run_engines(work: Path, runs: int) -> dict[str, Any]:
    path = day_path(work, DAY)
    path.write_bytes(sample_csv())
    plans = [
        ("polars, 1 thread (used)", "polars", "1"),
        ("polars, 2 threads", "polars", "2"),
        ("exact fallback (parse_row -> polars)", "exact-fallback", "1"),
        ("pure Python (csv module + Counter)", "python-csv", "1"),
    ]
    out: dict[str, Any] = {"file_bytes": path.stat().st_size, "rows": sample_csv().count(b"\n") - 1}
    for label, engine, threads in plans:
        env = {**os.environ, "POLARS_MAX_THREADS": threads}
        command = [sys.executable, __file__, "--engine", engine, "--engine-file", str(path), "--engine-runs", str(runs)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=True)
        out[label] = json.loads(done.stdout)
        print(
            f"  engine {label}: cold {out[label]['cold_s'] * 1000:.0f} ms, "
            f"cached {out[label]['cached_s'] * 1000:.1f} ms",
            flush=True,
        )
    return out


# ---------------------------------------------------------------------------------------------
# 2. Query latency over HTTP


def _get(port: int, path: str, timeout: float = 60.0) -> tuple[int, bytes]:
    response = request(port, "GET", path, timeout=timeout)
    return response.status, response.body


def _timed(port: int, path: str) -> float:
    started = time.perf_counter()
    status, body = _get(port, path)
    elapsed = time.perf_counter() - started
    assert status == 200, (path, status, body[:200])
    return elapsed


def endpoints(top_ip: int) -> dict[str, str]:
    base = f"/api/days/{DAY}"
    return {
        "days": "/api/days",
        "summary": f"{base}/summary?top=6",
        "whales": f"{base}/whales?top=6",
        "whales/hourly": f"{base}/whales/hourly?top=6",
        "downloads (limit 1000)": f"{base}/whales/{top_ip}/downloads?limit=1000",
        "chart traffic": f"{base}/charts/traffic.svg?top=6",
        "chart whales": f"{base}/charts/whales.svg?top=6",
        "chart hourly": f"{base}/charts/hourly.svg?top=6",
        "chart detail": f"{base}/charts/detail.svg?ip_id={top_ip}",
    }


def _bump(path: Path) -> None:
    """A new mtime_ns: a new version of the day file for every cache, same content."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000))


def _spread(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 2),
        "p90_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))] * 1000, 2),
        "n": len(ordered),
    }


def run_queries(work: Path, repeats: int) -> dict[str, Any]:
    data = work / "data"
    data.mkdir(parents=True)
    day = day_path(data, DAY)
    day.write_bytes(sample_csv())
    with Server(data, processes=1) as server:
        first = _timed(server.port, f"/api/days/{DAY}/summary?top=6")
        status, body = _get(server.port, f"/api/days/{DAY}/whales?top=1")
        top_ip = json.loads(body)["whales"][0]["ip_id"]
        out: dict[str, Any] = {"first_query_after_start_ms": round(first * 1000, 1), "endpoints": {}}
        for name, path in endpoints(top_ip).items():
            cold, cached = [], []
            for _ in range(repeats):
                _bump(day)
                cold.append(_timed(server.port, path))
                cached.extend(_timed(server.port, path) for _ in range(5))
            out["endpoints"][name] = {"path": path, "cold": _spread(cold), "cached": _spread(cached)}
            print(
                f"  {name:24s} cold {out['endpoints'][name]['cold']['median_ms']:8.1f} ms   "
                f"cached {out['endpoints'][name]['cached']['median_ms']:6.2f} ms",
                flush=True,
            )
    return out


# ---------------------------------------------------------------------------------------------
# 3. Ingest p99 with and without analytics load


class AnalyticsLoad:
    """Threads sending analytics requests back to back, half cached and half not, until stopped."""

    def __init__(
        self, port: int, day_file: Path, threads: int, ip_ids: list[int], whales: list[int], big: bool = False
    ) -> None:
        self.port = port
        self.big = big  # only uncached downloads of the top whales, megabytes each
        self._asked = itertools.count()
        self.day_file = day_file
        self.ip_ids = ip_ids
        self.whales = whales
        self.statuses: Counter[str] = Counter()
        self.latencies: dict[str, list[float]] = defaultdict(list)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(threads)]
        if not big:
            self._threads.append(threading.Thread(target=self._bumper, daemon=True))

    def _request(self, rng: random.Random) -> tuple[str, str]:
        base = f"/api/days/{DAY}"
        if self.big:
            return "big", f"{base}/whales/{rng.choice(self.whales[:8])}/downloads?limit={100_000 - next(self._asked)}"
        if rng.random() < 0.5:  # cached after the first time (until the next bump)
            return "cached", rng.choice(
                [
                    f"{base}/summary?top=6",
                    f"{base}/whales?top=6",
                    f"{base}/whales/hourly?top=6",
                    f"{base}/charts/traffic.svg?top=6",
                ]
            )
        kind = rng.randrange(4)
        if kind == 0:
            view = rng.choice(["traffic", "whales", "hourly"])
            return "uncached", f"{base}/charts/{view}.svg?top={rng.randint(1, 100)}"
        if kind == 1:
            return "uncached", f"{base}/charts/detail.svg?ip_id={rng.choice(self.whales)}"
        if kind == 2:
            return "uncached", f"{base}/whales/{rng.choice(self.ip_ids)}/downloads?limit=1000"
        return "uncached", "/api/days"  # counts the rows of the growing ingest day

    def _run(self, number: int) -> None:
        rng = random.Random(number)
        while not self._stop.is_set():
            kind, path = self._request(rng)
            started = time.perf_counter()
            try:
                status = str(_get(self.port, path)[0])
            except OSError:
                status = "no answer"
            with self._lock:
                self.statuses[status] += 1
                self.latencies[kind].append(time.perf_counter() - started)

    def _bumper(self) -> None:
        while not self._stop.wait(5.0):
            _bump(self.day_file)

    def __enter__(self) -> AnalyticsLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def count(self) -> int:
        with self._lock:
            return sum(self.statuses.values())

    def report(self) -> dict[str, Any]:
        return {
            "statuses": dict(self.statuses),
            **{f"{kind}_latency": _spread(samples) for kind, samples in self.latencies.items()},
        }


def _ab(port: int, body: Body, requests: int, out: Path, seconds: float | None = None) -> dict[str, Any]:
    """ab -k -c 8: ``requests`` requests, or as many as fit in ``seconds``."""
    percentiles = out.with_suffix(".csv")
    url = f"http://127.0.0.1:{port}/ingest"
    if seconds:
        command = ab_command(url, body, 8, True, 10_000_000, int(seconds), percentiles, socket_timeout=30)
    else:
        command = ab_command(url, body, 8, True, requests, None, percentiles, socket_timeout=30)
    load_average = os.getloadavg()[0]
    busy_before, total_before = system_cpu_seconds()
    output, code = run_driver(command, 600)
    busy_after, total_after = system_cpu_seconds()
    out.write_text(output)
    assert code == 0, output
    figures = parse_ab(output, percentiles)
    total = total_after - total_before
    return {
        "requests": figures["complete"],
        "requests_per_s": figures["rps"],
        "failed": figures["failed"],
        "non_2xx": figures["non2xx"],
        "p50_ms": figures["p50_ms"],
        "p90_ms": figures["p90_ms"],
        "p99_ms": figures["p99_ms"],
        "max_ms": figures["max_ms"],
        "machine_busy": round((busy_after - busy_before) / total, 3) if total > 0 else 0.0,
        "load_average_before": load_average,
        "command": " ".join(command),
    }


def _ingest_body(path: Path) -> Body:
    lines = sample_lines()[:BODY_RECORDS]
    path.write_bytes(b"".join(lines).replace(f'"date":"{DAY}"'.encode(), f'"date":"{INGEST_DAY}"'.encode()))
    return Body(str(BODY_RECORDS), path, BODY_RECORDS)


@contextlib.contextmanager
def _fresh_server(work: Path, env: dict[str, str], big: bool = False) -> Iterator[Server]:
    data = Path(tempfile.mkdtemp(prefix="data-", dir=work))
    header, _, rows = sample_csv().partition(b"\n")
    day_path(data, DAY).write_bytes(header + b"\n" + rows * (BIG_COPIES if big else 1))
    try:
        with Server(data, processes=0, env=env) as server:
            yield server
    finally:
        shutil.rmtree(data.parent / "tmp", ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)


def _one_run(
    work: Path, arm: str, body: Body, seconds: float, threads: int, ab_out: Path, big: bool = False
) -> dict[str, Any]:
    env = VARIANTS.get(arm, {})
    with _fresh_server(work, env, big=big) as server:
        _ab(server.port, body, 100, ab_out.with_name(ab_out.name + "-warmup"))  # connections, caches, disk
        if arm == "baseline":
            return {"arm": arm, **_ab(server.port, body, 0, ab_out, seconds)}
        status, data = _get(server.port, f"/api/days/{DAY}/whales?top=100")
        whales = [w["ip_id"] for w in json.loads(data)["whales"]]
        ip_ids = sorted({int(line.rsplit(b",", 1)[1]) for line in sample_csv().splitlines()[1:]})
        load = AnalyticsLoad(server.port, day_path(server.data_dir, DAY), threads, ip_ids, whales, big=big)
        with load:
            time.sleep(1.0)  # every worker's pool is up and busy
            alone = load.count()
            time.sleep(3.0)
            alone = (load.count() - alone) / 3.0
            started, before = time.monotonic(), load.count()
            result = _ab(server.port, body, 0, ab_out, seconds)
            elapsed = time.monotonic() - started
            during = (load.count() - before) / elapsed
        report = load.report()
        report.update(alone_requests_per_s=round(alone, 1), during_ingest_requests_per_s=round(during, 1))
        return {"arm": arm, "env": env, **result, "analytics": report}


def run_ingest(
    work: Path, rounds: int, seconds: float, threads: int, arms: list[str], big: bool = False
) -> dict[str, Any]:
    body = _ingest_body(work / "body-1600.ndjson")
    ab_dir = work / "ab"
    ab_dir.mkdir(exist_ok=True)
    runs: list[dict[str, Any]] = []
    for number in range(rounds):
        order = arms if number % 2 == 0 else list(reversed(arms))
        for arm in order:
            slug = re.sub(r"[^a-z0-9]+", "-", arm.lower()).strip("-")
            run = _one_run(work, arm, body, seconds, threads, ab_dir / f"round{number}-{slug}", big)
            run["round"] = number
            runs.append(run)
            extra = ""
            if "analytics" in run:
                extra = (
                    f", analytics {run['analytics']['alone_requests_per_s']} req/s alone, "
                    f"{run['analytics']['during_ingest_requests_per_s']} during"
                )
            print(
                f"  round {number} {arm:28s} p99 {run['p99_ms']:7.1f} ms  p50 {run['p50_ms']:6.1f} ms  "
                f"{run['requests_per_s']:7.1f} req/s  busy {run['machine_busy']:.2f}{extra}",
                flush=True,
            )
    summary: dict[str, Any] = {}
    for arm in arms:
        mine = [r for r in runs if r["arm"] == arm]
        summary[arm] = {
            "p99_ms_median": statistics.median(r["p99_ms"] for r in mine),
            "p50_ms_median": statistics.median(r["p50_ms"] for r in mine),
            "requests_per_s_median": statistics.median(r["requests_per_s"] for r in mine),
            "p99_ms_rounds": [r["p99_ms"] for r in mine],
        }
    base = summary["baseline"]["p99_ms_median"]
    baseline_of = {r["round"]: r["p99_ms"] for r in runs if r["arm"] == "baseline"}
    for arm in arms[1:]:
        paired = [r["p99_ms"] / baseline_of[r["round"]] for r in runs if r["arm"] == arm]
        summary[arm]["p99_vs_baseline"] = round(summary[arm]["p99_ms_median"] / base, 3)
        summary[arm]["p99_vs_baseline_same_round_median"] = round(statistics.median(paired), 3)
        summary[arm]["within_20_percent"] = summary[arm]["p99_vs_baseline_same_round_median"] <= 1.2
    return {
        "body_records": BODY_RECORDS,
        "body_bytes": body.size,
        "concurrency": 8,
        "load_threads": threads,
        "runs": runs,
        "summary": summary,
    }


# ---------------------------------------------------------------------------------------------
# Report


def draw(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ingest, queries = results.get("ingest"), results.get("queries")
    figure, (left, right) = plt.subplots(
        1, 2, figsize=(13, 5), layout="constrained", gridspec_kw={"width_ratios": [1, 1.3]}
    )
    if ingest:
        arms = list(ingest["summary"])
        medians = [ingest["summary"][a]["p99_ms_median"] for a in arms]
        colors = ["#9cc3e6"] + ["#e4572e"] * (len(arms) - 1)
        left.bar(range(len(arms)), medians, color=colors)
        for i, arm in enumerate(arms):
            rounds = ingest["summary"][arm]["p99_ms_rounds"]
            left.plot([i] * len(rounds), rounds, "o", color="#333333", markersize=4)
        left.axhline(medians[0] * 1.2, color="#333333", linestyle="--", linewidth=1)
        left.text(-0.45, medians[0] * 1.2, "baseline +20%", va="bottom", ha="left", fontsize=8)
        labels = [a.replace(" (default)", "\n(default)").replace(", ", "\n") for a in arms]
        left.set_xticks(range(len(arms)), ["no analytics" if a == "baseline" else a for a in labels], fontsize=8)
        left.set_ylabel("ingest p99 latency (ms)")
        left.set_title(
            f"Ingest p99, ab -k -c 8, {ingest['body_records']:,}-record bodies\n"
            f"alone vs with {ingest['load_threads']} analytics clients at full tilt "
            "(bars: median; dots: rounds)",
            fontsize=10,
            loc="left",
        )
    if queries:
        names = list(queries["endpoints"])
        cold = [queries["endpoints"][n]["cold"]["median_ms"] for n in names]
        cached = [queries["endpoints"][n]["cached"]["median_ms"] for n in names]
        y = range(len(names))
        right.barh([i + 0.2 for i in y], cold, height=0.4, color="#e4572e", label="cold (file changed)")
        right.barh([i - 0.2 for i in y], cached, height=0.4, color="#9cc3e6", label="cached")
        right.set_yticks(list(y), names)
        right.invert_yaxis()
        right.set_xscale("log")
        right.set_xlabel("latency over HTTP, median (ms, log scale)")
        right.set_title("Analytics query latency on the sample day (77,107 rows)", fontsize=10, loc="left")
        right.legend(frameon=False, loc="upper right")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def machine() -> dict[str, Any]:
    import matplotlib
    import polars

    return {
        "cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "polars": polars.__version__,
        "matplotlib": matplotlib.__version__,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 round, short runs, few repetitions")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=12.0, help="length of each measured ab run")
    parser.add_argument("--load-threads", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=7, help="cold queries per endpoint")
    parser.add_argument("--only", choices=["engines", "queries", "ingest", "big"])
    parser.add_argument(
        "--nice",
        type=int,
        default=-10,
        help="niceness of this process and so of the servers and ab it starts (default -10, "
        "when permitted: other tenants' jobs then disturb less; the pool's nice is relative)",
    )
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--engine-file", help=argparse.SUPPRESS)
    parser.add_argument("--engine-runs", type=int, default=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine:  # the child of run_engines
        print(json.dumps(_engine(args.engine, Path(args.engine_file), args.engine_runs)))
        return 0
    if shutil.which("ab") is None:
        print("ab is not installed (apt-get install apache2-utils)", file=sys.stderr)
        return 2
    if args.quick:
        args.rounds, args.seconds, args.repeats = 1, 5.0, 3
    try:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    except PermissionError:
        print(f"cannot set nice {args.nice} (needs CAP_SYS_NICE): measuring at the current one")
    results: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() and args.only else {}
    results["machine"] = {**machine(), "bench_nice": os.getpriority(os.PRIO_PROCESS, 0)}
    results["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    steps: dict[str, Callable[[Path], Any]] = {
        "engines": lambda work: run_engines(work, 3 if args.quick else 7),
        "queries": lambda work: run_queries(work, args.repeats),
        "ingest": lambda work: run_ingest(work, args.rounds, args.seconds, args.load_threads, ["baseline", *VARIANTS]),
        "big": lambda work: run_ingest(work, args.rounds, args.seconds, args.load_threads, ["baseline", BIG_ARM], True),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="analytics-bench-") as scratch:
        for name, step in steps.items():
            if args.only and name != args.only:
                continue
            print(f"{name}:", flush=True)
            work = Path(scratch) / name
            work.mkdir()
            results[name] = step(work)
            RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    if results.get("ingest") or results.get("queries"):  # --only big (or engines) keeps the chart
        draw(results, CHART)
    print(f"wrote {RESULTS.relative_to(ROOT)}" + (f" and {CHART.relative_to(ROOT)}" if results.get("ingest") else ""))
    return 0


if __name__ == "__main__":
    assert SAMPLE_DAY.exists(), f"the sample day is missing: {SAMPLE_DAY}"
    sys.exit(main())

"""Reads from the live aggregates: the store's catch-up, query latency, and ingest beside dashboard and API load.

Usage:
    python bench/reads_bench.py                  # everything, about 15 minutes on 2 cores
    python bench/reads_bench.py --quick          # smoke test: 1 round, short runs (about 3 minutes)
    python bench/reads_bench.py --only store|queries|ingest
    python bench/reads_bench.py --days 30 --copies 2 --rounds 3 --seconds 20 --clients 4 --think 0.5

What it does, from the sample day (../shared/data/cran-logs/2014-05-04.csv.gz, read in place):

1. ``store``: a history of --days days ending 2014-05-04, each the sample day --copies times over
   (the rows re-dated), in bench/results/work/reads-history (made once, kept for the next run:
   a marker file names its shape). ``tiny-admin rebuild-aggregates`` counts it from nothing:
   rows per second of the catch-up. Then the fold of one appended 1,600-row block (what a query
   after an ingest pays).
2. ``queries``: a server (2 processes) on that history; per query, the first answer after the
   server started (its pool process starts), the answer after a write to a day it reads (the
   fold of that write and the answer computed again), and the same answer again (from the
   worker's memory). Medians and p90 over --repeats.
3. ``ingest``: the target of "Analytics that never slow ingest". A fresh server, 2 processes,
   on --dash-days history days (1 copy each); `ab -k -c 8` posting bodies of 100 and of 1,600
   records (the sample day's, re-dated 2014-05-05, so the days read stay put during a round)
   for --seconds, in arms: ``alone``; ``dashboard``, --clients threads each loading the
   dashboard page as the browser does (days, summary, whales, hourly, the three charts from the
   aggregates, the top whale's downloads and its detail chart: random day, random top 1-100),
   then pausing --think seconds; ``api``, --clients threads asking the downloads API and
   badges (random packages, periods and counts), same pauses; ``api-past`` (on request), the same
   API queries over periods that end before the day being written (no fold of new rows: which
   share of the API's cost is the live day's); ``control`` (on request), the
   same clients asking /healthz 9 times a visit: what any reader costs; ``again`` (on request), a
   second arm without readers: its ratio to ``alone`` is what this design reads when nothing
   differs (the machine's noise). Between rounds a few new rows land in every day read, so the
   caches start stale. Arms interleave, their order reversed
   every other round; per round the loaded arm's figures are divided by the ``alone`` arm's of
   the same round and body; the report takes the median over rounds.

Writes bench/results/reads.json and prints a markdown table for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from datetime import date, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import RESULTS  # noqa: E402
from bench.harness.bodies import Body  # noqa: E402
from bench.harness.drivers import ab_command, parse_ab, run_driver  # noqa: E402
from bench.harness.output import machine  # noqa: E402
from bench.harness.proc import cpu_seconds  # noqa: E402
from tiny.layout import HEADER  # noqa: E402
from tiny.testing import SAMPLE_DAY, Server, sample_lines  # noqa: E402

LAST_DAY = date(2014, 5, 4)
INGEST_DAY = "2014-05-05"
WORK = RESULTS / "work"
OUT = RESULTS / "reads.json"
PACKAGES = ("Rcpp", "ggplot2", "plyr", "stringr", "digest", "reshape2", "colorspace", "RColorBrewer", "scales", "MASS")


# -- data ---------------------------------------------------------------------------------


def sample_rows() -> bytes:
    """The sample day's rows (no header), as the server writes them."""
    with gzip.open(SAMPLE_DAY, "rb") as handle:
        data = handle.read()
    return data[data.index(b"\n") + 1 :]


def make_history(path: Path, days: int, copies: int) -> list[str]:
    """--days day files ending LAST_DAY, each the sample rows ``copies`` times, re-dated; kept
    between runs when a marker says they have that shape."""
    marker = path / ".shape"
    shape = f"{days} days x {copies} copies\n"
    dates = [(LAST_DAY - timedelta(days=n)).isoformat() for n in reversed(range(days))]
    if marker.exists() and marker.read_text() == shape:
        return dates
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    rows = sample_rows()
    for day in dates:
        dated = rows.replace(b'"2014-05-04",', f'"{day}",'.encode())
        with open(path / f"{day}.csv", "wb") as out:
            out.write(HEADER)
            for _ in range(copies):
                out.write(dated)
    rebuild_aggregates(path)  # counted once, as by a server that ran all along
    marker.write_text(shape)
    return dates


def rebuild_aggregates(data: Path) -> tuple[list[str], float]:
    """``tiny-admin rebuild-aggregates`` of ``data``: its command and seconds."""
    command = [sys.executable, "-m", "tiny.admin", "rebuild-aggregates", str(data)]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=7200)
    assert done.returncode == 0, done.stderr
    return command, time.perf_counter() - started


def ingest_body(path: Path, records: int) -> Body:
    """``records`` lines of the sample day re-dated INGEST_DAY."""
    lines = sample_lines()[:records]
    path.write_bytes(b"".join(line.replace(b'"2014-05-04"', f'"{INGEST_DAY}"'.encode()) for line in lines))
    return Body(f"{records}", path, records)


# -- HTTP ---------------------------------------------------------------------------------


def get(port: int, path: str, timeout: float = 60.0) -> tuple[int, float, bytes]:
    """(status, seconds, body) of one GET on a new connection."""
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
    finally:
        connection.close()
    return response.status, time.perf_counter() - started, body


def post(port: int, body: bytes) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("POST", "/ingest", body, {"Content-Type": "application/x-ndjson"})
        return connection.getresponse().status
    finally:
        connection.close()


def record_line(day: str, n: int) -> bytes:
    fields = {
        "date": day,
        "time": f"{n % 24:02d}:00:00",
        "size": 1000 + n,
        "r_version": "3.1.0",
        "r_arch": "x86_64",
        "r_os": "linux-gnu",
        "package": PACKAGES[n % len(PACKAGES)],
        "version": "1.0",
        "country": "DE",
        "ip_id": 1 + n % 7,
    }
    return json.dumps(fields).encode() + b"\n"


def touch_days(port: int, days: list[str], rows: int = 5) -> None:
    """New rows in each of ``days``: every cache of them is stale afterwards."""
    for day in days:
        assert post(port, b"".join(record_line(day, n) for n in range(rows))) == 200


def spread(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "median_ms": round(statistics.median(ordered) * 1000, 2),
        "p90_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))] * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
    }


# -- 1. the store ---------------------------------------------------------------------------


def run_store(history: Path, dates: list[str]) -> dict[str, Any]:
    rows = sum(1 for _ in open(history / f"{dates[0]}.csv", "rb")) - 1
    store = history / ".tiny" / "aggregates.sqlite3"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{store}{suffix}").unlink(missing_ok=True)
    command, seconds = rebuild_aggregates(history)
    total = rows * len(dates)
    print(f"  rebuild-aggregates: {total:,} rows in {seconds:.1f} s = {total / seconds:,.0f} rows/s")
    # the fold one query pays after an ingest: 1,600 rows appended to the last day
    from tiny.aggregates import Aggregates

    aggregates = Aggregates(history)
    block = b"\n".join(sample_rows().split(b"\n", 1600)[:1600]) + b"\n"
    block = block.replace(b'"2014-05-04",', f'"{dates[-1]}",'.encode())
    path = history / f"{dates[-1]}.csv"
    size = path.stat().st_size
    times = []
    for _ in range(5):
        with open(path, "ab") as out:
            out.write(block)
        started = time.perf_counter()
        assert aggregates.fold({dates[-1]: path.stat().st_size}) == 1600
        times.append(time.perf_counter() - started)
    os.truncate(path, size)  # the history as it was: that day counted again from its start
    aggregates.fold({dates[-1]: size})
    aggregates.close()
    print(f"  fold of 1,600 appended rows: {spread(times)['median_ms']} ms")
    return {
        "command": " ".join(command[1:]),
        "rows": total,
        "seconds": round(seconds, 2),
        "rows_per_s": round(total / seconds),
        "store_mb": round(store.stat().st_size / 1e6, 1),
        "fold_1600_rows": spread(times),
    }


# -- 2. query latency ----------------------------------------------------------------------


def queries(day: str, top_ip: int) -> dict[str, str]:
    five = ",".join(PACKAGES[:5])
    return {
        "total last-day, 1 package": "/downloads/total/last-day/Rcpp",
        "daily last-month, 10 packages": f"/downloads/daily/last-month/{','.join(PACKAGES)}",
        "total last-week, 5 packages": f"/downloads/total/last-week/{five}",
        "top last-month 100": "/top/last-month/100",
        "trending": "/trending",
        "badge last-month": "/badges/last-month/ggplot2",
        "badge grand-total": "/badges/grand-total/ggplot2",
        "days (all)": "/api/days?limit=1000",
        "summary top 100": f"/api/days/{day}/summary?top=100",
        "whales top 100": f"/api/days/{day}/whales?top=100",
        "hourly top 100": f"/api/days/{day}/whales/hourly?top=100",
        "chart traffic top 6": f"/api/days/{day}/charts/traffic.svg?top=6",
        "chart hourly top 20": f"/api/days/{day}/charts/hourly.svg?top=20",
        "downloads of the top whale (rows)": f"/api/days/{day}/whales/{top_ip}/downloads",
    }


def run_queries(history: Path, dates: list[str], repeats: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    day = dates[-1]
    with Server(history, processes=2, log_path=RESULTS / "logs" / "reads-queries.log") as server:
        port = server.port
        status, seconds, body = get(port, f"/api/days/{day}/whales?top=1")
        assert status == 200, body[:300]
        results["first query after start (pool start + fold check)"] = round(seconds * 1000, 1)
        top_ip = json.loads(body)["whales"][0]["ip_id"]
        for name, path in queries(day, top_ip).items():
            after_write, cached = [], []
            for n in range(repeats):
                touch_days(port, [day], rows=1 + n % 3)
                status, seconds, body = get(port, path)
                assert status == 200, (path, body[:300])
                after_write.append(seconds)
                for _ in range(2):  # both workers hold it
                    status, seconds, body = get(port, path)
                    assert status == 200, (path, body[:300])
                cached.append(seconds)
            results[name] = {"after a write": spread(after_write), "again": spread(cached)}
            print(f"  {name:36s} after a write {results[name]['after a write']['median_ms']:8.2f} ms, "
                  f"again {results[name]['again']['median_ms']:6.2f} ms")  # fmt: skip
    return results


# -- 3. ingest beside reads ----------------------------------------------------------------


class ReadLoad:
    """``clients`` threads reading the server like their users, pausing ``think`` s between visits,
    each on one keep-alive connection as a browser or R's httr keeps one."""

    def __init__(self, port: int, kind: str, days: list[str], clients: int, think: float, seed: int) -> None:
        self.port, self.kind, self.days, self.think = port, kind, days, think
        self.stop = threading.Event()
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.status: dict[int, int] = defaultdict(int)
        self.lock = threading.Lock()
        self.local = threading.local()
        self.threads = [threading.Thread(target=self._run, args=(seed + n,), daemon=True) for n in range(clients)]

    def __enter__(self) -> ReadLoad:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(120)

    def _get(self, name: str, path: str) -> bytes:
        """One GET on this client's keep-alive connection (a browser's, or httr's handle),
        opened again after an error or a close."""
        connection = self.local.__dict__.get("connection")
        if connection is None:
            connection = self.local.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        started = time.perf_counter()
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            status, body = response.status, response.read()
            seconds = time.perf_counter() - started
            if response.will_close:
                connection.close()
        except (OSError, http.client.HTTPException):
            connection.close()
            status, seconds, body = 0, 0.0, b""
        with self.lock:
            self.status[status] += 1
            if status == 200:
                self.latency[name].append(seconds)
        return body if status == 200 else b""

    def _dashboard(self, rng: random.Random) -> None:
        day, top = rng.choice(self.days), rng.randint(1, 100)
        base = f"/api/days/{day}"
        self._get("days", "/api/days?limit=1000")
        self._get("summary", f"{base}/summary?top={top}")
        whales = self._get("whales", f"{base}/whales?top={top}")
        self._get("hourly", f"{base}/whales/hourly?top={top}")
        for view in ("traffic", "whales", "hourly"):
            self._get(f"chart {view}", f"{base}/charts/{view}.svg?top={top}")
        if whales:
            ip = json.loads(whales)["whales"][0]["ip_id"]
            self._get("whale downloads (rows)", f"{base}/whales/{ip}/downloads?limit=500")
            self._get("chart detail (rows)", f"{base}/charts/detail.svg?ip_id={ip}")

    def _api(self, rng: random.Random) -> None:
        self._downloads(rng, ["last-day", "last-week", "last-month", f"{self.days[0]}:{self.days[-1]}"])
        self._get("badge", f"/badges/{rng.choice(['last-day', 'last-week', 'last-month'])}/{rng.choice(PACKAGES)}")

    def _api_past(self, rng: random.Random) -> None:
        """As _api, with periods that end before the day being written: no live fold (a
        fourth query of the same kind in place of the badge, whose periods all end today)."""
        self._downloads(rng, [self.days[-1], f"{self.days[-2]}:{self.days[-1]}", f"{self.days[0]}:{self.days[-1]}"])
        self._get("top", f"/top/{self.days[-1]}/{rng.randint(1, 100)}")

    def _downloads(self, rng: random.Random, periods: list[str]) -> None:
        """The downloads API's total, daily and top of one of ``periods``, random packages and count."""
        packages = ",".join(rng.sample(PACKAGES, rng.randint(1, 5)))
        period = rng.choice(periods)
        self._get("downloads total", f"/downloads/total/{period}/{packages}")
        self._get("downloads daily", f"/downloads/daily/{period}/{packages}")
        self._get("top", f"/top/{period}/{rng.randint(1, 100)}")

    def _control(self, rng: random.Random) -> None:
        for _ in range(9):  # as many requests as a dashboard visit, each answered at once
            self._get("healthz", "/healthz")

    def _run(self, seed: int) -> None:
        rng = random.Random(seed)
        visits = {"dashboard": self._dashboard, "api": self._api, "api-past": self._api_past, "control": self._control}
        visit = visits[self.kind]
        try:
            while not self.stop.is_set():
                visit(rng)
                self.stop.wait(self.think)
        finally:
            if (connection := self.local.__dict__.get("connection")) is not None:
                connection.close()

    def figures(self, seconds: float) -> dict[str, Any]:
        answered = sum(len(v) for v in self.latency.values())
        return {
            "answers_per_s": round(answered / seconds, 1),
            "status": dict(self.status),
            "latency": {name: spread(samples) for name, samples in sorted(self.latency.items()) if samples},
        }


def pool_pids(server: Server) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (proc / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if parent in server.worker_pids() and b"spawn_main" in command:
            pids.append(int(proc.name))
    return pids


def one_arm(server: Server, arm: str, body: Body, days: list[str], args: argparse.Namespace, seed: int) -> dict:
    out = RESULTS / "logs" / f"reads-{arm}-{body.name}.csv"
    command = ab_command(f"http://127.0.0.1:{server.port}/ingest", body, 8, True, 10_000_000, args.seconds, out)
    load = None if arm in ("alone", "again") else ReadLoad(server.port, arm, days, args.clients, args.think, seed)
    if load is not None:
        load.__enter__()
    before = cpu_seconds([server.pid])
    started = time.monotonic()
    try:
        text, code = run_driver(command, timeout=args.seconds + 120)
        seconds = time.monotonic() - started
        after = cpu_seconds([server.pid])  # the ab run's, before the readers' last visits end
    finally:
        if load is not None:
            load.__exit__()
    pools = set(pool_pids(server))
    result = parse_ab(text, out)
    result["ab_exit"] = code
    result["wall_s"] = round(seconds, 2)
    result["server_cpu_s"] = round(sum(after.values()) - sum(before.values()), 2)
    result["analytics_cpu_s"] = round(sum(after.get(p, 0) - before.get(p, 0) for p in pools), 2)
    if load is not None:
        result["reads"] = load.figures(seconds)
    return result


def fresh_server(template: Path, data: Path, extra: list[str]) -> Server:
    """A server of 2 processes on a fresh copy of ``template`` (caches empty), to start with
    ``with``. The data dir the arm before wrote (gigabytes) is removed first, so its dirty
    pages are dropped instead of written back during this arm. The copies are other files
    (inodes) than those the template's store counted, which the store takes for replaced files
    and would count again from their start under the arm's load: counted here first, as by a
    server that ran all along."""
    shutil.rmtree(data, ignore_errors=True)
    os.sync()
    shutil.copytree(template, data)
    rebuild_aggregates(data)
    return Server(data, *extra, processes=2, log_path=RESULTS / "logs" / "reads-ingest.log")


def run_ingest(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    data = work / "reads-ingest"
    dash_days = [(LAST_DAY - timedelta(days=n)).isoformat() for n in reversed(range(args.dash_days))]
    bodies = [ingest_body(work / f"reads-body-{n}.ndjson", n) for n in args.bodies]
    arms = ["alone", *args.arms]
    rounds: list[dict[str, Any]] = []
    template = work / "reads-ingest-template"
    make_history(template, args.dash_days, 1)  # the days read, counted into the store once
    extra = ["--analytics-cpu", str(args.analytics_cpu)] if args.analytics_cpu is not None else []
    # A throwaway arm first: the first server of a run was 10-25% slower than the same arm later
    # (a cold machine), which favoured whichever arm came first, always `alone` in round 1.
    warm = argparse.Namespace(**{**vars(args), "seconds": min(args.seconds, 5.0)})
    with fresh_server(template, data, extra) as server:
        one_arm(server, "alone", bodies[0], dash_days, warm, seed=0)
    for number in range(args.rounds):
        for body in bodies:
            order = arms if number % 2 == 0 else list(reversed(arms))
            figures = {}
            for arm in order:
                with fresh_server(template, data, extra) as server:
                    touch_days(server.port, dash_days)  # the days read got new rows since the last arm
                    figures[arm] = one_arm(server, arm, body, dash_days, args, seed=number * 100)
                f = figures[arm]
                reads = f.get("reads", {})
                print(f"  round {number + 1} body {body.name:>4} {arm:9s} {f['rps']:8.0f} req/s p99 "
                      f"{f['p99_ms']} ms, analytics CPU {f['analytics_cpu_s']} s, "
                      f"reads {reads.get('answers_per_s', '-')}/s {reads.get('status', '')}")  # fmt: skip
            rounds.append({"round": number + 1, "body": body.name, "order": order, "arms": figures})
    summary: dict[str, Any] = {}
    for body in bodies:
        mine = [r for r in rounds if r["body"] == body.name]
        for arm in args.arms:
            rps = [r["arms"][arm]["rps"] / r["arms"]["alone"]["rps"] for r in mine]
            p99 = [r["arms"][arm]["p99_ms"] / r["arms"]["alone"]["p99_ms"] for r in mine]
            reads = [r["arms"][arm].get("reads", {"answers_per_s": 0, "status": {}, "latency": {}}) for r in mine]
            statuses: dict[str, int] = defaultdict(int)
            for figures in reads:
                for status, count in figures["status"].items():
                    statuses[str(status)] += count
            summary[f"{body.name}/{arm}"] = {
                "rps_ratio_median": round(statistics.median(rps), 3),
                "rps_ratios": [round(x, 3) for x in rps],
                "p99_ratio_median": round(statistics.median(p99), 3),
                "p99_ratios": [round(x, 3) for x in p99],
                "alone_rps_median": round(statistics.median(r["arms"]["alone"]["rps"] for r in mine)),
                "alone_p99_ms_median": statistics.median(r["arms"]["alone"]["p99_ms"] for r in mine),
                "loaded_p99_ms_median": statistics.median(r["arms"][arm]["p99_ms"] for r in mine),
                "reads_per_s_median": statistics.median(f["answers_per_s"] for f in reads),
                "read_statuses": dict(statuses),
                "analytics_cpu_s_median": statistics.median(r["arms"][arm]["analytics_cpu_s"] for r in mine),
                "read_latency_last_round": reads[-1]["latency"],
            }
    return {"rounds": rounds, "summary": summary}


def table(summary: dict[str, Any]) -> str:
    lines = [
        "| body | load | ingest req/s, loaded / alone (per round) | ingest p99, loaded / alone (per round) "
        "| reads answered/s | read statuses |",
        "|---|---|---|---|---|---|",
    ]
    for key, s in summary.items():
        body, arm = key.split("/")
        lines.append(
            f"| {body} | {arm} | **{s['rps_ratio_median']:.2f}** ({', '.join(f'{x:.2f}' for x in s['rps_ratios'])}) "
            f"| **{s['p99_ratio_median']:.2f}** ({', '.join(f'{x:.2f}' for x in s['p99_ratios'])}) "
            f"| {s['reads_per_s_median']} | {s['read_statuses']} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("store", "queries", "ingest"))
    parser.add_argument("--quick", action="store_true", help="1 round of 6 s, 3 days x 1 copy, 3 repeats")
    parser.add_argument("--days", type=int, default=30, help="days of history (store, queries)")
    parser.add_argument("--copies", type=int, default=2, help="copies of the sample day in each history day")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of each ab run")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--think", type=float, default=0.5, help="seconds a client pauses between visits")
    parser.add_argument("--dash-days", type=int, default=5, help="days the dashboard clients read (ingest)")
    arms = ("dashboard", "api", "api-past", "control", "again")
    parser.add_argument("--arms", nargs="+", default=["dashboard", "api"], choices=arms)
    parser.add_argument("--bodies", type=int, nargs="+", default=[100, 1600], help="records per ingest body")
    parser.add_argument("--analytics-cpu", type=float, default=None, help="the server's --analytics-cpu")
    args = parser.parse_args()
    if args.quick:
        args.days, args.copies, args.repeats, args.rounds, args.seconds = 3, 1, 3, 1, 6.0
    WORK.mkdir(parents=True, exist_ok=True)
    (RESULTS / "logs").mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"machine": machine(), "args": vars(args)}
    if args.only in (None, "store", "queries"):
        history = WORK / "reads-history"
        dates = make_history(history, args.days, args.copies)
        if args.only in (None, "store"):
            print(f"== store: {args.days} days x {args.copies} copies of the sample day")
            results["store"] = run_store(history, dates)
        if args.only in (None, "queries"):
            print("== queries")
            results["queries"] = run_queries(history, dates, args.repeats)
    if args.only in (None, "ingest"):
        print(f"== ingest beside reads: {args.rounds} rounds, {args.seconds:g} s each")
        results["ingest"] = run_ingest(args, WORK)
        print(table(results["ingest"]["summary"]))
    OUT.write_text(json.dumps(results, indent=1))
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

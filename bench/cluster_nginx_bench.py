"""Cluster mode against one host, both behind nginx, in one run; and the time without commits when the primary dies.

Starts its own PostgreSQL cluster (tiny.testing_pg: etcd and three PostgreSQL 15 nodes under
Patroni on loopback, strict synchronous replication, every node on this machine's one disk) and
two arms, each nginx (nginx/proxy.conf, one worker) in front of Tiny:

- ``cluster``: two ingest hosts in cluster mode (``app.py --cluster``, ``--processes 1`` each,
  their own data dirs, each with its follower);
- ``one host``: one server without ``--cluster`` (``--processes 2``, the local journal).

Both have two Tiny workers. For each round and each body size (``--records``: the first N
records of the real sample day), each arm is driven for ``--seconds`` by bench/post_load.py
(``--concurrency`` keep-alive connections, a fresh Idempotency-Key per request), the arms'
order reversed every other round. Per point: requests/s, p99, and CPU per record (µs) of the
server's processes from /proc (bench/harness/proc.py): nginx, Tiny (parents and workers), and
for the cluster the two followers, PostgreSQL (every process of the three nodes) and Patroni
with etcd, apart; and, for the cluster, positions (positioned flushes, so commits of the one global
order) per second and requests per flush. Then the ratios cluster / one host per round, and
their medians.

Then ``--failovers`` times: four threads post 1-record keyed batches through the cluster's
nginx, each sent again with its key after anything but a 200; the primary is killed -9 after
3 s of load; the longest time without an acknowledgement from the kill on is the failover
time. The victim rejoins before the next kill.

Usage:
    python bench/cluster_nginx_bench.py [--records 1 100 1600] [--rounds 3] [--seconds 5] \
        [--concurrency 8] [--failovers 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import re
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import RESULTS
from bench.harness.proc import cpu_seconds, loadavg
from bench.harness.services import LocalServer, NginxFront
from bench.post_load import run as post_load
from tests.cluster_support import fresh_database, on_primary, without_password
from tiny.testing import sample_lines
from tiny.testing_pg import PgCluster

LOGS = RESULTS / "cluster" / "logs"
_ANALYTICS = ("--analytics-cpu", "0", "--analytics-nice", "0")  # no idle priority for a pool that is not driven


def pg_roots(cluster: PgCluster) -> dict[str, list[int]]:
    """The cluster's processes by role: every node's postmaster (its tree: backends, WAL
    senders and receivers) and Patroni with etcd."""
    postmasters = []
    for node in cluster.nodes.values():
        try:
            postmasters.append(int((node.data_dir / "postmaster.pid").read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            pass
    managers = [node.proc.pid for node in cluster.nodes.values() if node.proc is not None]
    etcd = getattr(cluster, "_etcd", None)
    return {"postgres": postmasters, "patroni+etcd": managers + ([etcd.pid] if etcd is not None else [])}


def cpu_by_role(roles: dict[str, list[int]]) -> dict[str, float]:
    """CPU-seconds of each role's process trees; a follower's, which its server's tree holds
    too, counted as the follower's only."""
    seconds = {role: sum(cpu_seconds(roots).values()) for role, roots in roles.items()}
    if "follower" in seconds:
        seconds["tiny"] -= seconds["follower"]
    return seconds


def follower_pids(hosts: list[LocalServer]) -> list[int]:
    """The pid of each host's follower, from its log (tiny.follower's line when it starts)."""
    found = [re.findall(r"tiny\.follower\[(\d+)\] follower \S+ of ", host.server.log()) for host in hosts]
    return [int(pids[-1]) for pids in found if pids]


def head(dsn: str) -> int:
    return int(on_primary(dsn, "SELECT position FROM tiny.head")[0][0])


def point(
    front: NginxFront, roles: dict[str, list[int]], body: bytes, records: int, args: Any, dsn: str | None
) -> dict[str, Any]:
    """One arm at one body size: the load, then its figures."""
    before, at = cpu_by_role(roles), head(dsn) if dsn else 0
    load = asyncio.run(post_load(front.url, body, args.concurrency, args.seconds, uuid.uuid4().hex[:8], False))
    after = cpu_by_role(roles)
    answered = load["requests"] - load["non2xx"]  # 200s only
    rows = answered * records
    result: dict[str, Any] = {
        "requests_per_s": round(answered / load["seconds"], 1),
        "records_per_s": round(rows / load["seconds"]),
        "p50_ms": load["p50_ms"],
        "p99_ms": load["p99_ms"],
        "not_200": load["non2xx"] + load["failed"],
        "cpu_us_per_record": {role: round(1e6 * (after[role] - before[role]) / max(rows, 1), 2) for role in roles},
    }
    result["cpu_us_per_record"]["all"] = round(sum(result["cpu_us_per_record"].values()), 2)
    if dsn:
        positions = head(dsn) - at
        result["positions_per_s"] = round(positions / load["seconds"], 1)
        result["requests_per_position"] = round(answered / max(positions, 1), 2)
    return result


def failover(cluster: PgCluster, url: str, clients: int = 4) -> dict[str, Any]:
    """kill -9 of the primary under keyed 1-record load through nginx (see the module docstring)."""
    host, port = url.split("/")[2].split(":")
    body = sample_lines()[0]
    acks: list[float] = []
    answers: dict[str, int] = {}
    longest = [0.0]
    stop = threading.Event()
    lock = threading.Lock()

    def client(n: int) -> None:
        sent = 0
        while not stop.is_set():
            key = f"failover-{uuid.uuid4().hex[:6]}-{n}-{sent}"
            sent += 1
            while not stop.is_set():
                began = time.monotonic()
                conn = http.client.HTTPConnection(host, int(port), timeout=60)
                try:
                    conn.request("POST", "/ingest", body, {"Idempotency-Key": key})
                    response = conn.getresponse()
                    status = str(response.status)
                    response.read()
                except (OSError, http.client.HTTPException):
                    status = "no answer"
                finally:
                    conn.close()
                with lock:
                    longest[0] = max(longest[0], time.monotonic() - began)
                    answers[status] = answers.get(status, 0) + 1
                    if status == "200":
                        acks.append(time.monotonic())
                        break
                time.sleep(0.2)

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(3.0)
    victim = cluster.wait_primary(30)
    killed = time.monotonic()
    cluster.kill(victim)
    kill_took = time.monotonic() - killed
    survived = cluster.alive(victim) or cluster.query(victim, "SELECT 1") is not None  # a kill that did not take
    writable: set[str] = set()  # every node seen accepting writes until ingest resumed
    deadline = killed + 45
    while time.monotonic() < deadline:
        with lock:  # past the answers of requests in flight at the kill (no standby is promoted within 1 s)
            after = [t for t in acks if t > killed + 1.0]
        if len(after) > 2 * clients and time.monotonic() > after[0] + 3:
            break
        writable |= {name for name in cluster.nodes if cluster.query(name, "SELECT pg_is_in_recovery()") == [(False,)]}
        time.sleep(0.2)
    stop.set()
    for thread in threads:
        thread.join(90)
    with lock:
        times = sorted(t for t in acks if t >= killed)
    gap = max((b - a for a, b in zip([killed, *times], times, strict=False)), default=float("inf"))
    new = cluster.primary()
    cluster.restart(victim)
    cluster.wait_healthy(120)
    return {
        "killed": victim,
        "victim_survived_the_kill": survived,
        "kill_took_s": round(kill_took, 2),
        "promoted": new,
        "writable_meanwhile": sorted(writable),
        "seconds_without_an_ack": round(gap, 2),
        "answers": answers,
        "longest_request_s": round(longest[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, nargs="+", default=[1, 100, 1600])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--failovers", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    lines = sample_lines()
    points: list[dict[str, Any]] = []
    failovers: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="cluster-bench-") as scratch_name:
        scratch = Path(scratch_name)
        with PgCluster(scratch / "pg") as cluster:
            secret_dsn = fresh_database(cluster)
            dsn = without_password(cluster, secret_dsn, scratch)
            hosts = [
                LocalServer(
                    f"cluster-h{i}",
                    "app.py",
                    1,
                    scratch / f"h{i}" / "data",
                    args=["--cluster", dsn, "--host-name", f"h{i}", *_ANALYTICS],
                    logs=LOGS,
                )
                for i in (1, 2)
            ]
            alone = LocalServer("one-host", "app.py", 2, scratch / "alone" / "data", args=_ANALYTICS, logs=LOGS)
            for name in ("cluster", "alone"):
                (scratch / name).mkdir(exist_ok=True)
            fronts = {
                "cluster": NginxFront("cluster", 0, scratch / "cluster" / "x", 1, True, logs=LOGS, apps=hosts),
                "one host": NginxFront("one-host", 0, scratch / "alone" / "x", 1, True, logs=LOGS, apps=[alone]),
            }
            try:
                for front in fronts.values():
                    front.start()
                roles = {name: front.roles() for name, front in fronts.items()}
                roles = {name: {"tiny": r["app"], "nginx": r["nginx"]} for name, r in roles.items()}
                roles["cluster"].update(follower=follower_pids(hosts), **pg_roots(cluster))
                for records in args.records:  # warm-up: every arm, every size, 1 s
                    body = b"".join(lines[:records])
                    for front in fronts.values():
                        asyncio.run(post_load(front.url, body, args.concurrency, 1.0, uuid.uuid4().hex[:8], False))
                for round_ in range(args.rounds):
                    for records in args.records:
                        body = b"".join(lines[:records])
                        order = list(fronts) if round_ % 2 == 0 else list(reversed(fronts))
                        for arm in order:
                            result = point(
                                fronts[arm], roles[arm], body, records, args, secret_dsn if arm == "cluster" else None
                            )
                            entry = {"round": round_ + 1, "records": records, "arm": arm, **result}
                            points.append(entry)
                            print(json.dumps(entry), flush=True)
                print(f"load average {' '.join(loadavg())}", flush=True)
                for _ in range(args.failovers):
                    figures = failover(cluster, fronts["cluster"].url)
                    failovers.append(figures)
                    print(json.dumps({"failover": figures}), flush=True)
            finally:
                for front in fronts.values():
                    front.stop()
    summary = summarize(points, args.records)
    for line in summary["table"]:
        print(line)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"points": points, "failovers": failovers, "summary": summary}, indent=1))


def summarize(points: list[dict[str, Any]], sizes: list[int]) -> dict[str, Any]:
    """Per size: cluster / one host per round (requests/s, p99, CPU per record of Tiny and
    nginx, and of everything with PostgreSQL), their medians, and a markdown table."""
    table = [
        "| body | cluster / one host, req/s (per round; median) | p99 ms, cluster; one host (medians) "
        "| CPU µs per record, one host: tiny+nginx "
        "| cluster: tiny+nginx; followers; PostgreSQL; Patroni+etcd (medians) "
        "| cluster / one host, CPU per record incl. PostgreSQL (median) | positions/s; requests per position |",
        "|---:|:---|:---|---:|:---|:---|:---|",
    ]
    out: dict[str, Any] = {}

    def n(x: float) -> str:
        return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"

    for records in sizes:
        by_round: dict[int, dict[str, dict[str, Any]]] = {}
        for p in points:
            if p["records"] == records:
                by_round.setdefault(p["round"], {})[p["arm"]] = p
        rounds = [r for r in by_round.values() if len(r) == 2]
        if not rounds:
            continue
        rate = [r["cluster"]["requests_per_s"] / r["one host"]["requests_per_s"] for r in rounds]

        def own(p: dict[str, Any]) -> float:
            return float(p["cpu_us_per_record"]["tiny"] + p["cpu_us_per_record"]["nginx"])

        cpu_all = [r["cluster"]["cpu_us_per_record"]["all"] / own(r["one host"]) for r in rounds]
        med = statistics.median
        cl = [r["cluster"] for r in rounds]
        one = [r["one host"] for r in rounds]
        out[str(records)] = {"rate_ratios": rate, "cpu_ratios": cpu_all}
        table.append(
            f"| {records:,} | {', '.join(f'{x:.2f}' for x in rate)}; **{med(rate):.2f}** "
            f"({med(p['requests_per_s'] for p in cl):,.0f} vs {med(p['requests_per_s'] for p in one):,.0f}) "
            f"| {med(p['p99_ms'] for p in cl):.1f}; {med(p['p99_ms'] for p in one):.1f} "
            f"| {n(med(own(p) for p in one))} "
            f"| {n(med(own(p) for p in cl))}; {n(med(p['cpu_us_per_record']['follower'] for p in cl))}; "
            f"{n(med(p['cpu_us_per_record']['postgres'] for p in cl))}; "
            f"{n(med(p['cpu_us_per_record']['patroni+etcd'] for p in cl))} "
            f"| {med(cpu_all):.2f} "
            f"| {med(p['positions_per_s'] for p in cl):.0f}; {med(p['requests_per_position'] for p in cl):.2f} |"
        )
    out["table"] = table
    return out


if __name__ == "__main__":
    main()

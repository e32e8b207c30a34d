"""The commit log's throughput on a real cluster: commits/s and rows/s of keyed flushes, by batch size and committers.

Starts its own cluster (tiny.testing_pg: etcd and three PostgreSQL 15 nodes under Patroni on
loopback, strict synchronous replication, every node on this machine's one disk), then, for
each batch size (``--rows``, rows of the real sample day per flush) and each number of
committers (``--committers``: threads, each its own CommitLog, as hosts would be), commits
keyed flushes of one append for ``--seconds`` and prints commits/s, rows/s, and the median and
p99 latency of a commit. Every flush writes bytes, so each takes a position of the one global
order: the head row serialises commits (its lock is held through the wait for the standby),
which is the design's ceiling.

Usage:
    python bench/cluster_log_bench.py [--rows 1 1600] [--committers 1 4] [--seconds 8] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tiny.cluster.log import CommitLog
from tiny.commit import Claim
from tiny.testing import sample_csv
from tiny.testing_pg import PgCluster

DAY = "2014-05-04.csv"


def run(dsn: str, rows: int, committers: int, seconds: float) -> dict[str, float]:
    """Commit keyed flushes of ``rows`` rows from ``committers`` threads for ``seconds``."""
    lines = sample_csv().split(b"\n")[1:]
    body = b"\n".join(lines[:rows]) + b"\n"
    logs = [CommitLog(dsn) for _ in range(committers)]
    for log in logs:
        log.open()
    latencies: list[list[float]] = [[] for _ in range(committers)]
    start = threading.Barrier(committers + 1)
    stop = time.monotonic() + seconds + 1

    def commit(i: int) -> None:
        log = logs[i]
        digest = log.digest(body)
        start.wait()
        while time.monotonic() < stop:
            began = time.perf_counter()
            log.commit([({DAY: body}, Claim(uuid.uuid4().hex, digest, b'{"ok":1}'))])
            latencies[i].append(time.perf_counter() - began)

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(committers)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.monotonic()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - began
    for log in logs:
        log.close()
    every = sorted(x for per in latencies for x in per)
    count = len(every)
    return {
        "rows": rows,
        "committers": committers,
        "body_bytes": len(body),
        "commits_per_s": round(count / elapsed, 1),
        "rows_per_s": round(count * rows / elapsed),
        "median_ms": round(statistics.median(every) * 1000, 2),
        "p99_ms": round(every[int(count * 0.99) - 1] * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 1600])
    parser.add_argument("--committers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="tiny-bench-pg-") as tmp, PgCluster(Path(tmp)) as cluster:
        print(f"cluster started in {cluster.started_in:.1f} s", flush=True)
        for rows in args.rows:
            for committers in args.committers:
                result = run(cluster.dsn, rows, committers, args.seconds)
                results.append(result)
                print(json.dumps(result), flush=True)
    print(f"cluster stopped in {cluster.stopped_in:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()

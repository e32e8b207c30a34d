"""Cluster mode end to end: keyed POSTs to one ingest host, against one host alone, and a read host's lag.

Starts its own PostgreSQL cluster (tiny.testing_pg: etcd and three nodes under Patroni on
loopback, strict synchronous replication, all on this machine's one disk), an ingest host and a
read host (`app.py --cluster`, ``--processes`` workers each, their own data dirs), and, for
comparison in the same run, one host alone (no --cluster) with the same workers. For each body
size (``--records``, lines of the real sample day) it runs ``--clients`` threads, each on its
own keep-alive connection, posting bodies with a fresh Idempotency-Key each for ``--seconds``,
and prints requests/s and the median and p99 latency of a POST (the commit: with --cluster, the
PostgreSQL transaction and its synchronous standby; alone, the journal). Then the follower's
lag: ``--lag-samples`` times, a POST to the ingest host, then a read on the read host with
``Tiny-Wait-Position`` set to its ``Tiny-Position`` (the time until the read host has applied
it), against the same read with ``Tiny-Wait-Position: 0``.

Usage:
    python bench/cluster_mode_bench.py [--records 1 100] [--clients 8] [--seconds 8] [--processes 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.cluster_support import fresh_database, without_password
from tiny.testing import Server, sample_lines
from tiny.testing_pg import PgCluster


def post_load(port: int, body: bytes, clients: int, seconds: float) -> dict[str, float]:
    """``clients`` keep-alive connections posting ``body`` with a new key each for ``seconds``."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    failures = [0] * clients
    start = threading.Barrier(clients + 1)
    stop = [0.0]

    def client(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        start.wait()
        while time.monotonic() < stop[0]:
            began = time.perf_counter()
            conn.request("POST", "/ingest", body, {"Idempotency-Key": uuid.uuid4().hex})
            response = conn.getresponse()
            response.read()
            if response.status == 200:
                latencies[i].append(time.perf_counter() - began)
            else:
                failures[i] += 1
        conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    stop[0] = time.monotonic() + seconds
    began = time.monotonic()
    start.wait()
    for thread in threads:
        thread.join()
    took = time.monotonic() - began
    every = sorted(t for one in latencies for t in one)
    return {
        "requests_per_s": round(len(every) / took, 1),
        "median_ms": round(1000 * statistics.median(every), 2),
        "p99_ms": round(1000 * every[int(0.99 * (len(every) - 1))], 2),
        "failed": sum(failures),
    }


def lag(ingest: Server, read: Server, samples: int) -> dict[str, float]:
    """Read-your-writes across hosts: a read waiting for the POST's position, against one that does not."""
    body = b"".join(sample_lines()[:10])
    waited, plain = [], []
    for _ in range(samples):
        position = ingest.ingest(body, {"Idempotency-Key": uuid.uuid4().hex}).headers["tiny-position"]
        for out, asked in ((waited, position), (plain, "0")):
            began = time.perf_counter()
            answer = read.request("GET", "/downloads/total/2014-05-04/caret", headers={"Tiny-Wait-Position": asked})
            out.append(time.perf_counter() - began)
            assert answer.status == 200, answer.body
    return {
        "read_waiting_median_ms": round(1000 * statistics.median(waited), 2),
        "read_waiting_p99_ms": round(1000 * sorted(waited)[int(0.99 * (len(waited) - 1))], 2),
        "read_not_waiting_median_ms": round(1000 * statistics.median(plain), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, nargs="+", default=[1, 100])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--lag-samples", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: dict[str, object] = {}
    lines = sample_lines()
    with tempfile.TemporaryDirectory() as scratch, PgCluster(Path(scratch) / "pg") as cluster:
        dsn = without_password(cluster, fresh_database(cluster), Path(scratch))
        flags = ["--analytics-cpu", "0", "--analytics-nice", "0"]
        common = {"processes": args.processes}
        ingest = Server(Path(scratch) / "a" / "data", "--cluster", dsn, "--host-name", "a", *flags, **common)
        read = Server(Path(scratch) / "b" / "data", "--cluster", dsn, "--host-name", "b", "--role", "read", *flags)
        alone = Server(Path(scratch) / "alone" / "data", *flags, **common)
        with ingest, read, alone:
            for records in args.records:
                body = b"".join(lines[:records])
                for name, server in (("cluster", ingest), ("one host", alone)):
                    result = post_load(server.port, body, args.clients, args.seconds)
                    results[f"{name}, {records} records"] = result
                    print(f"{name:9} {records:5} records: {result}", flush=True)
            results["lag"] = lag(ingest, read, args.lag_samples)
            print(f"read host: {results['lag']}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

"""Acceptance tests of the ingest core: the real server, real sockets, real files.

pytest collects this file and the tests/ package (pyproject.toml); `make test` runs both.
Per-module specifications live in tests/test_<module>.py.
"""

from __future__ import annotations

import gzip
import http.client
import re
import signal
import socket
import threading
import time
from pathlib import Path

import orjson

from tests.support import Server, batches, record, rows_of, sample_csv, sample_lines
from tiny.layout import HEADER

ROW = re.compile(rb'^"\d{4}-\d{2}-\d{2}","\d{2}:\d{2}:\d{2}",\d+,(?:"[^"\n]*"|NA,?)+.*\d+\n$')


def test_sample_day_posted_in_order_reproduces_the_public_file_byte_for_byte(tmp_path: Path) -> None:
    lines = sample_lines()
    with Server(tmp_path / "data", processes=2) as server:
        started = time.perf_counter()
        for body in batches(lines, 1600):
            response = server.ingest(body)
            assert response.status == 200, response.body
            assert response.json()["result"]["stats"]["records"]["invalid"] == 0
        elapsed = time.perf_counter() - started
    print(f"round trip: {len(lines)} records in {elapsed:.2f} s = {len(lines) / elapsed:,.0f} records/s")
    assert (tmp_path / "data" / "2014-05-04.csv").read_bytes() == sample_csv()


def test_gzip_bodies_reproduce_the_same_rows(tmp_path: Path) -> None:
    lines = sample_lines()[:16000]
    with Server(tmp_path / "data") as server:
        for body in batches(lines, 4000):
            response = server.ingest(gzip.compress(body), {"Content-Encoding": "gzip"})
            assert response.status == 200, response.body
            assert response.json()["result"]["stats"]["bytes"] < len(body)  # bytes as received
    expected = b"".join(sample_csv().splitlines(keepends=True)[: 16000 + 1])
    assert (tmp_path / "data" / "2014-05-04.csv").read_bytes() == expected


def _tagged_batch(client: int, batch: int, size: int) -> list[bytes]:
    """NDJSON lines whose ip_id makes every row of the test unique and traceable."""
    return [
        orjson.dumps(record(ip_id=client * 1_000_000 + batch * 1_000 + i + 1, package=f"p{client}-{batch}"))
        for i in range(size)
    ]


def test_two_processes_sixteen_clients_append_one_day_file_without_tearing(tmp_path: Path) -> None:
    clients, per_client, size = 16, 12, 250
    acked: dict[tuple[int, int], list[bytes]] = {}
    failures: list[str] = []
    writers: set[int] = set()

    with Server(tmp_path / "data", processes=2) as server:

        def client(number: int) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            conn.request("GET", "/healthz")  # which worker this keep-alive connection posts to
            writers.add(orjson.loads(conn.getresponse().read())["pid"])
            for batch in range(per_client):
                lines = _tagged_batch(number, batch, size)
                conn.request("POST", "/ingest", b"\n".join(lines))
                response = conn.getresponse()
                response.read()
                if response.status == 200:
                    acked[(number, batch)] = lines
                else:
                    failures.append(f"{number}/{batch}: {response.status}")
            conn.close()

        threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    assert failures == []
    assert len(acked) == clients * per_client
    rows = rows_of(tmp_path / "data" / "2014-05-04.csv")
    assert rows[0] == HEADER and HEADER not in rows[1:]
    body = rows[1:]
    assert len(body) == clients * per_client * size
    assert all(ROW.match(row) for row in body), "a torn or interleaved row"
    # each request's rows are contiguous and in order: one write per file per flush
    where: dict[bytes, list[int]] = {}
    for index, row in enumerate(body):
        where.setdefault(row.split(b",")[6], []).append(index)  # the package column holds the batch's tag
    for number, batch in acked:
        indexes = where[f'"p{number}-{batch}"'.encode()]
        assert indexes == list(range(indexes[0], indexes[0] + size))
    assert len(writers) == 2  # both processes appended to the one file


def test_keep_alive_clients_spread_over_both_workers(tmp_path: Path) -> None:
    """16 keep-alive connections, 5 requests each: every connection stays with one worker, and
    the connections are spread over both (one SO_REUSEPORT socket per worker)."""
    with Server(tmp_path / "data", processes=2) as server:
        per_connection = []
        for _ in range(16):
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            pids = set()
            for _ in range(5):
                conn.request("GET", "/healthz")
                response = conn.getresponse()
                pids.add(orjson.loads(response.read())["pid"])
                assert response.getheader("Connection", "").lower() != "close"
            per_connection.append(pids)
            conn.close()
    assert all(len(pids) == 1 for pids in per_connection)  # kept alive: one worker each
    assert len(set().union(*per_connection)) == 2


def test_healthz_turns_503_while_draining_and_the_request_in_flight_completes(tmp_path: Path) -> None:
    with Server(tmp_path / "data") as server:
        health = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        health.request("GET", "/healthz")
        first = health.getresponse()
        assert first.status == 200 and orjson.loads(first.read())["status"] == "ok"

        body = orjson.dumps(record()) + b"\n"
        upload = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        upload.sendall(b"POST /ingest HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:10])
        time.sleep(0.2)
        server.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        time.sleep(0.3)

        health.request("GET", "/healthz")
        draining = health.getresponse()
        assert draining.status == 503
        assert orjson.loads(draining.read())["status"] == "draining"

        upload.sendall(body[10:])
        answer = upload.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200"), answer
        upload.close()
        health.close()
        assert server.proc.wait(10) == 0  # type: ignore[union-attr]
    assert rows_of(tmp_path / "data" / "2014-05-04.csv")[1:] == [
        b'"2014-05-04","00:50:55",695181,"3.0.2","x86_64","linux-gnu","caret","6.0-24","MX",1\n'
    ]


def test_metrics_are_summed_over_all_workers(tmp_path: Path) -> None:
    with Server(tmp_path / "data", processes=2) as server:
        pids = set()
        for _ in range(30):
            response = server.ingest(orjson.dumps(record()) + b"\nnot json\n")
            assert response.status == 200
            pids.add(server.request("GET", "/healthz").json()["pid"])
        text = server.request("GET", "/metrics").body.decode()
    assert len(pids) == 2
    assert 'tiny_requests_total{handler="ingest",status="200"} 30.0' in text
    assert 'tiny_records_total{result="valid"} 30.0' in text
    assert 'tiny_records_total{result="invalid"} 30.0' in text
    assert "tiny_request_duration_seconds_bucket" in text
    assert "tiny_flush_duration_seconds_count" in text
    assert "tiny_received_bytes_total" in text

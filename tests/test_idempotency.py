"""Exactly-once batches: the Idempotency-Key contract of /ingest, across processes, restarts and kill -9.

The contract's answers in-process (tiny.testing.InProcessServer); what needs processes,
restarts or kill -9 with subprocess servers.

Every batch here is traceable: its rows carry unique ip_ids, so a day file shows whether
each batch is there exactly once, whole and in order.
"""

from __future__ import annotations

import http.client
import os
import random
import signal
import threading
import time
import zlib
from pathlib import Path

import orjson
import pytest

from tests.support import Server, assert_exactly_once, body_of, key, keyed_clients, rows_of
from tiny.testing import InProcessServer

pytestmark = pytest.mark.hardening("exactly once: no batch could be retried safely")


def test_the_same_key_and_body_again_replays_the_answer_and_writes_nothing(tmp_path: Path) -> None:
    with InProcessServer(tmp_path / "data") as server:
        first = server.ingest(body_of(1), key(1))
        again = server.ingest(body_of(1), key(1))
    assert first.status == again.status == 200
    assert "idempotent-replayed" not in first.headers and again.headers["idempotent-replayed"] == "true"
    assert again.body == first.body  # the stored answer: counts and errors
    assert_exactly_once(tmp_path / "data", {1: body_of(1)})
    rejects = next((tmp_path / "data" / "rejects").glob("*.ndjson")).read_bytes().splitlines()
    assert len(rejects) == 1


def test_the_same_key_with_another_body_gets_422_and_writes_nothing(tmp_path: Path) -> None:
    with InProcessServer(tmp_path / "data") as server:
        assert server.ingest(body_of(1), key(1)).status == 200
        other = server.ingest(body_of(2), key(1))
    assert other.status == 422 and other.json()["error"]["status"] == 422
    assert_exactly_once(tmp_path / "data", {1: body_of(1)})


def test_the_same_body_gzipped_is_the_same_body(tmp_path: Path) -> None:
    """The digest is of the decompressed body: a retry may compress it, or not."""
    import gzip

    with InProcessServer(tmp_path / "data") as server:
        assert server.ingest(body_of(1), key(1)).status == 200
        packed = server.ingest(gzip.compress(body_of(1)), {**key(1), "Content-Encoding": "gzip"})
    assert packed.status == 200 and packed.headers["idempotent-replayed"] == "true"


def test_a_malformed_key_is_refused_and_a_quoted_one_is_the_same_key(tmp_path: Path) -> None:
    """The key's syntax, over HTTP (each rule of it: tests/test_rules.py)."""
    with InProcessServer(tmp_path / "data") as server:
        assert server.ingest(body_of(1), {"Idempotency-Key": "with space"}).status == 400
        assert server.ingest(body_of(1), {"Idempotency-Key": "~" * 255}).status == 200
        assert server.ingest(body_of(2), {"Idempotency-Key": '"quoted"'}).status == 200
        again = server.ingest(body_of(2), {"Idempotency-Key": "quoted"})  # the same key, unquoted
    assert again.headers["idempotent-replayed"] == "true"


def test_a_503_stores_nothing_and_the_retry_is_processed_afresh(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "2014-05-04.csv").mkdir(parents=True)  # the disk refuses this day's file
    with InProcessServer(data) as server:
        assert server.ingest(body_of(1), key(1)).status == 503
        (data / "2014-05-04.csv").rmdir()
        retried = server.ingest(body_of(1), key(1))
    assert retried.status == 200 and "idempotent-replayed" not in retried.headers
    assert_exactly_once(data, {1: body_of(1)})


def test_a_restart_keeps_the_keys(tmp_path: Path) -> None:
    with Server(tmp_path / "data") as server:
        first = server.ingest(body_of(1), key(1))
    with Server(tmp_path / "data") as again:
        replayed = again.ingest(body_of(1), key(1))
    assert replayed.headers["idempotent-replayed"] == "true" and replayed.body == first.body
    assert_exactly_once(tmp_path / "data", {1: body_of(1)})


def test_a_retry_after_the_window_is_processed_as_new(tmp_path: Path) -> None:
    with InProcessServer(tmp_path / "data", "--idempotency-window", "1") as server:
        assert server.ingest(body_of(1), key(1)).status == 200
        time.sleep(1.5)
        late = server.ingest(body_of(1), key(1))
    assert late.status == 200 and "idempotent-replayed" not in late.headers
    assert len(rows_of(tmp_path / "data" / "2014-05-04.csv")) == 1 + 2 * 20  # written twice, as documented


def test_past_max_keys_the_oldest_keys_go_first(tmp_path: Path) -> None:
    """(A server of its own: its metrics are its process's.)"""
    with Server(tmp_path / "data", "--idempotency-max-keys", "256") as server:
        for batch in range(260):
            assert server.ingest(body_of(batch, size=1), key(batch)).status == 200
        newest = server.ingest(body_of(259, size=1), key(259))
        oldest = server.ingest(body_of(0, size=1), key(0))
        metrics = server.request("GET", "/metrics").body.decode()
    assert newest.headers.get("idempotent-replayed") == "true"
    assert "idempotent-replayed" not in oldest.headers  # forgotten: written again
    assert "tiny_idempotency_keys 256.0" in metrics or "tiny_idempotency_keys 257.0" in metrics


def test_metrics_count_replays_conflicts_and_keys(tmp_path: Path) -> None:
    """(A server of its own: its metrics are its process's.)"""
    with Server(tmp_path / "data") as server:
        server.ingest(body_of(1), key(1))
        server.ingest(body_of(1), key(1))
        server.ingest(body_of(2), key(1))
        text = server.request("GET", "/metrics").body.decode()
    assert "tiny_idempotent_replays_total 1.0" in text
    assert 'tiny_idempotency_conflicts_total{status="422"} 1.0' in text
    assert "tiny_idempotency_keys 1.0" in text


def test_two_processes_receiving_the_same_key_at_once_write_one_copy(tmp_path: Path) -> None:
    """20 keep-alive connections send the same keyed batch at the same moment; each first asks
    /healthz which worker it talks to, and both workers get some."""
    workers: set[int] = set()
    with Server(tmp_path / "data", processes=2) as server:
        for batch in range(5):
            barrier = threading.Barrier(20)
            answers: list[tuple[int, bool, bytes]] = []

            def send(
                batch: int = batch,
                barrier: threading.Barrier = barrier,
                answers: list[tuple[int, bool, bytes]] = answers,
            ) -> None:
                conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
                conn.request("GET", "/healthz")
                workers.add(orjson.loads(conn.getresponse().read())["pid"])
                barrier.wait()
                conn.request("POST", "/ingest", body_of(batch), key(batch))
                response = conn.getresponse()
                answers.append((response.status, response.getheader("Idempotent-Replayed") == "true", response.read()))
                conn.close()

            threads = [threading.Thread(target=send) for _ in range(20)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            assert [status for status, _, _ in answers] == [200] * 20
            assert sum(not replayed for _, replayed, _ in answers) == 1  # one wrote, 19 replayed its answer
            assert len({body for _, _, body in answers}) == 1
    assert len(workers) == 2
    assert_exactly_once(tmp_path / "data", {batch: body_of(batch) for batch in range(5)})


@pytest.mark.parametrize(
    "point, durability",
    [
        ("before-writes", "write"),
        ("between-writes", "write"),
        ("after-writes", "write"),
        ("after-commit", "write"),
        ("after-finish", "write"),
        ("between-writes", "fsync"),
        ("after-writes", "fsync"),
        ("after-commit", "fsync"),
    ],
)
def test_kill9_inside_the_flush_then_retries_leave_every_batch_exactly_once(
    tmp_path: Path, point: str, durability: str, figures: dict[str, object]
) -> None:
    """Workers SIGKILL themselves at a point of one flush in five (injected), under 4 clients
    that retry each batch, with its key, until it is acknowledged."""
    data = tmp_path / "data"
    enough = threading.Event()
    env = {"TINY_CRASH_AT": f"{point}:0.2", "TINY_DURABILITY": durability}
    with Server(data, processes=2, env=env) as server:
        threading.Timer(3.0, enough.set).start()
        attempts = keyed_clients(server.port, clients=4, enough=enough)
        crashes = server.log().count("crash test: killing this process")
    figures.update(
        case=f"kill -9 {point} (1 flush in 5) for 3 s, durability {durability}",
        batches=len(attempts),
        crashes=crashes,
        retries=sum(attempts.values()) - len(attempts),
    )
    assert crashes >= 2
    days = ("2014-05-04", "2014-05-05")
    assert_exactly_once(data, {batch: body_of(batch, days=days) for batch in attempts})


def test_kill9_of_workers_at_random_moments_leaves_every_batch_exactly_once(
    tmp_path: Path, figures: dict[str, object]
) -> None:
    data = tmp_path / "data"
    enough = threading.Event()
    kills = []
    with Server(data, processes=2) as server:

        def killer() -> None:
            while len(kills) < 6 and not enough.wait(random.uniform(0.3, 0.8)):
                pids = server.worker_pids()
                if pids:
                    victim = random.choice(sorted(pids))
                    try:
                        os.kill(victim, signal.SIGKILL)
                        kills.append(victim)
                    except ProcessLookupError:
                        pass
            enough.set()

        thread = threading.Thread(target=killer)
        thread.start()
        try:
            attempts = keyed_clients(server.port, clients=4, enough=enough)
        finally:
            enough.set()
            thread.join(5)
    figures.update(
        case="6 kill -9 of random workers, 0.3-0.8 s apart",
        batches=len(attempts),
        kills=len(kills),
        retries=sum(attempts.values()) - len(attempts),
    )
    assert len(kills) == 6 and len(attempts) > 50
    days = ("2014-05-04", "2014-05-05")
    assert_exactly_once(data, {batch: body_of(batch, days=days) for batch in attempts})


def test_the_rollback_journal_mode_keeps_the_contract(tmp_path: Path) -> None:
    """--journal-mode delete (for writers on several hosts): the same replay, across a restart."""
    with Server(tmp_path / "data", "--journal-mode", "delete") as server:
        first = server.ingest(body_of(1), key(1))
    assert not (tmp_path / "data" / ".tiny" / "journal.sqlite3-wal").exists()
    with Server(tmp_path / "data", "--journal-mode", "delete") as again:
        replayed = again.ingest(body_of(1), key(1))
    assert replayed.headers["idempotent-replayed"] == "true" and replayed.body == first.body
    assert_exactly_once(tmp_path / "data", {1: body_of(1)})


@pytest.mark.hardening("exactly once 1: one key with two bodies in one flush wrote one and claimed the other")
def test_one_key_sent_with_two_bodies_at_once_keeps_the_written_body_and_refuses_the_other(
    tmp_path: Path, figures: dict[str, object]
) -> None:
    """Pairs of requests, the same key and two bodies, sent at the same moment (often into one
    group commit): one body is written, and from then on that body is answered 200 (replayed)
    and the other 422, never the written body's retry refused with 422 and the unwritten one's
    answered 200 (the claim and the write each decided by a different body)."""
    pairs = 150
    with InProcessServer(tmp_path / "data") as server:
        for pair in range(pairs):
            bodies = [body_of(2 * pair, size=3), body_of(2 * pair + 1, size=3)]
            headers = {"Idempotency-Key": f"pair-{pair}"}
            barrier = threading.Barrier(2)
            first: dict[int, int] = {}

            def send(
                which: int,
                bodies: list[bytes] = bodies,
                headers: dict[str, str] = headers,
                barrier: threading.Barrier = barrier,
                first: dict[int, int] = first,
            ) -> None:
                conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
                barrier.wait()
                conn.request("POST", "/ingest", bodies[which], headers)
                response = conn.getresponse()
                response.read()
                first[which] = response.status
                conn.close()

            threads = [threading.Thread(target=send, args=(which,)) for which in (0, 1)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            assert sorted(first.values()) == [200, 422], first
            written = 0 if first[0] == 200 else 1
            retried = [server.ingest(bodies[which], headers) for which in (0, 1)]
            assert retried[written].status == 200 and retried[written].headers["idempotent-replayed"] == "true"
            assert retried[1 - written].status == 422
    on_disk = (tmp_path / "data" / "2014-05-04.csv").read_bytes()
    assert on_disk.count(b"\n") == 1 + 3 * pairs  # one body of each pair
    figures.update(case="one key, two bodies sent at once", pairs=pairs)


def test_a_key_header_sent_twice_is_refused(tmp_path: Path) -> None:
    """Tornado joins the two into "a,b"; nginx 1.22 passed the first only: 400 on both routes now."""
    with InProcessServer(tmp_path / "data") as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.putrequest("POST", "/ingest")
        conn.putheader("Idempotency-Key", "a")
        conn.putheader("Idempotency-Key", "b")
        conn.putheader("Content-Length", "0")
        conn.endheaders()
        response = conn.getresponse()
        body = response.read()
        conn.close()
    assert response.status == 400 and b"sent 2 times" in body


def _forge_crc32(body: bytes, at: int, target: int) -> bytes:
    """``body`` with its 4 bytes at ``at`` replaced so that its CRC-32 is ``target`` (CRC-32 is
    affine over GF(2): solve for the 32 bits)."""
    base = bytearray(body)
    base[at : at + 4] = b"\0\0\0\0"
    zero = zlib.crc32(base)
    columns = []
    for bit in range(32):
        probe = bytearray(base)
        probe[at + bit // 8] ^= 1 << (bit % 8)
        columns.append(zlib.crc32(probe) ^ zero)
    # Gaussian elimination: find x with XOR of columns[bit] for the set bits of x == target ^ zero
    rows = [(columns[bit], 1 << bit) for bit in range(32)]
    want, solution = target ^ zero, 0
    for pivot in range(32):
        index = next(i for i in range(pivot, 32) if rows[i][0] >> pivot & 1)
        rows[pivot], rows[index] = rows[index], rows[pivot]
        for i in range(32):
            if i != pivot and rows[i][0] >> pivot & 1:
                rows[i] = (rows[i][0] ^ rows[pivot][0], rows[i][1] ^ rows[pivot][1])
    for pivot in range(32):
        if want >> pivot & 1:
            solution ^= rows[pivot][1]
    base[at : at + 4] = solution.to_bytes(4, "little")
    assert zlib.crc32(base) == target
    return bytes(base)


@pytest.mark.hardening("exactly once 12: a second body with the same length and CRC-32 passed for the first")
def test_a_second_body_with_the_first_ones_length_and_crc32_is_not_taken_for_it(tmp_path: Path) -> None:
    """The old digest was the length and the CRC-32: trivial to forge, and the forged body got
    200 (replayed) and was never written. A keyed 128-bit BLAKE3 tells them apart."""
    first = body_of(1) + b"junk\n"
    second = _forge_crc32(body_of(2) + b"junk\n", len(body_of(2)), zlib.crc32(first))
    assert len(second) == len(first) and zlib.crc32(second) == zlib.crc32(first) and second != first
    with InProcessServer(tmp_path / "data") as server:
        assert server.ingest(first, key(1)).status == 200
        forged = server.ingest(second, key(1))
    assert forged.status == 422

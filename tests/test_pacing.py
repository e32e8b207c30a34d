"""Reads paced while ingest is busy (tiny.pacing): the pacer's arithmetic, then a real server
with an ingest request held in flight (its body half sent) and reads over HTTP."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support import Server, record
from tiny.pacing import Paced, ReadPacer


def test_reads_are_not_paced_while_no_ingest_is_in_flight() -> None:
    pacer = ReadPacer(1.0, lambda: False, max_wait=10)
    assert [pacer.reserve() for _ in range(50)] == [0.0] * 50


def test_a_rate_of_zero_never_paces() -> None:
    pacer = ReadPacer(0, lambda: True, max_wait=10)
    assert [pacer.reserve() for _ in range(50)] == [0.0] * 50


def test_busy_reads_start_one_interval_apart() -> None:
    pacer = ReadPacer(10.0, lambda: True, max_wait=10)
    waits = [pacer.reserve() for _ in range(4)]
    assert waits[0] == 0.0
    assert [round(b - a, 2) for a, b in zip(waits, waits[1:], strict=False)] == [0.1, 0.1, 0.1]


def test_a_read_past_the_longest_wait_is_refused_without_taking_a_turn() -> None:
    pacer = ReadPacer(1.0, lambda: True, max_wait=2.5)
    assert [round(pacer.reserve()) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(Paced) as refused:
        pacer.reserve()
    assert 2.5 < refused.value.wait <= 3.0
    with pytest.raises(Paced):
        pacer.reserve()  # still 3 s away: the refusal took no turn


def test_turns_left_unused_do_not_pile_up_as_a_burst() -> None:
    pacer = ReadPacer(20.0, lambda: True, max_wait=10)
    pacer.reserve()
    time.sleep(0.3)  # six turns' worth of time without a read
    assert pacer.reserve() == 0.0
    assert pacer.reserve() > 0.04  # the next one waits its interval again


@contextmanager
def ingest_in_flight(server: Server) -> Iterator[None]:
    """A POST /ingest whose body is half sent: in flight until the block ends."""
    line = json.dumps(record()).encode() + b"\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /ingest HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\n")
        sock.sendall(b"Content-Length: %d\r\n\r\n" % (2 * len(line)) + line)
        time.sleep(0.3)  # the worker has the headers: the request is in flight
        yield


def _timed_get(server: Server, path: str) -> tuple[int, float, dict[str, str], bytes]:
    started = time.monotonic()
    response = server.request("GET", path, timeout=30)
    return response.status, time.monotonic() - started, response.headers, response.body


def test_reads_wait_their_turn_while_an_ingest_request_is_in_flight(tmp_path: Path) -> None:
    with Server(tmp_path / "data", "--read-rate", "4") as running:
        assert running.ingest(json.dumps(record()).encode()).status == 200
        assert running.request("GET", "/downloads/total/last-day").status == 200  # the answer is kept
        with ingest_in_flight(running), ThreadPoolExecutor(4) as pool:
            reads = list(pool.map(lambda _: _timed_get(running, "/downloads/total/last-day"), range(4)))
            health = _timed_get(running, "/healthz")
        assert [status for status, *_ in reads] == [200] * 4
        seconds = sorted(took for _, took, *_ in reads)
        assert seconds[0] < 0.2 and seconds[-1] >= 0.7, seconds  # four turns 0.25 s apart
        assert health[0] == 200 and health[1] < 0.2  # not a read: never paced
        metrics = running.request("GET", "/metrics").body.decode()
        assert 'tiny_paced_reads_total{outcome="waited"} 3.0' in metrics
        # The ingest request gone, reads are not paced.
        after = [_timed_get(running, "/downloads/total/last-day")[1] for _ in range(6)]
        assert max(after) < 0.2


def test_a_read_whose_turn_is_too_far_gets_a_503_that_says_so(tmp_path: Path) -> None:
    with Server(tmp_path / "data", "--read-rate", "0.05") as running, ingest_in_flight(running):
        first = _timed_get(running, "/api/days")
        status, took, headers, body = _timed_get(running, "/api/days")
    assert first[0] == 200
    assert status == 503 and took < 1.0
    assert "paced while ingest is busy" in json.loads(body)["error"]["message"]
    assert int(headers["retry-after"]) >= 1


def test_pacing_is_a_flag_and_an_environment_variable(tmp_path: Path) -> None:
    from tiny import config

    assert config.parse([], {}).read_rate == 2.0
    assert config.parse(["--read-rate", "0"], {}).read_rate == 0.0
    assert config.parse([], {"TINY_READ_RATE": "7.5"}).read_rate == 7.5
    with pytest.raises(SystemExit):
        config.parse(["--read-rate", "-1"], {})

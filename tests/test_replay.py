"""tiny.replay: the CRAN CSV posted to a real server comes back as the same day file."""

from __future__ import annotations

import fcntl
import gzip
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support import ROOT, SAMPLE_DAY, Server, free_port, rows_of, sample_csv
from tiny.replay import Options, Summary, batches, replay, retry_after


def _url(server: Server) -> str:
    return f"http://127.0.0.1:{server.port}/ingest"


def _small_day(path: Path, records: int) -> Path:
    """A plain .csv with the header and the first ``records`` rows of the sample day."""
    path.write_bytes(b"".join(sample_csv().splitlines(keepends=True)[: records + 1]))
    return path


def _ingest_503s(server: Server) -> int:
    text = server.request("GET", "/metrics").body.decode()
    match = re.search(r'^tiny_requests_total\{handler="ingest",status="503"\} (\S+)$', text, re.MULTILINE)
    return int(float(match.group(1))) if match else 0


def test_sample_day_replayed_in_order_is_the_public_file_byte_for_byte(tmp_path: Path) -> None:
    with Server(tmp_path / "data") as server:
        summary = replay(Options(SAMPLE_DAY, _url(server), batch=1600, concurrency=1))
    assert (summary.records, summary.valid, summary.invalid, summary.failures) == (77107, 77107, 0, 0)
    assert summary.batches == 49 and summary.retries == 0
    assert (tmp_path / "data" / "2014-05-04.csv").read_bytes() == sample_csv()


def test_concurrent_gzip_replay_stores_the_same_rows(tmp_path: Path) -> None:
    with Server(tmp_path / "data", processes=2) as server:
        summary = replay(Options(SAMPLE_DAY, _url(server), batch=1000, concurrency=4, gzip=True))
    assert (summary.records, summary.failures, summary.batches) == (77107, 0, 78)
    header, *rows = rows_of(tmp_path / "data" / "2014-05-04.csv")
    expected_header, *expected_rows = sample_csv().splitlines(keepends=True)
    assert header == expected_header
    assert sorted(rows) == sorted(expected_rows)


def test_503_is_retried_after_retry_after(tmp_path: Path) -> None:
    """A held flock stalls the first batch's write; with --max-backlog 1 the next gets 503."""
    data = tmp_path / "data"
    data.mkdir()
    day = data / "2014-05-04.csv"
    source = _small_day(tmp_path / "small.csv", 6)
    results: list[Summary] = []
    with Server(data, "--max-backlog", "1") as server, open(day, "ab") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)  # another writer holds the day file: the sink waits
        client = threading.Thread(
            target=lambda: results.append(replay(Options(source, _url(server), batch=1, concurrency=2, timeout=20)))
        )
        client.start()
        deadline = time.monotonic() + 5
        while _ingest_503s(server) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _ingest_503s(server) >= 1
        fcntl.flock(holder, fcntl.LOCK_UN)
        client.join(15)
    assert not client.is_alive()
    (summary,) = results
    assert summary.failures == 0 and summary.records == 6 and summary.retries_503 >= 1
    assert sorted(rows_of(day)[1:]) == sorted(sample_csv().splitlines(keepends=True)[1:7])


def test_a_refused_batch_fails_the_replay_with_exit_status_1(tmp_path: Path) -> None:
    source = _small_day(tmp_path / "small.csv", 3)
    with Server(tmp_path / "data", "--token", "s3cret") as server:
        command = [
            sys.executable,
            "-m",
            "tiny.replay",
            str(source),
            "--url",
            _url(server),
            "--batch",
            "2",
            "--concurrency",
            "1",
            "--no-progress",
        ]
        refused = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=30)
        accepted = subprocess.run([*command, "--token", "s3cret"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert refused.returncode == 1, refused.stderr
    assert "2 failed" in refused.stdout and "HTTP 401" in refused.stdout
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert "records sent   3 (3 valid, 0 invalid)" in accepted.stdout


def test_connection_errors_are_retried_a_bounded_number_of_times(tmp_path: Path) -> None:
    port = free_port()  # nothing listens on it
    source = _small_day(tmp_path / "small.csv", 1)
    started = time.monotonic()
    summary = replay(Options(source, f"http://127.0.0.1:{port}/ingest", concurrency=1, retries=2))
    assert (summary.failures, summary.retries, summary.records) == (1, 2, 0)
    assert "no answer after 3 attempts" in summary.errors[0]
    assert time.monotonic() - started < 5


def test_batches_and_retry_after() -> None:
    assert [count for count, _ in batches([b"a\n"] * 5, 2)] == [2, 2, 1]
    assert retry_after("3") == 3 and retry_after(None) == 1 and retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 1
    assert retry_after("100000") == 60 and retry_after("-5") == 0
    with pytest.raises(ValueError):
        next(batches([], 0))


def test_gzip_file_and_plain_file_give_the_same_batches(tmp_path: Path) -> None:
    plain = _small_day(tmp_path / "day.csv", 50)
    packed = tmp_path / "day.csv.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    from tiny.cranlog import ndjson_lines

    assert list(ndjson_lines(plain)) == list(ndjson_lines(packed))

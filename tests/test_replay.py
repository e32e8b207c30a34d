"""tiny.replay: the CRAN CSV posted to a real server comes back as the same day file."""

from __future__ import annotations

import fcntl
import gzip
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support import ROOT, SAMPLE_DAY, Server, free_port, rows_of, sample_csv
from tiny.layout import lock_path
from tiny.replay import Options, Summary, replay, retry_after
from tiny.replay_batches import numbered_batches


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
    """A held flush lock stalls the first batch's write; with --max-backlog 1 the next gets 503."""
    data = tmp_path / "data"
    data.mkdir()
    day = data / "2014-05-04.csv"
    lock_path(data).parent.mkdir()
    source = _small_day(tmp_path / "small.csv", 6)
    results: list[Summary] = []
    with Server(data, "--max-backlog", "1") as server, open(lock_path(data), "ab") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)  # another writer's flush holds the data dir: the sink waits
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
    numbered = [(n, b"a\n") for n in range(2, 7)]
    assert [(b.first_line, b.last_line, b.records) for b in numbered_batches(numbered, 2)] == [
        (2, 3, 2),
        (4, 5, 2),
        (6, 6, 1),
    ]
    assert retry_after("3") == 3 and retry_after(None) == 1 and retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 1
    assert retry_after("100000") == 60 and retry_after("-5") == 0
    with pytest.raises(ValueError):
        next(numbered_batches([], 0))


@pytest.mark.hardening("exactly once 8: the same day replayed from .csv.gz and from .csv was written twice")
def test_the_same_rows_replayed_from_any_encoding_of_the_file_are_written_once(tmp_path: Path) -> None:
    """The keys come from the records, not from the file's bytes: the gunzipped file and a copy
    with CRLF line ends replay as the .csv.gz did (keys from the bytes wrote 35,200 rows twice)."""
    plain = _small_day(tmp_path / "2014-05-04.csv", 3000)
    packed = tmp_path / "packed" / "2014-05-04.csv.gz"
    packed.parent.mkdir()
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    crlf = tmp_path / "crlf" / "2014-05-04.csv"
    crlf.parent.mkdir()
    crlf.write_bytes(plain.read_bytes().replace(b"\n", b"\r\n"))
    with Server(tmp_path / "data") as server:
        runs = [replay(Options(path, _url(server), batch=400, concurrency=2)) for path in (packed, plain, crlf)]
    assert [run.failures for run in runs] == [0, 0, 0]
    assert runs[0].replayed == 0 and runs[1].replayed == runs[2].replayed == runs[0].batches == 8
    assert sorted(rows_of(tmp_path / "data" / "2014-05-04.csv")) == sorted(plain.read_bytes().splitlines(keepends=True))


class _Hostile:
    """A real HTTP server on 127.0.0.1 whose answers to POST /ingest come from a script:
    ``(status, headers, body)`` per request, the last one repeated."""

    def __init__(self, script: list[tuple[int, dict[str, str], bytes]]) -> None:
        import http.server

        answers = list(script)
        self.requests = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests += 1
                status, headers, body = answers.pop(0) if len(answers) > 1 else answers[0]
                self.send_response(status)
                for name, value in {"Content-Length": str(len(body)), **headers}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/ingest"

    def __enter__(self) -> _Hostile:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _answer(valid: int, invalid: int = 0) -> bytes:
    return json.dumps({"result": {"status": "ok", "stats": {"records": {"valid": valid, "invalid": invalid}}}}).encode()


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tiny.replay", *args, "--no-progress"]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.mark.hardening("around 4: the replay client reported success when rows were not stored")
@pytest.mark.parametrize("concurrency", ["1", "3"])
def test_a_200_that_is_no_ingest_answer_fails_its_batch_and_the_run(tmp_path: Path, concurrency: str) -> None:
    """An HTML page with 200 (a proxy's, say) stored nothing: counted as failed, exit 1, no hang."""
    source = _small_day(tmp_path / "small.csv", 4)
    html = (200, {"Content-Type": "text/html"}, b"<html>maintenance</html>")
    with _Hostile([html]) as hostile:
        done = _run_cli(str(source), "--url", hostile.url, "--batch", "2", "--concurrency", concurrency)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "0 acknowledged, 2 failed (4 records not stored)" in done.stdout
    assert "HTTP 200 without an ingest answer" in done.stdout


@pytest.mark.hardening("around 4: the replay client reported success when rows were not stored")
def test_a_200_counting_other_records_than_sent_is_no_acknowledgement(tmp_path: Path) -> None:
    source = _small_day(tmp_path / "small.csv", 2)
    with _Hostile([(200, {}, _answer(1))]) as hostile:
        summary = replay(Options(source, hostile.url, batch=2, concurrency=1, retries=0))
    assert (summary.failures, summary.batches, summary.records) == (1, 0, 0)


@pytest.mark.hardening("around 4: the replay client reported success when rows were not stored")
@pytest.mark.parametrize("after", ["nan", "inf", "-inf", "1e999", "soon"])
def test_a_retry_after_that_is_no_number_of_seconds_is_waited_as_one(tmp_path: Path, after: str) -> None:
    source = _small_day(tmp_path / "small.csv", 2)
    script = [(503, {"Retry-After": after}, b"{}"), (200, {}, _answer(2))]
    with _Hostile(script) as hostile:
        started = time.monotonic()
        summary = replay(Options(source, hostile.url, batch=2, concurrency=1))
    assert (summary.failures, summary.batches, summary.records, summary.retries_503) == (0, 1, 2, 1)
    assert time.monotonic() - started < 5


@pytest.mark.hardening("around 4: the replay client reported success when rows were not stored")
def test_a_malformed_row_stops_the_run_at_its_line_and_says_how_to_resume(tmp_path: Path) -> None:
    rows = sample_csv().splitlines(keepends=True)[:9]
    source = tmp_path / "broken.csv"
    source.write_bytes(b"".join(rows[:4]) + b'"2014-05-04","oops\n' + b"".join(rows[4:]))  # line 5 is no row
    with Server(tmp_path / "data") as server:
        stopped = _run_cli(str(source), "--url", _url(server), "--batch", "2", "--concurrency", "1")
        resumed = _run_cli(
            str(source), "--url", _url(server), "--batch", "2", "--concurrency", "1", "--start-line", "6"
        )
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    assert "line 5: not a CRAN log row" in stopped.stdout and "resume with --start-line 5" in stopped.stdout
    assert "records sent   3 " in stopped.stdout  # lines 2-4: the batch before the row went out whole
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert (tmp_path / "data" / "2014-05-04.csv").read_bytes() == b"".join(rows)


@pytest.mark.hardening("careless operator: a CSV without its header lost its first row unsaid")
def test_a_file_whose_first_line_is_not_the_header_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    rows = sample_csv().splitlines(keepends=True)[1:6]
    source = tmp_path / "headless.csv"
    source.write_bytes(b"".join(rows))
    with Server(tmp_path / "data") as server:
        done = _run_cli(str(source), "--url", _url(server), "--batch", "2", "--concurrency", "1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "line 1: not the CRAN log header" in done.stdout and "records sent   0 " in done.stdout, done.stdout
    assert not (tmp_path / "data" / "2014-05-04.csv").exists()


def test_a_header_with_crlf_without_quotes_or_after_a_byte_order_mark_is_a_header(tmp_path: Path) -> None:
    from tiny.replay_batches import file_lines

    header, *rows = sample_csv().splitlines(keepends=True)[:3]
    for first in (header.replace(b"\n", b"\r\n"), header.replace(b'"', b""), b"\xef\xbb\xbf" + header):
        source = tmp_path / "day.csv"
        source.write_bytes(first + b"".join(rows))
        assert [number for number, _ in file_lines(source)] == [2, 3]


@pytest.mark.hardening("exactly once: no batch could be retried safely")
def test_the_same_day_replayed_twice_leaves_one_copy(tmp_path: Path) -> None:
    """Each batch's key comes from the file and its lines: the second run writes nothing."""
    with Server(tmp_path / "data", processes=2) as server:
        first = replay(Options(SAMPLE_DAY, _url(server), batch=1000, concurrency=4))
        second = replay(Options(SAMPLE_DAY, _url(server), batch=1000, concurrency=4, gzip=True))
    assert (first.failures, first.replayed, second.failures, second.replayed) == (0, 0, 0, 78)
    header, *rows = rows_of(tmp_path / "data" / "2014-05-04.csv")
    assert sorted(rows) == sorted(sample_csv().splitlines(keepends=True)[1:])

"""The HTTP contract of /ingest, /healthz, /metrics: statuses, bodies, headers, files.

In-process (tiny.testing.InProcessServer: the app built from its dependencies, real sockets
and files, no subprocess), one server per module where the flags allow it, its own where not;
a subprocess server only where the process is the point (its memory, its log, its argv).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import gzip
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support import Server, record, rows_of, wait_for
from tiny.layout import lock_path
from tiny.testing import InProcessServer, memory, raw_exchange

LIMIT = 64 * 1024
TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    with InProcessServer(tmp_path_factory.mktemp("http") / "data", "--max-body", str(LIMIT)) as running:
        yield running


@pytest.fixture(scope="module")
def general(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    """A server without the fast head parser (--lean false): Tornado's parser reads every head."""
    with InProcessServer(tmp_path_factory.mktemp("general") / "data", "--lean", "false") as running:
        yield running


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    with InProcessServer(tmp_path_factory.mktemp("auth") / "data", env={"TINY_TOKEN": TOKEN}) as running:
        yield running


def line(**fields: object) -> bytes:
    return orjson.dumps(record(**fields)) + b"\n"


def line_row(ip_id: int) -> bytes:
    return b'"2014-05-04","00:50:55",695181,"3.0.2","x86_64","linux-gnu","caret","6.0-24","MX",%d\n' % ip_id


def error(response: object) -> tuple[int, str]:
    body = response.json()  # type: ignore[attr-defined]
    assert set(body) == {"error"} and set(body["error"]) == {"status", "message"}
    assert body["error"]["status"] == response.status  # type: ignore[attr-defined]
    return body["error"]["status"], body["error"]["message"]


def test_ok_answer_counts_records_and_lists_the_first_ten_errors(server: InProcessServer) -> None:
    body = line() + b"".join(b"bad %d\n" % i for i in range(12)) + b"\n"
    response = server.ingest(body)
    assert response.status == 200
    assert response.headers["content-type"] == "application/json; charset=utf-8"
    answer = response.json()
    assert answer["result"] == {
        "status": "ok",
        "stats": {"bytes": len(body), "records": {"valid": 1, "invalid": 12, "total": 13}},
    }
    assert answer["errors"] == [{"line": n, "error": "invalid JSON"} for n in range(2, 12)]


def test_every_rejected_line_is_in_the_rejects_file(tmp_path: Path) -> None:
    with InProcessServer(tmp_path / "data") as server:
        body = line() + b"bad one\n" + b'{"date": "\xff\xfe"}\r\n' + line(size=-5)
        assert server.ingest(body).status == 200
    files = list((tmp_path / "data" / "rejects").glob("*.ndjson"))
    assert [f.name for f in files] == [time.strftime("%Y-%m-%d.ndjson", time.gmtime())]
    entries = [orjson.loads(x) for x in files[0].read_bytes().splitlines()]
    assert [(e["line"], e["reason"]) for e in entries] == [
        (2, "invalid JSON"),
        (3, "invalid UTF-8"),
        (4, "size: less than 0"),
    ]
    assert entries[0]["raw"] == "bad one"
    assert entries[1]["raw"] == '{"date": "\\xff\\xfe"}' and entries[1]["raw_base64"] == "eyJkYXRlIjogIv/+In0="
    assert all(e["received"].endswith("Z") for e in entries)
    assert len(rows_of(tmp_path / "data" / "2014-05-04.csv")) == 2  # header + the valid row


def test_empty_body_is_an_empty_ok(server: InProcessServer) -> None:
    response = server.ingest(b"")
    assert response.status == 200 and response.json()["result"]["stats"]["records"]["total"] == 0


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "application/x-ndjson",
        "application/jsonl",
        "application/json; charset=utf-8",
        "text/plain",
        "application/x-www-form-urlencoded",
    ],
)
def test_ndjson_like_content_types_are_accepted(server: InProcessServer, content_type: str | None) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    assert server.ingest(line(), headers).status == 200


def test_other_content_types_get_415(server: InProcessServer) -> None:
    response = server.ingest(line(), {"Content-Type": "multipart/form-data; boundary=x"})
    assert error(response)[0] == 415


def test_unsupported_content_encoding_gets_415(server: InProcessServer) -> None:
    response = server.ingest(line(), {"Content-Encoding": "br"})
    assert error(response)[0] == 415


def test_corrupt_gzip_gets_400(server: InProcessServer) -> None:
    response = server.ingest(b"\x1f\x8b\x08\x00garbage", {"Content-Encoding": "gzip"})
    assert error(response)[0] == 400


def test_truncated_gzip_gets_400(server: InProcessServer) -> None:
    response = server.ingest(gzip.compress(line() * 50)[:-12], {"Content-Encoding": "gzip"})
    assert error(response)[0] == 400


def test_gzip_bomb_gets_413(server: InProcessServer) -> None:
    bomb = gzip.compress(b"\n" * (LIMIT * 200))  # about 50 KB that inflates to 12.5 MB
    assert len(bomb) < LIMIT
    response = server.ingest(bomb, {"Content-Encoding": "gzip"})
    assert error(response)[0] == 413


def test_multi_member_gzip_is_read_whole(server: InProcessServer) -> None:
    body = gzip.compress(line(ip_id=7)) + gzip.compress(line(ip_id=8))
    response = server.ingest(body, {"Content-Encoding": "gzip"})
    assert response.json()["result"]["stats"]["records"]["valid"] == 2


def test_body_over_the_limit_gets_413(server: InProcessServer) -> None:
    response = server.ingest(line() * (LIMIT // len(line()) + 1))
    assert error(response)[0] == 413


def test_declared_content_length_over_the_limit_is_refused_before_the_body_is_sent(server: InProcessServer) -> None:
    head = b"POST /ingest HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (LIMIT + 1)
    answer = raw_exchange(server.port, head)  # no body byte sent at all
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b'"status":413' in answer


def test_chunked_body_over_the_limit_gets_413(server: InProcessServer) -> None:
    chunk = b"x" * 8192
    head = b"POST /ingest HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(LIMIT // len(chunk) + 2)) + b"0\r\n\r\n"
    answer = raw_exchange(server.port, head + body)
    assert answer.startswith(b"HTTP/1.1 413 ") and b'"status":413' in answer


def test_chunked_body_under_the_limit_is_accepted(server: InProcessServer) -> None:
    data = line() * 3
    head = b"POST /ingest HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    answer = raw_exchange(server.port, head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
    assert answer.startswith(b"HTTP/1.1 200 ") and b'"valid":3' in answer


@pytest.mark.parametrize(
    "framing",
    [
        b"Content-Length: ten",
        b"Content-Length: -1",
        b"Content-Length: +59",
        b"Content-Length: 5_9",
        b"Content-Length: 59\r\nContent-Length: 59",
        b"Content-Length: 59\r\nTransfer-Encoding: chunked",
        b"Transfer-Encoding: identity",
        b"Transfer-Encoding: gzip, chunked",
    ],
)
def test_framing_that_tornado_would_refuse_bare_gets_one_json_400_and_a_close(
    server: InProcessServer, framing: bytes
) -> None:
    """Tornado refuses these lengths and transfer codings with a bare 400; the rules refuse them
    first, in JSON, and the connection is closed without a second answer."""
    body = line()
    head = b"POST /ingest HTTP/1.1\r\nHost: x\r\n%s\r\n\r\n" % framing
    answer = raw_exchange(server.port, head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
    assert answer.startswith(b"HTTP/1.1 400 ") and answer.count(b"HTTP/1.1 ") == 1, answer
    status, message = orjson.loads(answer.split(b"\r\n\r\n", 1)[1])["error"].values()
    assert status == 400 and ("Content-Length" in message or "Transfer-Encoding" in message)


def test_a_content_length_of_thousands_of_digits_gets_413_not_a_crash(server: InProcessServer) -> None:
    answer = raw_exchange(
        server.port, b"POST /ingest HTTP/1.1\r\nHost: x\r\nContent-Length: %s\r\n\r\n" % (b"9" * 5000)
    )
    assert answer.startswith(b"HTTP/1.1 413 ") and b'"status":413' in answer and b"(5000 digits)" in answer


def test_a_content_length_padded_with_thousands_of_zeros_gets_a_json_400(server: InProcessServer) -> None:
    body = line()
    head = b"POST /ingest HTTP/1.1\r\nHost: x\r\nContent-Length: %s%d\r\n\r\n" % (b"0" * 5000, len(body))
    answer = raw_exchange(server.port, head + body)
    assert answer.startswith(b"HTTP/1.1 400 ") and b"digits; send at most 20" in answer, answer


def test_get_on_ingest_gets_405_with_allow(server: InProcessServer) -> None:
    response = server.request("GET", "/ingest")
    assert error(response)[0] == 405 and response.headers["allow"] == "POST"


def test_unknown_path_gets_json_404(server: InProcessServer) -> None:
    assert error(server.request("GET", "/nope"))[0] == 404


def test_healthz_names_the_instance(server: InProcessServer) -> None:
    answer = server.request("GET", "/healthz").json()
    assert answer["status"] == "ok"
    assert answer["instance"] == f"{socket.gethostname()}:{server.port}/{answer['pid']}"
    assert answer["codec"] in ("python", "rust")


def test_metrics_are_prometheus_text(server: InProcessServer) -> None:
    response = server.request("GET", "/metrics")
    assert response.status == 200 and response.headers["content-type"].startswith("text/plain")
    assert b"# TYPE tiny_requests_total counter" in response.body


def test_missing_token_gets_401(locked: InProcessServer) -> None:
    response = locked.ingest(line())
    assert error(response)[0] == 401 and response.headers["www-authenticate"].startswith("Bearer")


def test_wrong_token_gets_401(locked: InProcessServer) -> None:
    assert error(locked.ingest(line(), {"Authorization": "Bearer nope"}))[0] == 401


def test_right_token_is_accepted(locked: InProcessServer) -> None:
    assert locked.ingest(line(), {"Authorization": f"Bearer {TOKEN}"}).status == 200


def test_healthz_needs_no_token(locked: InProcessServer) -> None:
    assert locked.request("GET", "/healthz").status == 200


def test_disk_refusing_the_write_gets_503_and_keeps_nothing_of_the_request(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "2014-05-05.csv").mkdir(parents=True)  # open() of this "file" fails: EISDIR
    with InProcessServer(data) as server:
        response = server.ingest(line() + line(date="2014-05-05"))
        status, message = error(response)
        assert status == 503 and "nothing of this request was kept" in message
        assert response.headers["retry-after"].isdigit()
        assert not (data / "2014-05-04.csv").exists()  # rolled back: the file the flush created is gone
        assert server.ingest(line()).status == 200  # the server keeps serving other days
        assert len(rows_of(data / "2014-05-04.csv")) == 2


def test_full_backlog_gets_503_with_retry_after(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    day = data / "2014-05-04.csv"
    lock_path(data).parent.mkdir()
    with InProcessServer(data, "--max-backlog", "1") as server, open(lock_path(data), "ab") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)  # another writer's flush holds the data dir: the sink waits
        first: list[int] = []
        stalled = threading.Thread(target=lambda: first.append(server.ingest(line()).status))
        stalled.start()
        time.sleep(0.5)
        assert first == []  # not acknowledged while not written
        response = server.ingest(line(ip_id=2))
        assert error(response)[0] == 503 and response.headers["retry-after"] == "1"
        fcntl.flock(holder, fcntl.LOCK_UN)
        stalled.join(10)
        assert first == [200]
    assert rows_of(day)[1:] == [line_row(1)]


def test_durability_fsync_acks_written_rows(tmp_path: Path) -> None:
    with InProcessServer(tmp_path / "data", "--durability", "fsync") as server:
        assert server.ingest(line()).status == 200
        assert server.request("GET", "/healthz").json()["durability"] == "fsync"
    assert len(rows_of(tmp_path / "data" / "2014-05-04.csv")) == 2


def test_limits_come_from_the_environment(tmp_path: Path) -> None:
    with InProcessServer(tmp_path / "data", env={"TINY_MAX_BODY": "100"}) as server:
        assert error(server.ingest(b"x" * 101))[0] == 413
        assert server.ingest(line()[:100]).status == 200


def test_huge_headers_get_431(server: InProcessServer) -> None:
    response = server.request("POST", "/ingest", line(), {"X-Big": "a" * 70_000})
    assert error(response)[0] == 431


def test_too_many_headers_get_431(server: InProcessServer) -> None:
    headers = {f"X-H{i}": "v" for i in range(150)}
    assert error(server.request("GET", "/healthz", headers=headers))[0] == 431


def test_headers_past_the_read_limit_close_the_connection_unanswered(server: InProcessServer) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1024 * 1024 + 10) + b"\r\n\r\n"
    assert raw_exchange(server.port, head) == b""


def test_a_big_gzip_body_is_decoded_off_the_loop_with_the_same_answer(tmp_path: Path) -> None:
    body = line() * 20_000  # ~3.5 MB: past the inline limit
    with InProcessServer(tmp_path / "data") as server:
        plain = server.ingest(body).json()
        packed = server.ingest(gzip.compress(body), {"Content-Encoding": "gzip"}).json()
    assert (
        plain["result"]["stats"]["records"]
        == packed["result"]["stats"]["records"]
        == {"valid": 20_000, "invalid": 0, "total": 20_000}
    )


@pytest.mark.hardening("ingest 1: a 1 KB request took gigabytes of memory and disk")
def test_a_kilobyte_of_gzip_cannot_buy_gigabytes_of_memory_or_disk(tmp_path: Path, figures: dict[str, Any]) -> None:
    """A 1 KB gzip body of 500,000 invalid lines: bounded memory, bounded rejects, exact counts."""
    body = gzip.compress(b"x\n" * 500_000, 9)
    with Server(tmp_path / "data") as server:
        worker = server.worker_pid()
        before = memory(worker, "VmHWM")
        answer = server.ingest(body, {"Content-Encoding": "gzip"}).json()
        grown = memory(worker, "VmHWM") - before
    kept = [orjson.loads(x) for x in next((tmp_path / "data" / "rejects").glob("*.ndjson")).read_bytes().splitlines()]
    figures.update(
        case="a 1 KB gzip body of 500,000 invalid lines",
        body_bytes=len(body),
        peak_rss_growth_mb=round(grown / 1e6, 1),
        rejects_file_kb=round(sum(len(orjson.dumps(k)) + 1 for k in kept) / 1e3, 1),
    )
    assert answer["result"]["stats"]["records"] == {"valid": 0, "invalid": 500_000, "total": 500_000}
    assert len(answer["errors"]) == 10
    assert len(kept) == 1001 and kept[999]["line"] == 1000
    assert (kept[1000]["line"], kept[1000]["last_line"], kept[1000]["omitted"]) == (1001, 500_000, 499_000)
    assert grown < 100 * 1024**2, f"the worker grew by {grown / 1e6:.0f} MB for 1 MB of decompressed body"


@pytest.mark.hardening("ingest 3: gzip bodies of many members decoded in quadratic time")
def test_many_small_gzip_members_decode_in_linear_time_and_count_like_one(tmp_path: Path) -> None:
    """200,000 members (about 5 MB, quadratic before: minutes) decode at once; records counted alike."""
    empty = gzip.compress(b"") * 200_000
    records = b"".join(gzip.compress(line(ip_id=n + 1)) for n in range(20_000))
    one = gzip.compress(b"".join(line(ip_id=n + 1) for n in range(20_000)))
    with InProcessServer(tmp_path / "data") as server:
        started = time.monotonic()
        assert server.ingest(empty, {"Content-Encoding": "gzip"}).json()["result"]["stats"]["records"]["total"] == 0
        took = time.monotonic() - started
        many = server.ingest(records, {"Content-Encoding": "gzip"}).json()["result"]["stats"]["records"]
        single = server.ingest(one, {"Content-Encoding": "gzip"}).json()["result"]["stats"]["records"]
    assert many == single == {"valid": 20_000, "invalid": 0, "total": 20_000}
    assert took < 5, f"{len(empty) / 1e6:.1f} MB of empty members took {took:.1f} s"


@pytest.mark.hardening("ingest 3: gzip bodies of many members decoded in quadratic time")
def test_a_gzip_body_of_too_many_members_gets_a_json_413(tmp_path: Path) -> None:
    from tiny.limits import MAX_GZIP_MEMBERS

    with InProcessServer(tmp_path / "data") as server:
        response = server.ingest(gzip.compress(b"") * (MAX_GZIP_MEMBERS + 1), {"Content-Encoding": "gzip"})
    assert error(response) == (413, f"gzip body has more than {MAX_GZIP_MEMBERS} members")


@pytest.mark.hardening("ingest 8: the auth scheme was case-sensitive")
def test_the_bearer_scheme_is_case_insensitive(locked: InProcessServer) -> None:
    for scheme in ("bearer", "BEARER", "Bearer", "bEaReR"):
        assert locked.ingest(line(), {"Authorization": f"{scheme} {TOKEN}"}).status == 200, scheme
    assert error(locked.ingest(line(), {"Authorization": f"Basic {TOKEN}"}))[0] == 401
    assert error(locked.ingest(line(), {"Authorization": f"Bearer {TOKEN.upper()}"}))[0] == 401


@pytest.mark.hardening("ingest 2: an early refusal left nginx a connection the app was closing")
@pytest.mark.parametrize(
    "head",
    [
        b"POST /ingest HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\nContent-Length: 5\r\n\r\n",  # 401
        b"GET /ingest HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret-token\r\n\r\n",  # 405
        b"POST /ingest HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret-token\r\nContent-Length: 5\r\n"
        b"Content-Type: text/html\r\n\r\n",  # 415
    ],
)
def test_a_refusal_before_the_body_is_read_says_connection_close(locked: InProcessServer, head: bytes) -> None:
    answer = raw_exchange(locked.port, head)  # the body never comes: the server must close
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.split()[1] in (b"401", b"405", b"415")
    assert b"\r\nConnection: close\r\n" in b"\r\n" + rest.split(b"\r\n\r\n")[0] + b"\r\n"


@pytest.mark.hardening("ingest 4: one batch could open unboundedly many day files")
def test_a_request_of_thousands_of_days_writes_max_days_files_and_fails_nobody(tmp_path: Path) -> None:
    """15,000 distinct dates: the first --max-days days are written, the rest are invalid lines,
    and an honest request in the same group commit is written too."""
    start = datetime.date(1990, 1, 1)
    body = b"".join(line(date=(start + datetime.timedelta(days=n)).isoformat(), ip_id=n + 1) for n in range(15_000))
    data = tmp_path / "data"
    with InProcessServer(data, "--max-days", "4") as server:
        with ThreadPoolExecutor(2) as pool:
            hostile = pool.submit(server.ingest, body)
            honest = pool.submit(server.ingest, line(date="2014-05-09"))
            answer, other = hostile.result(), honest.result()
    assert other.status == 200 and answer.status == 200
    assert answer.json()["result"]["stats"]["records"] == {"valid": 4, "invalid": 14_996, "total": 15_000}
    assert answer.json()["errors"][0] == {"line": 5, "error": "date: more days in one request than --max-days"}
    assert sorted(p.name for p in data.glob("*.csv")) == [
        "1990-01-01.csv",
        "1990-01-02.csv",
        "1990-01-03.csv",
        "1990-01-04.csv",
        "2014-05-09.csv",
    ]


@pytest.mark.hardening("ingest 7: valid chunk extensions and trailers got a bare 400")
@pytest.mark.parametrize(
    "chunked",
    [
        b"%x;foo=bar\r\n%s\r\n0\r\n\r\n",  # a chunk extension
        b'%x ; name="quoted value" ;flag\r\n%s\r\n0;last\r\n\r\n',  # BWS, quoted values, on the last chunk too
        b"%x\r\n%s\r\n0\r\nChecksum: abc\r\nX-Trace: 1\r\n\r\n",  # trailer fields
    ],
)
def test_chunk_extensions_and_trailers_are_accepted(server: InProcessServer, chunked: bytes) -> None:
    data = line() * 2
    head = b"POST /ingest HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    answer = raw_exchange(server.port, head + chunked % (len(data), data))
    assert answer.startswith(b"HTTP/1.1 200 ") and b'"valid":2' in answer, answer


@pytest.mark.hardening("ingest 7: valid chunk extensions and trailers got a bare 400")
@pytest.mark.parametrize(
    "chunked",
    [
        b"zz\r\nabc\r\n0\r\n\r\n",  # not hex
        b"3\r\nabc\r\n0\r\nno colon here\r\n\r\n",  # a trailer line that is no field
        b"3\r\nabcX\r\n0\r\n\r\n",  # chunk data longer than its size
    ],
)
def test_malformed_chunked_bodies_are_still_refused(server: InProcessServer, chunked: bytes) -> None:
    before = _rows(server)
    head = b"POST /ingest HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    status, message, _ = _json_error(raw_exchange(server.port, head + chunked))  # JSON: once a bare 400
    assert status == 400 and message.startswith("the chunked body: ")
    assert _rows(server) == before


@pytest.mark.hardening("ingest 7: valid chunk extensions and trailers got a bare 400")
def test_trailers_past_their_limit_close_the_connection(server: InProcessServer) -> None:
    from tiny.limits import MAX_TRAILERS

    head = b"POST /ingest HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    trailers = b"".join(b"X-T%d: %s\r\n" % (n, b"v" * 1000) for n in range(MAX_TRAILERS // 1000 + 2))
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as conn:
        conn.sendall(head + b"1\r\nx\r\n0\r\n" + trailers)  # no end of the trailers: only the limit ends it
        answer = b""
        while chunk := conn.recv(65536):  # b"": the server closed it (a timeout here fails the test)
            answer += chunk
    assert not answer.startswith(b"HTTP/1.1 200")


@pytest.mark.hardening("around 7: the token leaked through argv and --help")
def test_a_token_file_guards_ingest_and_never_reaches_the_log(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("file-s3cret\n")
    with Server(tmp_path / "data", "--token-file", str(tmp_path / "token")) as server:
        assert error(server.ingest(line()))[0] == 401
        assert server.ingest(line(), {"Authorization": "Bearer file-s3cret"}).status == 200
    assert "file-s3cret" not in server.log() and "bearer token from the file" in server.log()


def test_a_token_on_the_command_line_is_warned_about(tmp_path: Path) -> None:
    with Server(tmp_path / "data", "--token", "argv-s3cret") as server:
        assert server.ingest(line(), {"Authorization": "Bearer argv-s3cret"}).status == 200
    assert "sees it in ps" in server.log() and "argv-s3cret" not in server.log()


@pytest.mark.parametrize("encoding", ["identity", "gzip"])  # decoded on the event loop, and on a thread
def test_a_post_that_reaches_a_worker_after_its_sink_closed_gets_a_json_503(tmp_path: Path, encoding: str) -> None:
    # A proxy may send a request on a kept-alive connection while the worker stops.
    body = line(ip_id=7) * 3
    with InProcessServer(tmp_path / "data") as server:
        assert server.call(server.deps.sink.close)
        sent = gzip.compress(body) if encoding == "gzip" else body
        response = server.ingest(sent, {"Content-Encoding": encoding})
        assert error(response) == (503, "the server is stopping; nothing of this request was kept")
        assert response.headers["retry-after"]
    assert not list((tmp_path / "data").glob("*.csv"))


# Every way into /ingest answers the same head the same: with a Content-Length (the fast head parser
# reads it when it is the commonest kind), chunked (Tornado's parser reads it), and a server
# without the fast head parser (--lean false: Tornado's parser reads every head). The one /ingest
# delegate answers all of them; tiny_ingest_heads_total says which parser read each.
WAYS = ("fast", "chunked", "general")


def _heads(server: InProcessServer) -> dict[str, float]:
    return server.deps.metrics.heads_read()


def _took(server: InProcessServer, before: dict[str, float]) -> dict[str, float]:
    """The requests to /ingest each parser read since ``before`` (only those that read any)."""
    now = _heads(server)
    return {parser: now[parser] - before.get(parser, 0) for parser in now if now[parser] != before.get(parser, 0)}


def _request(way: str, fields: bytes, body: bytes, version: bytes = b"1.1") -> bytes:
    if way == "chunked":
        return b"POST /ingest HTTP/%s\r\n%sTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (
            version,
            fields,
            len(body),
            body,
        )
    return b"POST /ingest HTTP/%s\r\n%sContent-Length: %d\r\n\r\n%s" % (version, fields, len(body), body)


def _until_closed(port: int, data: bytes) -> bytes:
    """What the server answers to ``data`` up to its close (which must come within 10 s)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out


def _rows(server: InProcessServer) -> int:
    day = server.config.data_dir / "2014-05-04.csv"
    return len(rows_of(day)) if day.exists() else 0


_BAD_HOSTS = {
    "no Host in HTTP/1.1": b"",
    "a space": b"Host: a b\r\n",
    "a slash": b"Host: a/b\r\n",
    "two Host lines": b"Host: a\r\nHost: b\r\n",
}


@pytest.mark.hardening("third 2: the lean way took a request with no Host, a malformed one or two")
@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("host", _BAD_HOSTS.keys())
def test_a_host_that_tornado_refuses_gets_a_json_400_and_a_close_on_every_way(
    server: InProcessServer, general: InProcessServer, way: str, host: str
) -> None:
    target = general if way == "general" else server
    before, heads = _rows(target), _heads(target)
    answer = _until_closed(target.port, _request(way, _BAD_HOSTS[host], line(ip_id=21)))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and answer.count(b"HTTP/1.1 ") == 1, answer
    assert b"\r\nConnection: close" in head and b"\r\nContent-Type: application/json" in head
    assert orjson.loads(body)["error"]["status"] == 400 and "Host" in orjson.loads(body)["error"]["message"]
    assert _rows(target) == before
    assert _took(target, heads) == {}  # refused by the server before /ingest's delegate, on every way


@pytest.mark.parametrize(
    "framing", [b"Content-Length: 100000", b"Content-Length: 5, 6", b"Transfer-Encoding: gzip"], ids=str
)
def test_a_refused_host_gets_one_answer_whatever_framing_follows(server: InProcessServer, framing: bytes) -> None:
    """The refusal is written and the connection closed before Tornado reads the body, whose
    framing it would refuse with a second answer, a bare 400."""
    answer = _until_closed(server.port, b"POST /ingest HTTP/1.1\r\n%s\r\n\r\n12345" % framing)
    assert answer.startswith(b"HTTP/1.1 400 ") and answer.count(b"HTTP/1.1 ") == 1, answer
    assert b"the Host header is missing" in answer


@pytest.mark.parametrize("way", ["fast", "general"])  # HTTP/1.0 has no chunked body (below)
def test_an_http10_request_without_a_host_is_taken_on_every_way(
    server: InProcessServer, general: InProcessServer, way: str
) -> None:
    target = general if way == "general" else server
    before, heads = _rows(target), _heads(target)
    answer = _until_closed(target.port, _request(way, b"", line(ip_id=22), b"1.0"))
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    assert _rows(target) == max(before, 1) + 1
    assert _took(target, heads) == {"fast" if way == "fast" else "tornado": 1}


@pytest.mark.hardening("hostile client: HTTP/1.0 with a chunked body was written")
def test_an_http10_request_with_a_transfer_encoding_gets_a_json_400_and_writes_nothing(server: InProcessServer) -> None:
    """RFC 9112, 6.1: its framing is faulty (an HTTP/1.0 proxy between would read it otherwise)."""
    before = _rows(server)
    answer = _until_closed(server.port, _request("chunked", b"Host: x\r\n", line(ip_id=23), b"1.0"))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and b"\r\nConnection: close" in head, answer
    assert "HTTP/1.0 has no Transfer-Encoding" in orjson.loads(body)["error"]["message"]
    assert _rows(server) == before


def test_a_host_that_tornado_refuses_gets_a_json_400_on_every_path(server: InProcessServer) -> None:
    answer = _until_closed(server.port, b"GET /healthz HTTP/1.1\r\nHost: a b\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 ") and b'"status":400' in answer and b"Connection: close" in answer


_PADS = {  # field lines in all (Host, Connection and the framing field among them): the answer
    "100 lines": (100, 200),
    "101 lines": (101, 431),
    "150 lines": (150, 431),
}


@pytest.mark.hardening("third 3: the 431 limit counted names on the lean way and lines on the general way")
@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("pad", _PADS.keys())
def test_the_header_limit_counts_field_lines_on_every_way(
    server: InProcessServer, general: InProcessServer, way: str, pad: str
) -> None:
    lines, status = _PADS[pad]
    target = general if way == "general" else server
    before, heads = _rows(target), _heads(target)
    fields = b"Host: x\r\nConnection: close\r\n" + b"X-Pad: 1\r\n" * (lines - 3)  # one name, sent again and again
    answer = _until_closed(target.port, _request(way, fields, line(ip_id=23)))
    assert answer.startswith(b"HTTP/1.1 %d " % status), answer
    assert _took(target, heads) == {"tornado": 1}  # past the fast parser's 32 fields on every way
    if status == 431:
        assert b'{"error":{"status":431,' in answer and _rows(target) == before
    else:
        assert _rows(target) == max(before, 1) + 1


@contextlib.contextmanager
def _flush_lock_held(server: InProcessServer) -> Iterator[None]:
    """Another writer's flush holds the data dir (its flush lock): the server's writes, and its
    reads of the committed sizes, wait (at most --lock-timeout, 5 s)."""
    with open(lock_path(server.config.data_dir), "ab") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(holder, fcntl.LOCK_UN)


def _half_closed(server: InProcessServer, data: bytes, rows_before: int | None = None) -> bytes:
    """What the server answers to ``data`` when its client shuts its sending side
    (``shutdown(SHUT_WR)``: nothing more to say, waiting to read) while the request waits for
    the flush lock; the request was read before the close arrived (its rows not yet written)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        with _flush_lock_held(server):
            sock.sendall(data)
            lock = server.deps.sink.commit_point.lock  # type: ignore[attr-defined]
            assert wait_for(lambda: lock.waiting_since, timeout=10)  # (the precondition: read, waiting for the lock)
            if rows_before is not None:
                assert _rows(server) == rows_before  # (and not written yet)
            sock.shutdown(socket.SHUT_WR)
            time.sleep(0.3)  # the close is there before the answer
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out


_HALF_CLOSED = {  # the ways into /ingest, and the parser that reads each
    "fast": (lambda body: _request("fast", b"Host: x\r\n", body), "fast"),
    "chunked": (lambda body: _request("chunked", b"Host: x\r\n", body), "tornado"),
    "a query string": (
        lambda body: b"POST /ingest?source=a HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body),
        "tornado",
    ),
    "100-continue": (
        lambda body: (
            b"POST /ingest HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        ),
        "tornado",
    ),
}


@pytest.mark.hardening("hostile client: a half-closed client on Tornado's way had its rows written, never answered")
@pytest.mark.parametrize("way", _HALF_CLOSED.keys())
def test_a_client_that_half_closes_while_its_batch_waits_gets_its_answer(server: InProcessServer, way: str) -> None:
    request_of, parser = _HALF_CLOSED[way]
    before, heads = _rows(server), _heads(server)
    answer = _half_closed(server, request_of(line(ip_id=31) * 3), before)
    assert answer.count(b"HTTP/1.1 200 ") == 1 and b'"valid":3' in answer, answer
    assert _rows(server) == max(before, 1) + 3
    assert _took(server, heads) == {parser: 1}


@pytest.mark.hardening("hostile client: a half-closed client on Tornado's way had its rows written, never answered")
def test_a_client_that_half_closes_gets_its_answer_when_tornado_reads_every_head(general: InProcessServer) -> None:
    before = _rows(general)
    answer = _half_closed(general, _request("general", b"Host: x\r\n", line(ip_id=32) * 2), before)
    assert answer.count(b"HTTP/1.1 200 ") == 1 and b'"valid":2' in answer, answer
    assert _rows(general) == max(before, 1) + 2


@pytest.mark.hardening("hostile client: a half-closed client on Tornado's way had its rows written, never answered")
@pytest.mark.parametrize("way", ["fast", "chunked"])
def test_a_batch_is_answered_or_not_written_whenever_its_client_half_closes(server: InProcessServer, way: str) -> None:
    """Sent and half-closed at once, the close may come in the server's very read of the request
    (IOStream then closes the connection): every time, either its answer came and its rows are
    on disk once, or no answer came and nothing of it was written."""
    request_of, _ = _HALF_CLOSED[way]
    for attempt in range(10):
        before = max(_rows(server), 1)
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(request_of(line(ip_id=40 + attempt) * 2))
            sock.shutdown(socket.SHUT_WR)
            answer = b""
            with contextlib.suppress(ConnectionResetError):
                while chunk := sock.recv(65536):
                    answer += chunk
        assert wait_for(lambda: server.deps.sink.backlog == 0, timeout=10)  # no write left in flight
        if answer:
            assert answer.count(b"HTTP/1.1 200 ") == 1 and _rows(server) == before + 2, answer
        else:
            assert _rows(server) == before, f"attempt {attempt}: rows written, no answer"


def _json_error(answer: bytes) -> tuple[int, str, bytes]:
    """The status, message and head of an answer that must be one JSON error."""
    head, _, body = answer.partition(b"\r\n\r\n")
    assert answer.count(b"HTTP/1.1 ") == 1 and b"\r\nContent-Type: application/json" in head, answer
    error = orjson.loads(body)["error"]
    assert int(head[9:12]) == error["status"]
    return error["status"], error["message"], head


@pytest.mark.hardening("hostile client: a chunk size past the limit waited for its bytes; a bare 400 otherwise")
def test_a_chunk_past_the_body_limit_gets_a_json_413_at_its_size_line(server: InProcessServer) -> None:
    before = _rows(server)
    head = b"POST /ingest HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    # Not one byte of the chunk is sent: the answer comes from its size line alone.
    status, message, answer_head = _json_error(_until_closed(server.port, head + b"%x\r\n" % (LIMIT + 1)))
    assert status == 413 and f"limit of {LIMIT} bytes" in message
    assert b"\r\nConnection: close" in answer_head
    status, _, _ = _json_error(_until_closed(server.port, head + b"FFFFFFFFFFFFFFFF\r\n"))
    assert status == 413
    assert _rows(server) == before


def test_chunks_that_add_up_past_the_body_limit_get_a_json_413_and_write_nothing(server: InProcessServer) -> None:
    before = _rows(server)
    data = line(ip_id=33) * (LIMIT // len(line(ip_id=33)))  # within the limit alone; past it twice
    head = b"POST /ingest HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    # The second chunk's size line ends it: its bytes would only be reset, unread.
    status, _, _ = _json_error(_until_closed(server.port, head + b"%x\r\n%s\r\n%x\r\n" % (len(data), data, len(data))))
    assert status == 413
    assert _rows(server) == before


@pytest.mark.hardening("hostile client: a POST without a length was answered 200 with 0 records")
@pytest.mark.parametrize("way", ["tornado", "general"])
def test_a_post_with_neither_a_length_nor_chunked_gets_a_json_411(
    server: InProcessServer, general: InProcessServer, way: str
) -> None:
    target = general if way == "general" else server
    before = _rows(target)
    status, message, _ = _json_error(_until_closed(target.port, b"POST /ingest HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert (status, message) == (411, "a POST to /ingest needs a Content-Length or a chunked body")
    assert _rows(target) == before


@pytest.mark.hardening("hostile client: a body past 64 KiB to another endpoint got a bare 400")
@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_a_body_past_its_limit_on_another_endpoint_gets_a_json_413(server: InProcessServer, framing: str) -> None:
    from tiny.limits import MAX_OTHER_BODY

    body = b"x" * (MAX_OTHER_BODY + 1)
    if framing == "length":
        request = b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    else:
        request = b"POST /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n" % len(body)
    status, message, _ = _json_error(_until_closed(server.port, request))  # the body is never sent
    assert status == 413 and f"limit of {MAX_OTHER_BODY} bytes" in message


@pytest.mark.parametrize("framing", [b"Content-Length: 5, 6", b"Content-Length: ten", b"Transfer-Encoding: gzip"])
def test_a_framing_tornado_refuses_gets_a_json_400_on_another_endpoint(server: InProcessServer, framing: bytes) -> None:
    request = b"POST /healthz HTTP/1.1\r\nHost: x\r\n%s\r\n\r\n12345" % framing
    assert _json_error(_until_closed(server.port, request))[0] == 400


@pytest.mark.hardening("hostile client: Expect: 100-Continue in another case got no 100")
@pytest.mark.parametrize("expect", [b"100-Continue", b"100-CONTINUE", b"100-continue"])
def test_expect_100_continue_in_any_case_gets_100_continue_before_the_body_is_sent(
    server: InProcessServer, expect: bytes
) -> None:
    body = line(ip_id=34)
    head = b"POST /ingest HTTP/1.1\r\nHost: x\r\nExpect: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (
        expect,
        len(body),
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head)
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 ")  # before any body byte is sent
        sock.sendall(body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 ") and b'"valid":1' in answer, answer


def test_an_http10_request_expecting_100_continue_gets_no_100_but_its_answer(server: InProcessServer) -> None:
    """RFC 9110, 10.1.1: a server must ignore 100-continue in HTTP/1.0 (its client cannot read a 1xx)."""
    body = line(ip_id=37)
    request = b"POST /ingest HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    answer = _until_closed(server.port, request)
    assert answer.startswith(b"HTTP/1.1 200 ") and b"100 (Continue)" not in answer, answer


def test_an_expectation_other_than_100_continue_gets_a_json_417_and_writes_nothing(server: InProcessServer) -> None:
    before = _rows(server)
    body = line(ip_id=35)
    request = b"POST /ingest HTTP/1.1\r\nHost: x\r\nExpect: 200-ok\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    status, message, _ = _json_error(_until_closed(server.port, request))
    assert status == 417 and "200-ok" in message
    assert _rows(server) == before


@pytest.mark.hardening("outside review: an absolute-form target with an unclosed bracket was a traceback, no answer")
@pytest.mark.parametrize("target", [b"http://[::1/healthz", b"http://x]/healthz", b"http://[x/ingest"])
def test_an_absolute_form_target_that_is_no_url_gets_a_json_404(server: InProcessServer, target: bytes) -> None:
    request = b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % target
    status, _, _ = _json_error(_until_closed(server.port, request))
    assert status in (404, 405)  # (405: GET of /ingest's path, had it been one)


@pytest.mark.hardening("outside review: the same Content-Length twice got 400 on paths other than /ingest")
def test_the_same_content_length_twice_is_taken_on_another_path_as_tornado_takes_it(server: InProcessServer) -> None:
    request = (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\nConnection: close\r\n\r\na"
    )
    assert _until_closed(server.port, request).startswith(b"HTTP/1.1 200 ")
    unequal = request.replace(b"Content-Length: 1\r\nContent-Length: 1", b"Content-Length: 1\r\nContent-Length: 2")
    assert _json_error(_until_closed(server.port, unequal))[0] == 400


@pytest.mark.hardening("hostile client: a request-target in absolute form got 404")
def test_a_request_target_in_absolute_form_is_served_as_its_path(server: InProcessServer) -> None:
    """RFC 9112, 3.2.2: a server must accept it, though clients send it only to proxies."""
    request = b"GET http://x/healthz?probe=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    answer = _until_closed(server.port, request)
    assert answer.startswith(b"HTTP/1.1 200 ") and b'"status":"ok"' in answer, answer
    before = _rows(server)
    body = line(ip_id=36)
    request = b"POST http://x:80/ingest HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
    answer = _until_closed(server.port, request % (len(body), body))
    assert answer.startswith(b"HTTP/1.1 200 ") and b'"valid":1' in answer, answer
    assert _rows(server) == max(before, 1) + 1


@pytest.mark.hardening("hostile client: a 431 on a path other than /ingest kept the connection open")
def test_headers_past_the_limits_on_any_path_get_a_json_431_and_a_close(server: InProcessServer) -> None:
    from tiny.limits import MAX_HEADERS

    fields = b"".join(b"X-%d: 1\r\n" % n for n in range(MAX_HEADERS + 1))
    pipelined = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    answer = _until_closed(server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n%s\r\n%s" % (fields, pipelined))
    status, message, head = _json_error(answer)  # one answer: the request behind it is never read
    assert status == 431 and str(MAX_HEADERS) in message and b"\r\nConnection: close" in head

"""Test support: what the tests share beyond the harness (tiny.testing): records, batches, load."""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tiny.codec import encode_reference
from tiny.cranlog import iter_records
from tiny.layout import HEADER
from tiny.testing import (  # noqa: F401  (re-exported for the tests)
    ROOT,
    SAMPLE_DAY,
    Response,
    Server,
    free_port,
    http_get,
    sample_csv,
    sample_lines,
)

REQUEST_TIMEOUT = 10.0  # seconds for any one HTTP request of a Load


def batches(lines: tuple[bytes, ...], size: int) -> Iterator[bytes]:
    """Consecutive bodies of ``size`` lines each."""
    it = iter(lines)
    while chunk := list(itertools.islice(it, size)):
        yield b"".join(chunk)


def second_day_csv() -> bytes:
    """A second real-looking day: every third row of the sample day, dated 2014-05-06."""
    rows = sample_csv().split(b"\n")[1:-1]
    return HEADER + b"".join(b'"2014-05-06"' + row[12:] + b"\n" for row in rows[::3])


def package_counts() -> dict[str, Counter[str]]:
    """Downloads per package of the sample day and of :func:`second_day_csv`, counted here
    (tiny.cranlog.iter_records and collections.Counter, no server)."""
    first: Counter[str] = Counter()
    second: Counter[str] = Counter()
    for n, row in enumerate(iter_records(SAMPLE_DAY)):
        if row["package"] is not None:
            first[row["package"]] += 1
            if n % 3 == 0:
                second[row["package"]] += 1
    return {"2014-05-04": first, "2014-05-06": second}


def record(**fields: Any) -> dict[str, Any]:
    """A valid record, with ``fields`` overriding (a value of ... removes the key)."""
    base: dict[str, Any] = {
        "date": "2014-05-04",
        "time": "00:50:55",
        "size": 695181,
        "r_version": "3.0.2",
        "r_arch": "x86_64",
        "r_os": "linux-gnu",
        "package": "caret",
        "version": "6.0-24",
        "country": "MX",
        "ip_id": 1,
    }
    base.update(fields)
    return {k: v for k, v in base.items() if v is not ...}


def rows_of(path: Path) -> list[bytes]:
    """The lines of a day file (each with its LF)."""
    return path.read_bytes().splitlines(keepends=True)


def is_json_error(content_type: str, body: bytes) -> bool:
    """True for the JSON error shape {"error": {..., "message": "..."}}."""
    try:
        return content_type.startswith("application/json") and bool(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return False


class Load:
    """Client threads posting unique, traceable batches of one day through nginx until stopped.

    Records each request's start time, duration and status, and the lines of every
    acknowledged batch. ``no answer``: the connection failed or closed before any answer.
    With ``retries``, each batch carries its own Idempotency-Key and is sent again after no
    answer, a 502, 503 or 504, up to ``retries`` times: its recorded status is the last.
    """

    def __init__(
        self,
        port: int,
        day: str,
        clients: int = 6,
        size: int = 100,
        max_seconds: float = 60.0,
        headers: dict[str, str] | None = None,
        retries: int = 0,
        timeout: float = REQUEST_TIMEOUT,
    ) -> None:
        self.port = port
        self.retries = retries
        self.timeout = timeout
        self.run = uuid.uuid4().hex[:8]  # keys unique to this load
        self.headers = {"Content-Type": "application/x-ndjson", **(headers or {})}
        self.day = day
        self.clients = clients
        self.size = size
        self.deadline = time.monotonic() + max_seconds
        self.requests: list[tuple[float, float, str, list[bytes]]] = []  # (started, seconds, status, lines)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, args=(n,), daemon=True) for n in range(clients)]

    def batch(self, client: int, number: int) -> list[bytes]:
        return [
            json.dumps(record(date=self.day, ip_id=client * 10**7 + number * 10**3 + i + 1)).encode()
            for i in range(self.size)
        ]

    def _client(self, client: int) -> None:
        conn: http.client.HTTPConnection | None = None
        number = 0
        while not self._stop.is_set() and time.monotonic() < self.deadline:
            lines = self.batch(client, number)
            headers = {**self.headers, "Idempotency-Key": f"load-{self.run}-{client}-{number}"}
            number += 1
            started = time.monotonic()
            for attempt in range(self.retries + 1):
                try:
                    conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
                    conn.request("POST", "/ingest", b"\n".join(lines), headers if self.retries else self.headers)
                    response = conn.getresponse()
                    body = response.read()
                    status = str(response.status)
                    if status != "200" and not is_json_error(response.getheader("Content-Type", ""), body):
                        status += " (not the JSON error shape)"
                except (OSError, http.client.HTTPException):
                    status = "no answer"
                    if conn is not None:
                        conn.close()
                    conn = None
                    time.sleep(0.01)
                if status not in ("no answer", "502", "503", "504") or attempt == self.retries:
                    break
                time.sleep(0.05)
            with self._lock:
                self.requests.append((started, time.monotonic() - started, status, lines))
        if conn is not None:
            conn.close()

    def note(self, lines: list[bytes], status: int) -> None:
        """Record a batch the test posted itself, so check_day_file counts it too."""
        with self._lock:
            self.requests.append((time.monotonic(), 0.0, str(status), lines))

    def start(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def wait_acked(self, count: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked()) < count:
            assert time.monotonic() < deadline, f"only {len(self.acked())} batches acked: {self.statuses()}"
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(self.timeout + 5)

    def acked(self) -> list[list[bytes]]:
        with self._lock:
            return [lines for _, _, status, lines in self.requests if status == "200"]

    def slowest(self) -> float:
        """The longest any one batch took, its retries included (seconds)."""
        with self._lock:
            return max((seconds for _, seconds, _, _ in self.requests), default=0.0)

    def statuses(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        with self._lock:
            for _, _, status, _ in self.requests:
                counts[status] = counts.get(status, 0) + 1
        return counts

    def check_day_file(self, data: Path) -> dict[str, int]:
        """Every acked row on disk exactly once and each batch whole; no row twice; no torn line."""
        from tiny.codec import encode_reference
        from tiny.cranlog import parse_row
        from tiny.layout import HEADER, day_path

        lines = day_path(data, self.day).read_bytes().split(b"\n")
        assert lines[0] + b"\n" == HEADER and lines[-1] == b""
        rows = lines[1:-1]
        for row in rows:
            parse_row(row.decode())  # raises on a torn or interleaved line
        position = {row: i for i, row in enumerate(rows)}
        assert len(position) == len(rows), "a row is on disk twice: a POST was replayed"
        lost = 0
        acked = self.acked()
        for batch in acked:
            expected = encode_reference(b"\n".join(batch)).days[self.day].rstrip(b"\n").split(b"\n")
            places = [position.get(row) for row in expected]
            lost += sum(place is None for place in places)
            first = places[0]
            if first is not None and None not in places:
                assert places == list(range(first, first + len(places))), "a batch is not contiguous"
        assert lost == 0, f"{lost} acknowledged rows are missing"
        return {
            "rows_on_disk": len(rows),
            "acked_rows": len(acked) * self.size,
            "unacked_rows_on_disk": len(rows) - len(acked) * self.size,
            "lost": lost,
            "torn": 0,
        }


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.split(")")[1].split()[0] != "Z"


def stopped(pid: int) -> bool:
    """Every thread of process ``pid`` is stopped (state T in /proc/PID/task/*/stat)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        states = [Path(f"/proc/{pid}/task/{task}/stat").read_text().rsplit(")", 1)[1].split()[0] for task in tasks]
    except (OSError, IndexError):
        return False
    return bool(states) and all(state in ("T", "t") for state in states)


def lock_is_held(data: Path) -> bool:
    """Someone holds ``data``'s flush lock now: a non-blocking flock of it fails (released at once if not)."""
    import fcntl

    from tiny.layout import lock_path

    fd = os.open(lock_path(data), os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def intent_is_live(data: Path) -> bool:
    """A flush of ``data`` is under way or unfinished: its intent's first byte is ``I``."""
    from tiny.layout import intent_path

    return intent_path(data).read_bytes()[:1] == b"I"


def assert_stopped_in_a_flush(pid: int, data: Path, timeout: float = 10.0) -> None:
    """Prove, from outside, the precondition of a test that stops a writer inside a flush:
    every thread of ``pid`` is stopped, the data dir's flush lock is held and its intent live."""
    assert wait_for(lambda: stopped(pid), timeout), f"process {pid} did not stop"
    assert lock_is_held(data), f"process {pid} stopped without holding the flush lock"
    assert intent_is_live(data), f"process {pid} stopped outside a flush (the intent is not live)"


def wait_for(predicate: object, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def once_counted(server: Any, path: str, seconds: float = 180.0) -> Response:
    """The answer to ``GET path`` once the store has counted what it asks for: while rows are
    left it answers 503 with a Retry-After (folding is held to the analytics pool's CPU quota,
    slow on a busy machine), asked again after it as the docs tell clients, for at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while (response := server.request("GET", path)).status == 503:
        assert time.monotonic() < deadline, response.body
        time.sleep(min(5.0, float(response.headers.get("retry-after", "1"))))
    return response


needs_strace = pytest.mark.skipif(shutil.which("strace") is None, reason="strace is installed by make sysdeps")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (mount's syntax: 256k, 4m) at ``path`` (made), unmounted after:
    a small disk that fills. (``mount -o remount,size=...`` grows it.)"""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tinytest", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def traced(trace: Path, script: str, *args: str, calls: str = "pwrite64,fsync,fdatasync,unlink,unlinkat") -> list[str]:
    """The system calls ``calls`` that ``python -c script args`` made, one line each, every
    descriptor with its path (strace -f -y into ``trace``; run from the repository's root)."""
    subprocess.run(
        ["strace", "-f", "-qq", "-y", "-e", f"trace={calls}", "-o", str(trace), sys.executable, "-c", script, *args],
        check=True,
        cwd=ROOT,
        timeout=60,
    )
    return trace.read_text().splitlines()


def unlinked_once_sizes_synced(lines: list[str], unlinked: str) -> int:
    """How many unlinks in ``lines`` (:func:`traced`) name a path matching ``unlinked``, each
    asserted to come when every write to the committed-size table (.tiny/sizes) before it had
    been fsynced: a power loss then never keeps a deletion and loses its forgetting."""
    unsynced, count = False, 0
    for line in lines:
        if re.search(r"pwrite64\(\d+<[^>]*/\.tiny/sizes>", line):
            unsynced = True
        elif re.search(r"f(data)?sync\(\d+<[^>]*/\.tiny/sizes>", line):
            unsynced = False
        elif re.search(rf'unlink(at)?\(.*{unlinked}"', line):
            assert not unsynced, f"{line}: unlinked before its forgotten size was fsynced"
            count += 1
    return count


def body_of(batch: int, size: int = 20, days: tuple[str, ...] = ("2014-05-04",)) -> bytes:
    """A batch of ``size`` records per day of ``days``, ip_ids unique to it, and one invalid line."""
    lines = [
        orjson.dumps(record(date=day, ip_id=batch * 1000 + d * 100 + i + 1))
        for d, day in enumerate(days)
        for i in range(size)
    ]
    return b"\n".join([*lines, b"not json"]) + b"\n"


def key(batch: int) -> dict[str, str]:
    return {"Idempotency-Key": f"batch-{batch}"}


def assert_exactly_once(data: Path, bodies: dict[int, bytes]) -> None:
    """Every batch's rows on disk once, contiguous and in order, per day; nothing else.

    Linear in the rows: each row is unique (its ip_id names its batch), so a batch is on disk
    once and whole when its first row is there and the rows after it are the batch's own, and
    the day holds no more rows than the batches."""
    expected: dict[str, list[bytes]] = {}
    for body in bodies.values():
        for day, rows in encode_reference(body).days.items():
            expected.setdefault(day, []).append(rows)
    for day, batches in expected.items():
        on_disk = rows_of(data / f"{day}.csv")[1:]
        assert len(on_disk) == sum(rows.count(b"\n") for rows in batches), f"{day}: rows missing or twice"
        where = {row: number for number, row in enumerate(on_disk)}
        assert len(where) == len(on_disk), f"{day}: a row is on disk twice"
        for rows in batches:
            lines = rows.splitlines(keepends=True)
            start = where.get(lines[0])
            assert start is not None and on_disk[start : start + len(lines)] == lines, f"{day}: a batch is not whole"


def post_until_200(port: int, body: bytes, headers: dict[str, str], deadline: float) -> int:
    """POST until a 200 (no answer, 502 or 503: send again, the same key); the attempts."""
    attempts = 0
    while time.monotonic() < deadline:
        attempts += 1
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            try:
                conn.request("POST", "/ingest", body, headers)
                response = conn.getresponse()
                response.read()
            finally:
                conn.close()  # also when the server died mid-answer: no socket left to the collector
            if response.status == 200:
                return attempts
            assert response.status in (502, 503), response.status
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.05)
    raise AssertionError("a batch never got its 200")


def keyed_clients(port: int, clients: int, enough: threading.Event, timeout: float = 120) -> dict[int, int]:
    """``clients`` threads post numbered batches (two days each) with keys, each until it is
    acknowledged, and take no new batch once ``enough`` is set; the attempts per batch."""
    attempts: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    numbers = iter(range(10**6))
    lock = threading.Lock()

    def client() -> None:
        while not enough.is_set():
            with lock:
                batch = next(numbers)
            days = ("2014-05-04", "2014-05-05")
            attempts[batch] = post_until_200(port, body_of(batch, days=days), key(batch), deadline)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 15)
    return attempts

"""Cluster mode with real servers: two or three hosts (servers with their own data dirs) on one PostgreSQL cluster.

One cluster (etcd and three PostgreSQL nodes under Patroni, tiny.testing_pg; the session's
``pg_cluster``), a fresh database (so a fresh log) per test. Each host is `python app.py --cluster DSN` with its
own data dir on 127.0.0.1; the password reaches it through a passfile, as --cluster wants.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.cluster_support import (
    NEEDS_CLUSTER,
    a_requests_bound,
    applied,
    data_files,
    eventually,
    fresh_database,
    health,
    host_flags,
    on_primary,
    wait_applied,
    without_password,
)
from tests.conftest import SCALE
from tests.support import assert_exactly_once, body_of
from tiny import layout
from tiny.cluster.log import CommitLog
from tiny.follower_status import NOT_RUNNING_AFTER
from tiny.testing import ROOT, Response, Server
from tiny.testing_pg import PgCluster

pytestmark = [pytest.mark.slow, NEEDS_CLUSTER, pytest.mark.timeout(300)]

_FOLLOWER = re.compile(r"tiny\.follower\[(\d+)\] follower \S+ of ")


@pytest.fixture
def cluster(pg_cluster: PgCluster) -> PgCluster:
    return pg_cluster


@pytest.fixture
def database(cluster: PgCluster) -> str:
    """A fresh database (so an empty log), its DSN with the password."""
    cluster.wait_healthy(30)
    return fresh_database(cluster)


@pytest.fixture
def hosts(cluster: PgCluster, database: str, tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """Starts hosts on the test's log: ``hosts("h1", *flags, role=..., processes=...)``; each
    has its data dir at tmp_path/NAME/data (a host started again is a new server on the same
    data dir). Every one is stopped (and killed) after the test; its flags: host_flags."""
    dsn = without_password(cluster, database, tmp_path)
    started: list[Server] = []

    def start(name: str, *flags: str, role: str = "ingest", processes: int = 1, wait: bool = True) -> Server:
        server = Server(
            tmp_path / name / "data",
            *host_flags(dsn, name, role),
            *flags,
            processes=processes,
            log_path=tmp_path / name / f"log-{len(started)}",
        )
        started.append(server)
        return server.start(timeout=60) if wait else server

    yield start
    for server in started:
        try:
            server.stop()
        except Exception:
            server.kill()


def ingest(server: Server, body: bytes, key: str | None = None) -> Response:
    return server.ingest(body, {"Idempotency-Key": key} if key else {})


def follower_pid(server: Server) -> int:
    """The pid of the host's follower that started last (its log names it)."""
    found = _FOLLOWER.findall(server.log())
    assert found, "no follower started"
    return int(found[-1])


def trimmed(database: str) -> int:
    return int(on_primary(database, "SELECT trimmed FROM tiny.retention")[0][0])


def retain(database: str) -> None:
    """A step of retention now, as a host's follower runs it every few seconds."""
    log = CommitLog(database)
    try:
        log.retain()
    finally:
        log.close()


# -- keys and positions across hosts ---------------------------------------------------------


def test_one_key_sent_to_two_hosts_at_once_is_written_once_and_replayed_once(
    hosts: Callable[..., Server],
) -> None:
    a, b = hosts("h1"), hosts("h2")
    written, replayed = [], []
    for n in range(30):
        body = body_of(n, size=3)
        both = threading.Barrier(2)

        def send(server: Server, body: bytes = body, n: int = n, both: threading.Barrier = both) -> Response:
            both.wait(5)
            return ingest(server, body, f"key-{n}")

        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(send, (a, b)))
        assert [r.status for r in answers] == [200, 200], [r.body for r in answers]
        kinds = sorted(r.headers.get("idempotent-replayed", "written") for r in answers)
        assert kinds == ["true", "written"], kinds
        assert answers[0].headers["tiny-position"] == answers[1].headers["tiny-position"]
        written.append(n)
        replayed.append(n)
    assert ingest(b, body_of(99, size=3), "key-0").status == 422
    head = int(ingest(a, body_of(100, size=3), "key-100").headers["tiny-position"])
    assert head == 31  # 30 written, the 422 took none
    wait_applied(head, a, b)
    assert data_files(a) == data_files(b)
    assert a.data_dir is not None
    assert_exactly_once(a.data_dir, {n: body_of(n, size=3) for n in [*written, 100]})


def test_every_hosts_files_are_byte_identical_and_what_one_host_writes_for_the_same_batches(
    hosts: Callable[..., Server], tmp_path: Path
) -> None:
    a, b, c = hosts("h1"), hosts("h2"), hosts("h3", role="read")
    bodies = [body_of(n, size=7, days=("2014-05-04", "2014-05-05")) for n in range(12)]
    for n, body in enumerate(bodies):  # one after the other: the log's order is this order
        answer = ingest((a, b)[n % 2], body, f"k{n}" if n % 3 else None)
        assert answer.status == 200 and answer.headers["tiny-position"] == str(n + 1)
    wait_applied(len(bodies), a, b, c)
    files = data_files(a)
    assert {"2014-05-04.csv", "2014-05-05.csv"} <= set(files) and any(name.startswith("rejects/") for name in files)
    assert data_files(b) == files and data_files(c) == files
    with Server(tmp_path / "one-host" / "data", processes=1) as alone:
        for body in bodies:
            assert alone.ingest(body).status == 200
        assert alone.data_dir is not None
        one_host = {name: data for name, data in data_files(alone).items() if layout.day_of(name)}
    assert one_host == {name: data for name, data in files.items() if layout.day_of(name)}


def test_a_replay_says_the_position_of_the_flush_that_wrote_it(hosts: Callable[..., Server]) -> None:
    a, b = hosts("h1"), hosts("h2")
    first = ingest(a, body_of(1), "same")
    ingest(a, body_of(2), "other")
    again = ingest(b, body_of(1), "same")
    assert again.headers["idempotent-replayed"] == "true"
    assert again.headers["tiny-position"] == first.headers["tiny-position"] == "1"
    assert again.body == first.body


# -- reads -----------------------------------------------------------------------------------


def downloads(server: Server, headers: dict[str, str] | None = None) -> Response:
    return server.request("GET", "/downloads/total/2014-05-04/caret", headers=headers or {}, timeout=30)


def count(answer: Response) -> int:
    assert answer.status == 200, answer.body
    return int(answer.json()[0]["downloads"])


@pytest.mark.parametrize("asked", ["Tiny-Wait-Position", "the head when the read began"])
def test_a_read_on_another_host_waits_for_the_batch_acknowledged_before_it(
    hosts: Callable[..., Server], asked: str
) -> None:
    a, b = hosts("h1"), hosts("h2", role="read")
    assert count(downloads(b, {"Tiny-Wait-Position": "0"})) == 0
    follower = follower_pid(b)
    os.kill(follower, signal.SIGSTOP)  # b applies nothing until SIGCONT
    try:
        answer = ingest(a, body_of(5, size=20))
        position = answer.headers["tiny-position"]
        headers = {"Tiny-Wait-Position": position} if asked == "Tiny-Wait-Position" else {}
        with ThreadPoolExecutor(1) as pool:
            began = time.monotonic()
            reading = pool.submit(downloads, b, headers)
            time.sleep(1.0)
            assert not reading.done(), "the read did not wait for its host to apply the batch"
            assert applied(b) == 0  # the precondition: b had not applied it
            os.kill(follower, signal.SIGCONT)
            result = reading.result(15)
        assert count(result) == 20 and time.monotonic() - began >= 1.0
    finally:
        os.kill(follower, signal.SIGCONT)


def test_a_read_waits_at_most_read_wait_then_says_how_far_behind(hosts: Callable[..., Server]) -> None:
    a, b = hosts("h1"), hosts("h2", "--read-wait", "1", role="read")
    follower = follower_pid(b)
    # Precondition: the read reaches b while its stopped follower still counts as running (its
    # last beat under NOT_RUNNING_AFTER old; past that a read is refused at once, by design).
    # A commit slowed by a loaded machine can take that long: then the try is made again.
    for _ in range(5):
        os.kill(follower, signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            position = ingest(a, body_of(6)).headers["tiny-position"]
            began = time.monotonic()
            if began - stopped < NOT_RUNNING_AFTER - 1.5:
                answer = downloads(b, {"Tiny-Wait-Position": position})
                took = time.monotonic() - began
                break
        finally:
            os.kill(follower, signal.SIGCONT)
        time.sleep(NOT_RUNNING_AFTER)
    else:
        pytest.fail(f"no commit on h1 came back within {NOT_RUNNING_AFTER - 1.5} s in 5 tries")
    assert answer.status == 503 and 1.0 <= took < 3.0, (answer.status, took, answer.body)
    assert int(answer.headers["retry-after"]) >= 1
    message = answer.json()["error"]["message"]
    assert re.search(rf"has applied position \d+ of the log, the read needs {position} ", message), message


def test_a_position_never_committed_or_not_a_number_is_refused(hosts: Callable[..., Server]) -> None:
    a = hosts("h1")
    ingest(a, body_of(1))
    assert downloads(a, {"Tiny-Wait-Position": "7"}).status == 400
    assert downloads(a, {"Tiny-Wait-Position": "-1"}).status == 400
    assert downloads(a, {"Tiny-Wait-Position": "1"}).status == 200


def test_a_host_for_reads_only_refuses_ingest_with_421_and_answers_reads(hosts: Callable[..., Server]) -> None:
    a, b = hosts("h1"), hosts("h2", role="read")
    refused = ingest(b, body_of(1))
    assert refused.status == 421 and refused.headers["connection"] == "close"
    assert "reads only" in refused.json()["error"]["message"]
    ingest(a, body_of(1, size=4))
    assert count(downloads(b)) == 4  # the default wait: the head when the read began
    assert health(b)["cluster"]["role"] == "read"


# -- the follower's crashes, a wiped host, retention ------------------------------------------


def test_a_follower_killed_between_its_append_and_its_position_doubles_nothing(hosts: Callable[..., Server]) -> None:
    a = hosts("h1")
    b = hosts("h2", "--crash-at", "follower-after-append:1:kill-once", role="read")
    bodies = {n: body_of(n, size=5) for n in range(10)}
    for n, body in bodies.items():
        assert ingest(a, body, f"k{n}").status == 200
    wait_applied(len(bodies), a, b)
    assert b.data_dir is not None
    assert (b.data_dir / ".tiny" / "crash-test-once").exists()  # the precondition: it died there
    assert "crash test: killing this process follower-after-append" in b.log()
    assert "recovered from an unfinished flush" in b.log()  # its appended bytes were cut back
    assert data_files(b) == data_files(a)
    assert_exactly_once(b.data_dir, bodies)


def test_a_stopped_follower_never_holds_up_ingest_and_fails_healthz_until_it_goes_on(
    hosts: Callable[..., Server],
) -> None:
    a = hosts("h1")
    stopped = follower_pid(a)
    os.kill(stopped, signal.SIGSTOP)
    try:
        began = time.monotonic()
        answer = ingest(a, body_of(1), "k1")
        assert answer.status == 200 and time.monotonic() - began < 2.0  # the commit point is PostgreSQL
        eventually(lambda: "the follower is not running" in str(health(a).get("reason")), 10)
    finally:
        os.kill(stopped, signal.SIGCONT)
    wait_applied(1, a)
    assert health(a)["status"] == "ok" and follower_pid(a) == stopped


def test_a_follower_stopped_past_the_stall_timeout_is_replaced(hosts: Callable[..., Server]) -> None:
    a = hosts("h1", "--stall-timeout", "1")
    stopped = follower_pid(a)
    os.kill(stopped, signal.SIGSTOP)
    try:
        eventually(lambda: follower_pid(a) != stopped, 20)  # the parent killed it, a new one took over
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stopped, signal.SIGCONT)
    assert f"the follower (pid {stopped}) stalled: it has not run for" in a.log()
    ingest(a, body_of(1), "k1")
    wait_applied(1, a)


def test_a_wiped_host_catches_up_by_itself(hosts: Callable[..., Server], database: str) -> None:
    # A follower that reports position 0 and stays seen holds the whole log: the wiped host
    # needs it from position 1, and the others' retention would trim it otherwise.
    a, b = hosts("h1"), hosts("h2")
    on_primary(database, "INSERT INTO tiny.followers VALUES ('holder', 0, now() + interval '1 hour')")
    bodies = {n: body_of(n, size=5) for n in range(8)}
    for n, body in bodies.items():
        ingest((a, b)[n % 2], body, f"k{n}")
    wait_applied(8, b)
    assert b.stop() == 0
    assert b.data_dir is not None
    shutil.rmtree(b.data_dir)
    assert trimmed(database) == 0  # the precondition: the log still holds every batch
    b = hosts("h2")
    wait_applied(8, b)
    assert data_files(b) == data_files(a)
    assert_exactly_once(b.data_dir, bodies)


def test_a_host_past_the_logs_retention_is_refused_then_started_from_a_peers_backup(
    hosts: Callable[..., Server], database: str, tmp_path: Path
) -> None:
    a, b = hosts("h1"), hosts("h2", role="read")
    for n in range(6):
        ingest(a, body_of(n), f"k{n}")
    wait_applied(6, a, b)
    eventually(lambda: trimmed(database) == 6, 40, pause=0.5)  # the followers' retention trimmed all
    refused = hosts("h3", role="read", wait=False)
    with pytest.raises(RuntimeError):
        refused.start(timeout=60)
    assert "cannot start: the log no longer holds positions 1-6" in refused.log()
    c = hosts("h3", role="read", wait=False)
    assert c.data_dir is not None
    shutil.rmtree(c.data_dir)
    assert a.data_dir is not None
    dsn = c.args[c.args.index("--cluster") + 1]
    command = ["backup", str(a.data_dir), str(c.data_dir), "--cluster", dsn, "--host-name", "h3"]
    copied = subprocess.run(
        [sys.executable, "-m", "tiny.admin", *command], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert copied.returncode == 0 and "at position 6 of the log (h3 holds the log from there)" in copied.stdout
    for n in range(6, 9):  # while the copy travels: the others go on, h3 holds what it lacks
        ingest(a, body_of(n), f"k{n}")
    wait_applied(9, a, b)
    eventually(lambda: on_primary(database, "SELECT min(applied) FROM tiny.followers WHERE name <> 'h3'") == [(9,)], 5)
    retain(database)
    assert trimmed(database) == 6
    c.start(timeout=60)
    wait_applied(9, c)
    assert data_files(c) == data_files(a) == data_files(b)


def test_a_data_dir_is_bound_to_its_cluster_and_refuses_another(
    hosts: Callable[..., Server], cluster: PgCluster, tmp_path: Path
) -> None:
    a = hosts("h1")
    ingest(a, body_of(1))
    assert a.stop() == 0
    other = without_password(cluster, fresh_database(cluster), tmp_path)
    assert a.data_dir is not None
    elsewhere = Server(a.data_dir, "--cluster", other, "--host-name", "h1", processes=1)
    with pytest.raises(RuntimeError):
        elsewhere.start(timeout=30)
    assert "follows the cluster" in elsewhere.log() and "but --cluster reaches the cluster" in elsewhere.log()
    alone = Server(a.data_dir, processes=1)
    with pytest.raises(RuntimeError):
        alone.start(timeout=30)
    assert "follows the PostgreSQL cluster" in alone.log() and "start its server with --cluster" in alone.log()


# -- failover under load ---------------------------------------------------------------------

RESUME_BOUND = 30.0  # seconds without an acknowledgement the issue allows after a primary's death
CLIENTS = 4


@dataclass
class Clients:
    """Keyed clients posting one-record batches through two ingest hosts, each batch retried,
    with its key, on the other host after a 503 or no answer, until it is acknowledged."""

    hosts: tuple[Server, Server]
    bodies: dict[int, bytes] = field(default_factory=dict)
    acks: list[float] = field(default_factory=list)  # time.monotonic() of each acknowledgement
    answers: Counter[str] = field(default_factory=Counter)
    longest: float = 0.0
    crashes: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, first: int) -> None:
        try:
            number = first
            while not self.stop.is_set():
                self.send(number)
                number += CLIENTS
        except BaseException as exc:
            with self.lock:
                self.crashes.append(repr(exc))
            raise

    def send(self, number: int) -> None:
        body, key = body_of(number, size=1), {"Idempotency-Key": f"batch-{number}"}
        with self.lock:
            self.bodies[number] = body
        host = number % 2
        while True:
            began = time.monotonic()
            try:
                answer: Response | None = self.hosts[host].ingest(body, key)
            except OSError:
                answer = None
            took = time.monotonic() - began
            status = "no answer" if answer is None else str(answer.status)
            with self.lock:
                self.longest = max(self.longest, took)
                self.answers[status] += 1
                if status == "200":
                    self.acks.append(time.monotonic())
                    return
            assert answer is None or (answer.status == 503 and "retry-after" in answer.headers), status
            host = 1 - host  # as nginx passes it on: the other host, the same key
            time.sleep(0.1)

    def acked_after(self, moment: float) -> int:
        with self.lock:
            return sum(1 for t in self.acks if t > moment)

    def gap_after(self, moment: float, within: float) -> float:
        """The longest time without an acknowledgement between ``moment`` and ``within``
        seconds later (a request committed before a kill may still be acknowledged just after
        it: the gap that follows is the outage)."""
        with self.lock:
            times = sorted(t for t in self.acks if moment <= t <= moment + within)
        if not times:
            return float("inf")
        return max(b - a for a, b in zip([moment, *times], times, strict=False))


@pytest.mark.reliability
def test_kill_9_of_the_primary_under_keyed_load_loses_nothing_doubles_nothing_and_resumes_in_30_s(
    hosts: Callable[..., Server], cluster: PgCluster, figures: dict[str, Any]
) -> None:
    a, b = hosts("h1", processes=2), hosts("h2", processes=2)
    load = Clients((a, b))
    threads = [threading.Thread(target=load.run, args=(i,), daemon=True) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    rounds = max(1, round(SCALE))
    gaps = []
    for round_ in range(rounds):
        if round_:
            cluster.wait_healthy(60)  # the last victim back as a standby: one node down at a time
        time.sleep(3.0)
        acked = len(load.acks)
        victim = cluster.wait_primary(30)
        killed = time.monotonic()
        cluster.kill(victim)
        # ingest resumed: more acknowledgements than the requests that were in flight at the kill
        eventually(lambda killed=killed: load.acked_after(killed + 1.0) > 4 * CLIENTS, RESUME_BOUND + 5, pause=0.2)
        time.sleep(1.0)
        gaps.append(load.gap_after(killed, time.monotonic() - killed))
        assert acked > 0 and not load.crashes
        cluster.restart(victim)  # it rejoins (pg_rewind) as a standby; the next user waits for it
    load.stop.set()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads) and not load.crashes, load.crashes
    head = max(int(health(host)["cluster"]["head"]) for host in (a, b))
    position = int(ingest(a, body_of(10**6, size=1)).headers["tiny-position"])  # after every ack
    load.bodies[10**6] = body_of(10**6, size=1)
    wait_applied(position, a, b, timeout=60)
    bound = a_requests_bound()
    figures.update(
        acknowledged=len(load.acks),
        answers=dict(load.answers),
        gaps_without_an_ack=[round(gap, 2) for gap in gaps],
        longest_request=round(load.longest, 2),
        request_bound=bound,
        head=max(head, position),
    )
    assert max(gaps) <= RESUME_BOUND, gaps
    assert load.longest <= bound, (load.longest, bound)
    assert a.data_dir is not None and b.data_dir is not None
    assert_exactly_once(a.data_dir, load.bodies)  # every acknowledged batch once: 0 lost, 0 doubled
    assert data_files(a) == data_files(b)

"""Cluster mode's hosts under keyed and unkeyed load while one part fails: nothing acknowledged lost or doubled.

Two ingest hosts and one read host (``python app.py --cluster``, each its own data dir) on the
session's PostgreSQL cluster (etcd and three nodes under Patroni, tiny.testing_pg), a fresh
database per test. Client threads post batches of :data:`ROWS` records (each row's ip_id
unique, naming its batch), every other batch with an Idempotency-Key: a keyed batch is sent
again, with its key, to the other host after a 503 or no answer, until a 200; an unkeyed one
after a refused connection or a 503 that says nothing was kept, and otherwise (no answer, or
"may or may not have been written") it is *unknown*: on disk once or not at all, never lost.
Then one fault per test, and after it, with the load stopped and the cluster healed, every
promise is checked (:func:`check`): every acknowledged batch on every host once and whole,
every unknown one at most once, nothing else; every host's day and rejects files byte-identical;
no request longer than :func:`tests.cluster_support.a_requests_bound` (a margin of
:data:`MARGIN` for HTTP and the codec).

The kill -9 of the primary under load is tests/test_cluster_mode.py's (keyed, through two
hosts), and at the commit log's level with a follower reading, tests/test_cluster_failover.py's;
a follower killed between its append and its position is tests/test_cluster_mode.py's.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import os
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
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
    wait_applied,
    wal_receiver_stopped,
    without_password,
)
from tests.support import body_of
from tiny import layout
from tiny.testing import Response, Server, free_port, request
from tiny.testing_pg import PgCluster

pytestmark = [pytest.mark.slow, NEEDS_CLUSTER, pytest.mark.timeout(300)]

CLIENTS = 4  # client threads; each alternates keyed and unkeyed batches
ROWS = 5  # valid records per batch (and one invalid line: a rejects file is written too)
PAUSE = 0.05  # seconds between two batches of one client: a bounded load on a shared machine
MAX_BATCHES = 800  # batches one client sends at most
BEFORE = 2.0  # seconds of load before the fault
AFTER = 2.0  # seconds of acknowledgements after the fault's end before the load stops
RESUME_BOUND = 30.0  # seconds without an acknowledgement the issue allows
MARGIN = 1.0  # seconds past the server's bound a client may see (HTTP, the codec, the queue's turn)
CATCH_UP = 60.0  # seconds every host has to apply the log's last position
DAY = "2014-05-04.csv"
_MAYBE = "may or may not have been written"
_WAITING = "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'"


@pytest.fixture
def cluster(pg_cluster: PgCluster) -> PgCluster:
    return pg_cluster


class Hosts:
    """The test's hosts on one fresh database: :meth:`start` (again, with the same name: the
    same data dir and port), each stopped and killed after the test."""

    def __init__(self, cluster: PgCluster, tmp_path: Path) -> None:
        cluster.wait_healthy(60)
        self.dsn = without_password(cluster, fresh_database(cluster), tmp_path)
        self.tmp_path = tmp_path
        self.ports: dict[str, int] = {}
        self.started: list[Server] = []

    def data_dir(self, name: str) -> Path:
        return self.tmp_path / name / "data"

    def start(self, name: str, role: str = "ingest") -> Server:
        port = self.ports.setdefault(name, free_port())
        server = Server(
            self.data_dir(name),
            *host_flags(self.dsn, name, role),
            port=port,
            log_path=self.tmp_path / "logs" / f"{name}-{len(self.started)}.log",
        )
        self.started.append(server)
        return server.start(timeout=60)

    def close(self) -> None:
        for server in self.started:
            try:
                server.stop()
            except Exception:
                server.kill()


@pytest.fixture
def hosts(cluster: PgCluster, tmp_path: Path) -> Iterator[Hosts]:
    started = Hosts(cluster, tmp_path)
    yield started
    started.close()


# -- the load --------------------------------------------------------------------------------


@dataclass
class Load:
    """Client threads posting to the ingest hosts on ``ports`` (see the module docstring)."""

    ports: list[int]
    bound: float
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    acked: dict[int, bytes] = field(default_factory=dict)  # batch -> body, answered 200 (replays too)
    unknown: dict[int, bytes] = field(default_factory=dict)  # unkeyed batches whose outcome is not known
    answers: Counter[str] = field(default_factory=Counter)
    acks: list[float] = field(default_factory=list)  # time.monotonic() of each 200
    longest: float = 0.0
    crashes: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Load:
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(CLIENTS)]
        for thread in self.threads:
            thread.start()
        return self

    def finish(self) -> None:
        """Stop sending new batches; wait for those under way (each within its bound)."""
        self.stop.set()
        for thread in self.threads:
            thread.join(self.bound * 3)
        assert not any(thread.is_alive() for thread in self.threads), "a client still waits past its bound"
        assert not self.crashes, self.crashes

    def guarded_send(self, batch: int, keyed: bool, host: int) -> None:
        """:meth:`send`, with what it raises recorded as a crash (a thread's death is silent)."""
        try:
            self.send(batch, keyed, host)
        except BaseException as exc:
            with self.lock:
                self.crashes.append(f"batch {batch}: {exc!r}")
            raise

    def _client(self, client: int) -> None:
        try:
            for number in range(MAX_BATCHES):
                if self.stop.is_set():
                    return
                batch = client * 10**5 + number
                self.send(batch, keyed=number % 2 == 0, host=(client + number) % len(self.ports))
                time.sleep(PAUSE)
        except BaseException as exc:
            with self.lock:
                self.crashes.append(f"client {client}: {exc!r}")
            raise

    def send(self, batch: int, keyed: bool, host: int) -> None:
        """One batch, sent again as a client would (see the module docstring) until it is
        acknowledged, or (unkeyed) its outcome is unknown. A keyed batch gives up only past
        RESUME_BOUND + the bound: a crash of the test."""
        body = body_of(batch, size=ROWS)
        headers = {"Idempotency-Key": f"{self.run}-{batch}"} if keyed else {}
        give_up = time.monotonic() + RESUME_BOUND + 2 * self.bound
        while True:
            began = time.monotonic()
            refused = False
            try:
                answer: Response | None = request(self.ports[host], "POST", "/ingest", body, headers, self.bound * 2)
            except ConnectionRefusedError:
                answer, refused = None, True  # nothing was sent
            except (OSError, http.client.HTTPException):
                answer = None
            took = time.monotonic() - began
            status = "refused" if refused else "no answer" if answer is None else str(answer.status)
            maybe = answer is not None and answer.status == 503 and _MAYBE in answer.body.decode(errors="replace")
            with self.lock:
                self.longest = max(self.longest, took)
                self.answers[status + (" (maybe written)" if maybe else "")] += 1
                if status == "200":
                    self.acks.append(time.monotonic())
                    self.acked[batch] = body
                    return
                if not keyed and not refused and (answer is None or maybe):
                    self.unknown[batch] = body
                    return
            if answer is not None and answer.status != 503:
                raise AssertionError(f"batch {batch}: {answer.status} {answer.body[:300]!r}")
            if answer is not None:
                assert "retry-after" in answer.headers, answer.headers
            if time.monotonic() > give_up:
                raise AssertionError(f"batch {batch} never acknowledged; last: {status}")
            host = (host + 1) % len(self.ports)  # as nginx passes it on: the other host, the same key
            time.sleep(0.2)

    def gap_after(self, moment: float) -> float:
        """The longest time without an acknowledgement from ``moment`` on (a request committed
        just before a fault may be acknowledged just after it: the gap that follows counts)."""
        with self.lock:
            times = sorted(t for t in self.acks if t >= moment)
        if not times:
            return float("inf")
        return max(b - a for a, b in zip([moment, *times], times, strict=False))

    def acked_after(self, moment: float) -> int:
        with self.lock:
            return sum(1 for t in self.acks if t > moment)


def wait_resumed(load: Load, moment: float) -> None:
    """Until AFTER seconds of acknowledgements followed ``moment`` (at most RESUME_BOUND + AFTER),
    ``moment`` being the fault's end: before it, answers to requests in flight when it began
    may still come, and are no resumption."""

    def resumed() -> bool:
        with load.lock:
            later = [t for t in load.acks if t > moment]
        return bool(later) and time.monotonic() >= later[0] + AFTER and len(later) > 2 * CLIENTS

    eventually(resumed, RESUME_BOUND + AFTER + 5, pause=0.2)


# -- the checks ------------------------------------------------------------------------------


def ip_ids(rows: bytes) -> list[int]:
    """The ip_id (the last column) of each row of a day file, its header skipped."""
    return [int(line.rsplit(b",", 1)[1]) for line in rows.splitlines()[1:]]


def batches_of(rows: bytes) -> list[int]:
    """The batch of each run of rows of a day file, in order (body_of: ip_id = batch * 1000 + n)."""
    runs: list[int] = []
    for ip_id in ip_ids(rows):
        if not runs or runs[-1] != ip_id // 1000:
            runs.append(ip_id // 1000)
    return runs


def check(load: Load, servers: list[Server], ingest: Server) -> dict[str, Any]:
    """Every promise after the load (see the module docstring); the figures."""
    marker = 10**8  # a last batch, after every other acknowledgement: its position is the head
    answer = ingest.ingest(body_of(marker, size=ROWS), {"Idempotency-Key": f"{load.run}-marker"})
    assert answer.status == 200, answer.body
    load.acked[marker] = body_of(marker, size=ROWS)
    head = int(answer.headers["tiny-position"])
    began = time.monotonic()
    wait_applied(head, *servers, timeout=CATCH_UP)
    caught_up = time.monotonic() - began
    files = [data_files(server) for server in servers]
    assert all(one == files[0] for one in files[1:]), "the hosts' files differ"
    ids = Counter(ip_ids(files[0][DAY]))
    doubled = sorted({ip_id // 1000 for ip_id, n in ids.items() if n > 1})
    wanted = range(1, ROWS + 1)
    lost = sorted(batch for batch in load.acked if any(ids[batch * 1000 + i] != 1 for i in wanted))
    unknown_written = sorted(batch for batch in load.unknown if ids[batch * 1000 + 1])
    torn = [b for b in unknown_written if any(ids[b * 1000 + i] != 1 for i in wanted)]
    strangers = sorted({ip_id // 1000 for ip_id in ids} - load.acked.keys() - load.unknown.keys())
    runs = batches_of(files[0][DAY])
    assert len(runs) == len(set(runs)), "a batch's rows are not contiguous"
    bound = a_requests_bound()
    figures = {
        "acknowledged": len(load.acked),
        "lost": len(lost),
        "doubled": len(doubled),
        "unknown_unkeyed": len(load.unknown),
        "unknown_written": len(unknown_written),
        "answers": dict(load.answers),
        "longest_request_s": round(load.longest, 2),
        "request_bound_s": bound,
        "head": head,
        "last_catch_up_s": round(caught_up, 2),
    }
    assert lost == [] and doubled == [] and torn == [] and strangers == [], figures
    assert load.longest <= bound + MARGIN, figures
    return figures


@contextlib.contextmanager
def flush_lock(data_dir: Path) -> Iterator[None]:
    """The data dir's flush lock, as every writer takes it first (tiny.flushlock): while it is
    held, no flush of the follower is under way."""
    fd = os.open(layout.lock_path(data_dir), os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


def three_hosts(hosts: Hosts) -> tuple[Server, Server, Server]:
    return hosts.start("h1"), hosts.start("h2"), hosts.start("h3", role="read")


def under_load(
    hosts: Hosts, fault: Callable[[Load], float], heal: Callable[[], None], ingest: tuple[Server, Server]
) -> tuple[Load, float]:
    """The load on ``ingest``'s ports, BEFORE seconds, ``fault(load)`` (which returns the moment
    the fault began, once it is over), load until ingest resumed after it, ``heal()``; the load
    (finished) and the moment."""
    load = Load([server.port for server in ingest], a_requests_bound()).start()
    try:
        time.sleep(BEFORE)
        assert load.acked_after(0) > 0, load.answers
        moment = fault(load)
        wait_resumed(load, time.monotonic())
    finally:
        load.stop.set()
        try:
            heal()
        finally:
            load.finish()
    return load, moment


# -- the faults ------------------------------------------------------------------------------


def test_kill_9_of_the_synchronous_standby_under_load_through_hosts_loses_and_doubles_nothing(
    cluster: PgCluster, hosts: Hosts, figures: dict[str, Any]
) -> None:
    """SIGKILL of the synchronous standby's Patroni and PostgreSQL; Patroni makes the other
    standby synchronous (strict mode: commits wait meanwhile, none goes asynchronous)."""
    a, b, c = three_hosts(hosts)
    victim = str(cluster.sync_standby())
    assert victim not in ("None", cluster.primary())

    def fault(load: Load) -> float:
        killed = time.monotonic()
        cluster.kill(victim)
        eventually(lambda: cluster.sync_standby() not in (None, victim), 30, pause=0.2)  # the fault's end
        return killed

    def heal() -> None:
        cluster.restart(victim)
        cluster.wait_healthy(60)

    load, killed = under_load(hosts, fault, heal, (a, b))
    figures.update(check(load, [a, b, c], a), longest_without_ack_s=round(load.gap_after(killed), 2))
    assert load.gap_after(killed) <= RESUME_BOUND


def test_a_primary_frozen_past_its_ttl_under_load_through_hosts_loses_and_doubles_nothing(
    cluster: PgCluster, hosts: Hosts, figures: dict[str, Any]
) -> None:
    """SIGSTOP of the primary (Patroni and PostgreSQL) for 14 s, past Patroni's ttl of 10 s: a
    standby is promoted; then SIGCONT: the old primary is demoted and rejoins."""
    a, b, c = three_hosts(hosts)
    victim = cluster.wait_healthy(60)
    during: list[str | None] = []

    def fault(load: Load) -> float:
        frozen = time.monotonic()
        cluster.stop(victim)
        try:
            while time.monotonic() < frozen + 14.0:
                during.append(cluster.primary())
                time.sleep(0.5)
        finally:
            cluster.cont(victim)
        return frozen

    def heal() -> None:
        cluster.wait_healthy(90)

    load, frozen = under_load(hosts, fault, heal, (a, b))
    figures.update(check(load, [a, b, c], a), longest_without_ack_s=round(load.gap_after(frozen), 2))
    assert any(leader not in (None, victim) for leader in during)  # the precondition: promoted while frozen
    assert load.gap_after(frozen) <= RESUME_BOUND


def test_kill_9_of_an_ingest_host_under_load_loses_and_doubles_nothing_and_it_catches_up(
    cluster: PgCluster, hosts: Hosts, figures: dict[str, Any]
) -> None:
    """SIGKILL of every process of one ingest host (parent, worker, follower) while its flush
    waits for the synchronous standby (whose WAL receiver is frozen meanwhile): the answers
    of the requests in flight there are lost; a keyed one sent again to the other host is
    replayed once the standby goes on, an unkeyed one stays unknown. Clients go to the other
    host; the host is started again on its data dir and catches up."""
    a, b, c = three_hosts(hosts)
    back: list[Server] = []
    took: dict[str, float] = {}
    in_flight: list[threading.Thread] = []

    def fault(load: Load) -> float:
        primary = cluster.wait_healthy(60)
        with wal_receiver_stopped(cluster, str(cluster.sync_standby())):
            for batch, keyed in ((10**7, True), (10**7 + 1, False)):  # sent to a, whatever the load does
                in_flight.append(threading.Thread(target=load.guarded_send, args=(batch, keyed, 0), daemon=True))
                in_flight[-1].start()
            eventually(lambda: cluster.query(primary, _WAITING), 5)  # a flush waits for the standby
            time.sleep(1.0)  # the two batches reached a (a loaded machine may start a thread late)
            killed = time.monotonic()
            a.kill()
        time.sleep(3.0)  # down for a while: the clients find the other host
        restarted = time.monotonic()
        back.append(hosts.start("h1"))
        took["restart_s"] = time.monotonic() - restarted
        behind = applied(b)
        eventually(lambda: applied(back[0]) >= behind, 30, pause=0.1)
        took["caught_up_s"] = time.monotonic() - restarted
        return killed

    def heal() -> None:
        for thread in in_flight:
            thread.join(a_requests_bound() * 3)

    load, killed = under_load(hosts, fault, heal, (a, b))
    figures.update(
        check(load, [back[0], b, c], b),
        restart_to_healthy_s=round(took["restart_s"], 2),
        restart_to_caught_up_s=round(took["caught_up_s"], 2),
        longest_without_ack_s=round(load.gap_after(killed), 2),
    )
    assert load.answers["no answer"] > 0 and load.answers["refused"] > 0  # the precondition: answers lost
    assert 10**7 in load.acked and 10**7 + 1 in load.unknown  # the keyed one retried, the unkeyed one unknown
    assert load.gap_after(killed) <= RESUME_BOUND


def test_a_full_disk_stops_one_hosts_follower_loudly_without_a_partial_batch_and_it_resumes(
    hosts: Hosts, figures: dict[str, Any]
) -> None:
    """h2's data dir on a 16 MB tmpfs, filled by another file: its follower fails every flush
    (ENOSPC), rolls each back, says so on /healthz and in its log, and goes on once the file
    is removed; ingest goes on through both hosts (the commit point is PostgreSQL)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    data = hosts.data_dir("h2")
    data.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tinyfull", str(data)], check=True)
    filler = data / "filler"
    try:
        a, b, c = three_hosts(hosts)
        seen: dict[str, Any] = {}

        def fault(load: Load) -> float:
            full = time.monotonic()
            fill(filler)
            reason = eventually(lambda: "No space left on device" in str(health(b).get("reason")), 15, pause=0.2)
            seen["reported_after_s"] = time.monotonic() - full
            assert reason
            stuck = applied(b)
            eventually(lambda: applied(a) > stuck + 10, 20, pause=0.2)  # others go on; b stays
            with flush_lock(b.data_dir or data):  # no flush under way: what b's files hold now
                held, position = data_files(b), applied(b)
                intent = layout.intent_path(data).read_bytes()[:1]
            seen.update(stuck_at=position, held=held, intent_state=intent, others_at=applied(a))
            freed = time.monotonic()
            filler.unlink()
            eventually(lambda: applied(b) >= applied(a) and health(b)["status"] == "ok", 30, pause=0.2)
            seen["resumed_after_s"] = time.monotonic() - freed
            return full

        load, _ = under_load(hosts, fault, lambda: None, (a, b))
        result = check(load, [a, b, c], a)
        final = data_files(a)
    finally:
        filler.unlink(missing_ok=True)
        hosts.close()
        subprocess.run(["umount", "-l", str(data)], check=False)
    held: dict[str, bytes] = seen["held"]
    assert seen["intent_state"] != b"I"  # every failed flush was rolled back and marked undone
    assert all(final[name].startswith(part) for name, part in held.items())  # a prefix of every file
    rows = Counter(ip_id // 1000 for ip_id in ip_ids(held[DAY]))
    assert set(rows.values()) == {ROWS}  # whole batches only
    assert seen["stuck_at"] < seen["others_at"]
    assert "cannot write its files: No space left on device" in "".join(s.log() for s in hosts.started)
    figures.update(
        result,
        full_reported_after_s=round(seen["reported_after_s"], 2),
        stuck_at=seen["stuck_at"],
        others_at_when_freed=seen["others_at"],
        resumed_after_space_freed_s=round(seen["resumed_after_s"], 2),
    )


def fill(path: Path) -> None:
    """Write ``path`` until its file system refuses a byte more (ENOSPC)."""
    chunk = b"\0" * 65536
    with open(path, "wb", buffering=0) as out:
        for size in (65536, 4096, 512, 1):
            with contextlib.suppress(OSError):
                while True:
                    out.write(chunk[:size])

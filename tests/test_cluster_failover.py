"""The commit log under load while a node dies or freezes: nothing acknowledged lost or doubled, no call past its bound.

Nor anything a follower read taken back.

Three writers (three hosts' CommitLogs) commit keyed and unkeyed batches as the sink will, each
retried as a client would: after "nothing kept" (Unavailable, NotCommitted) with the same body,
after "outcome unknown" only with its key (an unkeyed one is then left as it is: it may be in
the log once, or not). A follower reads the log throughout, as a host's follower will. After
the fault, the cluster heals (the victim rejoins) and the whole log is read back.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.cluster_support import NEEDS_CLUSTER, eventually, fresh_database
from tiny.cluster.errors import NotCommitted, OutcomeUnknown, Unavailable
from tiny.cluster.log import Batch, CommitLog
from tiny.cluster.session import Timeouts
from tiny.commit import Claim
from tiny.testing_pg import PgCluster

pytestmark = [pytest.mark.slow, NEEDS_CLUSTER, pytest.mark.timeout(300)]

DAY = "2014-05-04.csv"
WRITERS = 3
RESUME_BOUND = 30.0  # seconds without any acknowledgement the issue allows
BEFORE, AFTER = 2.0, 2.0  # seconds of load before the fault, and after ingest resumed


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgCluster]:
    with PgCluster(tmp_path_factory.mktemp("pg")) as running:
        yield running


@dataclass
class Seen:
    """What the writers were told, and when."""

    written: dict[bytes, int] = field(default_factory=dict)  # body -> position
    replayed: list[bytes] = field(default_factory=list)  # keyed bodies answered from the log
    unknown: list[bytes] = field(default_factory=list)  # unkeyed bodies left with "outcome unknown"
    retries: Counter[str] = field(default_factory=Counter)
    acks: list[float] = field(default_factory=list)  # monotonic times of each acknowledgement
    crashes: list[str] = field(default_factory=list)  # what ended a writer or the follower unexpectedly
    longest_call: float = 0.0
    longest_unavailable: float = 0.0  # calls that found no primary
    bound: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


def write(log: CommitLog, body: bytes, key: str | None, seen: Seen, stop: threading.Event) -> None:
    """Commit one batch as a client retries it, until it is acknowledged (or, unkeyed, unknown)."""
    claim = Claim(key, log.digest(body), b'{"ok":1}') if key else None
    while not stop.is_set():
        began = time.monotonic()
        try:
            done = log.commit([({DAY: body}, claim)])
        except Unavailable as exc:  # nothing kept (NotCommitted too): the same batch again
            outcome: Any = exc
        except OutcomeUnknown as exc:
            outcome = exc
        else:
            outcome = done
        took = time.monotonic() - began
        with seen.lock:
            seen.longest_call = max(seen.longest_call, took)
            if type(outcome) is Unavailable:
                seen.longest_unavailable = max(seen.longest_unavailable, took)
            if isinstance(outcome, Exception):
                seen.retries[type(outcome).__name__] += 1
                if isinstance(outcome, OutcomeUnknown) and claim is None:
                    seen.unknown.append(body)
                    return
            else:
                seen.acks.append(time.monotonic())
                if outcome.decisions[0] is None:
                    seen.written[body] = outcome.position
                else:
                    seen.replayed.append(body)
                return
        time.sleep(0.2)


def guarded(target: Callable[..., None], seen: Seen) -> Callable[..., None]:
    """``target``, with anything it raises recorded in ``seen.crashes`` (a thread's death is silent)."""

    def run(*args: Any) -> None:
        try:
            target(*args)
        except BaseException as exc:
            with seen.lock:
                seen.crashes.append(f"{target.__name__}: {exc!r}")
            raise

    return run


def writer(dsn: str, i: int, seen: Seen, stop: threading.Event) -> None:
    log = CommitLog(dsn, timeouts=Timeouts(commit=8, resolve=4))
    seen.bound = log.bound
    try:
        while not stop.is_set():
            try:
                log.open()
                break
            except Unavailable:
                time.sleep(0.2)
        n = 0
        while not stop.is_set():
            body = f"writer {i} batch {n}\n".encode() * 3
            write(log, body, f"w{i}-{n}" if n % 2 == 0 else None, seen, stop)
            n += 1
    finally:
        log.close()


def follower(dsn: str, got: list[Batch], stop: threading.Event) -> None:
    """Reads the log as a host's follower does, into ``got``."""
    log = CommitLog(dsn, timeouts=Timeouts(read_wait=1.0))
    try:
        while not stop.is_set():
            try:
                if log.digest_key is None:
                    log.open()
                batches = log.read(got[-1].position if got else 0)
            except Unavailable:
                time.sleep(0.2)
                continue
            got.extend(batches)
            if not batches:
                time.sleep(0.05)
    finally:
        log.close()


def read_all(dsn: str) -> list[Batch]:
    log = CommitLog(dsn)
    log.open()
    try:
        batches: list[Batch] = []
        while more := log.read(batches[-1].position if batches else 0):
            batches += more
        return batches
    finally:
        log.close()


def under_load(cluster: PgCluster, fault: Callable[[], None], heal: Callable[[], None]) -> dict[str, Any]:
    """Load, then ``fault()``; load on until ingest has resumed after it for AFTER seconds; then
    ``heal()``; checks every promise and returns the figures."""
    dsn = fresh_database(cluster)
    read_all(dsn)  # creates the schema before the writers race for it
    seen, got, stop, reading = Seen(), [], threading.Event(), threading.Event()
    threads = [
        threading.Thread(target=guarded(writer, seen), args=(dsn, i, seen, stop), daemon=True) for i in range(WRITERS)
    ]
    threads.append(threading.Thread(target=guarded(follower, seen), args=(dsn, got, reading), daemon=True))
    for thread in threads:
        thread.start()
    try:
        time.sleep(BEFORE)
        fault_at = time.monotonic()
        fault()
        over = time.monotonic()
        deadline = over + RESUME_BOUND + AFTER
        while time.monotonic() < deadline:
            resumed = _acks_after(seen, over)
            if resumed and time.monotonic() >= resumed[0] + AFTER:
                break
            time.sleep(0.1)
    finally:
        stop.set()
        for thread in threads[:-1]:
            thread.join(60)  # a call's bound (30 s) and a retry's pause
        try:
            heal()
            log = read_all(dsn)
            deadline = time.monotonic() + 20
            while len(got) < len(log) and time.monotonic() < deadline and threads[-1].is_alive():
                time.sleep(0.1)  # the follower catches up
        finally:
            reading.set()
            threads[-1].join(30)
    assert not [thread for thread in threads if thread.is_alive()]  # every one within its bound
    assert seen.crashes == []
    assert len(got) == len(log)
    return _check(seen, got, log, fault_at)


def _acks_after(seen: Seen, moment: float) -> list[float]:
    with seen.lock:
        return [t for t in seen.acks if t > moment]


def _check(seen: Seen, got: list[Batch], log: list[Batch], fault_at: float) -> dict[str, Any]:
    assert [b.position for b in log] == list(range(1, len(log) + 1))  # gapless
    bodies = Counter(b.files[DAY] for b in log)
    doubled = [body for body, count in bodies.items() if count > 1]
    lost = [body for body in seen.written if bodies[body] != 1] + [b for b in seen.replayed if bodies[b] != 1]
    assert doubled == [] and lost == []
    assert all(log[position - 1].files[DAY] == body for body, position in seen.written.items())
    assert all(bodies[body] <= 1 for body in seen.unknown)
    assert got == log[: len(got)]  # nothing a follower read was taken back
    times = sorted([fault_at, *seen.acks])
    gap = max(b - a for a, b in zip(times, times[1:], strict=False))
    assert gap <= RESUME_BOUND
    assert seen.longest_call <= seen.bound
    assert seen.longest_unavailable <= Timeouts().connect * 3 + 1  # each host tried once
    return {
        "acknowledged": len(seen.written) + len(seen.replayed),
        "replayed_after_unknown": len(seen.replayed),
        "unkeyed_left_unknown": len(seen.unknown),
        "unknown_unkeyed_in_log": sum(bodies[body] for body in seen.unknown),
        "retries": dict(seen.retries),
        "lost": len(lost),
        "doubled": len(doubled),
        "longest_without_ack_s": round(gap, 2),
        "longest_call_s": round(seen.longest_call, 2),
        "longest_unavailable_s": round(seen.longest_unavailable, 2),
        "call_bound_s": round(seen.bound, 1),
        "follower_batches": len(got),
        "log_batches": len(log),
    }


@pytest.mark.extended  # through Tiny hosts by default: tests/test_cluster_faults.py, test_cluster_mode.py
def test_kill_9_of_the_primary_loses_and_doubles_nothing(cluster: PgCluster, figures: dict[str, Any]) -> None:
    """SIGKILL of the primary's Patroni and PostgreSQL under keyed and unkeyed load."""
    victim = cluster.wait_healthy(60)
    standby = cluster.sync_standby()
    promoted: list[str] = []

    def fault() -> None:
        cluster.kill(victim)

    def heal() -> None:
        promoted.append(cluster.wait_primary(30))
        cluster.restart(victim)
        cluster.wait_healthy(60)

    figures.update(under_load(cluster, fault, heal))
    assert promoted[0] == standby != victim  # strict mode: only the synchronous standby is promoted


@pytest.mark.extended  # through Tiny hosts by default: tests/test_cluster_faults.py, test_cluster_mode.py
def test_kill_9_of_the_synchronous_standby_loses_and_doubles_nothing(
    cluster: PgCluster, figures: dict[str, Any]
) -> None:
    """SIGKILL of the synchronous standby's Patroni and PostgreSQL under load."""
    cluster.wait_healthy(60)
    victim = str(cluster.sync_standby())

    def fault() -> None:
        cluster.kill(victim)

    def heal() -> None:
        assert cluster.sync_standby() not in (None, victim)  # Patroni chose the other standby
        cluster.restart(victim)
        cluster.wait_healthy(60)

    figures.update(under_load(cluster, fault, heal))


@pytest.mark.extended  # through Tiny hosts by default: tests/test_cluster_faults.py, test_cluster_mode.py
def test_a_primary_frozen_past_its_lease_then_resumed_loses_and_doubles_nothing(
    cluster: PgCluster, figures: dict[str, Any]
) -> None:
    """SIGSTOP of the primary (Patroni and PostgreSQL) for longer than the ttl, then SIGCONT."""
    victim = cluster.wait_healthy(60)
    frozen_for = 14.0  # past ttl 10 s: the leader key expires and a standby is promoted
    during: list[str | None] = []

    def fault() -> None:
        cluster.stop(victim)
        deadline = time.monotonic() + frozen_for
        while time.monotonic() < deadline:
            during.append(cluster.primary())
            time.sleep(0.5)
        cluster.cont(victim)

    def heal() -> None:
        cluster.wait_healthy(90)
        writable = [name for name in cluster.nodes if cluster.query(name, "SELECT pg_is_in_recovery()") == [(False,)]]
        assert writable == [cluster.primary()] and writable != [victim]  # demoted, one primary

    figures.update(under_load(cluster, fault, heal))
    assert any(leader not in (None, victim) for leader in during)  # promoted while it was frozen


def test_a_commit_lost_with_a_primary_that_never_sent_it_is_settled_as_not_committed(
    cluster: PgCluster, figures: dict[str, Any]
) -> None:
    """The primary's WAL senders frozen (its COMMIT waits for the standby), then the primary
    killed: the new primary, on a new timeline, lacks the flush: not committed, and the retry
    with the same key writes it."""
    victim = cluster.wait_healthy(60)
    dsn = fresh_database(cluster)
    log = CommitLog(dsn, timeouts=Timeouts(commit=30, resolve=25))
    log.open()
    try:
        key = Claim("k", log.digest(b"row\n"), b'{"ok":1}')
        log.commit([({DAY: b"before\n"}, None)])
        senders = [int(pid) for (pid,) in cluster.query(victim, "SELECT pid FROM pg_stat_replication") or []]
        assert len(senders) == 2
        for pid in senders:
            os.kill(pid, signal.SIGSTOP)
        with ThreadPoolExecutor(1) as pool:
            lost = pool.submit(log.commit, [({DAY: b"row\n"}, key)])
            eventually(lambda: cluster.query(victim, _WAITING), 5)  # COMMIT sent, waiting for a standby
            killed = time.monotonic()
            cluster.kill(victim)  # SIGKILL takes the frozen senders too: no standby ever got the flush
            with pytest.raises(NotCommitted, match="not on the new primary") as raised:
                lost.result(timeout=60)
            settled = time.monotonic() - killed
        assert cluster.primary() != victim
        again = log.commit([({DAY: b"row\n"}, key)])
        assert again.decisions == [None]  # the key was not kept either: written now, once
    finally:
        log.close()
        cluster.restart(victim)
        cluster.wait_healthy(90)
    assert [b.files[DAY] for b in read_all(dsn)] == [b"before\n", b"row\n"]
    figures.update(settled_after_s=round(settled, 1), message=str(raised.value)[:200])


_WAITING = "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'"

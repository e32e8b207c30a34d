"""The commit log on a real cluster (etcd, three PostgreSQL nodes under Patroni): keys, order, followers, bounds.

One cluster for the module (tiny.testing_pg), a fresh database per test. The key rules are the
local journal's (tests/test_keys.py, tests/test_local_commit.py, tests/test_idempotency.py),
held across hosts: two CommitLogs are two hosts.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.cluster_support import (
    NEEDS_CLUSTER,
    eventually,
    fresh_database,
    on_primary,
    wal_receiver_stopped,
    with_params,
)
from tiny.cluster.errors import ClusterError, LogTrimmed, NotCommitted, OutcomeUnknown, Unavailable
from tiny.cluster.log import Batch, CommitLog
from tiny.cluster.session import Timeouts
from tiny.commit import Claim, Stored
from tiny.testing_pg import PgCluster

pytestmark = [pytest.mark.slow, NEEDS_CLUSTER, pytest.mark.timeout(240)]

DAY = "2014-05-04.csv"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgCluster]:
    with PgCluster(tmp_path_factory.mktemp("pg")) as running:
        yield running


@pytest.fixture
def dsn(cluster: PgCluster) -> str:
    cluster.wait_healthy(30)  # a test that froze a standby leaves it streaming again
    return fresh_database(cluster)


@pytest.fixture
def open_log(dsn: str) -> Iterator[Callable[..., CommitLog]]:
    """Opens CommitLogs on the test's database (each one a host); closes them all after."""
    logs: list[CommitLog] = []

    def make(**kwargs: Any) -> CommitLog:
        log = CommitLog(kwargs.pop("dsn", dsn), **kwargs)
        logs.append(log)
        log.open()
        return log

    yield make
    for log in logs:
        log.close()


def claim(log: CommitLog, key: str, body: bytes, answer: bytes = b'{"ok":1}') -> Claim:
    return Claim(key, log.digest(body), answer)


def all_batches(log: CommitLog) -> list[Batch]:
    batches: list[Batch] = []
    while more := log.read(batches[-1].position if batches else 0):
        batches += more
    return batches


# -- keys ------------------------------------------------------------------------------------


def test_the_first_append_of_a_key_in_a_flush_decides(open_log: Callable[..., CommitLog]) -> None:
    log = open_log()
    first, second = claim(log, "k", b"one\n"), claim(log, "k", b"two\n", b'{"other":1}')
    done = log.commit([({DAY: b"one\n"}, first), ({DAY: b"two\n"}, second)])
    assert done.decisions == [None, Stored(first.digest, first.answer, done.position)]
    assert all_batches(log) == [Batch(done.position or 0, {DAY: b"one\n"})]


def test_a_stored_key_is_answered_from_the_log_and_writes_nothing(open_log: Callable[..., CommitLog]) -> None:
    host1, host2 = open_log(), open_log()
    written = host1.commit([({DAY: b"row\n"}, claim(host1, "k", b"row\n"))])
    again = host2.commit([({DAY: b"row\n"}, claim(host2, "k", b"row\n"))])
    assert again.decisions == [Stored(host1.digest(b"row\n"), b'{"ok":1}', written.position)]
    assert again.position is None and again.held == {"k": written.position}
    assert [b.position for b in all_batches(host2)] == [written.position]


def test_a_replay_of_a_key_whose_flush_id_was_forgotten_says_the_trimmed_boundary(
    open_log: Callable[..., CommitLog], dsn: str
) -> None:
    log = open_log()
    written = log.commit([({DAY: b"row\n"}, claim(log, "k", b"row\n"))])
    log.report("h1", written.position or 0)
    log.retain()
    on_primary(dsn, "DELETE FROM tiny.flushes")  # as retention forgets flush ids an hour after their trim
    again = log.commit([({DAY: b"row\n"}, claim(log, "k", b"row\n"))])
    assert again.decisions[0] is not None and again.decisions[0].position == written.position == 1


def test_another_body_under_a_stored_key_gets_the_stored_digest_and_writes_nothing(
    open_log: Callable[..., CommitLog],
) -> None:
    log = open_log()
    log.commit([({DAY: b"first\n"}, claim(log, "k", b"first\n"))])
    other = claim(log, "k", b"second\n")
    done = log.commit([({DAY: b"second\n"}, other)])
    stored = done.decisions[0]
    assert stored is not None and stored.digest == log.digest(b"first\n") != other.digest  # the sink answers 422
    assert b"second" not in b"".join(b.files[DAY] for b in all_batches(log))


def test_a_key_past_the_window_is_written_again(open_log: Callable[..., CommitLog], dsn: str) -> None:
    log = open_log(window=0.5)
    first = log.commit([({DAY: b"row\n"}, claim(log, "k", b"row\n"))])
    time.sleep(0.6)
    again = log.commit([({DAY: b"row\n"}, claim(log, "k", b"row\n"))])
    assert again.decisions == [None] and again.position == (first.position or 0) + 1
    assert on_primary(dsn, "SELECT count(*), (SELECT keys FROM tiny.head) FROM tiny.idempotency_keys") == [(1, 1)]


def test_the_digest_is_keyed_by_the_clusters_secret_shared_by_every_host(
    open_log: Callable[..., CommitLog], cluster: PgCluster
) -> None:
    host1, host2 = open_log(), open_log()
    elsewhere = open_log(dsn=fresh_database(cluster))
    assert host1.cluster_id == host2.cluster_id != elsewhere.cluster_id
    assert host1.digest(b"body") == host2.digest(b"body") != elsewhere.digest(b"body")
    assert len(host1.digest(b"body")) == 16


def test_two_hosts_claiming_the_same_keys_in_opposite_orders_never_deadlock_and_one_writes(
    open_log: Callable[..., CommitLog],
) -> None:
    hosts = [open_log(), open_log()]
    rounds, per_flush = 30, 32
    outcomes: list[list[Any]] = [[], []]
    together = threading.Barrier(2, timeout=30)

    def run(i: int) -> None:
        for r in range(rounds):
            together.wait()  # each round's two flushes claim at the same time
            keys = [f"r{r}-k{k}" for k in range(per_flush)]
            keys = keys if i == 0 else keys[::-1]
            appends = [({DAY: f"{key} host{i}\n".encode()}, claim(hosts[i], key, key.encode())) for key in keys]
            outcomes[i].append((keys, hosts[i].commit(appends)))

    with ThreadPoolExecutor(2) as pool:
        for future in [pool.submit(run, i) for i in range(2)]:
            future.result(timeout=120)  # a NotCommitted (deadlock detected) would raise here
    writers: dict[str, int] = {}
    for i, done in enumerate(outcomes):
        for keys, committed in done:
            for key, decision in zip(keys, committed.decisions, strict=True):
                if decision is None:
                    assert key not in writers, f"{key} written twice"
                    writers[key] = i
    assert len(writers) == rounds * per_flush
    rows = b"".join(b.files[DAY] for b in all_batches(hosts[0])).splitlines()
    assert len(rows) == rounds * per_flush


# -- the global order ------------------------------------------------------------------------


def test_positions_are_gapless_and_follow_the_commit_order_under_concurrent_hosts(
    open_log: Callable[..., CommitLog],
) -> None:
    hosts, flushes = [open_log() for _ in range(4)], 40
    got: dict[int, bytes] = {}
    lock = threading.Lock()

    def run(i: int) -> None:
        for n in range(flushes):
            body = f"host{i} flush{n}\n".encode()
            keyed = claim(hosts[i], f"h{i}-{n}", body) if n % 2 else None
            position = hosts[i].commit([({DAY: body}, keyed)]).position
            assert position is not None
            with lock:
                assert position not in got
                got[position] = body

    with ThreadPoolExecutor(4) as pool:
        for future in [pool.submit(run, i) for i in range(4)]:
            future.result(timeout=120)
    assert sorted(got) == list(range(1, 4 * flushes + 1))
    batches = all_batches(hosts[0])
    assert [b.position for b in batches] == sorted(got)
    assert all(b.files == {DAY: got[b.position]} for b in batches)


def test_a_follower_reads_in_order_as_much_as_max_bytes_and_at_least_one_batch(
    open_log: Callable[..., CommitLog],
) -> None:
    log = open_log()
    for n in range(5):
        log.commit([({DAY: bytes([65 + n]) * 100, "rejects/2014-05-04.ndjson": b"{}\n"}, None)])
    assert [b.position for b in log.read(0, max_bytes=250)] == [1, 2, 3]  # 103 bytes each: 0, 103, 206 < 250
    assert [b.position for b in log.read(3, max_bytes=1)] == [4]
    assert log.read(5) == []
    assert list(log.read(4)[0].files) == [DAY, "rejects/2014-05-04.ndjson"]


def test_a_replay_only_flush_still_waits_for_the_synchronous_standby(
    open_log: Callable[..., CommitLog], cluster: PgCluster
) -> None:
    log = open_log()
    key = claim(log, "k", b"row\n")
    written = log.commit([({DAY: b"row\n"}, key)])
    with ThreadPoolExecutor(1) as pool:
        with wal_receiver_stopped(cluster, str(cluster.sync_standby())):
            replay = pool.submit(log.commit, [({DAY: b"row\n"}, key)])
            time.sleep(1.0)
            assert not replay.done()  # its COMMIT waits for the standby, as a write's does
        assert replay.result(timeout=10).decisions == [Stored(key.digest, key.answer, written.position)]


def test_a_batch_committed_only_on_the_primary_is_not_read_until_a_standby_has_it(
    open_log: Callable[..., CommitLog], cluster: PgCluster, dsn: str
) -> None:
    writer = open_log(timeouts=Timeouts(commit=20, resolve=1))
    follower = open_log(timeouts=Timeouts(read_wait=0.5))
    writer.commit([({DAY: b"durable\n"}, None)])
    standby = str(cluster.sync_standby())
    with ThreadPoolExecutor(1) as pool, wal_receiver_stopped(cluster, standby):
        local = pool.submit(writer.commit, [({DAY: b"local only\n"}, None)])
        waiting = eventually(
            lambda: on_primary(dsn, "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'"), 5
        )
        on_primary(dsn, "SELECT pg_cancel_backend(%s)", (waiting[0][0],))  # COMMIT returns, with a WARNING
        with pytest.raises(OutcomeUnknown):
            local.result(timeout=10)  # never "written"
        assert on_primary(dsn, "SELECT count(*) FROM tiny.flushes WHERE position = 2") == [(1,)]  # on the primary
        began = time.monotonic()
        assert follower.read(1) == []
        assert follower.read(0) == []  # a read is all or nothing: position 1 waits with 2
        assert time.monotonic() - began >= 0.9  # each waited its read_wait for the standby
    assert [b.files for b in eventually(lambda: follower.read(1), 10)] == [{DAY: b"local only\n"}]


def test_a_commit_whose_answer_was_lost_is_settled_as_written_once_the_standby_has_it(
    open_log: Callable[..., CommitLog], cluster: PgCluster, dsn: str
) -> None:
    log = open_log(timeouts=Timeouts(commit=20, resolve=8))
    with ThreadPoolExecutor(1) as pool:
        with wal_receiver_stopped(cluster, str(cluster.sync_standby())):
            lost = pool.submit(log.commit, [({DAY: b"row\n"}, None)])
            waiting = eventually(
                lambda: on_primary(dsn, "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'"), 5
            )
            on_primary(dsn, "SELECT pg_terminate_backend(%s)", (waiting[0][0],))  # the answer is lost
            time.sleep(0.5)
            assert not lost.done()  # settling: on the primary, waiting for the standby
        assert lost.result(timeout=10).position == 1


def test_head_is_the_newest_position_the_standby_has(open_log: Callable[..., CommitLog]) -> None:
    log = open_log()
    assert log.head() == 0
    for _ in range(3):
        log.commit([({DAY: b"row\n"}, None)])
    log.commit([({DAY: b"row\n"}, claim(log, "k", b"row\n"))])
    log.commit([({DAY: b"row\n"}, claim(log, "k", b"row\n"))])  # a replay: no position
    assert log.head() == 4


# -- retention -------------------------------------------------------------------------------


def test_batches_are_kept_until_every_follower_seen_recently_applied_them(
    open_log: Callable[..., CommitLog], dsn: str
) -> None:
    log = open_log()
    for _ in range(6):
        log.commit([({DAY: b"row\n"}, None)])
    assert log.retain(stale_after=60).batches == 0  # no follower yet: nothing is known applied
    log.report("gone", 1)
    time.sleep(1.1)
    log.report("host1", 5)
    log.report("host2", 3)
    assert log.retain(stale_after=60).batches == 1  # "gone" still holds from 1
    assert log.retain(stale_after=1).batches == 2  # no longer: host2's 3
    assert on_primary(dsn, "SELECT trimmed FROM tiny.retention") == [(3,)]
    assert [b.position for b in log.read(3)] == [4, 5, 6]
    with pytest.raises(LogTrimmed) as trimmed:
        log.read(1)
    assert trimmed.value.oldest == 4


def test_a_follower_reporting_past_the_head_trims_nothing_beyond_it(
    open_log: Callable[..., CommitLog], dsn: str
) -> None:
    log = open_log()
    for _ in range(3):
        log.commit([({DAY: b"row\n"}, None)])
    log.report("confused", 100)
    assert log.retain().batches == 3
    log.commit([({DAY: b"next\n"}, None)])
    assert [b.files for b in log.read(3)] == [{DAY: b"next\n"}]
    assert on_primary(dsn, "SELECT trimmed FROM tiny.retention") == [(3,)]


def test_keys_expire_oldest_first_in_bounded_steps(open_log: Callable[..., CommitLog], dsn: str) -> None:
    log = open_log(window=1.0, max_keys=10_000)
    for n in range(25):
        log.commit([({DAY: b"row\n"}, claim(log, f"k{n}", b"row\n"))])
    assert log.retain(limit=10).keys == 0  # none past the window
    time.sleep(1.1)
    assert [log.retain(limit=10).keys for _ in range(4)] == [10, 10, 5, 0]
    assert on_primary(dsn, "SELECT count(*), (SELECT keys FROM tiny.head) FROM tiny.idempotency_keys") == [(0, 0)]


def test_past_max_keys_the_oldest_go_first(open_log: Callable[..., CommitLog], dsn: str) -> None:
    log = open_log(max_keys=5)
    for n in range(8):
        log.commit([({DAY: b"row\n"}, claim(log, f"k{n}", b"row\n"))])
    assert log.retain(limit=100).keys == 3
    left = on_primary(dsn, "SELECT key FROM tiny.idempotency_keys ORDER BY seq")
    assert [key for (key,) in left] == [f"k{n}" for n in range(3, 8)]


# -- refusals and bounds ---------------------------------------------------------------------


def test_a_schema_of_another_version_is_refused(open_log: Callable[..., CommitLog], dsn: str) -> None:
    open_log()
    on_primary(dsn, "UPDATE tiny.meta SET value = '99' WHERE name = 'schema_version'")
    with pytest.raises(ClusterError, match="version 99"):
        open_log()


def test_a_role_that_cannot_see_the_standbys_positions_is_refused(open_log: Callable[..., CommitLog], dsn: str) -> None:
    role = "plain_" + str(conninfo_to_dict(dsn)["dbname"])
    on_primary(dsn, f"CREATE ROLE {role} LOGIN PASSWORD 'plain'")
    on_primary(dsn, f"GRANT CREATE ON DATABASE {conninfo_to_dict(dsn)['dbname']} TO {role}")
    with pytest.raises(ClusterError, match="pg_read_all_stats"):
        open_log(dsn=with_params(dsn, user=role, password="plain"))


def test_a_primary_that_names_no_synchronous_standby_is_refused_and_never_acknowledged(
    open_log: Callable[..., CommitLog], cluster: PgCluster, dsn: str
) -> None:
    log = open_log(timeouts=Timeouts(resolve=1))
    primary = str(cluster.primary())
    cluster.query(primary, "ALTER SYSTEM SET synchronous_standby_names = ''")  # overrides Patroni's
    try:
        cluster.query(primary, "SELECT pg_reload_conf()")
        eventually(lambda: on_primary(dsn, "SHOW synchronous_standby_names") == [("",)], 5)
        with pytest.raises(OutcomeUnknown, match="no synchronous standby"):
            log.commit([({DAY: b"row\n"}, None)])  # committed on the primary alone: not "written"
        with pytest.raises(ClusterError, match="synchronous"):
            open_log()
    finally:
        cluster.query(primary, "ALTER SYSTEM RESET synchronous_standby_names")
        cluster.query(primary, "SELECT pg_reload_conf()")
    eventually(lambda: on_primary(dsn, "SHOW synchronous_standby_names") != [("",)], 5)


def test_no_primary_among_the_hosts_is_unavailable_within_the_connect_bound(cluster: PgCluster, tmp_path: Path) -> None:
    standbys = [name for name in cluster.nodes if name != cluster.primary()]
    silent = socket.socket()  # accepts connections (the kernel does) and never answers: a frozen host
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    ports = [cluster.nodes[name].pg_port for name in standbys] + [silent.getsockname()[1]]
    log = CommitLog(with_params(cluster.dsn, port=",".join(map(str, ports))))
    began = time.monotonic()
    try:
        with pytest.raises(Unavailable) as raised:
            log.open()
    finally:
        log.close()
        silent.close()
    took = time.monotonic() - began
    assert raised.value.retry_after == Timeouts().retry_after
    assert 2 <= took <= Timeouts().connect * 3 + 1  # the silent host costs its connect_timeout, once


def test_a_commit_that_the_standby_never_confirms_ends_within_its_bound_unknown_and_uncancelled(
    open_log: Callable[..., CommitLog], cluster: PgCluster, dsn: str
) -> None:
    log = open_log(timeouts=Timeouts(commit=2, resolve=1))
    with wal_receiver_stopped(cluster, str(cluster.sync_standby())):
        began = time.monotonic()
        with pytest.raises(OutcomeUnknown):
            log.commit([({DAY: b"row\n"}, claim(log, "k", b"row\n"))])
        took = time.monotonic() - began
        # not cancelled: its backend still waits for the standby, the flush visible nowhere
        assert on_primary(dsn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'") == [(1,)]
        assert on_primary(dsn, "SELECT count(*) FROM tiny.flushes") == [(0,)]
    assert 2 <= took <= 2 + 1 + Timeouts().connect * 3 + 1  # COMMIT's deadline, settling, one reconnect
    assert took <= log.bound
    eventually(lambda: on_primary(dsn, "SELECT count(*) FROM tiny.flushes") == [(1,)], 10)  # it commits later


def test_a_commit_past_its_deadline_is_settled_once_its_backend_commits(
    open_log: Callable[..., CommitLog], cluster: PgCluster
) -> None:
    log = open_log(timeouts=Timeouts(commit=1, resolve=8))
    with ThreadPoolExecutor(1) as pool:
        with wal_receiver_stopped(cluster, str(cluster.sync_standby())):
            late = pool.submit(log.commit, [({DAY: b"row\n"}, claim(log, "k", b"row\n"))])
            time.sleep(2.5)  # COMMIT's deadline passed: settling, the old backend still waiting
            assert not late.done()
        assert late.result(timeout=10).decisions == [None]  # settled: its backend committed, the standby has it


def test_a_statement_refused_before_commit_keeps_nothing(open_log: Callable[..., CommitLog], dsn: str) -> None:
    log = open_log()
    on_primary(dsn, "ALTER TABLE tiny.chunks ADD CONSTRAINT small CHECK (length(data) < 10)")
    with pytest.raises(NotCommitted):
        log.commit([({DAY: b"a row that is too long\n"}, claim(log, "k", b"x"))])
    assert on_primary(dsn, "SELECT count(*) FROM tiny.idempotency_keys") == [(0,)]
    assert log.commit([({DAY: b"short\n"}, claim(log, "k", b"x"))]).decisions == [None]

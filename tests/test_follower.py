"""A host's follower on a real log: the batches in order, the header once, the position with the bytes, names checked.

The log is the session's PostgreSQL cluster (a fresh database per test); the batches are put
in it with tiny.cluster.log.CommitLog, as an ingest host's sink does; the follower is
tiny.follower.Follower on a data dir of the test's, driven a turn at a time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster_support import NEEDS_CLUSTER, fresh_database, on_primary, without_password
from tiny import config, layout
from tiny.cluster.errors import LogTrimmed
from tiny.cluster.errors import Unavailable as LogUnavailable
from tiny.cluster.log import Batch, CommitLog
from tiny.follower import MAX_FLUSH_FILES, REPORT_EVERY, Follower, Unfollowable, groups
from tiny.testing_pg import PgCluster

pytestmark = [pytest.mark.slow, NEEDS_CLUSTER, pytest.mark.timeout(240)]

DAY, NEXT = "2014-05-04.csv", "2014-05-05.csv"


@pytest.fixture
def dsn(pg_cluster: PgCluster, tmp_path: Path) -> str:
    pg_cluster.wait_healthy(30)
    return without_password(pg_cluster, fresh_database(pg_cluster), tmp_path)


@pytest.fixture
def log(dsn: str) -> Iterator[CommitLog]:
    opened = CommitLog(dsn)
    opened.open()
    yield opened
    opened.close()


@pytest.fixture
def follower(dsn: str, tmp_path: Path) -> Iterator[Callable[..., Follower]]:
    made: list[Follower] = []

    def make(name: str = "h1", data: str = "data") -> Follower:
        options = config.parse(["--cluster", dsn, "--host-name", name, "--data-dir", str(tmp_path / name / data)], {})
        one = Follower(options, listen=False)
        made.append(one)
        return one

    yield make
    for one in made:
        one.close()


def put(log: CommitLog, files: dict[str, bytes]) -> int:
    """One flush of one append to the log, as a sink's; its position."""
    position = log.commit([(files, None)]).position
    assert position is not None
    return position


def reported(one: Follower) -> Follower:
    """``one`` opened (reporting its position then), the log's batches applied, and the new
    position reported: a second later, since a follower reports a new position at most once a second."""
    one.open()
    one.step()
    time.sleep(REPORT_EVERY)
    one.idle()
    return one


def test_the_batches_are_appended_in_order_each_day_file_opened_by_its_header(
    log: CommitLog, follower: Callable[..., Follower]
) -> None:
    put(log, {DAY: b"a\n"})
    put(log, {DAY: b"b\n", NEXT: b"c\n"})
    put(log, {"rejects/2014-05-04.ndjson": b'{"line":1}\n', DAY: b"d\n"})
    one = follower()
    one.open()
    assert one.step() and one.applied == 3
    data = one.config.data_dir
    assert (data / DAY).read_bytes() == layout.HEADER + b"a\nb\nd\n"
    assert (data / NEXT).read_bytes() == layout.HEADER + b"c\n"
    assert (data / "rejects/2014-05-04.ndjson").read_bytes() == b'{"line":1}\n'  # no header: not a day file
    assert not one.step()


def test_the_position_is_committed_with_the_bytes_and_reported_to_the_log(
    log: CommitLog, follower: Callable[..., Follower], dsn: str
) -> None:
    for n in range(4):
        put(log, {DAY: b"%d\n" % n})
    one = follower()
    one.open()
    one.step()
    with one.local.locked():
        assert one.local.intent.committed_position() == 4
    time.sleep(REPORT_EVERY)  # reports are at most once a second
    one.idle()
    assert on_primary(dsn, "SELECT name, applied FROM tiny.followers") == [("h1", 4)]
    again = follower()  # the same data dir, as a restarted follower opens it
    again.open()
    assert again.applied == 4 and not again.step()


@pytest.mark.parametrize(
    "name",
    [
        "../escape.csv",
        "/tmp/escape.csv",
        "rejects/../../escape.ndjson",
        "2014-05-04.csv/x",
        "\u0662014-05-04.csv",
        "x.csv",
    ],
)
def test_a_batch_naming_anything_but_a_data_file_stops_the_follower_before_it_writes(
    log: CommitLog, follower: Callable[..., Follower], name: str, tmp_path: Path
) -> None:
    put(log, {DAY: b"a\n"})
    put(log, {name: b"evil\n", DAY: b"b\n"})
    put(log, {DAY: b"c\n"})
    one = follower()
    one.open()
    with pytest.raises(Unfollowable, match="at position 2 names"):
        one.step()
    assert one.applied == 0 and not (one.config.data_dir / DAY).exists()  # nothing of that read written
    assert not list(tmp_path.rglob("escape*")) and not list(tmp_path.rglob("x.csv"))


def test_a_data_dir_the_log_was_trimmed_past_is_told_which_positions_are_gone(
    log: CommitLog, follower: Callable[..., Follower]
) -> None:
    for n in range(3):
        put(log, {DAY: b"%d\n" % n})
    log.report("h1", 3)
    log.retain()
    late = follower("h2")
    late.open()
    with pytest.raises(LogTrimmed, match="no longer holds positions 1-3"):
        late.step()


def test_groups_keep_each_batch_whole_within_the_files_and_bytes_of_a_flush() -> None:
    many = {f"2014-01-{day:02d}.csv": b"x\n" for day in range(1, MAX_FLUSH_FILES + 2)}
    batches = [Batch(1, {DAY: b"a\n"}), Batch(2, {NEXT: b"b\n"}), Batch(3, many), Batch(4, {DAY: b"c\n"})]
    cut = groups(batches)
    assert [[b.position for b in group] for group in cut] == [[1, 2], [3], [4]]


def test_an_idle_follower_is_still_seen_so_retention_keeps_the_log_for_it(
    log: CommitLog, dsn: str, tmp_path: Path
) -> None:
    """Retention keeps batches for the followers seen within --follower-retention. A follower
    that reported only a new position went unseen on an idle cluster: when traffic came back
    while that host was down for less than the retention, the first host to apply trimmed the
    log past it and it could not start again."""
    put(log, {DAY: b"a\n"})
    options = config.parse(
        ["--cluster", dsn, "--host-name", "h1", "--data-dir", str(tmp_path / "h1"), "--follower-retention", "2"], {}
    )
    one = Follower(options, listen=False)
    try:
        one.open()
        assert one.step() and one.applied == 1
        time.sleep(REPORT_EVERY)  # reports of a new position are at most once a second
        one.idle()
        query = "SELECT applied, extract(epoch FROM seen) FROM tiny.followers WHERE name = 'h1'"
        [(applied, first_seen)] = on_primary(dsn, query)
        assert applied == 1  # the precondition: its position reported
        time.sleep(0.7)  # past a quarter of the retention, nothing new to apply
        one.idle()
        [(applied, seen)] = on_primary(dsn, query)
        assert applied == 1 and seen > first_seen
    finally:
        one.close()


def test_a_second_host_reporting_under_the_same_name_is_told_in_the_followers_status(
    log: CommitLog, follower: Callable[..., Follower]
) -> None:
    """Two hosts given one --host-name (two data dirs, one name): each report overwrites the
    other's position, so retention would keep the log only for whichever reported last. The
    first to find a position it never reported logs it and sets its gauge, and says so until it
    restarts; its status stays clear (its files are right: the host's reads go on)."""
    assert log.report("keeper", 0) is None  # a name the log held no position for; retention trims nothing now
    for n in range(4):
        put(log, {DAY: b"%d\n" % n})
    first = reported(follower("h1"))  # reports 0, then 4
    put(log, {DAY: b"4\n"})
    put(log, {DAY: b"5\n"})
    # The same name, another data dir: it reports 0 over the first's 4 (its first report, nothing of
    # its own to tell by), then 6 over its own 0 (the second's positions: 0, 6; the first's: 0, 4).
    second = reported(follower("h1", "data2"))
    assert second.clash == "" and first.clash == ""
    put(log, {DAY: b"6\n"})
    first.step()  # applies 5 to 7 and reports 7 over the second's 6, a position it never reported
    assert first.applied == 7
    assert "another host reports to the log as follower 'h1': it held position 6" in first.clash
    assert first.metrics.name_clash._value.get() == 1  # (prometheus_client's own value)
    assert first.status.progress().error == ""  # (the reads and /healthz go by it)
    put(log, {DAY: b"7\n"})
    time.sleep(REPORT_EVERY)
    first.step()  # reports 8, over its own 7 now: it still says so
    assert first.clash and first.metrics.name_clash._value.get() == 1


def test_a_host_finding_an_older_position_of_its_own_in_the_log_sees_no_clash(
    log: CommitLog, follower: Callable[..., Follower], dsn: str
) -> None:
    """A failover can lose a follower's newest report (reports do not wait for the standby):
    the log then holds a position it reported before, which is no other host's."""
    put(log, {DAY: b"a\n"})
    one = reported(follower("h1"))  # reports 0, then 1
    on_primary(dsn, "UPDATE tiny.followers SET applied = 0 WHERE name = 'h1'")  # as the failover left it
    put(log, {DAY: b"b\n"})
    time.sleep(REPORT_EVERY)
    one.step()  # reports 2 over its own 0
    assert on_primary(dsn, "SELECT applied FROM tiny.followers WHERE name = 'h1'") == [(2,)]
    assert one.clash == "" and one.status.progress().error == ""


def test_a_report_whose_answer_was_lost_is_no_clash_when_sent_again(
    log: CommitLog, follower: Callable[..., Follower]
) -> None:
    """A report that committed but whose answer was lost (the connection dropped after COMMIT):
    the same position, sent again, finds itself in the log, which is no other host's."""
    put(log, {DAY: b"a\n"})
    one = follower("h1")
    one.open()
    one.step()
    sent = one.log.report

    def committed_then_lost(name: str, applied: int) -> int | None:
        sent(name, applied)
        raise LogUnavailable("the primary failed during a report: connection lost", 1)

    one.log.report = committed_then_lost  # type: ignore[method-assign]
    time.sleep(REPORT_EVERY)
    with pytest.raises(LogUnavailable):
        one.idle()
    one.log.report = sent  # type: ignore[method-assign]
    time.sleep(REPORT_EVERY)
    one.idle()  # reports 1 again, over its own 1
    assert one.clash == ""


def test_a_restarted_follower_whose_first_report_failed_sees_no_clash_in_its_last_runs_position(
    log: CommitLog, follower: Callable[..., Follower]
) -> None:
    """The log holds what the host's previous run reported last (behind its files: a stop sends
    no report). Until a report of this run has returned, that position is not checked: a first
    report that failed (no primary yet) does not make the next one take it for another host's."""
    put(log, {DAY: b"a\n"})
    before = follower("h1")
    before.open()  # reports 0
    put(log, {DAY: b"b\n"})
    before.step()  # applies 1 and 2, reports nothing yet (at most once a second)
    before.close()
    after = follower("h1")  # the same host, restarted on the same data dir
    sent = after.log.report

    def no_primary(name: str, applied: int) -> int | None:
        raise LogUnavailable("no PostgreSQL primary reachable", 1)

    after.log.report = no_primary  # type: ignore[method-assign]
    with pytest.raises(LogUnavailable):
        after.open()
    after.log.report = sent  # type: ignore[method-assign]
    time.sleep(REPORT_EVERY)
    after.idle()  # reports 2 over the previous run's 0
    assert after.applied == 2 and after.clash == ""


def test_a_restarted_follower_whose_first_report_a_failover_lost_sees_no_clash(
    log: CommitLog, follower: Callable[..., Follower], dsn: str
) -> None:
    """Its first report returned, then a failover lost it (reports do not wait for the
    standby): the log shows the previous run's last position again, which is no other host's."""
    put(log, {DAY: b"a\n"})
    before = reported(follower("h1"))  # reports 0, then 1
    put(log, {DAY: b"b\n"})
    before.step()  # applies 2, reports nothing yet
    before.close()
    after = follower("h1")
    after.open()  # reports 2 over the previous run's 1
    on_primary(dsn, "UPDATE tiny.followers SET applied = 1 WHERE name = 'h1'")  # as a failover left it
    put(log, {DAY: b"c\n"})
    time.sleep(REPORT_EVERY)
    after.step()  # reports 3 over the previous run's 1
    assert after.applied == 3 and after.clash == ""

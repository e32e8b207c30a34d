"""Cluster mode's commit point on a real log: what a flush answers, its bounds, the data dir's binding.

The session's PostgreSQL cluster, a fresh database per test; "no primary" is a DSN whose every
node is a port where nothing listens (as a cluster whose nodes are all down looks to libpq).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cluster_support import NEEDS_CLUSTER, fresh_database, on_primary, without_password
from tiny import layout
from tiny.commit import Claim, Refused, Stored, Unavailable
from tiny.commit.cluster import ClusterCommit
from tiny.commit.local import LocalCommit
from tiny.testing import free_port
from tiny.testing_pg import PgCluster

pytestmark = [pytest.mark.slow, NEEDS_CLUSTER, pytest.mark.timeout(240)]

DAY = "2014-05-04.csv"


@dataclass(frozen=True)
class Append:
    chunks: dict[str, bytes]
    claim: Claim | None = None


@pytest.fixture
def dsn(pg_cluster: PgCluster, tmp_path: Path) -> str:
    pg_cluster.wait_healthy(30)
    return without_password(pg_cluster, fresh_database(pg_cluster), tmp_path)


@pytest.fixture
def commit_point(dsn: str, tmp_path: Path) -> Iterator[Callable[..., ClusterCommit]]:
    made: list[ClusterCommit] = []

    def make(data: Path | None = None, through: str = dsn, **kwargs: object) -> ClusterCommit:
        one = ClusterCommit(data or tmp_path / "data", through, **kwargs)  # type: ignore[arg-type]
        made.append(one)
        one.open()
        return one

    yield make
    for one in made:
        one.close()


def nowhere() -> str:
    ports = ",".join(str(free_port()) for _ in range(3))
    return f"host=127.0.0.1,127.0.0.1,127.0.0.1 port={ports} dbname=x user=x connect_timeout=2"


def test_a_flush_says_its_position_and_a_replay_the_position_of_the_flush_that_wrote_it(
    commit_point: Callable[..., ClusterCommit],
) -> None:
    host = commit_point()
    claim = Claim("k", host.digest(b"row\n"), b'{"ok":1}')
    first = host.commit([Append({DAY: b"row\n"}, claim), Append({DAY: b"other\n"})], time.monotonic() + 5)
    assert first.decisions == [None, None] and first.position == 1
    again = host.commit([Append({DAY: b"row\n"}, claim)], time.monotonic() + 5)
    assert again.decisions == [Stored(claim.digest, claim.answer, 1)] and again.position is None


def test_outcomes_are_counted(commit_point: Callable[..., ClusterCommit]) -> None:
    seen: list[str] = []
    host = commit_point(on_outcome=seen.append)
    host.commit([Append({DAY: b"row\n"})], time.monotonic() + 5)
    host.commit([], time.monotonic() + 5)  # a probe of the way in: no flush
    assert seen == ["written"]


def test_with_no_primary_a_flush_waits_its_bound_then_is_unavailable_and_keeps_nothing(
    commit_point: Callable[..., ClusterCommit], tmp_path: Path, dsn: str
) -> None:
    commit_point().close()  # the data dir bound to the cluster while it had a primary
    host = commit_point(through=nowhere(), wait_bound=1.0)
    seen = []
    began = time.monotonic()
    with pytest.raises(Unavailable, match="no PostgreSQL primary within") as refused:
        host.commit([Append({DAY: b"row\n"})], began + 1.0)
    seen.append(time.monotonic() - began)
    assert 0.75 <= seen[0] < 3.0 and refused.value.retry_after == 2
    assert "waiting" not in str(host.waiting())  # the wait ended with the flush
    assert on_primary(dsn, "SELECT count(*) FROM tiny.flushes") == [(0,)]


def test_a_flush_never_begins_past_its_deadline(commit_point: Callable[..., ClusterCommit], dsn: str) -> None:
    host = commit_point()
    with pytest.raises(Unavailable, match="took the 5 s it may wait"):
        host.commit([Append({DAY: b"row\n"})], time.monotonic() - 0.1)
    assert on_primary(dsn, "SELECT count(*) FROM tiny.flushes") == [(0,)]


def test_the_digest_is_the_clusters_and_known_without_a_primary(
    commit_point: Callable[..., ClusterCommit], tmp_path: Path
) -> None:
    one = commit_point()
    other = commit_point(tmp_path / "other")
    digest = one.digest(b"body")
    assert other.digest(b"body") == digest  # every host the same secret: a key's digest is compared anywhere
    one.close()
    assert commit_point(through=nowhere()).digest(b"body") == digest


def test_a_data_dir_holding_bytes_no_log_has_is_not_bound(
    commit_point: Callable[..., ClusterCommit], tmp_path: Path
) -> None:
    data = tmp_path / "used"
    alone = LocalCommit(data, cluster=False)
    alone.open()
    alone.close()
    (data / DAY).write_bytes(layout.HEADER + b"row\n")
    with pytest.raises(Refused, match="holds the data file .* written without the cluster"):
        commit_point(data)


def test_a_data_dir_holding_keys_of_its_own_is_not_bound(
    commit_point: Callable[..., ClusterCommit], tmp_path: Path
) -> None:
    """Its keys are in its key log, which the opening only notes (they are read later, on a
    thread): the check looks at the log's segments themselves."""
    data = tmp_path / "keyed"
    alone = LocalCommit(data, cluster=False)
    alone.open()
    alone.commit([Append({}, Claim("k", b"d", b"a"))], time.monotonic() + 5)
    alone.close()
    with pytest.raises(Refused, match="Idempotency-Keys in its own journal"):
        commit_point(data)


def test_new_journal_is_refused_and_a_refused_data_dir_says_how_to_rebuild_it(
    commit_point: Callable[..., ClusterCommit], tmp_path: Path, dsn: str
) -> None:
    host = commit_point()
    host.commit([Append({DAY: b"row\n"})], time.monotonic() + 5)
    host.close()
    with pytest.raises(Refused, match="does not apply to cluster mode"):
        ClusterCommit(tmp_path / "data", dsn).open(accept_new=True)
    layout.identity_path(tmp_path / "data").unlink()
    with pytest.raises(Refused, match="remove the data dir .* or put a copy of a peer's in its place"):
        commit_point()


def test_a_refused_data_dir_says_first_that_it_is_rebuilt_not_repaired(tmp_path: Path) -> None:
    """The way out comes before what was found: /healthz shows a follower's error cut to its first
    512 bytes, and a day file found short is explained at length, ending with the local journal's
    `tiny-admin forget`, which a cluster host's data dir refuses. No primary is needed: the data
    dir's own checks refuse it first."""
    data = tmp_path / "data"
    journal = LocalCommit(data)
    journal.open(keys=False)
    journal.close()
    layout.identity_path(data).unlink()
    with pytest.raises(Refused) as refused:
        ClusterCommit(data, f"host=127.0.0.1 port={free_port()} dbname=x").open()
    head = str(refused.value).encode()[:512].decode(errors="ignore")
    assert head.startswith("In cluster mode a host's data dir is rebuilt, not repaired") and "Found: " in head

"""The PostgreSQL cluster harness: it starts healthy and leaves nothing behind, whatever the test did."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.cluster_support import NEEDS_CLUSTER, on_primary
from tiny.procfs import stat
from tiny.testing_pg import PgCluster

pytestmark = [pytest.mark.slow, NEEDS_CLUSTER, pytest.mark.timeout(180)]


def segments_made_by(pids: set[int]) -> set[int]:
    """The System V shared memory segments that exist now and that one of ``pids`` made (another
    test's cluster, on another xdist worker, may hold its own meanwhile)."""
    out = subprocess.run(["ipcs", "-m", "-p"], capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in out.splitlines()]
    return {int(row[0]) for row in rows if len(row) >= 4 and row[0].isdigit() and int(row[2]) in pids}


def test_a_cluster_starts_healthy_and_is_gone_after_a_failing_test(tmp_path: Path, figures: dict[str, Any]) -> None:
    """The harness's start (to healthy) and its stop after a test that froze one node, killed another and raised."""
    with pytest.raises(RuntimeError, match="the test failed"), PgCluster(tmp_path) as cluster:
        primary, standby = cluster.primary(), cluster.sync_standby()
        assert primary in cluster.nodes and standby in cluster.nodes and primary != standby
        rows = on_primary(cluster.dsn, "SELECT application_name, sync_state FROM pg_stat_replication ORDER BY 1")
        assert sorted(state for _, state in rows) == ["async", "sync"]
        assert on_primary(cluster.dsn, "SELECT current_setting('synchronous_commit')") == [("on",)]
        pids = {name: cluster._pids(node) for name, node in cluster.nodes.items()}
        assert all(len(found) >= 5 for found in pids.values())  # Patroni, a postmaster and its children
        assert segments_made_by({pid for found in pids.values() for pid in found})  # precondition: seen
        home = cluster.home
        cluster.stop(str(standby))  # frozen: SIGKILL must still take it
        cluster.kill(str(primary))  # killed: its shared memory segment stays behind
        assert not cluster.alive(str(primary))
        raise RuntimeError("the test failed")
    left = [pid for found in pids.values() for pid in found if stat(pid) is not None]  # zombies are gone
    assert left == []
    assert not home.exists()
    made = {pid for found in pids.values() for pid in found}
    assert made and not segments_made_by(made)  # the killed primary's segment removed too
    assert (tmp_path / "pg-logs" / f"{primary}-patroni.log").exists()
    figures.update(start_seconds=round(cluster.started_in, 1), stop_seconds=round(cluster.stopped_in, 1))

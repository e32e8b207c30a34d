"""Every analytics cache under one byte budget (tiny.analytics.caches); --analytics-cache-bytes bounds them all."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tiny.analytics import caches
from tiny.analytics.caches import MISSING, Budget
from tiny.testing import InProcessServer, sample_csv

DAY = "2014-05-04"


def test_the_least_recently_used_entry_of_any_cache_goes_first() -> None:
    budget = Budget(100)
    answers, rows = budget.cache("answers"), budget.cache("rows")
    answers.put("a", b"a", 40)
    rows.put("r", b"r", 40)
    assert answers.get("a") == b"a"  # now "r" is the least recently used
    answers.put("b", b"b", 40)
    assert rows.get("r") is MISSING and answers.get("a") == b"a" and answers.get("b") == b"b"
    assert budget.used == 80 <= budget.limit


def test_a_cache_of_a_budget_also_bounds_its_entry_count() -> None:
    budget = Budget(1000)
    few = budget.cache("few", max_entries=2)
    for n in range(5):
        few.put(n, n, 1)
    assert len(few) == 2 and few.get(3) == 3 and few.get(4) == 4 and budget.used == 2


def test_an_entry_heavier_than_the_whole_budget_is_not_kept_and_drops_nothing() -> None:
    budget = Budget(100)
    results = budget.cache("results")
    results.put("small", 1, 10)
    results.put("huge", 2, 101)
    assert results.get("huge") is MISSING and results.get("small") == 1 and budget.used == 10


def test_putting_a_key_again_replaces_its_weight() -> None:
    budget = Budget(100)
    kept = budget.cache("kept")
    kept.put("k", 1, 60)
    kept.put("k", 2, 30)
    assert kept.get("k") == 2 and budget.used == 30 and kept.weight() == 30


def test_the_flag_is_shared_by_the_worker_and_the_processes_of_its_pools_two_lanes() -> None:
    assert caches.Shares.of(128 * 1024**2, 1) == caches.Shares(32 * 1024**2, 32 * 1024**2, 64 * 1024**2)
    for total, processes in ((1000, 3), (128 * 1024**2, 4), (7, 1)):
        shares = caches.Shares.of(total, processes)
        assert shares.worker + processes * (shares.answers_process + shares.rows_process) <= total


@pytest.fixture
def server(tmp_path: Path) -> Iterator[InProcessServer]:
    data = tmp_path / "data"
    data.mkdir()
    (data / f"{DAY}.csv").write_bytes(sample_csv())
    with InProcessServer(data, "--analytics-cache-bytes", "1MiB", "--analytics-processes", "1") as running:
        yield running


def test_the_flag_bounds_every_analytics_cache_of_a_worker_and_its_pool_together(server: InProcessServer) -> None:
    """Many distinct answers and a whale's rows, far more than 1 MiB: the worker's caches (tiny.live's
    answers and the row queries' results) hold at most its share, the answers lane's process its
    own, and the shares add up to no more than the flag."""
    whales = server.request("GET", f"/api/days/{DAY}/whales?top=100").json()["whales"]
    sent = 0
    for top in range(1, 101):
        for view in ("traffic", "whales", "hourly"):
            response = server.request("GET", f"/api/days/{DAY}/charts/{view}.svg?top={top}")
            assert response.status == 200
            sent += len(response.body)
    for whale in whales[:3]:
        for limit in (100_000, 99_999):
            response = server.request("GET", f"/api/days/{DAY}/whales/{whale['ip_id']}/downloads?limit={limit}")
            assert response.status == 200
            sent += len(response.body)
    assert sent > 2 * 1024**2  # the answers together are far more than the whole budget
    analytics = server.deps.analytics
    worker = analytics.budget
    assert worker.limit == 256 * 1024 and 0 < worker.used <= worker.limit
    assert {cache.name for cache in worker.caches()} == {"answers from the aggregates", "results of the row queries"}
    limit, used, weights = server.call(lambda: analytics.call("test: the pool's caches", caches.report))
    assert limit == analytics.shares.answers_process == 256 * 1024 and 0 < used <= limit
    assert "day aggregates" in weights and sum(weights.values()) == used
    assert worker.limit + limit + analytics.shares.rows_process == 1024**2

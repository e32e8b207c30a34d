"""Shared fixtures: reliability figures, hardening findings, and the scale of the bounded fault runs.

A test marked ``@pytest.mark.hardening("finding")`` is the regression test of one finding of
an adversarial review; with TINY_FIGURES_FILE set, its outcome (and its figures, if any) is
recorded for docs/reliability.md.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

SCALE = float(os.environ.get("TINY_RELIABILITY_SCALE", "1"))  # `make reliability` runs longer


@pytest.fixture(scope="session")
def pg_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A PostgreSQL cluster (etcd, three nodes under Patroni: tiny.testing_pg) that the cluster
    mode's test modules share (its start takes 10-20 s); each test uses a fresh database of it,
    and waits for it to be healthy first (a test may have killed its primary)."""
    from tiny.testing_pg import PgCluster

    with PgCluster(tmp_path_factory.mktemp("pg")) as running:
        yield running


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """A dict the test fills with what it tried and what held; saved for docs/reliability.md.

    Written (one JSON line per test) only when TINY_FIGURES_FILE names a file.
    """
    found: dict[str, Any] = {}
    yield found
    if found or request.node.get_closest_marker("hardening"):
        outcome = "passed" if not getattr(request.node, "failed_call", False) else "failed"
        _record(request.node, outcome, found)


def _record(item: pytest.Item, outcome: str, found: dict[str, Any]) -> None:
    target = os.environ.get("TINY_FIGURES_FILE")
    if not target:
        return
    entry = {"test": item.nodeid, "outcome": outcome, "doc": (getattr(item, "function", None).__doc__ or "").strip()}
    marker = item.get_closest_marker("hardening")
    if marker is not None:
        entry["finding"] = marker.args[0]
    with open(target, "a", encoding="utf-8") as out:
        out.write(json.dumps({**entry, **found}) + "\n")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        if report.failed:
            item.failed_call = True  # type: ignore[attr-defined]
        if item.get_closest_marker("hardening") and "figures" not in getattr(item, "fixturenames", ()):
            _record(item, report.outcome, {})  # a test with figures records itself, with them
    return report


# The Docker tests (compose and Swarm) share one daemon, its images and a one-node Swarm, and
# measure replicas under load: `make test` runs them after the rest, one at a time (-m docker),
# while the rest runs on two pytest-xdist workers (-m "not docker").
_DOCKER_FILES = {"test_docker.py", "test_swarm.py"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in _DOCKER_FILES:
            item.add_marker(pytest.mark.docker)

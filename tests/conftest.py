"""Shared fixtures: reliability figures, and the scale of the bounded fault runs."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

SCALE = float(os.environ.get("TINY_RELIABILITY_SCALE", "1"))  # `make reliability` runs longer


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """A dict the test fills with what it tried and what held; saved for docs/reliability.md.

    Written (one JSON line per test) only when TINY_FIGURES_FILE names a file.
    """
    found: dict[str, Any] = {}
    yield found
    target = os.environ.get("TINY_FIGURES_FILE")
    if target and found:
        outcome = "passed" if not getattr(request.node, "failed_call", False) else "failed"
        entry = {
            "test": request.node.nodeid,
            "outcome": outcome,
            "doc": (request.function.__doc__ or "").strip(),
            **found,
        }
        with open(target, "a", encoding="utf-8") as out:
            out.write(json.dumps(entry) + "\n")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call" and report.failed:
        item.failed_call = True  # type: ignore[attr-defined]
    return report

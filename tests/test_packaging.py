"""The package metadata (pyproject.toml) against the pinned requirements files it repeats.

The Docker images install requirements.txt (ingest) and requirements-analytics.txt; `pip install .`
installs [project] dependencies and the `analytics` extra: the same pins, in both places.
"""

from __future__ import annotations

import importlib
import re
import signal
import tomllib

from tests.support import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def pins(name: str) -> list[str]:
    lines = (ROOT / name).read_text().splitlines()
    return [re.sub(r"\s*#.*", "", line) for line in lines if re.match(r"[A-Za-z0-9_.-]+==", line)]


def test_dependencies_are_the_ingest_pins() -> None:
    assert PROJECT["dependencies"] == pins("requirements.txt")


def test_analytics_extra_is_the_analytics_pins() -> None:
    assert PROJECT["optional-dependencies"]["analytics"] == pins("requirements-analytics.txt")


def test_console_scripts_name_functions_that_exist() -> None:
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        for target in PROJECT["scripts"].values():
            module, _, function = target.partition(":")
            assert callable(getattr(importlib.import_module(module), function)), target
    finally:  # tiny.main sets its early SIGTERM handler on import: not in pytest's process
        signal.signal(signal.SIGTERM, sigterm)

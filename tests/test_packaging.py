"""The package metadata (pyproject.toml) against the pinned requirements files it repeats.

The Docker images install requirements.txt; `pip install .` installs [project] dependencies:
the same pins, in both places, and no optional extra.
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


def test_there_is_no_optional_extra_to_forget() -> None:
    assert "optional-dependencies" not in PROJECT


def test_console_scripts_name_functions_that_exist() -> None:
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        for target in PROJECT["scripts"].values():
            module, _, function = target.partition(":")
            assert callable(getattr(importlib.import_module(module), function)), target
    finally:  # tiny.main sets its early SIGTERM handler on import: not in pytest's process
        signal.signal(signal.SIGTERM, sigterm)

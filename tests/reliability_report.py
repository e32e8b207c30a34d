"""Render docs/reliability.md from the figures a reliability run recorded.

Usage:
    TINY_FIGURES_FILE=build/figures.jsonl TINY_RELIABILITY_SCALE=3 python -m pytest \\
        tests/test_faults.py tests/test_fuzz_http.py ...
    python tests/reliability_report.py build/figures.jsonl docs/reliability.md

`make reliability` does both.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

_HELD = (
    "lost",
    "torn",
    "rows_on_disk",
    "acked_rows",
    "unacked_rows_on_disk",
    "exit_code",
    "stop_seconds",
    "restart_seconds",
    "orphans_gone_seconds",
    "same_port_restart",
    "accepted_after_limit_lifted",
    "accepted_after_space_back",
    "idle_closed",
    "fast_p99_ms",
    "slow_headers_cut_after_s",
    "trickled_body_cut_after_s",
    "five_xx",
    "accounted",
)


def _cell(entry: dict[str, Any], keys: list[str]) -> str:
    return "<br>".join(f"{key.replace('_', ' ')}: {entry[key]}" for key in keys if key in entry)


def render(entries: list[dict[str, Any]], command: str) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [
        "# Reliability: what was tried and what held",
        "",
        f"Produced by `make reliability` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {commit or '?'}, "
        f"{os.cpu_count()} cores, Linux {platform.release()}, Python {platform.python_version()}.",
        "Every number below comes from that real run: real server processes on 127.0.0.1, real signals, "
        "real files (tests/test_faults.py, tests/test_fuzz_http.py, tests/test_codec_properties.py, "
        "tests/test_cluster.py).",
        "",
        f"Reproduce: `{command}`. The same tests run, shorter, in `make test`.",
        "",
        "| case | tried | what held | result |",
        "|---|---|---|---|",
    ]
    for entry in entries:
        tried_keys = [k for k in entry if k not in _HELD and k not in ("test", "outcome", "doc", "case")]
        held_keys = [k for k in _HELD if k in entry]
        lines.append(
            f"| {entry.get('case', entry['test'])} | {_cell(entry, tried_keys)} | "
            f"{_cell(entry, held_keys)} | {entry['outcome']} |"
        )
    lines += [
        "",
        "Reading the table: *acked rows* are rows of batches answered 200; *lost* counts acked rows missing from "
        "the day file; *torn* counts lines that do not parse as a whole CRAN row (every line is parsed). "
        "*no answer* requests were in flight on a killed process or a closed socket: the client cannot know "
        "whether they were written, and a retry may duplicate their rows (*unacked rows on disk* counts the rows "
        "of such requests that were written). A client that must never duplicate either does not resend a batch "
        "that got no answer, or checks the day file for its rows first; a 503 always means nothing of the "
        "request was kept, so retrying a 503 is always safe.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    source, target = Path(argv[1]), Path(argv[2])
    entries = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    command = os.environ.get("TINY_RELIABILITY_COMMAND", "make reliability")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(entries, command))
    print(f"wrote {target} ({len(entries)} cases)")
    return 0 if all(e["outcome"] == "passed" for e in entries) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""What a run writes: the machine it ran on, results.json and results.csv (merged with an
earlier run's on request), and bench/sink_bench.py's figures."""

from __future__ import annotations

import csv
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from bench.harness import ROOT
from bench.harness.plans import CORES
from bench.harness.proc import cpu_model, loadavg


def _version(command: list[str]) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return "absent"
    return (done.stdout + done.stderr).strip().splitlines()[0] if (done.stdout + done.stderr).strip() else "?"


def machine() -> dict[str, Any]:
    """What ran the benchmark: hardware, load, versions."""
    import tornado

    from tiny import codec

    model = cpu_model(platform.processor())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "usable_cores": CORES,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "tornado": tornado.version,
        "orjson": orjson.__version__,
        "codec_installed": codec.CODEC,
        "ab": _version(["ab", "-V"]).replace("This is ApacheBench, ", "ab ").replace(" <$Revision$>", ""),
        "nginx": _version(["nginx", "-v"]),
        "git_commit": commit.stdout.strip(),
        "loadavg": loadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


_CSV_COLUMNS = (
    "experiment",
    "round",
    "config",
    "body",
    "records_per_body",
    "body_bytes",
    "gzip",
    "concurrency",
    "keepalive",
    "requests",
    "complete",
    "failed",
    "non2xx",
    "seconds",
    "rps",
    "records_per_s",
    "mean_ms",
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "max_ms",
    "server_cpu_s",
    "cpu_s_per_million",
    "busiest_process_share",
    "cpu_per_process",
    "ab_cpu_s",
    "other_cpu_s",
    "loadavg_1m_before",
    "codec",
    "ab_exit",
    "error",
    "ab_command",
)


def write_results(results: dict[str, Any], directory: Path) -> None:
    """results.json (everything) and results.csv (one row per point)."""
    (directory / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    with open(directory / "results.csv", "w", newline="") as out:
        writer = csv.DictWriter(out, _CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for point in results["points"]:
            writer.writerow({**point, "cpu_per_process": ";".join(map(str, point.get("cpu_per_process", [])))})


def merged(previous: Path, fresh: dict[str, Any]) -> dict[str, Any]:
    """``fresh`` plus the points of ``previous`` whose (experiment, config) were not re-run."""
    try:
        old = json.loads(previous.read_text())
    except (OSError, ValueError):
        return fresh
    rerun = {(p["experiment"], p["config"]) for p in fresh["points"]}
    kept = [p for p in old.get("points", []) if (p["experiment"], p["config"]) not in rerun]
    sink = fresh.get("sink") or old.get("sink")
    later = {"machine": fresh["machine"], "args": fresh["args"], "redone": sorted(map(list, rerun))}
    # the first run's description stays; each merged run is listed after it
    stores = old.get("key_stores", {}) | fresh.get("key_stores", {})
    return {
        **old,
        "points": kept + fresh["points"],
        "sink": sink,
        "key_stores": stores,
        "merged_runs": [*old.get("merged_runs", []), later],
    }


def run_sink_bench(quick: bool, out: Path) -> dict[str, Any] | None:
    """bench/sink_bench.py in its own interpreter; its JSON, or None if it failed."""
    quick_flag = ["--quick"] if quick else []
    command = [sys.executable, str(ROOT / "bench" / "sink_bench.py"), "--json", str(out), *quick_flag]
    print("sink: " + shlex.join(command), flush=True)
    try:
        done = subprocess.run(command, cwd=ROOT, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        print("  sink bench timed out", file=sys.stderr)
        return None
    if done.returncode != 0 or not out.exists():
        print(f"  sink bench failed ({done.returncode})", file=sys.stderr)
        return None
    return dict(json.loads(out.read_text()))

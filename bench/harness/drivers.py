"""The load drivers of every benchmark: the one ab command line and its parser, and
bench/post_load.py's (which can send a different header per request)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.harness import ROOT
from bench.harness.bodies import Body


def ab_command(
    url: str,
    body: Body,
    concurrency: int,
    keepalive: bool,
    requests: int,
    time_limit: float | None,
    percentiles: Path,
    socket_timeout: int = 20,
) -> list[str]:
    """The exact ab command line of one run: ``requests`` requests, at most ``time_limit``
    seconds (none: no -t), exact percentiles into ``percentiles``. -t comes before -n: ab's -t
    resets -n."""
    command = ["ab"]
    if time_limit is not None:
        command += ["-t", str(max(1, round(time_limit)))]
    command += [
        "-n",
        str(requests),
        "-c",
        str(concurrency),
        "-s",
        str(socket_timeout),
        "-l",
        "-r",
        "-q",
        "-e",
        str(percentiles),
        "-p",
        str(body.path),
        "-T",
        "application/x-ndjson",
    ]
    if body.gzip:
        command += ["-H", "Content-Encoding: gzip"]
    if keepalive:
        command.append("-k")
    return [*command, url]


def _number(pattern: str, text: str, default: float = 0.0) -> float:
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else default


def parse_ab(text: str, percentiles: Path | None = None) -> dict[str, Any]:
    """The figures of one ab run: counts, rate, latency (ms)."""
    result: dict[str, Any] = {
        "complete": int(_number(r"^Complete requests:\s+(\d+)", text)),
        "failed": int(_number(r"^Failed requests:\s+(\d+)", text)),
        "non2xx": int(_number(r"^Non-2xx responses:\s+(\d+)", text)),
        "keepalive_requests": int(_number(r"^Keep-Alive requests:\s+(\d+)", text)),
        "seconds": _number(r"^Time taken for tests:\s+([\d.]+)", text),
        "rps": _number(r"^Requests per second:\s+([\d.]+)", text),
        "mean_ms": _number(r"^Time per request:\s+([\d.]+) \[ms\] \(mean\)$", text),
    }
    table = {int(p): float(ms) for p, ms in re.findall(r"^\s+(\d+)%\s+(\d+)", text, re.MULTILINE)}
    exact: dict[int, float] = {}
    # ab -e reads past its array for the 99th percentile when it completed 50 requests or fewer
    if percentiles is not None and percentiles.exists() and result["complete"] > 50:
        for row in percentiles.read_text().splitlines()[1:]:
            percent, ms = row.split(",")
            exact[int(percent)] = float(ms)
    for p in (50, 90, 99):
        result[f"p{p}_ms"] = exact.get(p, table.get(p))
    result["max_ms"] = table.get(100)
    result["latency_source"] = "ab -e" if exact else "ab table (integer ms)"
    return result


def post_load_command(url: str, body: Body, concurrency: int, seconds: float, key_prefix: str | None) -> list[str]:
    """The exact bench/post_load.py command of one point (keep-alive; a fresh key per request
    with ``key_prefix``). ab cannot vary a header per request, and wrk copies the body for each
    request whose headers change (3x its CPU), so the keys experiment uses this one for both arms."""
    command = [sys.executable, str(ROOT / "bench" / "post_load.py"), url, str(body.path)]
    command += ["--concurrency", str(concurrency), "--seconds", f"{seconds:g}"]
    if key_prefix:
        command += ["--key-prefix", key_prefix]
    if body.gzip:
        command.append("--gzip")
    return command


def parse_post_load(text: str) -> dict[str, Any]:
    """The figures of one post_load run, in parse_ab's shape."""
    match = re.search(r"^LOAD (\{.*\})$", text, re.MULTILINE)
    figures = json.loads(match.group(1)) if match else {}
    requests, seconds = figures.get("requests", 0), figures.get("seconds", 0.0)
    return {
        "complete": requests + figures.get("failed", 0),
        "failed": figures.get("failed", 0),
        "non2xx": figures.get("non2xx", 0),
        "keepalive_requests": requests,
        "seconds": seconds,
        "rps": round(requests / seconds, 2) if seconds else 0.0,
        **{key: figures.get(key) for key in ("mean_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms")},
        "latency_source": "bench/post_load.py",
    }


def run_driver(command: list[str], timeout: float) -> tuple[str, int]:
    """Run one driver command: (its stdout and stderr, its exit status; -1 when it timed out)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return f"ab timed out: {exc}", -1
    return done.stdout + done.stderr, done.returncode

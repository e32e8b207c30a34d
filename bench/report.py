"""Markdown tables for BENCHMARKS.md from bench/results/results.json.

Usage:
    python bench/report.py [--results bench/results/results.json] [--out bench/results/tables.md]
                           [--all-points]

Prints the markdown (and writes it to ``--out``). It opens as BENCHMARKS.md's "Current results"
does, with the same headings, so that its tables 1-3 can replace those: the machine and load,
then, each with the commit and date of the run that measured it, (1) the lean path at every
body size against the seed and the floor (experiment lean), (2) a fresh key's cost and nginx's
in front (lean-keys), (3) the headline ratios against their targets (key, scale, nginx,
latency, and python and keys when run): medians over the rounds of interleaved experiments,
with each round's ratio. Then the details: the server cost of those runs, and the sweep:
records/s by concurrency with the ratio to the seed-style 1-process server at the same
concurrency, keep-alive and records per body; the c=8 and c=16 points in full (ratio to the
HTTP floor with as many processes, p50/p99, CPU-seconds per million records, the busiest
process's share of the CPU); CPU-seconds per million records per configuration; and the sink
microbenchmark. ``--all-points`` adds every point.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "results.json"
SEED_MEAN_MS = 23.4  # the seed's mean at c=16 on 8 cores (../shared/seeds/004_*.txt)
Point = dict[str, Any]


def fmt_rate(value: float | None) -> str:
    """1234567 -> '1.23M', 98765 -> '98.8k'."""
    if value is None:
        return "-"
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}"


def fmt(value: float | None, digits: int = 1, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def table(header: Sequence[str], rows: Iterable[Sequence[str]], align: str = "") -> str:
    """A markdown table; ``align`` has one l/r per column (default: first left, others right)."""
    align = align or "l" + "r" * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


class Results:
    """results.json with lookups by configuration, body, concurrency and keep-alive."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        complete = [p for p in data["points"] if p.get("complete")]
        # A point with failed or non-2xx requests measured something else than ingest (ab's
        # requests/s counts them): it is left out of every table and named at the top.
        self.failed: list[Point] = [p for p in complete if p.get("failed") or p.get("non2xx")]
        self.points: list[Point] = [p for p in complete if not (p.get("failed") or p.get("non2xx"))]
        self.cores = data.get("cores", 2)
        self.configs: dict[str, Any] = data.get("configs", {})

    def select(self, experiment: str, **match: Any) -> list[Point]:
        return [p for p in self.points if p["experiment"] == experiment and all(p[k] == v for k, v in match.items())]

    def sweep_point(self, config: str, body: str, c: int, keepalive: bool) -> Point | None:
        found = self.select("sweep", config=config, body=body, concurrency=c, keepalive=keepalive)
        return found[-1] if found else None

    def baseline(self, base: str, point: Point) -> Point | None:
        """``base``'s sweep point like ``point`` (same c, -k; the same body, else the plain one)."""
        for body in (point["body"], point["body"].split("-")[0]):
            found = self.sweep_point(base, body, point["concurrency"], point["keepalive"])
            if found:
                return found
        return None

    def floor_for(self, config: str) -> str:
        processes = self.configs.get(config, {}).get("processes", 1)
        name = f"floor-{processes}"
        return name if any(p["config"] == name for p in self.points) else "floor-1"

    def sweep_configs(self) -> list[str]:
        return list(dict.fromkeys(p["config"] for p in self.points if p["experiment"] == "sweep"))


# --------------------------------------------------------------------------- headlines


def _rounds(results: Results, experiment: str, config: str, **match: Any) -> list[Point]:
    return sorted(results.select(experiment, config=config, **match), key=lambda p: p["round"])


def paired(
    results: Results, experiment: str, a: str, b: str, key: str = "records_per_s", **match: Any
) -> dict[str, Any] | None:
    """``a`` against ``b`` in an interleaved experiment (their points that also ``match``, e.g.
    ``body="100"``): medians, the ratio of the medians and each round's ratio."""
    pa, pb = _rounds(results, experiment, a, **match), _rounds(results, experiment, b, **match)
    if not pa or not pb:
        return None
    by_round = {p["round"]: p for p in pb}
    per_round = [ratio(p[key], by_round[p["round"]][key]) for p in pa if p["round"] in by_round]
    ma, mb = median(p[key] for p in pa), median(p[key] for p in pb)
    return {
        "a": ma,
        "b": mb,
        "ratio": ratio(ma, mb),
        "rounds": [r for r in per_round if r is not None],
        "a_points": pa,
        "b_points": pb,
    }


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("**met**" if ok else "**not met**")


def headlines(results: Results) -> str:
    n = results.cores
    rows: list[list[str]] = []

    def add(what: str, target: str, cmp: dict[str, Any] | None, ok: Any, cost: bool = False) -> None:
        if cmp is None:  # that experiment was not run
            return
        rounds = ", ".join(f"{r:.2f}" for r in cmp["rounds"])
        times = fmt(cmp["ratio"], 2, "x")  # "-" where an arm measured nothing (every request failed)
        if cost:
            shown = f"{times} ({fmt(cmp['a'], 2)} vs {fmt(cmp['b'], 2)} CPU-s per M records)"
        else:
            shown = f"{times} ({fmt_rate(cmp['a'])} vs {fmt_rate(cmp['b'])} records/s)"
        rows.append([what, target, shown, rounds, _verdict(ok(cmp["ratio"]) if cmp["ratio"] else None)])

    add(
        "tiny-1 vs seed-1, c=8 -k, 1,600-record bodies",
        ">= 10x (goal 15x)",
        paired(results, "key", "tiny-1", "seed-1"),
        lambda r: r >= 10,
    )
    add(
        "same runs: server CPU per record, seed-1 / tiny-1",
        ">= 10x per core",
        paired(results, "key", "seed-1", "tiny-1", "cpu_s_per_million"),
        lambda r: r >= 10,
        cost=True,
    )
    add("tiny-1 vs HTTP floor-1, same run", "(reference)", paired(results, "key", "tiny-1", "floor-1"), lambda r: None)
    add(f"tiny-{n} vs tiny-1, c=16 -k", ">= 1.8x", paired(results, "scale", f"tiny-{n}", "tiny-1"), lambda r: r >= 1.8)
    add(
        f"nginx-{n} vs tiny-{n}, c=16 -k",
        ">= 0.9x (within 10%)",
        paired(results, "nginx", f"nginx-{n}", f"tiny-{n}"),
        lambda r: r >= 0.9,
    )
    add(
        f"nginx-{n}, proxy_request_buffering off vs on",
        "(choice)",
        paired(results, "nginx", f"nginx-{n}-nobuf", f"nginx-{n}"),
        lambda r: None,
    )
    add(
        "tiny-1-python (reference codec) vs seed-1, c=8 -k",
        "(reference; the 2x target is the codec's, bench/codec_bench.py)",
        paired(results, "python", "tiny-1-python", "seed-1"),
        lambda r: None,
    )
    add(
        "a fresh Idempotency-Key per request: CPU per record, with / without",
        "<= 1.05x",
        paired(results, "keys", "tiny-1-keys", "tiny-1", "cpu_s_per_million"),
        lambda r: r <= 1.05,
        cost=True,
    )
    add(
        "same runs: records/s, with / without keys",
        "(reference)",
        paired(results, "keys", "tiny-1-keys", "tiny-1"),
        lambda r: None,
    )
    add(
        "same runs: tiny-1 with keys vs seed-1 (post_load, c=8)",
        ">= 10x",
        paired(results, "keys", "tiny-1-keys", "seed-1"),
        lambda r: r >= 10,
    )
    for experiment, config, keep in (
        ("latency", f"tiny-{n}", ""),
        ("latency", "tiny-1", ""),
        ("scale", f"tiny-{n}", " -k"),
        ("scale", "tiny-1", " -k"),
    ):
        points = _rounds(results, experiment, config)
        if not points:
            continue
        p99 = median(p["p99_ms"] for p in points)
        each = ", ".join(fmt(p["p99_ms"]) for p in points)
        rows.append(
            [
                f"p99 of {config}, c=16{keep}",
                f"< {SEED_MEAN_MS} ms",
                fmt(p99, 1, " ms"),
                each,
                _verdict(None if p99 is None else p99 < SEED_MEAN_MS),
            ]
        )
    note = (
        "Medians over the rounds of interleaved runs (arms alternate, order reversed every other round, "
        "all servers up at once); the per-round column gives each round's ratio (or p99 in ms)."
    )
    return table(["what", "target", "measured", "per round", "verdict"], rows, "llrrl") + "\n\n" + note


def cost_of_headlines(results: Results) -> str:
    """CPU-seconds per million records of every arm of the interleaved experiments."""
    rows = []
    for experiment in ("key", "scale", "nginx", "latency", "python", "keys"):
        for config in dict.fromkeys(p["config"] for p in results.select(experiment)):
            points = _rounds(results, experiment, config)
            first = points[0]
            roles = {
                role: median(p["cpu_by_role"].get(role, 0) / max(p["wall_s"], 1e-9) for p in points)
                for role in first.get("cpu_by_role", {})
            }
            rows.append(
                [
                    experiment,
                    config,
                    f"c={first['concurrency']}{' -k' if first['keepalive'] else ''}",
                    fmt_rate(median(p["records_per_s"] for p in points)),
                    fmt(median(p["cpu_s_per_million"] for p in points), 2),
                    fmt(median(p["busiest_process_share"] for p in points), 2),
                    " / ".join(f"{k} {fmt(v, 2)}" for k, v in roles.items()),
                    fmt(median(p["ab_cpu_s"] / max(p["wall_s"], 1e-9) for p in points), 2),
                    fmt(median(p["other_cpu_s"] / max(p["wall_s"], 1e-9) for p in points), 2),
                ]
            )
    note = (
        "Cores busy = CPU-seconds during the point / its wall time (medians over the rounds); "
        "other load = the machine's busy CPU minus the servers and ab (other work on the machine)."
    )
    return (
        table(
            [
                "experiment",
                "config",
                "load generator",
                "records/s",
                "CPU-s per M records",
                "busiest process",
                "server cores busy",
                "load generator cores",
                "other load (cores)",
            ],
            rows,
            "lllrrrlrr",
        )
        + "\n\n"
        + note
    )


# --------------------------------------------------------------------------- sweep


def by_concurrency(results: Results, body: str, keepalive: bool) -> str | None:
    levels = sorted({p["concurrency"] for p in results.select("sweep", body=body, keepalive=keepalive)})
    configs = [c for c in results.sweep_configs() if results.select("sweep", config=c, body=body, keepalive=keepalive)]
    if not levels or not configs:
        return None
    rows = []
    for config in configs:
        cells = [config]
        for c in levels:
            point = results.sweep_point(config, body, c, keepalive)
            if point is None:
                cells.append("-")
                continue
            seed = results.baseline("seed-1", point)
            x = ratio(point["records_per_s"], seed["records_per_s"] if seed else None)
            cells.append(fmt_rate(point["records_per_s"]) + (f" ({x:.1f}x)" if x and config != "seed-1" else ""))
        rows.append(cells)
    return table(["config", *(f"c={c}" for c in levels)], rows)


def detail_rows(results: Results, points: Iterable[Point]) -> list[list[str]]:
    rows = []
    for p in points:
        seed = results.baseline("seed-1", p)
        floor = results.baseline(results.floor_for(p["config"]), p)
        rows.append(
            [
                p["config"],
                p["body"],
                f"{p['concurrency']}{' -k' if p['keepalive'] else ''}",
                fmt_rate(p["records_per_s"]),
                fmt(ratio(p["records_per_s"], seed["records_per_s"] if seed else None), 1),
                fmt(ratio(p["records_per_s"], floor["records_per_s"] if floor else None), 2),
                fmt(p["p50_ms"]),
                fmt(p["p99_ms"]),
                fmt(p["cpu_s_per_million"], 2),
                fmt(p["busiest_process_share"], 2),
                str(p["failed"] + p["non2xx"]),
                fmt(p["other_cpu_s"] / max(p["wall_s"], 1e-9), 2),
            ]
        )
    return rows


_DETAIL_HEADER = [
    "config",
    "body",
    "c",
    "records/s",
    "x seed-1",
    "x floor",
    "p50 ms",
    "p99 ms",
    "CPU-s/M",
    "busiest",
    "failed",
    "other load",
]


def details(results: Results, concurrency: int) -> str:
    points = [p for p in results.select("sweep", concurrency=concurrency)]
    points.sort(key=lambda p: (results.sweep_configs().index(p["config"]), p["body"], not p["keepalive"]))
    return table(_DETAIL_HEADER, detail_rows(results, points), "lllrrrrrrrrr")


def cost_table(results: Results) -> str:
    rows = []
    for config in results.sweep_configs():
        bodies = dict.fromkeys(p["body"] for p in results.select("sweep", config=config))
        for body in bodies:
            points = results.select("sweep", config=config, body=body)
            costs = [p["cpu_s_per_million"] for p in points if p["cpu_s_per_million"] is not None]
            rows.append(
                [
                    config,
                    body,
                    fmt(median(costs), 2),
                    fmt(min(costs, default=None), 2),
                    fmt(max(costs, default=None), 2),
                    str(len(points)),
                ]
            )
    return table(["config", "body", "median CPU-s per M records", "min", "max", "points"], rows, "llrrrr")


def sink_table(sink: dict[str, Any] | None) -> str | None:
    if not sink:
        return None
    rows = [
        [
            r["strategy"],
            r["durability"],
            f"{r['appends_per_s']:,.0f}",
            fmt(r["mb_per_s"]),
            fmt(r["cpu_s"], 3),
            fmt(r["append_p50_ms"], 2),
            fmt(r["append_p99_ms"], 2),
            fmt(r["loop_lag_p99_ms"], 2),
            fmt(r["loop_lag_max_ms"], 2),
        ]
        for r in sink["rows"]
    ]
    params = sink.get("params", {})
    head = (
        f"{params.get('clients')} coroutines x {params.get('appends_per_client')} appends of "
        f"{params.get('chunk_bytes', 0) // 1024} KiB (a third as many with fsync), {params.get('work_us')} us of "
        f"CPU on the loop before each; medians of {params.get('repeats')} interleaved runs."
    )
    return (
        head
        + "\n\n"
        + table(
            [
                "sink",
                "durability",
                "appends/s",
                "MB/s",
                "CPU-s",
                "append p50 ms",
                "append p99 ms",
                "loop lag p99 ms",
                "loop lag max ms",
            ],
            rows,
            "llrrrrrrr",
        )
    )


def machine(results: Results) -> str:
    m = results.data.get("machine", {})
    return "\n".join(
        [
            f"- CPU: {m.get('cpu')}, {m.get('cores')} cores ({m.get('usable_cores')} usable), "
            f"{m.get('memory_gib')} GiB; Linux {m.get('kernel')}",
            f"- Python {m.get('python')}, Tornado {m.get('tornado')}, orjson {m.get('orjson')}, codec installed: "
            f"{m.get('codec_installed')}; {m.get('ab')}; {m.get('nginx')}",
            f"- commit {m.get('git_commit')}, {m.get('date')}; load average at start {' '.join(m.get('loadavg', []))}, "
            f"at end {' '.join(m.get('loadavg_end', []))}",
            f"- {results.data.get('seconds_per_point')} s per point, {results.data.get('rounds')} rounds per "
            f"interleaved experiment; ab runs on the same cores as the servers",
            *(
                f"- merged later (`--merge`): {', '.join('/'.join(r) for r in run['redone']) or 'sink only'}, "
                f"{run['machine'].get('date')}, codec {run['machine'].get('codec_installed')}, load average at start "
                f"{' '.join(run['machine'].get('loadavg', []))}"
                for run in results.data.get("merged_runs", [])
            ),
        ]
    )


# --------------------------------------------------------------------------- the lean path's tables

_LEAN_SEED_TARGET = {"1600": 15.0}  # tiny-1 / seed-1 req/s; 1.2 at every other size
_LEAN_FLOOR_TARGET = {"1": 0.85, "10": 0.85, "100": 0.85}  # tiny-1 / floor-1 req/s
_KEY_TARGET = {"1": 1.10, "100": 1.05}  # keyed / plain CPU per record


def _cell(compared: dict[str, Any] | None) -> str:
    """Each round's ratio of a :func:`paired` comparison, then their median."""
    rounds = compared["rounds"] if compared else []
    middle = median(rounds)
    return f"{', '.join(f'{r:.2f}' for r in rounds)}; **{middle:.2f}**" if middle is not None else "-"


def _us(points: list[Point]) -> str:
    """The median CPU per record of ``points`` in µs."""
    value = median(p["cpu_s_per_million"] for p in points)
    return "-" if value is None else (f"{value:.3g}" if value < 10 else f"{value:.0f}")


def lean_table(results: Results) -> str | None:
    """Table 1, from the ``lean`` experiment: tiny-1 against seed-1 and floor-1 at every body
    size (requests/s, round by round, medians, CPU per record)."""
    bodies = list(dict.fromkeys(p["body"] for p in results.select("lean")))
    if not bodies:
        return None
    rows = []
    for body in bodies:
        cpu = (_us(results.select("lean", config=c, body=body)) for c in ("seed-1", "floor-1", "tiny-1"))
        rows.append(
            [
                f"{int(body):,}" if body.isdigit() else body,
                _cell(paired(results, "lean", "tiny-1", "seed-1", "rps", body=body)),
                f"{_LEAN_SEED_TARGET.get(body, 1.2):g}",
                _cell(paired(results, "lean", "tiny-1", "floor-1", "rps", body=body)),
                f"{_LEAN_FLOOR_TARGET[body]:g}" if body in _LEAN_FLOOR_TARGET else "-",
                ", ".join(cpu),
            ]
        )
    return table(
        [
            "body",
            "tiny-1 / seed-1 req/s (per round; median)",
            "target",
            "tiny-1 / floor-1 (per round; median)",
            "target",
            "CPU per record: seed, floor, tiny (µs)",
        ],
        rows,
        "rlrlrl",
    )


def keys_table(results: Results) -> str | None:
    """Table 2, from the ``lean-keys`` experiment: a fresh key's cost at every body size, then
    nginx's in front of a keyed tiny-1."""
    keyed = [p["body"] for p in results.select("lean-keys") if p["config"].startswith("tiny-1-keys-")]
    rows = []
    for body in dict.fromkeys(keyed):
        cost = paired(
            results, "lean-keys", f"tiny-1-keys-{body}", f"tiny-1-post-{body}", "cpu_s_per_million", body=body
        )
        if cost is None:
            continue
        target = _KEY_TARGET.get(body)
        rows.append(
            [
                f"a fresh key per request, {int(body):,}-record bodies",
                _us(cost["b_points"]),
                _us(cost["a_points"]),
                _cell(cost),
                f"{target:g}" if target else "-",
            ]
        )
    nginx = paired(results, "lean-keys", "nginx-1-1600", "tiny-1-keys-1600", "cpu_s_per_million", body="1600")
    if nginx is not None:
        rows.append(
            [
                "nginx in front of a keyed tiny-1 (its own keys), 1,600",
                _us(nginx["b_points"]),
                _us(nginx["a_points"]),
                _cell(nginx),
                "1.1",
            ]
        )
    if not rows:
        return None
    return table(
        [
            "what it costs",
            "without (µs per record)",
            "with",
            "with / without, CPU per record (per round; median)",
            "target",
        ],
        rows,
        "lrrlr",
    )


def measured_by(results: Results, experiments: Sequence[str]) -> str:
    """The commit and date of the run that last measured any of ``experiments`` (a merged run
    that redid one of them, else the first run)."""
    machine = results.data.get("machine", {})
    for run in results.data.get("merged_runs", []):
        if any(experiment in experiments for experiment, _config in run.get("redone", [])):
            machine = run.get("machine", {})
    return f"Measured on {machine.get('git_commit')}, {machine.get('date')}."


# BENCHMARKS.md's "Current results" that this report makes: heading, experiments, table.
QUESTIONS = (
    ("1. Ingest against the seed's approach and Tornado's floor, at every body size", ("lean",), lean_table),
    ("2. What a fresh Idempotency-Key and nginx in front cost", ("lean-keys",), keys_table),
    (
        "3. Two processes, nginx over two instances, and the p99",
        ("key", "scale", "nginx", "latency", "python", "keys"),
        headlines,
    ),
)


def render(results: Results, all_points: bool = False) -> str:
    """The whole markdown report."""
    parts = ["## Current results", machine(results)]
    if results.failed:
        named = ", ".join(f"{p['experiment']}/{p['config']}/{p['body']} c={p['concurrency']}" for p in results.failed)
        parts.append(f"**Left out: {len(results.failed)} points with failed or non-2xx requests** ({named}).")
    for title, experiments, make in QUESTIONS:
        if any(results.select(experiment) for experiment in experiments):
            parts += [f"### {title}", measured_by(results, experiments), make(results) or "(no complete points)"]
    parts += ["## Details", "### Server cost of the interleaved runs", cost_of_headlines(results)]
    bodies = list(dict.fromkeys(p["body"] for p in results.select("sweep")))
    for body in bodies:
        for keepalive in (True, False):
            rendered = by_concurrency(results, body, keepalive)
            if rendered:
                records = next(p["records_per_body"] for p in results.select("sweep", body=body))
                parts += [
                    f"### records/s by concurrency: body {body} ({records:,} records), "
                    f"{'ab -k' if keepalive else 'no keep-alive'} (x seed-1 at the same point)",
                    rendered,
                ]
    for c in (8, 16):
        if results.select("sweep", concurrency=c):
            parts += [f"### Every sweep point at c={c}", details(results, c)]
    if results.select("sweep"):
        parts += [
            "### CPU-seconds per million records (all sweep points of a configuration and body)",
            cost_table(results),
        ]
    stores = results.data.get("key_stores") or {}
    if stores:
        parts += [
            "### The key store after the keys experiment (journal on disk, server memory)",
            table(
                ["arm", "keys held", "database bytes", "bytes per key", ".tiny/ files on disk", "server RSS"],
                (
                    [
                        arm,
                        f"{s['keys']:,}",
                        f"{s['database_bytes']:,}",
                        fmt(s["bytes_per_key"], 0),
                        ", ".join(f"{name} {size:,}" for name, size in s["files"].items()),
                        f"{s['server_rss_kb'] / 1024:.1f} MiB",
                    ]
                    for arm, s in stores.items()
                ),
                "lrrrlr",
            ),
        ]
    sink = sink_table(results.data.get("sink"))
    if sink:
        parts += ["### Sink: blocking vs aiofiles vs thread pool (bench/sink_bench.py)", sink]
    if all_points:
        parts += [
            "### All points",
            table(
                ["experiment", "round", *_DETAIL_HEADER, "ab command"],
                (
                    [p["experiment"], str(p["round"]), *row, f"`{p['ab_command']}`"]
                    for p, row in zip(results.points, detail_rows(results, results.points), strict=True)
                ),
            ),
        ]
    return "\n\n".join(parts) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--out", type=Path, help="also write the markdown here (default: beside results.json)")
    parser.add_argument("--all-points", action="store_true", help="append a table of every point")
    args = parser.parse_args(argv)
    try:
        data = json.loads(args.results.read_text())
    except (OSError, ValueError) as exc:
        print(f"cannot read {args.results}: {exc} (run bench/run.py first)", file=sys.stderr)
        return 1
    text = render(Results(data), args.all_points)
    out = args.out or args.results.with_name("tables.md")
    out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

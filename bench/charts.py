"""Charts for BENCHMARKS.md from bench/results/ (matplotlib, Agg) into images/.

Usage:
    python bench/charts.py [--results bench/results/results.json] [--codec bench/results/codec.json]
                           [--out images] [--body 1600]

Writes, from the sweep of bench/run.py (bodies of ``--body`` records):

- ``bench_throughput.png``: records/s against concurrency per configuration, with and without
  keep-alive (log scale: the seed and the floor are 20x apart);
- ``bench_latency_c16.png``: p50/p90/p99 at c=16 per configuration, with the seed's mean
  (23.4 ms) for reference;
- ``bench_cpu_per_million.png``: CPU-seconds per million records per configuration (median
  of its sweep points; the figure that survives a noisy machine);
- ``bench_headline.png``: the interleaved runs (10x, 1.8x and nginx experiments), every round
  as a dot, the median as a bar;
- ``bench_codec.png`` when ``--codec`` exists (bench/codec_bench.py): the codec candidates.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

ROOT = Path(__file__).resolve().parents[1]
SEED_MEAN_MS = 23.4
_RATE = FuncFormatter(lambda v, _pos=None: f"{v / 1e6:.3g}M" if v >= 1e6 else f"{v / 1e3:.3g}k")
Point = dict[str, Any]


def _style(config: str) -> dict[str, Any]:
    """Related configurations share a colour family; seed dashed, floor dotted."""
    colours = {"seed": "#7f7f7f", "floor": "#2ca02c", "tiny": "#1f77b4", "nginx": "#ff7f0e", "docker": "#9467bd"}
    darker = {"seed": "#404040", "floor": "#006d2c", "tiny": "#08306b"}  # N processes
    family, *rest = config.split("-")
    many = bool(rest) and rest[0].isdigit() and int(rest[0]) > 1
    colour = darker.get(family) if many and family != "nginx" else colours.get(family)
    style: dict[str, Any] = {"color": colour or "#d62728", "marker": "o", "linewidth": 1.8}
    if family == "seed":
        style["linestyle"] = "--"
    elif family == "floor":
        style["linestyle"] = ":"
    if many or config.endswith(("-python", "-nobuf")):
        style["marker"] = "s"
    if config.endswith("-python"):
        style["color"] = "#17becf"
    elif config.endswith("-fsync"):
        style["color"] = "#8c564b"
    elif config.endswith("-nobuf"):
        style["color"] = "#bcbd22"
    return style


def sweep(points: list[Point], body: str) -> dict[str, list[Point]]:
    """Sweep points of ``body`` by configuration, in run order."""
    found: dict[str, list[Point]] = {}
    for p in points:
        if p["experiment"] == "sweep" and p["body"] == body and p.get("complete"):
            found.setdefault(p["config"], []).append(p)
    return found


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def throughput(points: list[Point], body: str, out: Path) -> Path | None:
    by_config = sweep(points, body)
    if not by_config:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5), sharey=True)
    for ax, keepalive in zip(axes, (True, False), strict=True):
        for config, ps in by_config.items():
            chosen = sorted((p for p in ps if p["keepalive"] == keepalive), key=lambda p: p["concurrency"])
            if chosen:
                ax.plot(
                    [p["concurrency"] for p in chosen],
                    [p["records_per_s"] for p in chosen],
                    label=config,
                    **_style(config),
                )
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({p["concurrency"] for ps in by_config.values() for p in ps}))
        ax.get_xaxis().set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(_RATE)
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("concurrent clients (ab -c)")
        ax.set_title(f"ab {'-k (keep-alive)' if keepalive else 'without keep-alive'}")
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_ylabel("records/s (log scale)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=9, frameon=False)
    records = next(iter(by_config.values()))[0]["records_per_body"]
    fig.suptitle(f"Throughput by concurrency, {records:,}-record bodies")
    fig.tight_layout(rect=(0, 0, 0.86, 0.95))
    return _save(fig, out / "bench_throughput.png")


def latency(points: list[Point], body: str, out: Path, concurrency: int = 16) -> Path | None:
    by_config = sweep(points, body)
    rows = {
        config: {
            k: next((p for p in ps if p["concurrency"] == concurrency and p["keepalive"] == k), None)
            for k in (True, False)
        }
        for config, ps in by_config.items()
    }
    rows = {c: r for c, r in rows.items() if any(r.values())}
    if not rows:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(13, 6), sharey=True, sharex=True)
    names = list(rows)
    width = 0.27
    for ax, keepalive in zip(axes, (True, False), strict=True):
        for i, (key, shade) in enumerate((("p50_ms", "#9ecae1"), ("p90_ms", "#4292c6"), ("p99_ms", "#08519c"))):
            values = [(rows[c][keepalive] or {}).get(key) or 0 for c in names]
            ax.barh(
                [y + (i - 1) * width for y in range(len(names))],
                values,
                height=width,
                color=shade,
                label=key.replace("_ms", ""),
            )
        ax.axvline(
            SEED_MEAN_MS,
            color="#d62728",
            linestyle="--",
            linewidth=1.2,
            label=f"the seed's mean at c=16 on 8 cores ({SEED_MEAN_MS} ms)",
        )
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.set_xlabel("latency, ms (log scale)")
        ax.set_title(f"c={concurrency}, ab {'-k' if keepalive else 'without keep-alive'}")
        ax.grid(True, axis="x", which="major", alpha=0.3)
    axes[0].set_yticks(range(len(names)), names)
    axes[0].invert_yaxis()  # shared: once turns both; first configuration on top, p50 above p99
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=9, frameon=False)
    fig.suptitle(f"Latency percentiles at c={concurrency}, {body}-record bodies")
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    return _save(fig, out / "bench_latency_c16.png")


def cpu_cost(points: list[Point], body: str, out: Path) -> Path | None:
    by_config = sweep(points, body)
    medians = {c: _median([p["cpu_s_per_million"] for p in ps]) for c, ps in by_config.items()}
    costs = {c: v for c, v in medians.items() if v is not None}
    if not costs:
        return None
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(costs) + 1.6))
    names = list(costs)
    bars = ax.barh(names, [costs[c] for c in names], color=[_style(c)["color"] for c in names])
    ax.bar_label(bars, labels=[f"{costs[c]:.2f}" for c in names], padding=3, fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("server CPU-seconds per million records (median of the sweep points)")
    ax.set_xlim(0, max(costs.values()) * 1.15)
    ax.set_title(f"Server cost per million records, {body}-record bodies (lower is better)")
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return _save(fig, out / "bench_cpu_per_million.png")


def headline(points: list[Point], out: Path) -> Path | None:
    experiments = [e for e in ("key", "scale", "nginx") if any(p["experiment"] == e for p in points)]
    if not experiments:
        return None
    fig, axes = plt.subplots(1, len(experiments), figsize=(4.6 * len(experiments), 4.8), squeeze=False)
    titles = {"key": "10x target: c=8 -k", "scale": "1.8x target: c=16 -k", "nginx": "nginx within 10%: c=16 -k"}
    for ax, experiment in zip(axes[0], experiments, strict=True):
        arms: dict[str, list[float]] = {}
        for p in points:
            if p["experiment"] == experiment and p.get("complete"):
                arms.setdefault(p["config"], []).append(p["records_per_s"])
        names = list(arms)
        medians = [statistics.median(arms[c]) for c in names]
        xs = range(len(names))
        ax.bar(xs, medians, color=[_style(c)["color"] for c in names], alpha=0.75)
        for x, config in enumerate(names):
            ax.scatter([x] * len(arms[config]), arms[config], color="black", s=14, zorder=3)
        # the median goes under the name: a label above a short bar would sit on its dots
        ax.set_xticks(xs, [f"{c}\n{_RATE(m)}" for c, m in zip(names, medians, strict=True)])
        ax.yaxis.set_major_formatter(_RATE)
        ax.set_ylim(0, max(max(v) for v in arms.values()) * 1.1)
        ax.set_title(titles[experiment])
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].set_ylabel("records/s (bar: median, dots: rounds)")
    fig.suptitle("Headline comparisons, interleaved rounds, 1,600-record bodies")
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    return _save(fig, out / "bench_headline.png")


def codec(path: Path, out: Path) -> Path | None:
    """The codec candidates of bench/codec_bench.py: {"results": {variant: {kind: {"median": ...}}}}."""
    try:
        data = json.loads(path.read_text())
        results: dict[str, dict[str, dict[str, float]]] = data["results"]
        kinds = list(dict.fromkeys(kind for by_kind in results.values() for kind in by_kind))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        print(f"no codec chart: {path}: {exc}", file=sys.stderr)
        return None
    names = sorted(results, key=lambda v: -max((results[v].get(k) or {}).get("median", 0) for k in kinds))
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(names) * len(kinds) + 1.6))
    height = 0.8 / max(1, len(kinds))
    shades = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"]
    for i, kind in enumerate(kinds):
        values = [(results[v].get(kind) or {}).get("median", 0) for v in names]
        bars = ax.barh(
            [y + (i - (len(kinds) - 1) / 2) * height for y in range(len(names))],
            values,
            height=height,
            label=kind,
            color=shades[i % len(shades)],
        )
        ax.bar_label(
            bars, labels=[f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v / 1e3:.0f}k" for v in values], padding=3, fontsize=8
        )
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()  # fastest on top, the first kind above the second
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(_RATE)
    ax.xaxis.set_minor_formatter(NullFormatter())
    medians = [(results[v].get(k) or {}).get("median", 0) for v in names for k in kinds]
    smallest = min((m for m in medians if m > 0), default=1e4)
    ax.set_xlim(10 ** math.floor(math.log10(smallest / 2)), max(medians) * 3)
    ax.set_xlabel(f"records/s in process (log scale), {data.get('records_per_body', '?')}-record bodies")
    ax.set_title("Codec candidates: NDJSON bytes in, CSV rows per day + rejects out")
    ax.legend(loc="lower right", fontsize=9)
    ax.grid(True, axis="x", which="major", alpha=0.3)
    fig.tight_layout()
    return _save(fig, out / "bench_codec.png")


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "results.json")
    parser.add_argument("--codec", type=Path, default=ROOT / "bench" / "results" / "codec.json")
    parser.add_argument("--out", type=Path, default=ROOT / "images")
    parser.add_argument("--body", default="1600", help="which sweep body the charts show")
    args = parser.parse_args(argv)
    try:
        points = json.loads(args.results.read_text())["points"]
    except (OSError, ValueError, KeyError) as exc:
        print(f"cannot read {args.results}: {exc} (run bench/run.py first)", file=sys.stderr)
        points = []
    made = [
        throughput(points, args.body, args.out),
        latency(points, args.body, args.out),
        cpu_cost(points, args.body, args.out),
        headline(points, args.out),
    ]
    if args.codec.exists():
        made.append(codec(args.codec, args.out))
    for path in made:
        if path is not None:
            print(path)
    return 0 if any(made) else 1


if __name__ == "__main__":
    sys.exit(main())

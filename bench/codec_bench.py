"""In-process microbenchmark of the codec: records per second on request-sized bodies.

Usage:
    .venv/bin/python bench/codec_bench.py [--records 1600] [--bodies 8] [--repeats 9]
                                          [--min-time 0.2] [--sample PATH] [--out PATH]

Bodies: the sample day (../shared/data/cran-logs/2014-05-04.csv.gz beside the repo) as NDJSON
(``tiny.cranlog.ndjson_lines``, keys in column order), cut into bodies of ``--records``
lines; ``--bodies`` of them make one pass. The same bodies are also measured with the keys
shuffled per line. One repeat runs whole passes for at least ``--min-time`` seconds; the
table gives the median of ``--repeats`` repeats (records/s), JSON (with min and max too)
goes to ``--out`` (default bench/results/codec.json, git-ignored).

Variants:
- ``seed``: the seed's approach (bench/seed_server.py ``write_csv``): ``json.loads`` per
  line and ``csv.DictWriter`` rows, here into an ``io.StringIO``; no validation, not the
  product's output format (CRLF, no NA), rows not grouped by record date.
- ``reference``: ``tiny.codec.encode_reference``, orjson per line + the Python checks.
- ``reference+msgspec`` (when msgspec is installed): the same with ``msgspec.json.decode``
  instead of orjson. Only a speed comparison: on hostile input msgspec's JSON edge cases
  (integer range, depth) differ from orjson's, so it is not a drop-in codec.
- ``tiny_codec``: the Rust extension ``tiny._codec`` (``make codec``), returning the same values as the
  reference; checked equal to it on every body before timing.
"""

from __future__ import annotations

import argparse
import csv
import gc
import io
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tiny.codec import Batch, encode_reference  # noqa: E402
from tiny.cranlog import ndjson_lines  # noqa: E402
from tiny.layout import COLUMNS  # noqa: E402
from tiny.testing import SAMPLE_DAY  # noqa: E402

SAMPLE = SAMPLE_DAY
FIELDNAMES = list(COLUMNS)

Codec = Callable[[bytes], Any]


def seed_codec(body: bytes) -> str:
    """bench/seed_server.py's ``write_csv`` with an ``io.StringIO`` in place of the day file."""
    out = io.StringIO()
    writer = csv.DictWriter(out, FIELDNAMES, extrasaction="ignore")
    rows = []
    for record in [line for line in body.decode("utf-8").split("\n") if line]:
        try:
            rows.append(json.loads(record))
            if len(rows) >= 100:
                writer.writerows(rows)
                rows = []
        except Exception:  # the seed counted the line as invalid and dropped it
            pass
    if rows:
        writer.writerows(rows)
    return out.getvalue()


def msgspec_codec() -> Codec | None:
    """``encode_reference`` with msgspec's JSON decoder, or None without msgspec."""
    try:
        import msgspec
    except ImportError:
        return None
    decode = msgspec.json.Decoder().decode
    error = msgspec.DecodeError

    def decode_line(raw: bytes) -> Any:
        try:
            return decode(raw)
        except error:
            raise ValueError("not JSON") from None  # encode_reference names the reason

    def encode(body: bytes) -> Batch:
        return encode_reference(body, decode=decode_line)

    return encode


def variants() -> dict[str, Codec]:
    found: dict[str, Codec] = {"seed": seed_codec, "reference": encode_reference}
    with_msgspec = msgspec_codec()
    if with_msgspec is not None:
        found["reference+msgspec"] = with_msgspec
    try:
        from tiny import _codec
    except ImportError:
        print("tiny._codec is not importable (run `make codec`): measuring the Python variants only", file=sys.stderr)
    else:
        found["tiny_codec"] = _codec.encode
    return found


def make_bodies(sample: Path, records: int, count: int) -> dict[str, list[bytes]]:
    lines = []
    for line in ndjson_lines(sample):
        lines.append(line)
        if len(lines) == records * count:
            break
    rng = random.Random(20140504)

    def shuffled(line: bytes) -> bytes:
        items = list(orjson.loads(line).items())
        rng.shuffle(items)
        return orjson.dumps(dict(items)) + b"\n"

    def cut(all_lines: list[bytes]) -> list[bytes]:
        return [b"".join(all_lines[k : k + records]) for k in range(0, len(all_lines), records)]

    return {"plain keys": cut(lines), "shuffled keys": cut([shuffled(line) for line in lines])}


def _timer(codec: Codec, bodies: list[bytes]) -> Callable[[], float]:
    def one_pass() -> float:
        start = time.perf_counter()
        for body in bodies:
            codec(body)
        return time.perf_counter() - start

    return one_pass


def measure(
    codecs: dict[str, Codec], bodies: dict[str, list[bytes]], records: int, repeats: int, min_time: float
) -> dict[str, dict[str, dict[str, Any]]]:
    """Records/s of every codec on every kind of body, interleaved: each repeat times every
    (codec, kind) once, so drift on a shared machine hits them alike. Per (codec, kind): the
    median, min and max of the repeats, and each repeat's ratio to the seed's same repeat."""
    arms = [(name, kind) for name in codecs for kind in bodies]
    timers = {arm: _timer(codecs[arm[0]], bodies[arm[1]]) for arm in arms}
    passes = {arm: max(1, int(min_time / max(timers[arm](), 1e-9))) for arm in arms}  # also warms up
    rates: dict[tuple[str, str], list[float]] = {arm: [] for arm in arms}
    for repeat in range(repeats):
        for arm in arms if repeat % 2 == 0 else reversed(arms):
            gc.collect()
            elapsed = sum(timers[arm]() for _ in range(passes[arm]))
            rates[arm].append(records * len(bodies[arm[1]]) * passes[arm] / elapsed)
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for name, kind in arms:
        own, seed = rates[(name, kind)], rates[("seed", kind)]
        results.setdefault(name, {})[kind] = {
            "median": statistics.median(own),
            "min": min(own),
            "max": max(own),
            "passes": passes[(name, kind)],
            "x_seed_per_repeat": [round(a / b, 2) for a, b in zip(own, seed, strict=True)],
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1600, help="records per body (default 1600)")
    parser.add_argument("--bodies", type=int, default=8, help="bodies per pass (default 8)")
    parser.add_argument("--repeats", type=int, default=9, help="repeats; the median is reported (default 9)")
    parser.add_argument("--min-time", type=float, default=0.2, help="seconds per repeat at least (default 0.2)")
    parser.add_argument("--sample", type=Path, default=SAMPLE, help="a CRAN log day (default: the sample day)")
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/codec.json", help="JSON results")
    args = parser.parse_args()

    bodies = make_bodies(args.sample, args.records, args.bodies)
    codecs = variants()
    if "tiny_codec" in codecs:  # never time a codec that gives other values than the reference
        for kind in bodies.values():
            for body in kind:
                assert tuple(codecs["tiny_codec"](body)) == tuple(encode_reference(body)), "tiny_codec differs"

    results = measure(codecs, bodies, args.records, args.repeats, args.min_time)
    for name, by_kind in results.items():
        for kind, figures in by_kind.items():
            print(f"  {name:18} {kind:14} {figures['median']:>12,.0f} records/s", file=sys.stderr)

    kinds = list(bodies)
    print(
        f"\nCodec, records/s (median of {args.repeats} interleaved repeats; bodies of {args.records:,} records, "
        f"{len(bodies[kinds[0]])} per pass; x seed: the median of each repeat's ratio)\n"
    )
    print("| variant | " + " | ".join(kinds) + " | " + " | ".join(f"x seed ({k})" for k in kinds) + " |")
    print("|---|" + "---:|" * (2 * len(kinds)))
    for name, by_kind in results.items():
        rates = " | ".join(f"{by_kind[k]['median']:,.0f}" for k in kinds)
        ratios = " | ".join(f"{statistics.median(by_kind[k]['x_seed_per_repeat']):.1f}" for k in kinds)
        print(f"| {name} | {rates} | {ratios} |")

    report = {
        "unit": "records/s",
        "records_per_body": args.records,
        "bodies_per_pass": len(bodies[kinds[0]]),
        "repeats": args.repeats,
        "min_time": args.min_time,
        "sample": args.sample.name,
        "python": sys.version.split()[0],
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "processor": platform.machine()},
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwritten: {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()

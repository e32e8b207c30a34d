"""The key log at its default bound: a data dir with N keys in its log, then a server process's start on it.

Builds a data dir whose key log (tiny.keylog) holds ``--keys`` keys as a server stores them
(60-character keys, 16-byte digests, 120-byte answers, in segments of 64 MiB), then, in a fresh
interpreter each time (as a worker starts), opens its journal (``LocalCommit.open``: the
segments noted under the flush lock, then read into memory without it) and reports the wall
time of the opening itself and until the keys are all in memory (read on a thread of their
own, tiny.commit.local), the CPU of both, the process's RSS before and after it (VmRSS, /proc/self/status),
the key table's size, and the CPU of a flush with a fresh key and of a replayed one afterwards.
With ``--both``, each start is made twice, alternating: with the codec in use (the compiled
one's start loop, tiny._codec.take_keys) and with the reference codec (TINY_CODEC=python: the
loop in Python).
The data dir is a temp dir under ``--dir`` (default: the system's), removed afterwards unless
``--keep``.

Usage:
    python bench/keys_bench.py [--keys 10000000] [--starts 2] [--both] [--dir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tiny.commit import Claim  # noqa: E402
from tiny.commit.local import LocalCommit  # noqa: E402
from tiny.keylog import FIRST, SEGMENT_BYTES, encode, segment_name  # noqa: E402

_ANSWER = b'{"accepted":1,"rejected":0,"errors":[],"files":["2014-05-04.csv"],"bytes":173,' + b"x" * 40 + b"}"


def build(data: Path, keys: int) -> int:
    """A journal for ``data`` with ``keys`` keys in its log (stored within the last hour); returns its bytes."""
    journal = LocalCommit(data)
    journal.open()
    journal.close()
    number, out, size, total = 1, None, 0, 0
    stored = time.time() - 3600
    try:
        for seq in range(1, keys + 1):
            if out is None or size >= SEGMENT_BYTES:
                if out is not None:
                    out.close()
                    number += 1
                path = data / segment_name(number)
                path.parent.mkdir(parents=True, exist_ok=True)
                out, size = open(path, "wb", buffering=1 << 20), 0
            key = f"bench-{seq:016d}-{os.urandom(19).hex()}"[:60].encode()
            record = encode(seq, stored + seq * 1e-4, FIRST, key, os.urandom(16), _ANSWER)
            out.write(record)
            size += len(record)
            total += len(record)
    finally:
        if out is not None:
            out.close()
    return total


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def start(data: str) -> dict[str, float]:
    """One start on ``data`` (run in a fresh interpreter: ``--start DATA``)."""
    before = _rss_kib()
    wall, cpu = time.monotonic(), time.process_time()
    journal = LocalCommit(Path(data))
    journal.open()
    opened = time.monotonic() - wall
    assert journal.keys_read(3600)
    figures = {
        "open_s": opened,
        "keys_read_s": time.monotonic() - wall,
        "cpu_s": time.process_time() - cpu,
        "rss_before_mib": before / 1024,
        "rss_after_mib": _rss_kib() / 1024,
        "keys_in_table": journal.keys.table.size,
        "table_mib": journal.keys.table.nbytes / 1024**2,
    }
    fresh, replayed = [], []
    known = journal.keys.last[0] if journal.keys.last else "none"
    for n in range(200):
        for claim, spent in (
            (Claim(f"fresh-{n}-{os.urandom(8).hex()}", b"d" * 16, _ANSWER), fresh),
            (Claim(known, b"d", b"a"), replayed),
        ):
            cpu = time.process_time()
            journal.commit([_Append(claim)], time.monotonic() + 5)
            spent.append(time.process_time() - cpu)
    figures["fresh_key_flush_us"] = sorted(fresh)[len(fresh) // 2] * 1e6
    figures["replayed_key_flush_us"] = sorted(replayed)[len(replayed) // 2] * 1e6
    journal.close()
    return figures


class _Append:
    def __init__(self, claim: Claim) -> None:
        self.claim = claim
        self.chunks = {"2014-05-04.csv": b"1\n"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--starts", type=int, default=2)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--both", action="store_true", help="each start also with TINY_CODEC=python, alternating")
    parser.add_argument("--start", help=argparse.SUPPRESS)  # one start, in this interpreter
    args = parser.parse_args()
    if args.start:
        print(json.dumps(start(args.start)))
        return 0
    scratch = Path(tempfile.mkdtemp(prefix="tiny-keys-", dir=args.dir))
    try:
        data = scratch / "data"
        began = time.monotonic()
        total = build(data, args.keys)
        print(
            f"built {args.keys:,} keys: {total / 1024**2:,.0f} MiB of log in {time.monotonic() - began:.0f} s",
            flush=True,
        )
        for number in range(args.starts):
            for codec in ("", "python")[: 2 if args.both else 1][:: 1 if number % 2 == 0 else -1]:
                found = subprocess.run(
                    [sys.executable, __file__, "--start", str(data)],
                    check=True,
                    capture_output=True,
                    text=True,
                    env={**os.environ, **({"TINY_CODEC": codec} if codec else {})},
                )
                figures = json.loads(found.stdout)
                named = f" ({codec or 'in use'} codec)" if args.both else ""
                shown = ", ".join(f"{k} {v:,.1f}" for k, v in figures.items())
                print(f"start {number + 1}{named}: {shown}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

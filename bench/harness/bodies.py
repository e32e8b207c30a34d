"""The request bodies that the load drivers post, from the sample day."""

from __future__ import annotations

import gzip
import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from tiny.cranlog import ndjson_lines
from tiny.testing import SAMPLE_DAY


@dataclass(frozen=True)
class Body:
    """One request body file that ab posts."""

    name: str
    path: Path
    records: int
    gzip: bool = False

    @property
    def size(self) -> int:
        return self.path.stat().st_size


def _shuffled(line: bytes, rng: random.Random) -> bytes:
    items = list(orjson.loads(line).items())
    rng.shuffle(items)
    return orjson.dumps(dict(items)) + b"\n"


def make_bodies(out_dir: Path, sizes: Sequence[int] = (1, 10, 100, 1600, 16000)) -> dict[str, Body]:
    """Write the bench bodies from the sample day; returns them by name.

    For each size S: ``S`` (the first S records, keys in file order), ``S-shuffled`` (keys in
    a random order per line, seeded), ``S-gzip`` (``S``, gzip level 6).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = list(itertools.islice(ndjson_lines(SAMPLE_DAY), max(sizes)))
    rng = random.Random(20140504)
    bodies: dict[str, Body] = {}
    for size in sizes:
        plain = b"".join(lines[:size])
        variants = {
            f"{size}": (plain, False),
            f"{size}-shuffled": (b"".join(_shuffled(line, rng) for line in lines[:size]), False),
            f"{size}-gzip": (gzip.compress(plain, 6), True),
        }
        for name, (data, compressed) in variants.items():
            path = out_dir / (f"{name}.ndjson.gz" if compressed else f"{name}.ndjson")
            if not path.exists() or path.read_bytes() != data:
                path.write_bytes(data)
            bodies[name] = Body(name, path, size, compressed)
    return bodies

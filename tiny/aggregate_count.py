"""Counting day-file rows into the sums the aggregate store adds (tiny.aggregates, tiny.aggregate_sql).

A row is a line of the day file after its header (lines end at LF only: a string may hold
U+2028 or U+0085, which Python's ``splitlines`` would also break at), read by
tiny.cranlog.read_row (the row queries read a whale's rows by the same rule); a quoted ``"NA"``
is the string, a bare ``NA`` is missing. A row that does not parse is skipped and counted
(:attr:`Sums.skipped`): the CSV the sink writes always parses. With the compiled codec in use
(tiny.codec.CODEC), ``tiny._codec.tally`` counts the usual rows of a block with the GIL
released and hands every other line back to :meth:`Sums.add`, the rule book (about 3x faster a
fold; BENCHMARKS.md "Analytics beside ingest"); :func:`count_reference` counts by the rule book
alone, and both give the same sums.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from tiny import codec
from tiny.cranlog import read_row


@dataclass
class Sums:
    """What one fold adds for one day."""

    rows: int = 0
    bytes: int = 0
    skipped: int = 0

    def __post_init__(self) -> None:
        self.packages: defaultdict[str, int] = defaultdict(int)
        self.hours: defaultdict[int, int] = defaultdict(int)
        self.ips: defaultdict[int, list[int]] = defaultdict(lambda: [0, 0])
        self.ip_hours: defaultdict[tuple[int, int], int] = defaultdict(int)
        self.ip_countries: defaultdict[tuple[int, str], int] = defaultdict(int)

    def add(self, line: str) -> None:
        row = read_row(line)  # the rule book: which lines are rows, and their fields
        if row is None:
            self.skipped += 1
            return
        self.rows += 1
        self.bytes += row.size
        if row.package is not None:
            self.packages[row.package] += 1
        self.hours[row.hour] += 1
        totals = self.ips[row.ip_id]
        totals[0] += 1
        totals[1] += row.size
        self.ip_hours[row.ip_id, row.hour] += 1
        if row.country is not None:
            self.ip_countries[row.ip_id, row.country] += 1


def count(block: bytes, start: int, end: int) -> Sums:
    """The sums of the day-file lines in ``block[start:end]`` (``end`` just past an LF)."""
    if codec.CODEC == "rust":
        from tiny import _codec

        rows, nbytes, packages, hours, ips, ip_hours, ip_countries, deferred = _codec.tally(block, start, end)
        sums = Sums(rows, nbytes)
        sums.packages.update(packages)
        sums.hours.update((hour, n) for hour, n in enumerate(hours) if n)
        sums.ips.update(ips)
        sums.ip_hours.update(ip_hours)
        sums.ip_countries.update(ip_countries)
        for first, last in deferred:  # the lines the compiled count leaves to the rule book
            sums.add(block[first:last].decode("utf-8", "replace"))
        return sums
    return count_reference(block, start, end)


def count_reference(block: bytes, start: int, end: int) -> Sums:
    """:func:`count` by the rule book alone (no compiled codec)."""
    sums = Sums()
    if end > start:
        for line in block[start : end - 1].decode("utf-8", "replace").split("\n"):
            sums.add(line)
    return sums

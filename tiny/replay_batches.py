"""The replay client's source: a CRAN log file's records as numbered NDJSON batches.

:func:`file_lines` reads a ``YYYY-MM-DD.csv[.gz]`` file with :mod:`tiny.cranlog` and gives
each record as an NDJSON line with its line number; :func:`numbered_batches` cuts them into
:class:`Batch` es, each of which names itself by its records (:meth:`Batch.key`, the
``Idempotency-Key`` tiny.replay sends).
"""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from tiny.cranlog import open_log, parse_row
from tiny.layout import COLUMNS


class MalformedRow(ValueError):
    """A row of the input file that is not a CRAN log row; ``line`` is its line number."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")
        self.line = line


def file_lines(path: Path, start_line: int = 2) -> Iterator[tuple[int, bytes]]:
    """``(line number, NDJSON line)`` of each record of a CRAN log file from ``start_line`` on
    (line 1 is the header); MalformedRow, raised when it is reached, for a row that is not one,
    and for a first line that is not the header (a file cut from the middle of a day's would
    otherwise lose its first row unsaid)."""
    number = 0
    with open_log(path) as handle:
        try:
            for number, text in enumerate(handle, 1):
                if number == 1 and _columns(text) != COLUMNS:
                    raise MalformedRow(1, f"not the CRAN log header ({', '.join(COLUMNS)}): give the file its header")
                if number < max(start_line, 2):
                    continue
                try:
                    record = parse_row(text.rstrip("\n"))
                except ValueError as exc:
                    raise MalformedRow(number, f"not a CRAN log row ({exc})") from None
                yield number, orjson.dumps(record) + b"\n"
        except (UnicodeDecodeError, EOFError, gzip.BadGzipFile) as exc:  # while reading line number + 1
            raise MalformedRow(number + 1, f"unreadable: {exc}") from None


def _columns(line: str) -> tuple[str, ...]:
    """The column names of a header line, its quotes, line end and byte order mark dropped."""
    return tuple(name.strip().strip('"') for name in line.lstrip("\ufeff").rstrip("\r\n").split(","))


@dataclass(frozen=True)
class Batch:
    """One request's records: the file lines it holds (first and last), their count, its body."""

    first_line: int
    last_line: int
    records: int
    body: bytes

    def key(self) -> str:
        """``replay-<128-bit BLAKE2b of the NDJSON body>-<first line>-<last line>``: made of
        the records (the body is built from the parsed rows) and where they stand, never of
        the file's bytes, so that the same rows replayed from the .csv.gz, the gunzipped
        .csv or a copy with CRLF line ends get the same keys, and equal batches at two places
        of a file do not."""
        digest = hashlib.blake2b(self.body, digest_size=16).hexdigest()
        return f"replay-{digest}-{self.first_line}-{self.last_line}"


def numbered_batches(lines: Iterable[tuple[int, bytes]], size: int) -> Iterator[Batch]:
    """Consecutive ``size``-record batches of numbered lines (see :func:`file_lines`). When the
    lines end in MalformedRow, the records before it still make a last batch, then it is raised."""
    if size < 1:
        raise ValueError("batch size must be at least 1")
    it = iter(lines)
    while True:
        chunk: list[tuple[int, bytes]] = []
        try:
            for item in it:
                chunk.append(item)
                if len(chunk) == size:
                    break
        except MalformedRow:
            if chunk:
                yield _batch(chunk)
            raise
        if not chunk:
            return
        yield _batch(chunk)


def _batch(chunk: list[tuple[int, bytes]]) -> Batch:
    return Batch(chunk[0][0], chunk[-1][0], len(chunk), b"".join(line for _, line in chunk))

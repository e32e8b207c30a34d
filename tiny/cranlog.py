"""Reading CRAN log CSV files (the public ``YYYY-MM-DD.csv.gz``) back into records.

Python's csv module cannot tell a quoted ``"NA"`` (the string) from a bare ``NA``
(missing), so rows are split here: quoted fields are strings with ``""`` undoubled,
bare ``NA`` is None, other bare fields are integers.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from tiny.layout import COLUMNS

_FIELD = re.compile(r'"((?:[^"]|"")*)"|([^,"]*)')


def parse_row(line: str) -> dict[str, Any]:
    """One CSV row (without its LF) as a record dict; raises ValueError if malformed."""
    values: list[Any] = []
    pos = 0
    while True:
        match = _FIELD.match(line, pos)
        if match is None:
            raise ValueError(f"malformed CSV at column {pos}: {line!r}")
        quoted, bare = match.groups()
        if quoted is not None:
            values.append(quoted.replace('""', '"'))
        elif bare == "NA":
            values.append(None)
        else:
            values.append(int(bare))
        pos = match.end()
        if pos == len(line):
            break
        if line[pos] != ",":
            raise ValueError(f"malformed CSV at column {pos}: {line!r}")
        pos += 1
    if len(values) != len(COLUMNS):
        raise ValueError(f"expected {len(COLUMNS)} fields, got {len(values)}: {line!r}")
    return dict(zip(COLUMNS, values, strict=True))


def open_log(path: str | Path) -> IO[str]:
    """Open a CRAN log file, gzip-compressed or plain, as UTF-8 text."""
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", newline="\n")
    return open(path, encoding="utf-8", newline="\n")


def iter_records(path: str | Path) -> Iterator[dict[str, Any]]:
    """Yield every record of a CRAN log file, in file order, skipping the header."""
    with open_log(path) as handle:
        next(handle, None)
        for line in handle:
            yield parse_row(line.rstrip("\n"))


def ndjson_lines(path: str | Path) -> Iterator[bytes]:
    """Yield each record of a CRAN log file as one LF-terminated NDJSON line."""
    for record in iter_records(path):
        yield orjson.dumps(record) + b"\n"

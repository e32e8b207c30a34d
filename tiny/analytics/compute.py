"""The pool side of the queries that read a day's rows: one ip_id's downloads (and its chart).

Everything else the dashboard shows comes from the aggregate store (tiny.analytics.store).
This runs in an analytics pool process (see :mod:`tiny.analytics.service`), never in a
worker serving HTTP, within the server's analytics CPU quota (tiny.analytics.cpu): the
``*_job`` functions are what the worker submits, and they return small, picklable results.

Only that ip_id's rows are parsed: ip_id is a day file's last column, a bare integer, so each
of its rows ends with ``,<ip_id>`` and its LF, which a byte search finds (memchr speed: about
10 ms for 10 MB, where parsing every row took 230 ms); those lines alone are parsed, then
held to the ip_id again. A line that could not be read that way (hand-edited) is not one of
its rows for the aggregates either. The pool process keeps the parsed rows of its last
ip_ids and file versions, at most ``_ROWS_CACHE_BYTES``.

Reading a file that is being appended to: a job reads exactly the first ``size`` bytes (the
stat its :class:`DayFile` came from) and ignores a last line without its LF (a write in
progress).

Engine: polars reads the day CSV with quote processing off (bare ``NA`` is missing, a quoted
``"NA"`` stays the string NA, e.g. Namibia's country code) and unquotes the strings itself;
a file whose strings hold commas falls back to the exact pure-Python parser
(:func:`tiny.cranlog.parse_row`).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from tiny.analytics.names import whale_name
from tiny.layout import COLUMNS

if TYPE_CHECKING:  # imported in the pool process only: workers never load polars
    import polars as pl

DEFAULT_TOP = 6
MAX_TOP = 100  # whales a dashboard query may ask for (``top``)
DEFAULT_LIMIT = 1000
MAX_LIMIT = 100_000
HOURS = 24
_ROWS_CACHE_BYTES = 64 * 1024**2  # parsed rows of ip_ids a pool process keeps (the newest always)
_PARENT_POLL_SECONDS = 1.0
_STRING_COLUMNS = ("time", "package", "version", "country")
_USED_COLUMNS = ("time", "size", "package", "version", "country", "ip_id")

_frames: OrderedDict[tuple[str, int, int, int], Any] = OrderedDict()


def dumps(value: Any) -> bytes:
    """An answer as JSON bytes: orjson, or the stdlib's json when an integer is past orjson's
    64-bit range (byte totals can be: sums are exact, 128-bit in polars)."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


@dataclass(frozen=True)
class DayFile:
    """One version of a day file: what a job reads and what a cached result is keyed on."""

    date: str
    path: str
    size: int
    mtime_ns: int

    @property
    def version(self) -> tuple[int, int]:
        return (self.size, self.mtime_ns)


def pool_init(parent: int, threads: int) -> None:
    """Runs first in each pool process (confined already: tiny.analytics.cpu.ConfinedContext):
    threads, signals, the parent watch."""
    os.environ["POLARS_MAX_THREADS"] = str(threads)  # read when polars is first imported
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group; the worker decides
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="parent-watch").start()


def _watch_parent(parent: int) -> None:
    # A worker killed with -9 cannot stop its pool: the pool process notices and exits.
    while os.getppid() == parent:
        time.sleep(_PARENT_POLL_SECONDS)
    os._exit(0)


def read_complete_lines(path: str, size: int) -> bytes:
    """The first ``size`` bytes of ``path`` up to and including the last LF among them."""
    with open(path, "rb") as handle:
        data = handle.read(size)
    return data[: data.rfind(b"\n") + 1]


def _schema() -> dict[str, Any]:
    import polars as pl

    types = {"size": pl.UInt64, "ip_id": pl.UInt64}
    return {column: types.get(column, pl.String) for column in COLUMNS}


def parse_fast(data: bytes) -> pl.DataFrame:
    """Parse day-file bytes with polars, quote processing off (bare NA = null, "NA" = "NA").

    Raises polars' ComputeError when a string holds a comma (the row has too many fields).
    """
    import polars as pl

    frame = pl.read_csv(
        data,
        has_header=False,
        skip_rows=1,
        schema=_schema(),
        quote_char=None,
        null_values="NA",
        columns=[COLUMNS.index(c) for c in _USED_COLUMNS],
    )
    unquote = [
        pl.col(c).str.strip_prefix('"').str.strip_suffix('"').str.replace_all('""', '"', literal=True)
        for c in _STRING_COLUMNS
    ]
    return frame.with_columns(unquote)


def parse_exact(data: bytes) -> pl.DataFrame:
    """Parse day-file bytes row by row with tiny.cranlog.parse_row (any valid CSV; slow)."""
    import polars as pl

    from tiny.cranlog import parse_row

    columns: dict[str, list[Any]] = {c: [] for c in _USED_COLUMNS}
    for line in data.decode("utf-8", "replace").split("\n")[1:]:
        try:
            row = parse_row(line)
        except ValueError:
            continue  # the empty string after the last LF, or a line that is not a row
        if isinstance(row["size"], int) and isinstance(row["ip_id"], int):
            for c in _USED_COLUMNS:
                columns[c].append(row[c])
    schema = _schema()
    return pl.DataFrame(columns, schema={c: schema[c] for c in _USED_COLUMNS})


def lines_of(data: bytes, ip_id: int, start: int = 0) -> bytes:
    """The lines of ``data[start:]`` (complete day-file lines from ``start``, a line's start)
    that end with ``,<ip_id>``: its rows."""
    needle = b",%d\n" % ip_id
    found = []
    at = data.find(needle, start)
    while at != -1:  # each step: one search forward and one back to the line's start
        end = at + len(needle)
        found.append(data[max(data.rfind(b"\n", 0, at) + 1, start) : end])
        at = data.find(needle, end)
    return b"".join(found)


def rows_of(day: DayFile, ip_id: int) -> pl.DataFrame:
    """The rows of ``ip_id`` in this version of the day file (cached), with an ``hour`` column."""
    import polars as pl

    key = (day.path, day.size, day.mtime_ns, ip_id)
    frame = _frames.get(key)
    if frame is not None:
        _frames.move_to_end(key)
        return frame
    data = read_complete_lines(day.path, day.size)
    first = data.find(b"\n") + 1  # the header: the parsers skip it
    mine = data[:first] + lines_of(data, ip_id, first)
    try:
        frame = parse_fast(mine) if mine.count(b"\n") > 1 else parse_exact(mine)
    except pl.exceptions.PolarsError:
        frame = parse_exact(mine)
    frame = frame.filter(pl.col("ip_id") == ip_id)
    frame = frame.with_columns(hour=pl.col("time").str.slice(0, 2).cast(pl.Int32, strict=False))
    _frames[key] = frame
    while len(_frames) > 1 and sum(f.estimated_size() for f in _frames.values()) > _ROWS_CACHE_BYTES:
        _frames.popitem(last=False)
    return frame


def _total(column: str) -> pl.Expr:
    """The exact sum of a UInt64 column: 128-bit, where a 64-bit sum wraps (2 x (2^64-1) = 2^64-2)."""
    import polars as pl

    return pl.col(column).cast(pl.Int128).sum()


def whale_downloads(frame: pl.DataFrame, date: str, ip_id: int, limit: int) -> dict[str, Any] | None:
    """One ip_id's downloads in time order (file order within a second), the first ``limit``."""
    import polars as pl

    mine = frame.filter(pl.col("ip_id") == ip_id)
    if mine.height == 0:
        return None
    ordered = mine.sort("time", maintain_order=True)
    countries = mine["country"].drop_nulls().value_counts().sort(["count", "country"], descending=[True, False])
    return {
        "date": date,
        "ip_id": ip_id,
        "name": whale_name(date, ip_id),
        "country": countries["country"][0] if countries.height else None,
        "total": mine.height,
        "bytes": int(mine.select(_total("size")).item() or 0),
        "packages": mine["package"].n_unique(),
        "limit": limit,
        "truncated": mine.height > limit,
        "downloads": ordered.head(limit).select("time", "package", "version", "size").to_dicts(),
    }


def downloads_job(day: DayFile, ip_id: int, limit: int) -> bytes | None:
    """Pool job: one ip_id's downloads (see :func:`whale_downloads`) as JSON bytes, None if it has
    none. Serialised here: an answer of 100,000 downloads is megabytes the worker only sends."""
    result = whale_downloads(rows_of(day, ip_id), day.date, ip_id, limit)
    return None if result is None else dumps(result)

"""The codec: an NDJSON request body in, CRAN-format CSV rows per day and rejects out.

Contract (both implementations keep it, byte for byte; tests/test_codec_differential.py
holds them equal):

``encode(body: bytes, max_days: int = MAX_DAYS, max_rejects: int = MAX_REJECTS) -> Batch``
where

- ``Batch.days`` maps each record's date (``"YYYY-MM-DD"``) to the CSV rows of that day,
  in body order, each row LF-terminated, no header; at most ``max_days`` days: a valid
  record of a further day is an invalid line (:data:`TOO_MANY_DAYS`);
- ``Batch.rejects`` lists ``(line_number, reason, raw_line)`` for the first
  ``max_rejects`` invalid lines, 1-based over the body's physical lines, ``raw_line``
  without its LF or CRLF;
- ``Batch.valid`` and ``Batch.invalid`` count every valid and invalid line. Blank lines
  (only spaces, tabs and CRs) are not records and count in neither;
- ``Batch.omitted`` is ``(first, last)``, the line numbers of the first and last invalid
  line past ``max_rejects`` (``invalid - len(rejects)`` of them), or None.

So the memory one body takes is bounded by a small multiple of its size, whatever its mix
of valid and invalid lines. A line is valid when it is a UTF-8 JSON object whose fields
pass :func:`record_row`'s rules (docs in README "Records"). The function never raises
for any input bytes.

The reference codec reads in two layers: :func:`record_row` is the rule book, one check per
field in column order; :func:`_fast_row` is a shortcut for the usual valid record that
gives the same rows from a few cheap tests, and leaves every other record to the rule book.

:data:`encode` is the compiled codec (the ``tiny._codec`` extension module, Rust, built from
rust/tiny_codec by ``pip install .`` or, in the source tree, ``make codec``) when it is
importable, and the pure-Python :func:`encode_reference` otherwise; :data:`CODEC` names the
one in use ("rust" or "python"). ``TINY_CODEC=python`` forces the reference codec.
"""

from __future__ import annotations

import io
import os
import re
from collections import defaultdict
from collections.abc import Callable, Container
from datetime import date as _date
from operator import itemgetter
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import orjson

from tiny import limits
from tiny.layout import COLUMNS
from tiny.profiling import profile

STRING_FIELDS = ("r_version", "r_arch", "r_os", "package", "version", "country")  # strings, or NA
_CRATE = Path(__file__).resolve().parent.parent / "rust" / "tiny_codec"
MAX_STRING = limits.MAX_STRING  # characters (code points), not bytes
MAX_DAYS = limits.MAX_DAYS  # distinct days in one body (--max-days)
MAX_REJECTS = limits.MAX_REJECTS  # invalid lines whose record one body keeps (--max-rejects)
TOO_MANY_DAYS = "date: more days in one request than --max-days"
# Every reason a line can be refused with, in the order the checks run (the compiled codec's
# own list, tiny._codec.REASONS, is held equal to this when it is imported).
REASONS = (
    "invalid UTF-8",
    "invalid JSON",
    "not a JSON object",
    "date: missing",
    "date: not a string",
    "date: not a calendar date YYYY-MM-DD",
    "time: missing",
    "time: not a string",
    "time: not a time of day HH:MM:SS",
    "size: missing",
    "size: not an integer",
    "size: less than 0",
    *(
        f"{field}: {reason}"
        for field in STRING_FIELDS
        for reason in ("not a string or null", f"longer than {MAX_STRING} characters", "control character")
    ),
    "ip_id: missing",
    "ip_id: not an integer",
    "ip_id: less than 1",
    TOO_MANY_DAYS,
)

# Integers keep orjson's range: it decodes -2**63 .. 2**64-1 as int and anything wider as
# float, which is "not an integer" here, in both codecs.
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}\Z")
_TIME = re.compile(r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\Z")
_CONTROL = re.compile(r"[\x00-\x1f]")
_BLANK = b" \t\r"


class Batch(NamedTuple):
    """What one request body becomes: see the module docstring."""

    days: dict[str, bytes]
    rejects: list[tuple[int, str, bytes]]
    valid: int
    invalid: int
    omitted: tuple[int, int] | None = None


class InvalidRecord(ValueError):
    """A line that is not a valid record; ``reason`` is the short text clients see."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _quote(value: str) -> str:
    return '"' + value.replace('"', '""') + '"'


def _string(record: dict[str, Any], field: str) -> str:
    value = record.get(field)
    if value is None:
        return "NA"
    if type(value) is not str:
        raise InvalidRecord(f"{field}: not a string or null")
    if len(value) > MAX_STRING:
        raise InvalidRecord(f"{field}: longer than {MAX_STRING} characters")
    if _CONTROL.search(value):
        raise InvalidRecord(f"{field}: control character")
    return _quote(value)


def _integer(record: dict[str, Any], field: str, minimum: int) -> str:
    value = record.get(field)
    if value is None:
        raise InvalidRecord(f"{field}: missing")
    if type(value) is not int:  # bool is a subclass of int, and 1.0 is a float: both refused
        raise InvalidRecord(f"{field}: not an integer")
    if value < minimum:
        raise InvalidRecord(f"{field}: less than {minimum}")
    return str(value)


def _day(record: dict[str, Any]) -> str:
    value = record.get("date")
    if value is None:
        raise InvalidRecord("date: missing")
    if type(value) is not str:
        raise InvalidRecord("date: not a string")
    if not _DATE.match(value):
        raise InvalidRecord("date: not a calendar date YYYY-MM-DD")
    try:
        _date(int(value[:4]), int(value[5:7]), int(value[8:]))
    except ValueError:
        raise InvalidRecord("date: not a calendar date YYYY-MM-DD") from None
    return value


def _time(record: dict[str, Any]) -> str:
    value = record.get("time")
    if value is None:
        raise InvalidRecord("time: missing")
    if type(value) is not str:
        raise InvalidRecord("time: not a string")
    if not _TIME.match(value):
        raise InvalidRecord("time: not a time of day HH:MM:SS")
    return value


def record_row(record: Any) -> tuple[str, str]:
    """Validate one decoded JSON value; return its date and its CSV row (LF-terminated).

    Fields are checked in column order and the first failure is reported. Raises
    :class:`InvalidRecord`. This is the rule book; :func:`_fast_row` only takes shortcuts
    that give the same rows.
    """
    if type(record) is not dict:
        raise InvalidRecord("not a JSON object")
    day = _day(record)
    fields = [
        _quote(day),
        _quote(_time(record)),
        _integer(record, "size", 0),
        *(_string(record, name) for name in STRING_FIELDS),
        _integer(record, "ip_id", 1),
    ]
    return day, ",".join(fields) + "\n"


# One C call reads the ten columns for _fast_row. Its keys are orjson's own str objects for
# those texts (orjson caches the keys it decodes: see its README), so each dict lookup finds
# its key by identity instead of comparing text. With another decoder (or once orjson's
# cache drops one) lookups compare text: slower, same values.
_COLUMN_VALUES = itemgetter(*orjson.loads(orjson.dumps(dict.fromkeys(COLUMNS))))
# `int in bytes` is one memchr; `b"\\" in bytes` takes several times longer (CPython 3.11).
_BACKSLASH = ord("\\")


def _fast_row(raw: bytes, record: Any, known_days: Container[str]) -> tuple[str, str] | None:
    """:func:`record_row` for the usual valid record, by a few cheap tests; None if unsure.

    Speed: nearly every record comes this way, so instead of a check per rule and field it
    makes a few tests that imply the rules, and leaves anything else (every invalid record
    among them) to :func:`record_row`, which decides and gives the reason:

    - ``raw``, the record's JSON line, has no backslash: then none of its strings has an
      escape, so none holds a ``"`` or a control character (JSON escapes them, and the
      decoder refuses them raw): no control check, and no quotes to double;
    - the date is one of ``known_days``, dates this batch already found valid (a body holds
      one or two);
    - the row is at most 1,024 characters long, so no string in it is longer.
    """
    if type(record) is not dict or _BACKSLASH in raw:
        return None
    try:
        values = _COLUMN_VALUES(record)
    except KeyError:  # an absent string is null; other absent columns fail below
        values = tuple(map(record.get, COLUMNS))
    date, time, size, r_version, r_arch, r_os, package, version, country, ip_id = values
    if not (
        type(date) is str
        and date in known_days
        and type(time) is str
        and _TIME.match(time)
        and type(size) is int
        and size >= 0
        and type(ip_id) is int
        and ip_id >= 1
    ):
        return None
    try:  # str.join takes strs only (and no JSON decoder makes a str subclass)
        strings = '","'.join((r_version, r_arch, r_os, package, version, country))
    except TypeError:  # a null among them, or a value of another type
        cells = _cells_with_nulls(values[3:9])
        if cells is None:
            return None
        row = f'"{date}","{time}",{size},{cells},{ip_id}\n'
    else:
        row = f'"{date}","{time}",{size},"{strings}",{ip_id}\n'
    return (date, row) if len(row) <= MAX_STRING else None


def _cells_with_nulls(values: tuple[Any, ...]) -> str | None:
    """The string cells of a row: "text" or NA (null), comma-separated; None if one is neither."""
    cells = []
    for value in values:
        if type(value) is str:
            cells.append(f'"{value}"')
        elif value is None:
            cells.append("NA")
        else:
            return None
    return ",".join(cells)


def undecodable(raw: bytes) -> InvalidRecord:
    """The error for a line a JSON decoder refused: not UTF-8, else not JSON."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return InvalidRecord("invalid UTF-8")
    return InvalidRecord("invalid JSON")


@profile
def encode_reference(
    body: bytes,
    max_days: int = MAX_DAYS,
    max_rejects: int = MAX_REJECTS,
    *,
    decode: Callable[[bytes], Any] = orjson.loads,
) -> Batch:
    """The readable reference codec: orjson per line, then :func:`record_row`'s rules.

    ``decode`` swaps the JSON decoder (the codec benchmark measures others with it). It gets
    each line with its LF (and the CR of a CRLF), which are JSON whitespace, and raises
    ValueError for a line it cannot decode (:func:`undecodable` then names the reason). It
    must refuse what JSON refuses: :func:`_fast_row` relies on unescaped strings having no
    control characters.
    """
    days: defaultdict[str, list[str]] = defaultdict(list)
    rejects: list[tuple[int, str, bytes]] = []
    invalid = 0
    omitted_first = omitted_last = 0
    # Lines one at a time (BytesIO shares the body's buffer): body.split() would hold every
    # line as an object at once, about 35 bytes each, 20 times a body of short lines.
    for number, raw in enumerate(io.BytesIO(body), 1):
        try:
            try:
                record = decode(raw)
            except ValueError:  # blank lines land here too: no JSON text
                if not raw.strip(_BLANK + b"\n"):
                    continue
                raise undecodable(_line(raw)) from None
            day, row = _fast_row(raw, record, days) or record_row(record)
            if day not in days and len(days) >= max_days:
                raise InvalidRecord(TOO_MANY_DAYS)
        except InvalidRecord as exc:
            invalid += 1
            if len(rejects) < max_rejects:
                rejects.append((number, exc.reason, _line(raw)))
            else:  # kept as a count and a line range only: a small body may hold millions
                omitted_first = omitted_first or number
                omitted_last = number
            continue
        days[day].append(row)
    valid = sum(map(len, days.values()))
    omitted = (omitted_first, omitted_last) if omitted_first else None
    return Batch({day: "".join(rows).encode() for day, rows in days.items()}, rejects, valid, invalid, omitted)


def _line(raw: bytes) -> bytes:
    """A line without its LF or CRLF."""
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    return raw[:-1] if raw.endswith(b"\r") else raw


class Encode(Protocol):
    """The signature both codecs share."""

    def __call__(self, body: bytes, max_days: int = MAX_DAYS, max_rejects: int = MAX_REJECTS) -> Batch: ...


def _select() -> tuple[str, Encode]:
    """Pick the compiled codec unless it is missing or TINY_CODEC=python asks otherwise."""
    if os.environ.get("TINY_CODEC", "").lower() in ("python", "reference"):
        return "python", encode_reference
    try:
        from tiny import _codec
    except ImportError:
        return "python", encode_reference
    _check_agrees(_codec)
    compiled = _codec.encode

    def encode_compiled(body: bytes, max_days: int = MAX_DAYS, max_rejects: int = MAX_REJECTS) -> Batch:
        return Batch(*compiled(body, max_days, max_rejects))

    return "rust", encode_compiled


def _check_agrees(compiled: Any) -> None:
    """The compiled codec's limits, columns and reasons are this module's: ImportError otherwise
    (a compiled module from another version of the code, whose rows or reasons would differ)."""
    theirs = (compiled.MAX_DAYS, compiled.MAX_REJECTS, compiled.MAX_STRING, tuple(compiled.COLUMNS))
    ours = (MAX_DAYS, MAX_REJECTS, MAX_STRING, COLUMNS)
    if theirs != ours or set(compiled.REASONS) != set(REASONS):
        raise ImportError(
            f"the compiled codec {compiled.__file__} disagrees with tiny/codec.py (limits, columns or reasons: "
            f"{theirs} against {ours}): rebuild it with `make codec`, or run the reference codec with TINY_CODEC=python"
        )


def source_hash(crate: Path = _CRATE) -> str | None:
    """The build id the crate's sources in ``crate`` give (rust/tiny_codec/build.rs: FNV-1a 64
    over Cargo.toml and src/*.rs, each as its path, NUL, its bytes, NUL), or None without them
    (an installed package, not a checkout)."""
    if not (crate / "Cargo.toml").exists():
        return None
    digest = 0xCBF29CE484222325
    for name in ["Cargo.toml", *sorted(f"src/{path.name}" for path in (crate / "src").glob("*.rs"))]:
        for byte in name.encode() + b"\0" + (crate / name).read_bytes() + b"\0":
            digest = ((digest ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{digest:016x}"


def stale_build() -> str | None:
    """Why the compiled codec in use was not built from this checkout's sources, or None (it
    was, or no compiled codec or no sources are here)."""
    if CODEC != "rust":
        return None
    from tiny import _codec

    found = source_hash()
    if found is None or found == _codec.BUILD_ID:
        return None
    return (
        f"the compiled codec {_codec.__file__} was built from other sources (build {_codec.BUILD_ID}) than "
        f"this checkout's rust/tiny_codec (build {found}): run `make codec` (`make run` does), or start with "
        "TINY_CODEC=python"
    )


def build_id() -> str | None:
    """The compiled codec's version and build id (for /healthz), or None for the reference codec."""
    if CODEC != "rust":
        return None
    from tiny import _codec

    return f"{_codec.__version__}+{_codec.BUILD_ID}"


CODEC, encode = _select()

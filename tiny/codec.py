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
pass :func:`encode_record`'s rules (docs in README "Records"). The function never raises
for any input bytes.

``digest(body: bytes) -> bytes``: the fingerprint an Idempotency-Key is stored with, the
body's length (8 bytes) and CRC-32 (4 bytes), big-endian. Not a cryptographic hash: it tells
a retry of the same body from another body sent with the same key by mistake.

:data:`encode` is the compiled codec (the ``tiny._codec`` extension module, Rust, built from
rust/tiny_codec by ``pip install .`` or, in the source tree, ``make codec``) when it is
importable, and the pure-Python :func:`encode_reference` otherwise; :data:`CODEC` names the
one in use ("rust" or "python"). ``TINY_CODEC=python`` forces the reference codec.
"""

from __future__ import annotations

import io
import os
import re
import zlib
from collections.abc import Callable
from datetime import date as _date
from typing import Any, NamedTuple, Protocol

import orjson

from tiny.profiling import profile

STRING_FIELDS = ("r_version", "r_arch", "r_os", "package", "version", "country")  # strings, or NA
MAX_STRING = 1024  # characters (code points), not bytes
MAX_DAYS = 16  # distinct days in one body (--max-days)
MAX_REJECTS = 1000  # invalid lines whose record one body keeps (--max-rejects)
TOO_MANY_DAYS = "date: more days in one request than --max-days"

# Integers keep orjson's range: it decodes -2**63 .. 2**64-1 as int and anything wider as
# float, which is "not an integer" here, in both codecs.
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}\Z")
_TIME = re.compile(r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\Z")
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


def encode_record(record: Any) -> tuple[str, bytes]:
    """Validate one decoded JSON value; return its date and its CSV row (LF-terminated).

    Fields are checked in column order and the first failure is reported. Raises
    :class:`InvalidRecord`.
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
    return day, (",".join(fields) + "\n").encode()


def undecodable(raw: bytes) -> InvalidRecord:
    """The error for a line a JSON decoder refused: not UTF-8, else not JSON."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return InvalidRecord("invalid UTF-8")
    return InvalidRecord("invalid JSON")


def _decode_line(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise undecodable(raw) from None


@profile
def encode_reference(
    body: bytes,
    max_days: int = MAX_DAYS,
    max_rejects: int = MAX_REJECTS,
    *,
    decode: Callable[[bytes], Any] = _decode_line,
) -> Batch:
    """The readable reference codec: orjson per line, then :func:`encode_record`.

    ``decode`` swaps the JSON decoder (the codec benchmark measures others with it); it
    raises :class:`InvalidRecord` for a line it cannot decode.
    """
    days: dict[str, list[bytes]] = {}
    rejects: list[tuple[int, str, bytes]] = []
    invalid = valid = 0
    omitted_first = omitted_last = 0
    # Lines one at a time (BytesIO shares the body's buffer): body.split() would hold every
    # line as an object at once, about 35 bytes each, 20 times a body of short lines.
    for number, raw in enumerate(io.BytesIO(body), 1):
        if raw.endswith(b"\n"):
            raw = raw[:-1]
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not raw.strip(_BLANK):
            continue
        try:
            day, row = encode_record(decode(raw))
            if day not in days and len(days) >= max_days:
                raise InvalidRecord(TOO_MANY_DAYS)
        except InvalidRecord as exc:
            invalid += 1
            if len(rejects) < max_rejects:
                rejects.append((number, exc.reason, raw))
            else:  # kept as a count and a line range only: a small body may hold millions
                omitted_first = omitted_first or number
                omitted_last = number
            continue
        days.setdefault(day, []).append(row)
        valid += 1
    omitted = (omitted_first, omitted_last) if omitted_first else None
    return Batch({day: b"".join(rows) for day, rows in days.items()}, rejects, valid, invalid, omitted)


def digest_reference(body: bytes) -> bytes:
    """The body's length and CRC-32, 12 bytes (see the module docstring)."""
    return len(body).to_bytes(8, "big") + zlib.crc32(body).to_bytes(4, "big")


class Encode(Protocol):
    """The signature both codecs share."""

    def __call__(self, body: bytes, max_days: int = MAX_DAYS, max_rejects: int = MAX_REJECTS) -> Batch: ...


def _select() -> tuple[str, Encode, Callable[[bytes], bytes]]:
    """Pick the compiled codec unless it is missing or TINY_CODEC=python asks otherwise."""
    if os.environ.get("TINY_CODEC", "").lower() in ("python", "reference"):
        return "python", encode_reference, digest_reference
    try:
        from tiny import _codec
    except ImportError:
        return "python", encode_reference, digest_reference
    compiled = _codec.encode

    def encode_compiled(body: bytes, max_days: int = MAX_DAYS, max_rejects: int = MAX_REJECTS) -> Batch:
        return Batch(*compiled(body, max_days, max_rejects))

    return "rust", encode_compiled, _codec.digest


CODEC, encode, digest = _select()

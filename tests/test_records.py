"""The record and line rules (README "Records"), for every codec this machine has."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest

from tests.support import record
from tiny import codec

CODECS: dict[str, Callable[..., tuple[Any, ...]]] = {"python": codec.encode_reference}
try:
    from tiny import _codec

    CODECS["rust"] = _codec.encode
except ImportError:
    pass

ROW = b'"2014-05-04","00:50:55",695181,"3.0.2","x86_64","linux-gnu","caret","6.0-24","MX",1\n'


@pytest.fixture(params=sorted(CODECS))
def encode(request: pytest.FixtureRequest) -> Callable[[bytes], codec.Batch]:
    function = CODECS[request.param]
    return lambda body: codec.Batch(*function(body))


def line(**fields: Any) -> bytes:
    return orjson.dumps(record(**fields))


def reason(encode: Callable[[bytes], codec.Batch], raw: bytes) -> str | None:
    """The reject reason of a one-line body, or None if it is valid.

    The line after a valid record of 2014-05-04 gets the same answer (the reference codec
    checks the records of a day it has already seen by shortcuts: tiny.codec._fast_row).
    """
    batch = encode(raw)
    assert batch.valid + batch.invalid == 1
    found = batch.rejects[0][1] if batch.rejects else None
    second = encode(line() + b"\n" + raw)
    assert [(number, why) for number, why, _ in second.rejects] == ([(2, found)] if found else [])
    return found


def test_a_valid_record_becomes_the_exact_cran_row(encode: Callable[[bytes], codec.Batch]) -> None:
    assert encode(line()).days == {"2014-05-04": ROW}


def test_missing_and_null_strings_are_bare_na(encode: Callable[[bytes], codec.Batch]) -> None:
    body = line(r_version=None, r_arch=..., r_os=None, country=...)
    assert encode(body).days["2014-05-04"] == b'"2014-05-04","00:50:55",695181,NA,NA,NA,"caret","6.0-24",NA,1\n'


def test_the_string_na_stays_quoted(encode: Callable[[bytes], codec.Batch]) -> None:
    assert b',"NA",' in encode(line(country="NA")).days["2014-05-04"]


def test_quotes_are_doubled_and_commas_and_unicode_kept(encode: Callable[[bytes], codec.Batch]) -> None:
    row = encode(line(package='a "b", c', version="é✓")).days["2014-05-04"]
    assert row == '"2014-05-04","00:50:55",695181,"3.0.2","x86_64","linux-gnu","a ""b"", c","é✓","MX",1\n'.encode()


def test_unknown_keys_are_ignored(encode: Callable[[bytes], codec.Batch]) -> None:
    assert encode(line(extra={"nested": [1, 2, {"x": None}]}, other=1.5)).days == {"2014-05-04": ROW}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"date": ...}, "date: missing"),
        ({"date": None}, "date: missing"),
        ({"date": 20140504}, "date: not a string"),
        ({"date": "2014-5-4"}, "date: not a calendar date YYYY-MM-DD"),
        ({"date": "2014-02-30"}, "date: not a calendar date YYYY-MM-DD"),
        ({"date": "2013-02-29"}, "date: not a calendar date YYYY-MM-DD"),
        ({"date": "0000-01-01"}, "date: not a calendar date YYYY-MM-DD"),
        ({"date": "2014-05-04T00:00:00"}, "date: not a calendar date YYYY-MM-DD"),
        ({"date": "٢٠١٤-05-04"}, "date: not a calendar date YYYY-MM-DD"),
        ({"date": "../../etc/x"}, "date: not a calendar date YYYY-MM-DD"),
        ({"time": ...}, "time: missing"),
        ({"time": 3600}, "time: not a string"),
        ({"time": "24:00:00"}, "time: not a time of day HH:MM:SS"),
        ({"time": "12:60:00"}, "time: not a time of day HH:MM:SS"),
        ({"time": "12:00:60"}, "time: not a time of day HH:MM:SS"),
        ({"time": "1:00:00"}, "time: not a time of day HH:MM:SS"),
        ({"size": ...}, "size: missing"),
        ({"size": -1}, "size: less than 0"),
        ({"size": 1.0}, "size: not an integer"),
        ({"size": True}, "size: not an integer"),
        ({"size": "5"}, "size: not an integer"),
        ({"ip_id": 0}, "ip_id: less than 1"),
        ({"ip_id": False}, "ip_id: not an integer"),
        ({"ip_id": 1.0}, "ip_id: not an integer"),
        ({"ip_id": None}, "ip_id: missing"),
        ({"package": 5}, "package: not a string or null"),
        ({"r_os": ["linux"]}, "r_os: not a string or null"),
        ({"country": "M\u0001X"}, "country: control character"),
        ({"version": "1\t2"}, "version: control character"),
        ({"package": "x" * 1025}, "package: longer than 1024 characters"),
    ],
)
def test_invalid_fields_are_refused_with_their_reason(
    encode: Callable[[bytes], codec.Batch], fields: dict[str, Any], expected: str
) -> None:
    assert reason(encode, line(**fields)) == expected


@pytest.mark.parametrize(
    "fields",
    [
        {"date": "2012-02-29"},
        {"date": "0001-01-01"},
        {"time": "23:59:59"},
        {"size": 0},
        {"size": 2**64 - 1},
        {"package": "x" * 1024},
        {"package": "é" * 1024},
        {"version": "\u007f"},
    ],
)
def test_edge_values_are_valid(encode: Callable[[bytes], codec.Batch], fields: dict[str, Any]) -> None:
    assert reason(encode, line(**fields)) is None


def test_integers_wider_than_64_bits_are_not_integers(encode: Callable[[bytes], codec.Batch]) -> None:
    assert reason(encode, line().replace(b"695181", str(2**64).encode())) == "size: not an integer"


def test_lines_that_are_not_utf8_json_or_objects_are_each_one_invalid_record(
    encode: Callable[[bytes], codec.Batch],
) -> None:
    body = b"\n".join([b'{"date": "\xff"}', b"{not json", b"[1, 2]", b'"text"', b"42", line()])
    batch = encode(body)
    assert [(n, r) for n, r, _ in batch.rejects] == [
        (1, "invalid UTF-8"),
        (2, "invalid JSON"),
        (3, "not a JSON object"),
        (4, "not a JSON object"),
        (5, "not a JSON object"),
    ]
    assert batch.valid == 1 and batch.days == {"2014-05-04": ROW}


def test_crlf_and_a_last_line_without_lf_count(encode: Callable[[bytes], codec.Batch]) -> None:
    batch = encode(line() + b"\r\n" + line(ip_id=2))
    assert batch.valid == 2 and batch.days["2014-05-04"] == ROW + ROW.replace(b",1\n", b",2\n")


def test_blank_lines_are_not_records_but_still_number_lines(encode: Callable[[bytes], codec.Batch]) -> None:
    batch = encode(b"\n  \t\r\n" + line() + b"\n\r\nbad\n\n")
    assert (batch.valid, batch.invalid) == (1, 1)
    assert batch.rejects == [(5, "invalid JSON", b"bad")]


def test_raw_rejected_line_is_kept_without_its_line_ending(encode: Callable[[bytes], codec.Batch]) -> None:
    assert encode(b"oops\r\n").rejects == [(1, "invalid JSON", b"oops")]


def test_records_keep_their_order_and_split_by_day(encode: Callable[[bytes], codec.Batch]) -> None:
    body = b"\n".join([line(ip_id=1), line(date="2014-05-05", ip_id=2), line(ip_id=3)])
    days = encode(body).days
    assert list(days) == ["2014-05-04", "2014-05-05"]
    assert [row.rsplit(b",", 1)[1] for row in days["2014-05-04"].splitlines()] == [b"1", b"3"]


def test_an_empty_body_has_no_records(encode: Callable[[bytes], codec.Batch]) -> None:
    assert encode(b"") == codec.Batch({}, [], 0, 0)


@pytest.mark.hardening("ingest 1: a 1 KB request took gigabytes of memory and disk")
def test_invalid_lines_past_the_reject_limit_are_counted_with_their_line_range(
    encode: Callable[[bytes], codec.Batch],
) -> None:
    body = b"x\n" * (codec.MAX_REJECTS + 5) + line() + b"\n" + b"y\n"
    batch = encode(body)
    assert (batch.valid, batch.invalid) == (1, codec.MAX_REJECTS + 6)
    assert len(batch.rejects) == codec.MAX_REJECTS and batch.rejects[-1][0] == codec.MAX_REJECTS
    assert batch.omitted == (codec.MAX_REJECTS + 1, codec.MAX_REJECTS + 7)


@pytest.mark.hardening("ingest 4: one batch could open unboundedly many day files")
def test_records_of_days_past_the_day_limit_are_invalid_with_a_clear_reason(
    encode: Callable[[bytes], codec.Batch],
) -> None:
    dates = [f"2014-05-{day:02d}" for day in range(1, codec.MAX_DAYS + 3)]
    batch = encode(b"\n".join(line(date=date) for date in dates + dates[:2]))
    assert list(batch.days) == dates[: codec.MAX_DAYS]
    assert [(n, why) for n, why, _ in batch.rejects] == [
        (codec.MAX_DAYS + 1, codec.TOO_MANY_DAYS),
        (codec.MAX_DAYS + 2, codec.TOO_MANY_DAYS),
    ]
    assert (batch.valid, batch.invalid) == (codec.MAX_DAYS + 2, 2)  # the last two are days already held

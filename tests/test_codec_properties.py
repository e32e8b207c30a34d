"""Properties of the codec for any input, for every codec this machine has."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_records import CODECS
from tiny import codec
from tiny.cranlog import parse_row

EXAMPLES = int(os.environ.get("TINY_FUZZ_EXAMPLES", "300"))
_text = st.text(st.characters(min_codepoint=0x20, blacklist_categories=("Cs",)), max_size=40)
_records = st.fixed_dictionaries(
    {
        "date": st.dates().map(lambda d: d.isoformat()),
        "time": st.times().map(lambda t: t.strftime("%H:%M:%S")),
        "size": st.integers(0, 2**64 - 1),
        **{name: st.one_of(st.none(), _text) for name in codec.STRING_FIELDS},
        "ip_id": st.integers(1, 2**64 - 1),
    }
)

pytestmark = pytest.mark.reliability  # `make reliability` runs these longer


def _each_codec(check: Callable[[Callable[..., tuple[Any, ...]]], None]) -> None:
    for encode in CODECS.values():
        check(encode)


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.binary(max_size=4096))
def test_any_bytes_give_a_batch_and_count_every_non_blank_line(body: bytes) -> None:
    lines = sum(1 for raw in body.split(b"\n") if raw.strip(b" \t\r"))

    def check(encode: Callable[..., tuple[Any, ...]]) -> None:
        days, rejects, valid, invalid, omitted = encode(body)
        assert valid + invalid == lines and len(rejects) == min(invalid, codec.MAX_REJECTS)
        assert (omitted is not None) == (invalid > codec.MAX_REJECTS)
        assert sum(rows.count(b"\n") for rows in days.values()) == valid

    _each_codec(check)


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.lists(_records, min_size=1, max_size=20))
def test_valid_rows_read_back_to_the_values_sent(records: list[dict[str, Any]]) -> None:
    body = b"\n".join(orjson.dumps(r) for r in records)

    def check(encode: Callable[..., tuple[Any, ...]]) -> None:
        days, rejects, valid, *_ = encode(body, len(records))  # as many days as records: none refused
        assert rejects == [] and valid == len(records)
        got = [parse_row(line) for rows in days.values() for line in rows.decode().split("\n")[:-1]]
        expected = sorted(records, key=lambda r: list(days).index(r["date"]))  # grouped by day, stable
        assert got == expected
        for rows in days.values():  # valid CSV for any RFC 4180 reader: 10 fields a row
            assert all(len(fields) == 10 for fields in csv.reader(io.StringIO(rows.decode(), newline="")))

    _each_codec(check)

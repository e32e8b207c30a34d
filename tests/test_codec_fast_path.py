"""The reference codec's shortcut, ``tiny.codec._fast_row``, against its rule book, ``record_row``.

``_fast_row`` may answer None ("not sure") for any record, but when it answers, it gives
``record_row``'s date and row: for any decoded line, whether written by orjson (raw UTF-8,
escapes only where JSON needs them) or by ``json.dumps`` (every non-ASCII character escaped).
No compiled codec needed. ``TINY_FUZZ_EXAMPLES`` raises the number of examples.
"""

from __future__ import annotations

import json
import os
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import record
from tiny.codec import STRING_FIELDS, InvalidRecord, _fast_row, record_row
from tiny.layout import COLUMNS

EXAMPLES = int(os.environ.get("TINY_FUZZ_EXAMPLES", "300"))
DAY = "2014-05-04"  # the day the batch already holds

_texts = st.one_of(
    st.text(max_size=20),
    st.text(st.sampled_from('"\\,\x00\x1f\x7f é😀\u2028NA'), max_size=8),
    st.builds(lambda ch, n: ch * n, st.sampled_from(["x", "é", "😀"]), st.integers(1000, 1030)),
)
_any = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    _texts,
    st.lists(st.integers(-(2**63), 2**64 - 1), max_size=2),
    st.dictionaries(st.text(max_size=3), st.booleans(), max_size=2),
)
_GOOD: dict[str, st.SearchStrategy[Any]] = {
    "date": st.just(DAY),
    "time": st.times().map(lambda t: t.strftime("%H:%M:%S")),
    "size": st.integers(0, 2**64 - 1),
    **{name: st.one_of(st.none(), st.text(max_size=12)) for name in STRING_FIELDS},
    "ip_id": st.integers(1, 2**64 - 1),
}
_NEAR: dict[str, st.SearchStrategy[Any]] = {
    "date": st.sampled_from(["2014-05-05", "2014-02-30", "2014-5-4", DAY + " "]),
    "time": st.sampled_from(["24:00:00", "23:60:00", "1:00:00", "00:00:00\n", "２3:00:00"]),
    "size": st.sampled_from([-1, -(2**63), 1.0, True, "5"]),
    **{name: _texts for name in STRING_FIELDS},
    "ip_id": st.sampled_from([0, -1, 1.0, False, None]),
}
ABSENT = object()


@st.composite
def records(draw: st.DrawFn) -> dict[str, Any]:
    """A valid record where up to three fields are near misses, of any JSON type, or absent; extra keys."""
    odd = draw(st.sets(st.sampled_from(COLUMNS), max_size=3))
    fields = {
        name: draw(st.one_of(_NEAR[name], _any, st.just(ABSENT)) if name in odd else _GOOD[name]) for name in COLUMNS
    }
    found = {name: value for name, value in fields.items() if value is not ABSENT}
    return {**found, **draw(st.dictionaries(st.text(max_size=6), _any, max_size=2))}


def record_row_or_reason(decoded: Any) -> tuple[str, str] | str:
    try:
        return record_row(decoded)
    except InvalidRecord as exc:
        return exc.reason


@settings(max_examples=EXAMPLES, deadline=None)
@given(records(), st.booleans())
def test_the_fast_path_answers_as_the_rules_do_or_not_at_all(fields: dict[str, Any], ascii_only: bool) -> None:
    raw = json.dumps(fields).encode() if ascii_only else orjson.dumps(fields)
    decoded = orjson.loads(raw)
    fast = _fast_row(raw, decoded, {DAY})
    if fast is not None:
        assert fast == record_row_or_reason(decoded)


def test_the_usual_records_take_the_fast_path() -> None:
    """Valid, with or without nulls, absent strings, extra keys, keys in any order, CRLF."""
    usual = [
        record(),
        record(r_version=None, r_arch=None, r_os=None),
        record(country=..., version=...),
        record(package="", country="NA", extra=[1, {"x": None}]),
        dict(reversed(record().items())),
        record(package="é✓ 😀", version="q" * 900),
    ]
    for fields in usual:
        raw = orjson.dumps(fields)
        for line in (raw, raw + b"\r"):
            assert _fast_row(line, orjson.loads(line), {DAY}) == record_row(fields), fields


def test_records_the_fast_path_leaves_to_the_rules() -> None:
    """Unsure cases: a day not seen yet, an escape anywhere in the line, a row over 1,024 characters."""
    assert _fast_row(orjson.dumps(record()), record(), set()) is None
    escaped = record(package='say "hi"')
    assert _fast_row(orjson.dumps(escaped), escaped, {DAY}) is None
    long_row = record(package="q" * 600, version="w" * 600)
    assert _fast_row(orjson.dumps(long_row), long_row, {DAY}) is None
    assert record_row(long_row)[1].count("q") == 600

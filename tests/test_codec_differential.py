"""The compiled codec (``tiny._codec``, Rust) against the reference codec, value for value.

For every body: ``_codec.encode(body) == tuple(encode_reference(body))`` — the same day
keys, the same CSV bytes per day, the same rejects (line number, reason, raw bytes), the
same counts. The reference's JSON oracle is orjson, so the hostile lines below aim at the
places where a hand-written scanner could disagree with it: types, integer range, dates,
escapes, surrogates, control characters, length limits, duplicate and escaped keys,
nesting depth, float overflow, invalid UTF-8, CRLF and blank lines, truncation.

Skipped when ``tiny._codec`` is not importable (build it with ``make codec``).
``TINY_FUZZ_EXAMPLES`` raises the number of examples per property.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from datetime import date, time
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiny.codec import STRING_FIELDS, encode_reference
from tiny.cranlog import ndjson_lines
from tiny.layout import COLUMNS
from tiny.testing import SAMPLE_DAY

_codec = pytest.importorskip("tiny._codec", reason="tiny._codec (the Rust codec) is not built: run `make codec`")

SAMPLE = SAMPLE_DAY
EXAMPLES = int(os.environ.get("TINY_FUZZ_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_same(body: bytes, *limits: int) -> None:
    expected = tuple(encode_reference(body, *limits))
    got = _codec.encode(body, *limits)
    assert type(got) is tuple and len(got) == 5
    days, rejects, valid, invalid, omitted = got
    assert list(days) == list(expected[0]), "day keys (and their order)"
    assert days == expected[0], "CSV rows per day"
    assert rejects == expected[1], "rejects"
    assert (valid, invalid) == expected[2:4], "counts"
    assert omitted == expected[4], "the line range of the rejects left out"


# --- the real sample day -------------------------------------------------------------------


@pytest.fixture(scope="module")
def sample_lines() -> list[bytes]:
    if not SAMPLE.exists():
        pytest.skip(f"sample day not found: {SAMPLE}")
    return list(ndjson_lines(SAMPLE))


def test_sample_day_body_gives_the_same_batch(sample_lines: list[bytes]) -> None:
    assert_same(b"".join(sample_lines))


def test_sample_day_with_keys_shuffled_per_line_gives_the_same_batch(sample_lines: list[bytes]) -> None:
    rng = random.Random(20140504)

    def shuffled(line: bytes) -> bytes:
        items = list(orjson.loads(line).items())
        rng.shuffle(items)
        return orjson.dumps(dict(items)) + b"\n"

    assert_same(b"".join(shuffled(line) for line in sample_lines))


# --- building blocks: raw JSON texts ---------------------------------------------------------

_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _u_escape(code: int, upper: bool) -> str:
    text = f"\\u{code:04x}"
    return text.upper().replace("\\U", "\\u") if upper else text


def json_text(text: str, rng: random.Random, escape_rate: float) -> bytes:
    """``text`` as a JSON string, escaping a random share of characters (\\u, pairs, short)."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        escape = rng.random() < escape_rate
        if ch in _SHORT_ESCAPES and (code < 0x20 or ch in '"\\') and not escape:
            out.append(_SHORT_ESCAPES[ch])  # must be escaped: the short form
        elif code < 0x20 or ch in '"\\' or escape:
            if ch == "/" and rng.random() < 0.5:
                out.append("\\/")
            elif code > 0xFFFF:  # a surrogate pair
                code -= 0x10000
                upper = rng.random() < 0.5
                out.append(_u_escape(0xD800 + (code >> 10), upper) + _u_escape(0xDC00 + (code & 0x3FF), upper))
            else:
                out.append(_u_escape(code, rng.random() < 0.5))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out).encode()


_INTERESTING_CHARS = '"\\,/\n\r\t\x00\x1f\x7f é€\u2028😀\U0010ffffNA'
_any_chars = st.characters(exclude_categories=("Cs",))
texts = st.one_of(st.text(_any_chars, max_size=20), st.text(_INTERESTING_CHARS, max_size=20))


def strings(text_strategy: st.SearchStrategy[str] = texts) -> st.SearchStrategy[bytes]:
    """JSON strings of the given texts, some characters escaped, some not."""
    return st.builds(
        json_text, text_strategy, st.randoms(use_true_random=True), st.sampled_from([0.0, 0.0, 0.1, 0.5, 1.0])
    )


def raw(values: list[Any]) -> st.SearchStrategy[bytes]:
    return st.sampled_from([v if isinstance(v, bytes) else str(v).encode() for v in values])


INT_EDGES = [-(2**63) - 1, -(2**63), -1, 0, 1, 2, 2**31, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**25]
integers = st.one_of(st.integers(-(2**70), 2**70).map(lambda i: str(i).encode()), raw(INT_EDGES), raw([b"-0"]))
floats = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: repr(f).encode()),
    raw(
        [
            b"1.0",
            b"0.0",
            b"-0.0",
            b"1E2",
            b"1e+2",
            b"1e-2",
            b"1e400",
            b"-1e400",
            b"1e-400",
            b"0e400",
            b"1.7976931348623157e308",
            b"1.7976931348623158e308",
            b"1.7976931348623159e308",
            b"1" + b"0" * 308,
            b"1" + b"0" * 309,
            b"9" * 400,
            b"1" + b"0" * 30 + b".5",
            b"1.5e3",
        ]
    ),
)
not_numbers = raw([b"01", b"-01", b"-", b"1.", b".5", b"+1", b"NaN", b"Infinity", b"-Infinity", b"1e", b"0x10", b"1_0"])
literals = raw([b"true", b"false", b"null"])
scalars = st.one_of(literals, integers, floats, strings())
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda items: b"[" + b",".join(items) + b"]"),
        st.lists(st.tuples(strings(), inner), max_size=4).map(
            lambda members: b"{" + b",".join(k + b":" + v for k, v in members) + b"}"
        ),
    ),
    max_leaves=12,
)

ABSENT = b""  # as a field value: leave the key out
spaces = st.sampled_from([b"", b"", b"", b"", b" ", b"\t", b"\r", b" \t "])


def iso_time(t: time) -> str:
    return t.strftime("%H:%M:%S")


VALID: dict[str, st.SearchStrategy[bytes]] = {
    "date": strings(st.dates(min_value=date(2012, 1, 1), max_value=date(2016, 12, 31)).map(date.isoformat)),
    "time": strings(st.times().map(iso_time)),
    "size": st.integers(0, 2**64 - 1).map(lambda i: str(i).encode()),
    **{name: st.one_of(raw([b"null"]), strings(st.text(max_size=12))) for name in STRING_FIELDS},
    "ip_id": st.integers(1, 2**64 - 1).map(lambda i: str(i).encode()),
}


def plain(text: st.SearchStrategy[str]) -> st.SearchStrategy[bytes]:
    """JSON strings of ASCII texts without escapes: with compact spacing, the lines the
    compiled codec's fast path takes."""
    return text.map(lambda t: b'"' + t.encode() + b'"')


_ascii = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters='"\\'), max_size=12)
PLAIN: dict[str, st.SearchStrategy[bytes]] = {
    **VALID,
    "date": plain(st.dates(min_value=date(2012, 1, 1), max_value=date(2016, 12, 31)).map(date.isoformat)),
    "time": plain(st.times().map(iso_time)),
    **{name: st.one_of(raw([b"null"]), plain(_ascii)) for name in STRING_FIELDS},
}

DATES = st.one_of(
    st.dates().map(date.isoformat),
    st.from_regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", fullmatch=True),
    st.sampled_from(
        [
            "2014-02-30",
            "0000-01-01",
            "2014-13-01",
            "2014-00-01",
            "2014-01-00",
            "2013-02-29",
            "1900-02-29",
            "2000-02-29",
            "2012-02-29",
            "2014-04-31",
            "2014-5-04",
            "2014-05-04 ",
            " 2014-05-04",
            "2014/05/04",
            "２０１４-05-04",
            "2014-05-04\n",
            "10000-01-01",
            "9999-12-31",
            "0001-01-01",
            "",
            "2014-05-04T00:00:00",
        ]
    ),
)
TIMES = st.one_of(
    st.times().map(iso_time),
    st.from_regex(r"[0-9]{2}:[0-9]{2}:[0-9]{2}", fullmatch=True),
    st.sampled_from(
        [
            "24:00:00",
            "23:60:00",
            "23:59:60",
            "1:00:00",
            "00:00:00\n",
            "00:00",
            "00:00:00.5",
            "",
            "２3:00:00",
            "19:59:59",
            "20:00:00",
        ]
    ),
)


def key(name: str) -> st.SearchStrategy[bytes]:
    """A key naming ``name``: mostly plain, sometimes with escapes (``"d\\u0061te"``)."""
    return st.builds(json_text, st.just(name), st.randoms(use_true_random=True), st.sampled_from([0.0, 0.0, 0.0, 0.3]))


SPACES = [b"", b"", b"", b"", b"", b" ", b"\t", b"\r", b" \t "]


@st.composite
def record_lines(
    draw: st.DrawFn,
    overrides: dict[str, st.SearchStrategy[bytes]] | None = None,
    extra: st.SearchStrategy[list[tuple[bytes, bytes]]] | None = None,
) -> bytes:
    """One object line: the ten fields (values from ``overrides``, else PLAIN or VALID), ``extra`` members,
    in a random order, compact or with random whitespace around tokens, some keys escaped."""
    values = {**(PLAIN if draw(st.booleans()) else VALID), **(overrides or {})}
    # Cosmetics (order, whitespace, key escapes) come from one seeded Random: far cheaper to
    # generate than a draw each, and they never decide the outcome alone.
    rng = draw(st.randoms(use_true_random=True))
    escape_keys = rng.random() < 0.2

    def name(text: str) -> bytes:
        return json_text(text, rng, 0.3) if escape_keys else b'"' + text.encode() + b'"'

    members = [(name(field), value) for field in COLUMNS if (value := draw(values[field])) != ABSENT]
    if extra is not None:
        members += draw(extra)
    rng.shuffle(members)

    compact = rng.random() < 0.5  # no whitespace at all: the compiled codec's fast path

    def ws() -> bytes:
        return b"" if compact else rng.choice(SPACES)

    parts = [ws() + k + ws() + b":" + ws() + v + ws() for k, v in members]
    return ws() + b"{" + b",".join(parts) + (ws() if not parts else b"") + b"}" + ws()


@st.composite
def bodies(draw: st.DrawFn, lines: st.SearchStrategy[bytes], max_lines: int = 4) -> bytes:
    """Lines joined by LF or CRLF, with blank lines between them, a final LF or not."""
    out = []
    for line in draw(st.lists(lines, min_size=1, max_size=max_lines)):
        out.append(draw(st.sampled_from([b"", b"", b"", b"\n", b" \n", b"\t\r\n", b"\r\n", b"\r\r\n"])))
        out.append(line + draw(st.sampled_from([b"\n", b"\n", b"\r\n"])))
    body = b"".join(out)
    return body if draw(st.booleans()) else body.rstrip(b"\r\n")


def one_field(
    values: Callable[[str], st.SearchStrategy[bytes]], names: tuple[str, ...] = COLUMNS
) -> st.SearchStrategy[bytes]:
    """Record lines where one field (of ``names``) takes its value from ``values(name)``."""
    return st.sampled_from(names).flatmap(lambda name: record_lines({name: values(name)}))


# --- properties ---------------------------------------------------------------------------------


@FUZZ
@given(bodies(record_lines()))
def test_valid_records_in_any_key_order_and_spacing_match(body: bytes) -> None:
    assert_same(body)


@FUZZ
@given(bodies(one_field(lambda _: st.one_of(json_values, raw([b"true", b"false", b"[]", b"{}", b'""'])))))
def test_any_json_type_in_any_field_matches(body: bytes) -> None:
    assert_same(body)


@FUZZ
@given(bodies(one_field(lambda _: st.one_of(integers, floats, literals, strings(st.just("1"))), ("size", "ip_id"))))
def test_integer_fields_with_range_edges_floats_bools_and_big_numbers_match(body: bytes) -> None:
    assert_same(body)


@FUZZ
@given(bodies(record_lines({"date": strings(DATES), "time": strings(TIMES)})))
def test_date_and_time_texts_match(body: bytes) -> None:
    assert_same(body)


@FUZZ
@given(bodies(one_field(lambda _: strings(), STRING_FIELDS)))
def test_strings_with_quotes_commas_unicode_controls_and_escapes_match(body: bytes) -> None:
    assert_same(body)


long_texts = st.builds(
    lambda ch, n, tail: ch * n + tail,
    st.sampled_from(["x", "é", "😀", '"', "\\", "\x01"]),
    st.integers(1015, 1026),
    st.sampled_from(["", "", "a", "\x1f", "é"]),
)


@settings(FUZZ, suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example])
@given(bodies(one_field(lambda _: strings(long_texts), STRING_FIELDS), max_lines=3))
def test_string_length_limit_of_1024_characters_matches(body: bytes) -> None:
    assert_same(body)


@FUZZ
@given(
    bodies(
        record_lines(
            {name: st.one_of(VALID[name], raw([ABSENT, b"null"])) for name in COLUMNS},
            extra=st.lists(
                st.sampled_from(COLUMNS).flatmap(
                    lambda name: st.tuples(key(name), st.one_of(VALID[name], raw([b"null", b"1", b'"x"'])))
                ),
                max_size=4,
            ),
        )
    )
)
def test_null_absent_and_duplicate_fields_match(body: bytes) -> None:
    assert_same(body)


unknown_keys = strings(st.one_of(texts, st.sampled_from(["Date", "date ", "dat", "ip", "r_os2", "", "sizé"])))


@FUZZ
@given(bodies(record_lines(extra=st.lists(st.tuples(unknown_keys, json_values), max_size=4))))
def test_unknown_keys_with_nested_values_match(body: bytes) -> None:
    assert_same(body)


# --- records of a day the body already had: the reference codec's fast path -------------------
# encode_reference checks a record by shortcuts (tiny.codec._fast_row) once an earlier record
# of the body with the same date was valid, and only when its line has no escapes. These
# bodies start with such a record; their lines keep its date unless the date is the field
# under test, and their other fields are PLAIN (unescaped).

DAY = "2014-05-04"
FIRST = b'{"date":"2014-05-04","time":"00:50:55","size":1,"package":"caret","ip_id":1}\n'
SAME_DAY = {"date": st.one_of(plain(st.just(DAY)), strings(st.just(DAY)))}
SMALL_NUMBERS = raw(
    [
        -2,
        -1,
        b"-0",
        0,
        1,
        2,
        -(2**63),
        2**64 - 1,
        b"1.0",
        b"0.0",
        b"-1.0",
        b"1e2",
        b"true",
        b"false",
        b"null",
        b'"1"',
        b"[1]",
    ]
)
PLAIN_LONG = plain(st.builds(lambda ch, n: ch * n, st.sampled_from(["x", "é", "😀"]), st.integers(1018, 1030)))


def same_day(lines: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    return bodies(lines).map(lambda body: FIRST + body)


def one_field_of_the_day(
    values: st.SearchStrategy[bytes], names: tuple[str, ...] = COLUMNS
) -> st.SearchStrategy[bytes]:
    return st.sampled_from(names).flatmap(lambda name: record_lines({**PLAIN, **SAME_DAY, name: values}))


@FUZZ
@given(same_day(one_field_of_the_day(st.one_of(SMALL_NUMBERS, literals, integers, floats), ("size", "ip_id"))))
def test_records_of_a_day_already_seen_with_any_numbers_match(body: bytes) -> None:
    assert_same(body)


@FUZZ
@given(same_day(st.one_of(record_lines({**PLAIN, **SAME_DAY}), one_field_of_the_day(json_values))))
def test_records_of_a_day_already_seen_with_any_json_type_in_any_field_match(body: bytes) -> None:
    assert_same(body)


@FUZZ
@given(
    same_day(
        st.one_of(
            one_field_of_the_day(strings(TIMES), ("time",)),
            one_field_of_the_day(strings(DATES), ("date",)),
        )
    )
)
def test_records_of_a_day_already_seen_with_any_date_and_time_texts_match(body: bytes) -> None:
    assert_same(body)


@settings(FUZZ, suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example])
@given(same_day(one_field_of_the_day(st.one_of(strings(), PLAIN_LONG, strings(long_texts)), STRING_FIELDS)))
def test_records_of_a_day_already_seen_with_any_strings_match(body: bytes) -> None:
    assert_same(body)


@FUZZ
@given(
    same_day(
        st.one_of(
            record_lines(
                {**{name: st.one_of(PLAIN[name], raw([ABSENT, b"null"])) for name in COLUMNS}, **SAME_DAY},
                extra=st.lists(
                    st.sampled_from(COLUMNS).flatmap(
                        lambda name: st.tuples(key(name), st.one_of(PLAIN[name], raw([b"null", b"1", b'"x"'])))
                    ),
                    max_size=4,
                ),
            ),
            record_lines({**PLAIN, **SAME_DAY}, extra=st.lists(st.tuples(unknown_keys, json_values), max_size=4)),
        )
    )
)
def test_records_of_a_day_already_seen_with_null_absent_duplicate_and_unknown_fields_match(body: bytes) -> None:
    assert_same(body)


@st.composite
def nested(draw: st.DrawFn, levels: st.SearchStrategy[int]) -> bytes:
    n = draw(levels)
    opens = draw(st.lists(st.sampled_from([b"[", b'{"a":', b"[1,", b'{"k":0,"a":']), min_size=n, max_size=n))
    closes = [b"]" if o.startswith(b"[") else b"}" for o in reversed(opens)]
    return b"".join(opens) + draw(st.sampled_from([b"1", b"[]", b"{}", b'"s"'])) + b"".join(closes)


depths = st.integers(1018, 1026)


@settings(FUZZ, max_examples=max(20, EXAMPLES // 5))
@given(
    bodies(
        st.one_of(
            nested(depths),
            record_lines(extra=st.tuples(unknown_keys, nested(depths)).map(lambda member: [member])),
            one_field(lambda _: nested(depths)),
        ),
        max_lines=3,
    )
)
def test_nesting_depth_around_1024_matches(body: bytes) -> None:
    assert_same(body)


@FUZZ
@given(
    bodies(
        st.one_of(json_values, scalars, not_numbers).flatmap(
            lambda value: st.tuples(spaces, spaces).map(lambda ws: ws[0] + value + ws[1])
        )
    )
)
def test_json_values_that_are_not_objects_match(body: bytes) -> None:
    assert_same(body)


@st.composite
def near_overflow(draw: st.DrawFn) -> bytes:
    """Decimal texts around f64's largest value and the int range, in several spellings."""
    sign = draw(st.sampled_from([b"", b"-"]))
    digits = draw(
        st.sampled_from(
            [
                b"17976931348623157",
                b"179769313486231580793",
                b"1797693134862315807937",
                b"17976931348623159",
                b"18446744073709551615",
                b"9223372036854775808",
            ]
        )
    )
    digits += draw(st.text("0123456789", max_size=4)).encode()
    point = draw(st.integers(1, len(digits)))
    exponent = draw(st.integers(300, 312)) - point + 1
    return draw(
        st.sampled_from(
            [
                sign + digits[:point] + b"." + digits[point:] + b"e" + str(exponent).encode()
                if point < len(digits)
                else sign + digits + b"e" + str(exponent).encode(),
                sign + digits + b"0" * draw(st.integers(285, 295)),
                sign + digits,
                sign + digits + b"E+" + str(exponent - len(digits) + point).encode(),
            ]
        )
    )


@FUZZ
@given(
    bodies(
        st.one_of(
            record_lines(extra=st.tuples(unknown_keys, near_overflow()).map(lambda member: [member])),
            one_field(lambda _: near_overflow(), ("size", "ip_id", "date")),
        )
    )
)
def test_numbers_near_float_overflow_and_int_range_match(body: bytes) -> None:
    assert_same(body)


def escaped_key(name: str) -> st.SearchStrategy[bytes]:
    escaped = st.builds(json_text, st.just(name), st.randoms(use_true_random=True), st.sampled_from([0.3, 0.6, 1.0]))
    return escaped.filter(lambda k: b"\\" in k)


@FUZZ
@given(
    bodies(
        st.sampled_from(COLUMNS).flatmap(
            lambda name: record_lines(
                extra=st.tuples(escaped_key(name), st.one_of(VALID[name], json_values)).map(lambda member: [member])
            )
        )
    )
)
def test_keys_written_with_escapes_match(body: bytes) -> None:
    assert_same(body)


bad_utf8 = st.sampled_from(
    [
        b"\xff",
        b"\xfe",
        b"\x80",
        b"\xc0\x80",
        b"\xc3",
        b"\xe2\x82",
        b"\xed\xa0\x80",
        b"\xed\xbf\xbf",
        b"\xf4\x90\x80\x80",
        b"\xf8\x88\x80\x80\x80",
        b"\xef\xbb\xbf",
    ]
)


@st.composite
def spliced(draw: st.DrawFn, lines: st.SearchStrategy[bytes], pieces: st.SearchStrategy[bytes]) -> bytes:
    line = draw(lines)
    at = draw(st.integers(0, len(line)))
    cut = draw(st.sampled_from([0, 0, 0, 1]))
    return line[:at] + draw(pieces) + line[at + cut :]


@FUZZ
@given(bodies(spliced(record_lines(), bad_utf8)))
def test_invalid_utf8_bytes_anywhere_in_a_line_match(body: bytes) -> None:
    assert_same(body)


@FUZZ
@given(
    st.lists(
        st.one_of(record_lines(), raw([b"", b" ", b"\t", b"\r", b"\r\r", b" \t\r ", b"\x0b", b"\x0c", b"{}"])),
        max_size=8,
    ),
    st.lists(st.sampled_from([b"\n", b"\r\n", b"\r", b"\n\r", b"\r\r\n"]), min_size=8, max_size=8),
)
def test_crlf_blank_lines_and_line_numbers_match(lines: list[bytes], ends: list[bytes]) -> None:
    assert_same(b"".join(line + end for line, end in zip(lines, ends, strict=False)))


json_bytes = st.sampled_from(
    [
        b"{",
        b"}",
        b"[",
        b"]",
        b",",
        b":",
        b'"',
        b"\\",
        b"\\u",
        b"\\ud800",
        b"0",
        b"-",
        b".",
        b"e",
        b"n",
        b"t",
        b" ",
        b"\x00",
        b"\x1f",
        b"\r",
    ]
)


@FUZZ
@given(
    bodies(
        st.one_of(
            record_lines().flatmap(lambda line: st.integers(0, len(line)).map(lambda n: line[:n])),
            spliced(record_lines(), json_bytes),
            spliced(record_lines(), st.just(b"")),
        )
    )
)
def test_truncated_and_corrupted_lines_match(body: bytes) -> None:
    assert_same(body)


@FUZZ
@given(
    st.lists(
        st.one_of(
            json_bytes,
            raw(
                [
                    b'"date"',
                    b'"size"',
                    b'"2014-05-04"',
                    b"true",
                    b"null",
                    b"1e400",
                    b"\\u0061",
                    b"\\udc00",
                    b"\n",
                    b"\xff",
                ]
            ),
        ),
        max_size=40,
    ).map(b"".join)
)
def test_json_token_soup_matches(body: bytes) -> None:
    assert_same(body)


@FUZZ
@given(st.binary(max_size=600))
def test_random_bytes_match(body: bytes) -> None:
    assert_same(body)


@FUZZ
@given(
    bodies(st.one_of(record_lines(), st.sampled_from([b"x", b"[]", b"{}", b'{"date":"2014-02-30"}'])), max_lines=12),
    st.integers(0, 4),
    st.integers(0, 5),
)
def test_day_and_reject_limits_match(body: bytes, max_days: int, max_rejects: int) -> None:
    assert_same(body, max_days, max_rejects)


def test_a_body_of_many_days_and_many_bad_lines_matches_at_the_default_limits() -> None:
    record = {"date": "", "time": "00:50:55", "size": 1, "package": "caret", "ip_id": 1}
    lines = [orjson.dumps({**record, "date": f"2014-{1 + n % 12:02d}-{1 + n % 28:02d}"}) for n in range(40)]
    assert_same(b"\n".join(lines + [b"x"] * 3000 + lines))

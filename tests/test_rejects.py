"""The rejects file's lines (tiny.rejects.render): one JSON object per refused line, exact bytes kept."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import orjson

from tiny.rejects import render

RECEIVED = datetime(2026, 11, 23, 9, 41, 7, 123456, tzinfo=UTC)


def lines(data: bytes) -> list[dict[str, object]]:
    assert data.endswith(b"\n")
    return [orjson.loads(line) for line in data.splitlines()]


def test_each_refused_line_is_one_object_with_its_number_reason_and_raw_text() -> None:
    out = lines(render([(2, "invalid JSON", b"bad"), (5, "size: not an integer", b'{"size":1.0}')], RECEIVED))
    assert out == [
        {"received": "2026-11-23T09:41:07.123456Z", "line": 2, "reason": "invalid JSON", "raw": "bad"},
        {"received": "2026-11-23T09:41:07.123456Z", "line": 5, "reason": "size: not an integer", "raw": '{"size":1.0}'},
    ]


def test_bytes_that_are_not_utf8_are_escaped_and_given_exactly_in_base64() -> None:
    raw = b"caf\xe9 \xff"
    (entry,) = lines(render([(1, "invalid UTF-8", raw)], RECEIVED))
    assert entry["raw"] == "caf\\xe9 \\xff"
    assert base64.b64decode(str(entry["raw_base64"])) == raw


def test_lines_past_the_limit_are_one_summary_with_their_count_and_range() -> None:
    out = lines(render([(1, "invalid JSON", b"x")], RECEIVED, omitted=(499_000, 1001, 500_000)))
    assert out[1] == {
        "received": "2026-11-23T09:41:07.123456Z",
        "line": 1001,
        "last_line": 500_000,
        "omitted": 499_000,
        "reason": "499000 more invalid lines (1001-500000) not kept: over --max-rejects",
    }


def test_nothing_refused_renders_nothing() -> None:
    assert render([], RECEIVED) == b""

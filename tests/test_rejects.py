"""The rejects file's lines (tiny.rejects.render): one JSON object per refused line, exact bytes kept."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import orjson

from tiny.rejects import RAW_LINE, RAW_REQUEST, render

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


def test_a_long_line_keeps_its_first_bytes_and_says_its_whole_length() -> None:
    (entry,) = lines(render([(1, "invalid JSON", b"x" * (RAW_LINE + 10))], RECEIVED))
    assert entry["raw"] == "x" * RAW_LINE and entry["raw_bytes"] == RAW_LINE + 10


def test_a_line_cut_inside_a_character_stays_valid_utf8() -> None:
    raw = b"x" * (RAW_LINE - 1) + "é".encode() + b"tail"
    (entry,) = lines(render([(1, "invalid JSON", raw)], RECEIVED))
    assert entry["raw"] == "x" * (RAW_LINE - 1) and "raw_base64" not in entry and entry["raw_bytes"] == len(raw)


def test_one_request_writes_a_bounded_rejects_file_however_its_lines_escape() -> None:
    """1,000 lines of 16,000 control bytes (17 KB of gzip) wrote 96 MB of rejects: each one's
    escaping is six times its bytes. The lines' bytes kept are bounded per line and per request."""
    out = render(((n, "invalid JSON", b"\x01" * 16_000) for n in range(1, 1001)), RECEIVED)
    assert len(out) < 6.5 * RAW_REQUEST + 1000 * 200
    entries = lines(out)
    assert len(entries) == 1000 and all(entry["raw_bytes"] == 16_000 for entry in entries)
    assert sum(len(str(entry["raw"])) for entry in entries) == RAW_REQUEST

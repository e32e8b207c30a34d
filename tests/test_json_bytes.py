"""Answers as JSON bytes (tiny.analytics.json_bytes): compact, UTF-8, exact for integers of any size."""

from __future__ import annotations

import json

from tiny.analytics.json_bytes import dumps


def test_an_answer_is_compact_utf8_json() -> None:
    value = {"name": "мир 🐳", "hourly": [1, 2], "country": None}
    assert dumps(value) == '{"name":"мир 🐳","hourly":[1,2],"country":null}'.encode()


def test_an_integer_past_64_bits_is_written_exactly_in_the_same_shape() -> None:
    """A day's byte total may pass 2^64 (Python's sums are exact): the stdlib writes it."""
    total = 3 * (2**64 - 1)
    value = {"bytes": total, "name": "мир", "whales": [{"bytes": 2**64 - 1}]}
    assert json.loads(dumps(value)) == value
    assert dumps(value) == f'{{"bytes":{total},"name":"мир","whales":[{{"bytes":{2**64 - 1}}}]}}'.encode()

"""Answers as JSON bytes, exact for integers of any size."""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(value: Any) -> bytes:
    """An answer as JSON bytes: orjson, or the stdlib's json when an integer is past orjson's
    64-bit range (byte totals can be: Python's sums are exact)."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()

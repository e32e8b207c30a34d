"""The data dir's layout (tiny.layout): file names, the header, the columns."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tiny import layout
from tiny.testing import ROOT, sample_csv


def test_header_is_the_public_files_header() -> None:
    assert layout.HEADER == sample_csv().split(b"\n", 1)[0] + b"\n"


def test_day_file_names_round_trip() -> None:
    assert layout.day_file("2014-05-04") == "2014-05-04.csv"
    assert layout.day_of(layout.day_file("2014-05-04")) == "2014-05-04"
    assert layout.day_path(ROOT, "2014-05-04") == ROOT / "2014-05-04.csv"


@pytest.mark.parametrize("name", ["2014-05-04.csv.gz", "x2014-05-04.csv", "2014-05-04.ndjson", "rejects", ".tiny"])
def test_other_names_are_no_day_files(name: str) -> None:
    assert layout.day_of(name) is None


def test_rejects_file_is_named_for_the_utc_day_received() -> None:
    assert layout.rejects_file(datetime(2026, 11, 23, 23, 59, tzinfo=UTC)) == "rejects/2026-11-23.ndjson"


@pytest.mark.parametrize("text", ["2014-02-30", "0000-01-01", "2014-5-4", "../etc", "2014-05-04.csv"])
def test_parse_day_refuses_what_is_not_a_calendar_date(text: str) -> None:
    with pytest.raises(ValueError):
        layout.parse_day(text)


def test_a_data_file_is_a_day_file_or_a_rejects_file_named_from_the_data_dir() -> None:
    assert layout.is_data_file("2014-05-04.csv") and layout.is_data_file("rejects/2014-05-04.ndjson")
    for name in ("../2014-05-04.csv", "x/2014-05-04.csv", ".tiny/sizes", "2014-05-04.csv.bak", "rejects/a.ndjson"):
        assert not layout.is_data_file(name), name

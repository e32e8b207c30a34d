"""The dashboard's answers (tiny.analytics.answers): the rows of the days listed, a day's aggregate typed and kept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tiny import codec
from tiny.aggregates import Aggregates
from tiny.analytics import answers, caches
from tiny.layout import HEADER

DAY = "2014-05-04"


@pytest.mark.parametrize("engine", ["python", "rust"])
def test_a_day_files_rows_are_counted_on_from_the_last_count_unless_those_bytes_changed(
    tmp_path: Path, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if engine == "rust" and codec.CODEC != "rust":
        pytest.skip("the compiled codec is not built here")
    monkeypatch.setattr(codec, "CODEC", engine)
    path = tmp_path / "2014-05-04.csv"
    row = b'"2014-05-04","01:00:00",1,"3.1.0","x86_64","linux-gnu","a","1",NA,%d\n'
    path.write_bytes(HEADER + b"".join(row % n for n in range(3)))
    assert answers.count_rows(str(path), path.stat().st_size) == 3
    with path.open("ab") as handle:
        handle.write(b"".join(row % n for n in range(10, 12)) + b'"2014-05-04","01:0')  # and half a row
    assert answers.count_rows(str(path), path.stat().st_size) == 5
    # cut back below the last count and written again, differently, to a greater size
    with path.open("r+b") as handle:
        handle.truncate(len(HEADER) + len(row % 0))
        handle.seek(0, os.SEEK_END)
        handle.write(b"x" * 300 + b"\n" + b"".join(row % n for n in range(100, 104)))
    assert answers.count_rows(str(path), path.stat().st_size) == 1 + 1 + 4


def _row(ip_id: int, hour: int = 1) -> bytes:
    return f'"{DAY}","{hour:02d}:00:00",10,"3.1.0","x86_64","linux-gnu","a","1","DE",{ip_id}\n'.encode()


def test_a_smaller_top_is_the_prefix_of_the_aggregate_kept_for_a_larger_one(tmp_path: Path) -> None:
    caches.set_process_budget(1024**2)
    path = tmp_path / f"{DAY}.csv"
    path.write_bytes(HEADER + b"".join(_row(ip_id, hour) for ip_id in range(1, 6) for hour in range(ip_id)))
    store = Aggregates(tmp_path)
    store.fold({DAY: path.stat().st_size})
    many = answers.day_aggregate(store, DAY, 5)
    assert many is not None and [w.ip_id for w in many.whales] == [5, 4, 3, 2, 1]
    assert many.downloads == 15 and many.bytes == 150 and many.downloaders == 5 and sum(many.hourly) == 15
    assert many.whales[0].hourly[:5] == (1, 1, 1, 1, 1) and many.whales[0].country == "DE"
    few = answers.day_aggregate(store, DAY, 2)
    assert few is not None and few.whales == many.whales[:2] and few.hourly == many.hourly
    assert answers.day_aggregate(store, "2014-05-05", 2) is None
    store.close()


def test_the_biggest_whale_of_a_day_nobody_downloaded_on_is_null(tmp_path: Path) -> None:
    (tmp_path / f"{DAY}.csv").write_bytes(HEADER)
    store = Aggregates(tmp_path)
    sizes = {DAY: len(HEADER)}
    store.fold(sizes)
    assert answers.Biggest(DAY).answer(store, sizes) == b"null"
    assert answers.Summary("2014-05-05", 3).answer(store, {}) == b"null"  # no file: no day
    store.close()

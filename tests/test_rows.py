"""One ip_id's rows of a day file (tiny.analytics.rows): found by a byte search, whole lines, kept per version."""

from __future__ import annotations

import os
from pathlib import Path

from tiny.analytics import caches
from tiny.analytics.rows import DayFile, lines_of, read_complete_lines, rows_of, whale_downloads
from tiny.layout import HEADER

DAY = "2014-05-04"


def _row(ip_id: int, time: str = "01:00:00", package: str = "a") -> bytes:
    return f'"{DAY}","{time}",1,"3.1.0","x86_64","linux-gnu","{package}","1",NA,{ip_id}\n'.encode()


def test_an_ip_ids_rows_are_the_lines_whose_last_field_it_is() -> None:
    """One whale's rows are found by a byte search for ",<ip_id>" at a line's end: never an
    ip_id that ends with its digits, a string holding them, or the header."""
    rows = [
        b'"2014-05-04","01:00:00",1,"3.1.0","x86_64","linux-gnu","a","1",NA,371\n',
        b'"2014-05-04","01:00:01",1,"3.1.0","x86_64","linux-gnu","b","1",NA,1371\n',
        b'"2014-05-04","01:00:02",1,"3.1.0","x86_64","linux-gnu","c,371","1",NA,37\n',
        b'"2014-05-04","01:00:03",1,"3.1.0","x86_64","linux-gnu","d","1",NA,371\n',
    ]
    data = HEADER + b"".join(rows)
    assert lines_of(data, 371, len(HEADER)) == rows[0] + rows[3]
    assert lines_of(data, 37, len(HEADER)) == rows[2]
    assert lines_of(data, 1, len(HEADER)) == b""


def test_a_read_stops_at_the_last_complete_line_below_the_size(tmp_path: Path) -> None:
    path = tmp_path / f"{DAY}.csv"
    path.write_bytes(HEADER + _row(1) + _row(2)[:20])  # a writer in the middle of a row
    assert read_complete_lines(str(path), path.stat().st_size) == HEADER + _row(1)
    assert read_complete_lines(str(path), len(HEADER) + 5) == HEADER


def _version(path: Path) -> DayFile:
    stat = path.stat()
    return DayFile(DAY, str(path), stat.st_size, stat.st_mtime_ns)


def test_the_rows_of_one_version_are_read_once_and_a_new_version_is_read_again(tmp_path: Path) -> None:
    caches.set_process_budget(1024**2)
    path = tmp_path / f"{DAY}.csv"
    path.write_bytes(HEADER + _row(5, "02:00:00", "b") + _row(6) + _row(5, "01:00:00", "a"))
    first = rows_of(_version(path), 5)
    assert [(row.time, row.package) for row in first] == [("02:00:00", "b"), ("01:00:00", "a")]  # file order
    assert rows_of(_version(path), 5) is first  # kept
    with path.open("ab") as out:
        out.write(_row(5, "03:00:00", "c"))
    assert len(rows_of(_version(path), 5)) == 3
    os.truncate(path, len(HEADER))
    assert rows_of(_version(path), 5) == []


def test_a_whales_downloads_are_in_time_order_and_cut_at_the_limit(tmp_path: Path) -> None:
    path = tmp_path / f"{DAY}.csv"
    path.write_bytes(HEADER + _row(5, "02:00:00", "b") + _row(5, "01:00:00", "a") + _row(5, "01:00:00", "c"))
    found = whale_downloads(rows_of(_version(path), 5), DAY, 5, 2)
    assert found is not None and found["total"] == 3 and found["truncated"] and found["packages"] == 3
    assert [(d["time"], d["package"]) for d in found["downloads"]] == [("01:00:00", "a"), ("01:00:00", "c")]
    assert whale_downloads([], DAY, 5, 2) is None

"""The aggregate tables' SQL (tiny.aggregate_sql): each read against a count of the rows folded, and the encodings."""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tiny import aggregate_sql as sql
from tiny.aggregates import Aggregates
from tiny.layout import HEADER

DAY, NEXT = "2014-05-04", "2014-05-05"
BIG = 2**64 - 1  # the largest ip_id and size a record may hold


def row(day: str, hour: int, package: str, ip_id: int, size: int = 100, country: str | None = "DE") -> bytes:
    where = "NA" if country is None else f'"{country}"'
    return f'"{day}","{hour:02d}:00:00",{size},"4.0","x86_64","linux-gnu","{package}","1.0",{where},{ip_id}\n'.encode()


ROWS = {
    DAY: [
        row(DAY, 1, "caret", 7, country="MX"),
        row(DAY, 1, "caret", 7, country="DE"),  # a tie: alphabetical, DE first
        row(DAY, 2, "Rcpp", 7, country=None),
        row(DAY, 2, "Rcpp", 3),
        row(DAY, 5, "Rcpp", 3),
        row(DAY, 23, "ggplot2", 3, country="US"),
        row(DAY, 23, "ggplot2", BIG, size=BIG, country=None),
        row(DAY, 23, "ggplot2", BIG, size=BIG, country=None),
        row(DAY, 23, "ggplot2", BIG, size=BIG, country=None),
        row(DAY, 9, "x", 1),
    ],
    NEXT: [row(NEXT, 0, "caret", 7), row(NEXT, 0, "Rcpp", 8)],
}


@pytest.fixture
def db(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    for day, rows in ROWS.items():
        (tmp_path / f"{day}.csv").write_bytes(HEADER + b"".join(rows))
    store = Aggregates(tmp_path)
    assert store.fold({day: (tmp_path / f"{day}.csv").stat().st_size for day in ROWS}) == 12
    yield store.db
    store.close()


def test_a_byte_total_past_2_to_the_64_is_stored_in_two_columns_and_read_back_exact() -> None:
    for total in (0, 1, 2**32 - 1, 2**32, 3 * BIG, 2**95 - 1):
        assert sql.join_bytes(total >> 32, total & 0xFFFFFFFF) == total


def test_a_days_totals_and_hours(db: sqlite3.Connection) -> None:
    assert sql.day_totals(db, DAY) == (10, 7 * 100 + 3 * BIG)
    hourly = sql.day_hourly(db, DAY)
    assert len(hourly) == sql.HOURS and hourly[1] == 2 and hourly[23] == 4 and sum(hourly) == 10
    assert sql.downloaders(db, DAY) == 4


def test_the_top_ip_ids_most_downloads_first_ties_by_smaller_ip_id_up_to_2_to_the_64(db: sqlite3.Connection) -> None:
    ranked = sql.top_ips(db, DAY, 10)
    assert [(ip_id, n) for ip_id, n, _ in ranked] == [(3, 3), (7, 3), (BIG, 3), (1, 1)]
    assert ranked[2][2] == 3 * BIG
    assert sql.top_ips(db, DAY, 2) == ranked[:2]


def test_an_ip_ids_hours_and_its_most_frequent_country(db: sqlite3.Connection) -> None:
    assert sql.ip_hourly(db, DAY, 7)[1:3] == [2, 1] and sum(sql.ip_hourly(db, DAY, 7)) == 3
    assert sql.ip_country(db, DAY, 7) == "DE"  # MX and DE once each: alphabetical
    assert sql.ip_country(db, DAY, 3) == "DE"  # twice, against US once
    assert sql.ip_country(db, DAY, BIG) is None


def test_the_cran_apis_spans_of_days(db: sqlite3.Connection) -> None:
    assert sql.rows_between(db, DAY, NEXT) == 12 and sql.rows_between(db, "2014-06-01", "2014-06-30") == 0
    assert sql.rows_per_day(db, DAY, NEXT) == [(DAY, 10), (NEXT, 2)]
    assert sql.package_sum(db, "Rcpp", DAY, NEXT) == 4 and sql.package_sum(db, "nope", DAY, NEXT) == 0
    assert sql.package_per_day(db, "caret", DAY, NEXT) == [(DAY, 2), (NEXT, 1)]
    counted = Counter({"ggplot2": 4, "Rcpp": 4, "caret": 3, "x": 1})
    assert sql.ranked_packages(db, DAY, NEXT, -1) == sorted(counted.items(), key=lambda item: (-item[1], item[0]))
    assert sql.ranked_packages(db, DAY, NEXT, 2) == [("Rcpp", 4), ("ggplot2", 4)]


def test_rising_packages_compare_a_week_with_the_average_week_before(db: sqlite3.Connection) -> None:
    # NEXT against DAY as one week: caret 1 against 2, Rcpp 1 against 3
    assert sql.rising_packages(db, (NEXT, NEXT), (DAY, NEXT), 1, 1) == [("caret", 50.0), ("Rcpp", 100 / 3)]
    assert sql.rising_packages(db, (NEXT, NEXT), (DAY, NEXT), 1, 2) == []  # none downloaded twice that week


def test_a_forgotten_day_leaves_nothing_and_its_count_is_gone(db: sqlite3.Connection) -> None:
    assert sql.counted(db, DAY) is not None and sql.has_day(db, DAY)
    sql.forget(db, DAY)
    assert sql.counted(db, DAY) is None and not sql.has_day(db, DAY) and sql.day_version(db, DAY) is None
    for table in ("packages", "hours", "ips", "ip_hours", "ip_countries"):
        assert db.execute(f"SELECT COUNT(*) FROM {table} WHERE day = ?", (DAY,)).fetchone() == (0,)
    assert sql.days_within(db, ("0000-00-00", "9999-99-99")) == [NEXT]


def test_a_new_store_has_the_tables_of_its_version_and_a_generation(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "store.sqlite3", isolation_level=None)
    try:
        assert sql.version(db) == 0
        sql.create(db, 12345)
        sql.set_version(db)
        assert sql.version(db) == sql.VERSION and sql.generation(db) == 12345
        sql.set_generation(db, 12346)
        assert sql.generation(db) == 12346 and sql.days_within(db, ("0000-00-00", "9999-99-99")) == []
    finally:
        db.close()

"""Answers from the live aggregates (tiny.live): the typed queries, the answers a worker keeps, the pool's fold job."""

from __future__ import annotations

import dataclasses
import json
import pickle
import zlib
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path

import pytest

from tests.support import record
from tiny import live
from tiny.analytics import answers
from tiny.cran_api import Count, Daily, MonthlyTotals, Period, Top, Total, Trending
from tiny.layout import HEADER
from tiny.testing import InProcessServer

DAY = "2014-05-04"
WEEK = Period(date(2014, 5, 1), date(2014, 5, 7))
QUERIES: list[live.Query] = [
    Total(WEEK, None),
    Total(WEEK, ("Rcpp", "caret")),
    Daily(WEEK, ("Rcpp",)),
    Top(WEEK, 9),
    MonthlyTotals(WEEK),
    Trending(date(2014, 5, 7)),
    Count("Rcpp", WEEK),
    Count("Rcpp", None),
    answers.Days((DAY, "2014-05-05")),
    answers.Summary(DAY, 6),
    answers.Whales(DAY, 6),
    answers.Hourly(DAY, 6),
    answers.Biggest(DAY),
    answers.Chart(DAY, "traffic", 6),
]


def test_every_kind_of_query_is_a_frozen_value_that_hashes_and_pickles() -> None:
    """Keys of the answers a worker keeps and of the pool's jobs, and sent to the pool as they are."""
    for query in QUERIES:
        again = pickle.loads(pickle.dumps(query))
        assert again == query and hash(again) == hash(query) and again is not query
        field = dataclasses.fields(query)[0].name  # type: ignore[arg-type]
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(query, field, None)
    assert len(set(QUERIES)) == len(QUERIES)
    assert Total(WEEK, None) != Daily(WEEK, None)  # the same fields, another kind


def test_a_query_names_the_days_it_reads() -> None:
    assert Top(WEEK, 3).days == WEEK.days() and len(WEEK.days()) == 7
    assert Count("Rcpp", None).days is None  # every day
    assert Trending(date(2014, 5, 7)).days[0] == "2013-11-14" and len(Trending(date(2014, 5, 7)).days) == 7 + 7 * 24
    assert answers.Chart(DAY, "whales", 3).days == [DAY]
    assert answers.Days((DAY,)).folds is False and answers.Summary(DAY, 1).folds is True


def test_an_etag_is_the_crc_and_length_of_the_body() -> None:
    body = b'{"downloads": 1}'
    assert live.etag_of(body) == f'"{zlib.crc32(body):08x}-{len(body):x}"'
    assert live.Answer(body, (1,)).etag == live.etag_of(body)


def test_the_fold_job_answers_a_query_that_does_not_fold_without_folding(tmp_path: Path) -> None:
    (tmp_path / f"{DAY}.csv").write_bytes(HEADER + b'"2014-05-04","01:00:00",1,NA,NA,NA,"a","1",NA,5\n')
    generation, body = live.fold_job(str(tmp_path), {}, ("", ""), answers.Days((DAY,)), 77, 0.0)
    assert generation == 77  # the worker's, handed back: the store was not read
    size = (tmp_path / f"{DAY}.csv").stat().st_size
    assert json.loads(body) == [{"date": DAY, "rows": 1, "bytes": size}]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[InProcessServer]:
    with InProcessServer(tmp_path / "data") as running:
        yield running


def _answer(server: InProcessServer, query: live.Query) -> live.Answer:
    return server.call(lambda: server.deps.live.answer(query))  # type: ignore[no-any-return]


def test_the_days_are_the_day_files_oldest_first(server: InProcessServer) -> None:
    for day in ("2014-05-06", DAY):
        assert server.ingest(json.dumps(record(date=day)).encode()).status == 200
    (server.data_dir / "notes.txt").write_text("not a day")
    found = server.deps.live
    assert found.days(found.version()) == [DAY, "2014-05-06"]
    assert found.last_day(found.version()) == date(2014, 5, 6)


@pytest.mark.hardening("hostile client: a record dated 9999-12-31 moved last-day for every badge and query")
def test_the_last_day_is_the_last_with_data_up_to_tomorrow(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    ahead = date.today() + timedelta(days=3)  # past tomorrow in UTC: local and UTC dates differ by a day at most
    for day in (DAY, "9999-12-31", ahead.isoformat()):
        (data / f"{day}.csv").write_bytes(HEADER)
    with InProcessServer(data) as server:
        found = server.deps.live
        assert found.last_day(found.version()) == date(2014, 5, 4)
        assert server.ingest(json.dumps(record(date="2014-05-06")).encode()).status == 200
        assert found.last_day(found.version()) == date(2014, 5, 6)


def test_an_answer_is_kept_until_a_file_it_reads_changes(server: InProcessServer) -> None:
    assert server.ingest(json.dumps(record(date=DAY, package="Rcpp")).encode()).status == 200
    query = Total(Period(date(2014, 5, 4), date(2014, 5, 4)), ("Rcpp",))
    first = _answer(server, query)
    assert json.loads(first.body)[0]["downloads"] == 1
    assert _answer(server, query) is first  # from memory: nothing it reads changed
    assert server.ingest(json.dumps(record(date="2014-05-09")).encode()).status == 200
    assert _answer(server, query) is first  # another day was written
    assert server.ingest(json.dumps(record(date=DAY, package="Rcpp")).encode()).status == 200
    again = _answer(server, query)
    assert again is not first and json.loads(again.body)[0]["downloads"] == 2


def test_the_version_moves_with_every_flush(server: InProcessServer) -> None:
    before = server.deps.live.version()
    assert server.ingest(json.dumps(record(date=DAY)).encode()).status == 200
    assert server.deps.live.version() != before


@pytest.mark.hardening("hostile client: 150 century-long GETs held the event loop 10 s and got the worker killed")
def test_a_period_of_a_century_is_answered_by_its_span_without_listing_its_days(
    server: InProcessServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert server.ingest(json.dumps(record(date="2014-05-06", package="span")).encode()).status == 200

    def listed(period: Period) -> list[str]:
        raise AssertionError(f"the days of {period} were listed on the event loop")

    monkeypatch.setattr(Period, "days", listed)  # this process's: the pool's processes answer the total
    query = Total(Period(date(1914, 5, 6), date(2114, 5, 6)), ("span",))
    first = _answer(server, query)
    assert json.loads(first.body)[0]["downloads"] == 1
    assert _answer(server, query) is first  # kept, and found again without the days

"""The downloads API as the public service (r-hub/cranlogs.app, routes/*.js) serves it: its routes,
its periods, counts and colours, HEAD, and JSON that names its charset.

The server holds the real day 2014-05-04 and a second day made from it (every third row, dated
2014-05-06; 2014-05-05 has no file): ``last-day`` is 2014-05-06. Counts are checked against
tests.support.package_counts; the R client's own run is tests/test_r_client.py.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from urllib.parse import quote

import orjson
import pytest
from PIL import ImageColor

from tests.support import once_counted, package_counts, record, sample_csv, second_day_csv
from tiny import badges
from tiny.cran_api import Period, parse_period
from tiny.testing import InProcessServer, Response, raw_exchange

DAY, SECOND = "2014-05-04", "2014-05-06"
JSON = "application/json; charset=utf-8"
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def truth() -> dict[str, Counter[str]]:
    return package_counts()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    data = tmp_path_factory.mktemp("downloads-api") / "data"
    data.mkdir()
    (data / f"{DAY}.csv").write_bytes(sample_csv())
    (data / f"{SECOND}.csv").write_bytes(second_day_csv())
    with InProcessServer(data, "--public-downloads") as running:
        counted(running)
        yield running


def counted(server: InProcessServer, seconds: float = 180.0) -> None:
    """Wait until the store has counted both days (a first query answers 503 while rows are left)."""
    response = once_counted(server, f"/downloads/total/{DAY}:{SECOND}", seconds)
    assert response.status == 200, response.body


def get(server: InProcessServer, path: str) -> Response:
    return server.request("GET", path)


def ok_json(server: InProcessServer, path: str) -> object:
    response = get(server, path)
    assert response.status == 200, (path, response.body[:300])
    assert response.headers["content-type"] == JSON
    return orjson.loads(response.body)


def badge_texts(body: bytes) -> list[str | None]:
    return [t.text for t in ET.fromstring(body).iter() if t.tag.endswith("text")]


# -- periods -----------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["last-week", "LAST-WEEK", "Last-Week"])
def test_period_keywords_are_taken_in_any_case(text: str) -> None:
    assert parse_period(text, date(2014, 5, 6)) == Period(date(2014, 4, 30), date(2014, 5, 6))


def test_a_keyword_with_a_non_ascii_letter_that_lowers_to_ascii_is_no_keyword() -> None:
    with pytest.raises(ValueError, match="not a period"):
        parse_period("last-wee\u212a", date(2014, 5, 6))  # KELVIN SIGN lowers to "k"


@pytest.mark.parametrize("text", ["2014-05-04:last-day", "2014-05-04:LAST-DAY"])
def test_a_day_to_last_day_ends_on_the_last_day_with_data(text: str) -> None:
    assert parse_period(text, date(2014, 5, 6)) == Period(date(2014, 5, 4), date(2014, 5, 6))


def test_a_day_to_last_day_that_starts_after_the_last_day_is_refused() -> None:
    with pytest.raises(ValueError, match="ends before it starts .last-day is 2014-05-06"):
        parse_period("2014-05-07:last-day", date(2014, 5, 6))


@pytest.mark.parametrize("text", ["last-day:2014-05-06", "last-week:last-day", "2014-05-04:last-week"])
def test_other_keyword_ranges_are_refused_as_the_service_refuses_them(text: str) -> None:
    with pytest.raises(ValueError, match="not a period"):
        parse_period(text, date(2014, 5, 6))


def test_the_client_default_period_over_http(server: InProcessServer, truth: dict[str, Counter[str]]) -> None:
    (answer,) = ok_json(server, f"/downloads/daily/{DAY}:last-day/ggplot2")  # type: ignore[misc]
    assert answer == {
        "downloads": [
            {"day": DAY, "downloads": truth[DAY]["ggplot2"]},
            {"day": "2014-05-05", "downloads": 0},
            {"day": SECOND, "downloads": truth[SECOND]["ggplot2"]},
        ],
        "start": DAY,
        "end": SECOND,
        "package": "ggplot2",
    }
    assert ok_json(server, "/downloads/total/LAST-WEEK/ggplot2") == [
        {
            "downloads": truth[DAY]["ggplot2"] + truth[SECOND]["ggplot2"],
            "start": "2014-04-30",
            "end": SECOND,
            "package": "ggplot2",
        }
    ]


# -- /top ------------------------------------------------------------------------------------


def ranked(counts: Counter[str], limit: int) -> list[dict[str, str]]:
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
    return [{"package": name, "downloads": str(n)} for name, n in top]


def test_top_without_a_count_gives_the_services_9_with_its_start_and_end_format(
    server: InProcessServer, truth: dict[str, Counter[str]]
) -> None:
    assert ok_json(server, "/top/last-day") == {
        "start": f"{SECOND}T00:00:00.000Z",
        "end": f"{SECOND}T00:00:00.000Z",
        "downloads": ranked(truth[SECOND], 9),
    }


@pytest.mark.parametrize("count", ["101", "150", "000150", "9" * 5000])
def test_top_of_more_than_100_gives_100(server: InProcessServer, truth: dict[str, Counter[str]], count: str) -> None:
    answer = ok_json(server, f"/top/last-week/{count}")
    both = truth[DAY] + truth[SECOND]
    assert len(both) > 100
    assert answer == {
        "start": "2014-04-30T00:00:00.000Z",
        "end": f"{SECOND}T00:00:00.000Z",
        "downloads": ranked(both, 100),
    }


@pytest.mark.parametrize(
    "count", ["0", "000", "-1", "ten", "1.5", "\u00b2", "\u0661"]
)  # SUPERSCRIPT TWO, ARABIC-INDIC ONE
def test_top_of_a_count_that_is_not_a_positive_whole_number_is_400(server: InProcessServer, count: str) -> None:
    response = get(server, f"/top/last-day/{quote(count)}")
    assert response.status == 400, response.body
    assert "whole number from 1" in orjson.loads(response.body)["error"]["message"]


# -- /badges -----------------------------------------------------------------------------------


def test_a_badge_of_several_names_is_the_count_of_that_one_name_as_the_service_draws_it(
    server: InProcessServer,
) -> None:
    response = get(server, "/badges/last-week/Rcpp,ggplot2")
    assert response.status == 200, response.body
    assert response.headers["content-type"] == "image/svg+xml"
    assert badge_texts(response.body)[2:] == ["0/week", "0/week"]  # no package is named "Rcpp,ggplot2"


def test_a_badge_summary_alone_is_that_summary_of_a_package_of_that_name(server: InProcessServer) -> None:
    response = get(server, "/badges/last-week")
    assert response.status == 200, response.body
    assert badge_texts(response.body)[2:] == ["0/week", "0/week"]


def test_a_badge_summary_is_taken_in_any_case(server: InProcessServer, truth: dict[str, Counter[str]]) -> None:
    response = get(server, "/badges/LAST-DAY/Rcpp")
    assert response.status == 200, response.body
    shown = badges.text(truth[SECOND]["Rcpp"], "day")
    assert badge_texts(response.body)[2:] == [shown, shown]


@pytest.mark.parametrize(
    ("color", "fill"),
    [("%23ff69b4", "#ff69b4"), ("ff69b4", "#ff69b4"), ("%23FFF", "#FFF"), ("purple", "purple"), ("Orange", "#fe7d37")],
)
def test_a_badge_takes_a_colour_name_or_a_hex_code_with_or_without_its_hash(
    server: InProcessServer, color: str, fill: str
) -> None:
    response = get(server, f"/badges/Rcpp?color={color}")
    assert response.status == 200, response.body
    assert f'<path fill="{fill}" d="M70 '.encode() in response.body


def test_badge_colour_names_are_the_css_colour_keywords() -> None:
    assert badges.NAMED == set(ImageColor.colormap)  # pillow's table of the CSS Color 4 keywords
    assert badges.color("RebeccaPurple") == "rebeccapurple"
    assert badges.color("ff69b4cc") == "#ff69b4cc"


@pytest.mark.parametrize(
    "color", ["notacolour", "12345", "#ff69b4x", '"/><script>', "\uff52\uff45\uff44"]
)  # FULLWIDTH red
def test_a_badge_colour_that_is_neither_is_400(server: InProcessServer, color: str) -> None:
    response = get(server, f"/badges/Rcpp?color={quote(color)}")
    assert response.status == 400, response.body
    assert "not a badge colour" in orjson.loads(response.body)["error"]["message"]


def test_a_badge_says_its_count_to_screen_readers(server: InProcessServer, truth: dict[str, Counter[str]]) -> None:
    response = get(server, "/badges/grand-total/Rcpp")
    svg = ET.fromstring(response.body)
    said = f"CRAN downloads: {badges.text(truth[DAY]['Rcpp'] + truth[SECOND]['Rcpp'], '')}"
    assert (svg.get("role"), svg.get("aria-label")) == ("img", said)
    title = svg.find("{http://www.w3.org/2000/svg}title")
    assert title is not None and title.text == said and svg[0] is title  # the first child, as SVG asks


# -- the service's other routes -----------------------------------------------------------------


def test_ping_answers_as_the_service(server: InProcessServer) -> None:
    for path in ("/ping", "/ping/"):
        assert ok_json(server, path) == {"operation": "ping", "message": "Thanks! Live long and prosper!"}


def test_check_answers_i_am_alive_in_plain_text(server: InProcessServer) -> None:
    for path in ("/check", "/check/"):
        response = get(server, path)
        assert (response.status, response.headers["content-type"], response.body) == (
            200,
            "text/plain; charset=utf-8",
            b"I am alive",
        )


def test_downloads_points_to_the_apis_documentation(server: InProcessServer) -> None:
    for path in ("/downloads", "/downloads/"):
        assert ok_json(server, path) == {"info": "https://github.com/r-hub/cranlogs.app"}


def test_monthly_totals_list_every_package_of_the_last_month_most_first(
    server: InProcessServer, truth: dict[str, Counter[str]]
) -> None:
    both = truth[DAY] + truth[SECOND]
    expected = sorted(both.items(), key=lambda kv: (-kv[1], kv[0]))
    assert ok_json(server, "/downloads/monthly-totals") == [{"package": name, "count": str(n)} for name, n in expected]


def test_the_routes_need_no_token_only_where_they_hold_no_data(tmp_path: Path) -> None:
    with InProcessServer(tmp_path / "data", env={"TINY_TOKEN": "s3cret"}) as locked:
        for path in ("/ping", "/check", "/downloads/"):
            assert get(locked, path).status == 200, path
        assert get(locked, "/downloads/monthly-totals").status == 401


# Every route of the service (routes/*.js), with typical and odd arguments, and what Tiny answers.
SERVICE_PATHS = [
    ("/", 200),
    ("/ping", 200),
    ("/check", 200),
    ("/downloads", 200),
    ("/downloads/", 200),
    ("/downloads/monthly-totals", 200),
    ("/downloads/total/last-day", 200),
    ("/downloads/total/LAST-MONTH/Rcpp", 200),
    ("/downloads/daily/last-week/ggplot2,Rcpp,nosuchpackage", 200),
    ("/downloads/daily/2014-05-04", 200),
    ("/downloads/daily/2014-05-04:2014-05-06/Rcpp", 200),
    ("/downloads/total/2014-05-04:last-day/Rcpp", 200),
    ("/downloads/daily/1970-01-01:last-day/Rcpp", 200),
    ("/downloads/daily/0001-01-01:9999-12-31", 400),
    ("/downloads/total/2014-02-30", 400),
    ("/downloads/total/2014-05-07:last-day", 400),
    ("/downloads/total/yesterday", 400),
    ("/downloads/total/last-day/a_b", 400),
    ("/downloads/total/last-day/ggplot2,", 400),
    ("/downloads/total/last-day/R", 404),
    ("/downloads/daily/last-day/ggplot2,R", 404),
    ("/downloads/total/last-day/", 404),
    ("/downloads/weekly/last-day", 404),
    ("/top/last-day", 200),
    ("/top/LAST-WEEK/5", 200),
    ("/top/last-month/100", 200),
    ("/top/last-week/150", 200),
    ("/top/last-day/0", 400),
    ("/top/last-day/-1", 400),
    ("/top/yesterday", 400),
    ("/top/last-day/", 404),
    ("/trending", 200),
    ("/trending/", 200),
    ("/badges/Rcpp", 200),
    ("/badges/last-week/Rcpp,ggplot2", 200),
    ("/badges/grand-total/Rcpp?color=%23ff69b4", 200),
    ("/badges/last-day", 200),
    ("/badges/a_b.c,d", 200),
    ("/badges/Rcpp?color=notacolour", 400),
    ("/badges/all/Rcpp", 400),
    ("/badges/last-week/gg-plot", 400),
    ("/badges/R", 404),
    ("/css/skeleton.css", 404),
    ("/images/metacran-logo.svg", 404),
]


@pytest.mark.parametrize(("path", "status"), SERVICE_PATHS)
def test_every_path_the_service_serves_gets_an_answer_not_a_5xx(
    server: InProcessServer, path: str, status: int
) -> None:
    response = get(server, path)
    assert response.status == status, response.body[:300]
    if status != 200:
        assert response.headers["content-type"] == JSON
        assert orjson.loads(response.body)["error"]["status"] == status


# -- every JSON answer names its charset ---------------------------------------------------------


def test_every_json_answer_says_utf_8(server: InProcessServer) -> None:
    paths = ["/downloads/total/last-day", "/top/last-day/3", "/trending", "/ping", "/api/days", "/healthz", "/nope"]
    for path in paths:
        assert get(server, path).headers["content-type"] == JSON, path
    assert server.request("POST", "/top/last-day").headers["content-type"] == JSON  # 405


def test_ingest_answers_say_utf_8_on_the_lean_way_and_the_handlers(server: InProcessServer) -> None:
    line = orjson.dumps(record(date="2014-05-02")) + b"\n"
    lean_ok = server.ingest(line)
    lean_refused = server.ingest(b"not gzip", {"Content-Type": "application/x-ndjson", "Content-Encoding": "gzip"})
    handler = server.request("POST", "/ingest", line, {"Content-Type": "text/csv"})
    assert (lean_ok.status, lean_refused.status, handler.status) == (200, 400, 415)
    for response in (lean_ok, lean_refused, handler):
        assert response.headers["content-type"] == JSON


# -- HEAD on every GET endpoint ------------------------------------------------------------------

GET_ROUTES = [
    f"/downloads/total/{DAY}:last-day/Rcpp",
    "/downloads/daily/last-week",
    "/downloads/monthly-totals",
    "/downloads/",
    "/top/last-week/20",
    "/trending",
    "/badges/last-week/Rcpp?color=red",
    "/ping",
    "/check",
    "/api/days",
    f"/api/days/{DAY}/summary",
    f"/api/days/{DAY}/whales",
    f"/api/days/{DAY}/whales/hourly",
    f"/api/days/{DAY}/whales/1/downloads",
    f"/api/days/{DAY}/charts/traffic.svg",
    "/",
    "/downloads/total/yesterday",  # 400
    "/nope",  # 404
]
VOLATILE = ["/healthz", "/metrics"]  # their bodies change from one request to the next (uptime, counters)


def head_then_ping(server: InProcessServer, path: str) -> bytes:
    """HEAD ``path`` and GET /ping on one connection: all the bytes the server sent."""
    request = f"HEAD {path} HTTP/1.1\r\nHost: t\r\n\r\nGET /ping HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    return raw_exchange(server.port, request.encode(), timeout=30.0)


def head_of(server: InProcessServer, path: str) -> tuple[int, dict[str, str]]:
    """The status and headers of HEAD ``path``, having checked that no body came after them:
    the next bytes on the connection are the answer to the next request (or none, after a
    ``Connection: close``)."""
    sent = head_then_ping(server, path)
    head, _, rest = sent.partition(b"\r\n\r\n")
    status_line, *fields = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value for name, _, value in (field.partition(": ") for field in fields)}
    if headers.get("connection") == "close":
        assert rest == b"", sent[:600]
    else:
        assert rest.startswith(b"HTTP/1.1 200 OK\r\n") and rest.endswith(b'Thanks! Live long and prosper!"}'), sent[
            :600
        ]
    return int(status_line.split()[1]), headers


@pytest.mark.parametrize("path", GET_ROUTES)
def test_head_answers_the_gets_status_and_headers_without_its_body(server: InProcessServer, path: str) -> None:
    got = get(server, path)
    assert got.status != 405 and got.body
    status, headers = head_of(server, path)
    assert status == got.status
    assert int(headers["content-length"]) == len(got.body)
    assert {k: v for k, v in headers.items() if k != "date"} == {k: v for k, v in got.headers.items() if k != "date"}


@pytest.mark.parametrize("path", VOLATILE)
def test_head_of_an_operators_endpoint_has_its_headers_without_its_body(server: InProcessServer, path: str) -> None:
    get(server, path)  # a first request adds its own counters' lines to /metrics
    got = get(server, path)
    status, headers = head_of(server, path)
    assert status == got.status == 200
    assert headers["content-type"] == got.headers["content-type"]
    assert abs(int(headers["content-length"]) - len(got.body)) < 50  # a few counters' or the uptime's digits


def test_head_where_there_is_no_get_is_405_with_allow(server: InProcessServer) -> None:
    status, headers = head_of(server, "/ingest")
    assert (status, headers["allow"]) == (405, "POST")
    response = server.request("POST", "/top/last-day")
    assert (response.status, response.headers["allow"]) == (405, "GET, HEAD")


def test_daily_counts_past_the_bound_are_400_before_any_counting(server: InProcessServer) -> None:
    """A century for 200 packages fits a 1 KB URL and held the analytics pool for its whole
    deadline, past a gigabyte: refused at once, saying the bound."""
    names = ",".join(f"p{n}" for n in range(200))
    response = get(server, f"/downloads/daily/1915-01-01:2014-12-31/{names}")
    assert response.status == 400, response.body
    assert "at most 100,000" in orjson.loads(response.body)["error"]["message"]
    assert get(server, f"/downloads/daily/2014-01-01:2014-12-31/{names.split(',', 1)[0]}").status == 200


def test_more_packages_than_the_bound_are_400(server: InProcessServer) -> None:
    names = ",".join(f"p{n}" for n in range(1001))
    response = get(server, f"/downloads/total/{DAY}/{names}")
    assert response.status == 400 and "at most 1,000" in orjson.loads(response.body)["error"]["message"]


@pytest.mark.parametrize(
    "path",
    ["/downloads/total/last-week/pkg", "/downloads/daily/last-month", "/top/last-week", "/trending", "/badges/pkg"],
)
def test_a_last_day_at_the_first_days_there_are_answers_from_the_first_day(tmp_path: Path, path: str) -> None:
    """A record dated 0001-01-05 makes it the last day with data; a week before it is no date
    (an OverflowError, a 500): the periods start at 0001-01-01 instead."""
    with InProcessServer(tmp_path / "data", "--public-downloads") as early:
        assert early.ingest(orjson.dumps(record(date="0001-01-05", package="pkg")) + b"\n").status == 200
        response = once_counted(early, path)
        assert response.status == 200, response.body


@pytest.mark.hardening("hostile client: million-character badge names held memory the cache did not count")
@pytest.mark.parametrize("path", ["/badges/{name}", "/downloads/total/last-day/Rcpp,{name}", "/badges/last-day/{name}"])
def test_a_package_name_past_its_bound_gets_a_400_that_does_not_echo_it(server: InProcessServer, path: str) -> None:
    from tiny.limits import CRAN_MAX_NAME

    name = "a" * 100_000
    response = get(server, path.format(name=name))
    assert response.status == 400, response.body[:200]
    assert len(response.body) < 500 and f"at most {CRAN_MAX_NAME}" in response.json()["error"]["message"]
    assert get(server, path.format(name="a" * CRAN_MAX_NAME)).status == 200


def test_an_answer_kept_in_memory_is_charged_its_query_too(server: InProcessServer) -> None:
    """A thousand long names are 100 KB of key beside a 20 KB answer: the budget counts both."""
    live = server.deps.live
    names = ",".join(f"p{n:03d}" + "a" * 96 for n in range(1000))
    before = live._answers.weight()  # the cache's own charge
    assert get(server, f"/downloads/total/{DAY}/{names}").status == 200
    assert live._answers.weight() - before > 100_000

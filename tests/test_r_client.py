"""The real client: the `cranlogs` R package (../shared/clients) against a server, as R users run it.

The package is installed from its tarball into a library of this test run (`R CMD INSTALL -l`,
no network) and pointed at the server through its namespace's ``daily_url`` and ``top_url``,
as ../shared/clients/README.md says. The server ingested, over HTTP (tiny.replay), the real day
../shared/data/cran-logs/2014-05-04.csv.gz and a second day made from it (every third row,
dated 2014-05-06; 2014-05-05 has no file), so ``last-day`` is 2014-05-06.

Every exported function that reaches the API runs with the public service's defaults
(``cran_downloads()`` with ``when``, ``from`` and ``to`` left alone, ``to`` alone left at
``last-day``, ``cran_top_downloads()`` with its count of 10), and ``cranlogs_badge()``, which
only writes Markdown, has the badge its Markdown names fetched from the server. Every count is
compared with one made here from the file itself (gzip and csv: no code of the server's), every
run's stderr must be empty (httr says "No encoding supplied" there when a JSON answer has no
charset) and its warnings are the ones expected.
Needs Debian's r-base-core, r-cran-httr, r-cran-jsonlite and r-cran-testthat (`make sysdeps`).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
import shutil
import subprocess
import tarfile
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, SAMPLE_DAY, Server, once_counted, second_day_csv
from tiny import badges
from tiny.replay import Options, replay

CLIENT = ROOT.parent / "shared" / "clients" / "cranlogs_2.1.1.9000.tar.gz"
RSCRIPT = shutil.which("Rscript")
DAY, SECOND = "2014-05-04", "2014-05-06"
NO_PACKAGE = "NA"  # the file's bare NA: a row with no package
pytestmark = [
    pytest.mark.skipif(RSCRIPT is None, reason="R is not installed (`make sysdeps` installs r-base-core and friends)"),
    pytest.mark.skipif(not CLIENT.exists(), reason=f"the client is not at {CLIENT}"),
    pytest.mark.timeout(300),
]


@pytest.fixture(scope="module")
def truth() -> dict[str, Counter[str]]:
    """Rows per package field of each day, counted here from the file: every row, those with no
    package under NO_PACKAGE; the second day is every third row, as tests.support makes it."""
    raw = gzip.decompress(SAMPLE_DAY.read_bytes())
    assert b',"NA",' not in raw  # so the csv module's "NA" is the bare NA of a row with no package
    first: Counter[str] = Counter()
    second: Counter[str] = Counter()
    for n, row in enumerate(csv.DictReader(io.StringIO(raw.decode()))):
        first[row["package"]] += 1
        if n % 3 == 0:
            second[row["package"]] += 1
    assert first.total() == raw.count(b"\n") - 1 == 77_107 and first[NO_PACKAGE] == 7
    assert second.total() == second_day_csv().count(b"\n") - 1
    return {DAY: first, SECOND: second}


def ranked(counts: Counter[str], limit: int) -> list[tuple[str, int]]:
    """The ``limit`` most downloaded packages, most first, ties by name (rows with no package are no package)."""
    named = [(name, n) for name, n in counts.items() if name != NO_PACKAGE]
    return sorted(named, key=lambda kv: (-kv[1], kv[0]))[:limit]


@pytest.fixture(scope="module")
def rlib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The client, installed as its README says, in a library of this run; its sources beside it."""
    base = tmp_path_factory.mktemp("r")
    library = base / "rlib"
    library.mkdir()
    done = subprocess.run(["R", "CMD", "INSTALL", "-l", str(library), str(CLIENT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    with tarfile.open(CLIENT) as packed:
        packed.extractall(base / "src", filter="data")
    return library


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("served")
    second = base / f"{SECOND}.csv"
    second.write_bytes(second_day_csv())
    with Server(base / "data", processes=2) as running:
        url = f"http://127.0.0.1:{running.port}/ingest"
        for path in (SAMPLE_DAY, second):
            summary = replay(Options(path, url, batch=2000, concurrency=2))
            assert summary.failures == 0 and summary.invalid == 0
        counted(running)
        yield running


def counted(server: Server, seconds: float = 180.0) -> None:
    """Wait until the server has counted both days: a first query folds them within the analytics
    pool's CPU quota, and answers 503 with Retry-After while rows are left (slow on a busy machine)."""
    response = once_counted(server, f"/downloads/total/{DAY}:{SECOND}", seconds)
    assert response.status == 200, response.body


def run_r(rlib: Path, server: Server, code: str, warnings: Sequence[str] = ()) -> Any:
    """``code`` in Rscript with the client pointed at ``server``: what it passes to ``answer()``,
    parsed. Its stderr must be empty and its warnings exactly ``warnings``."""
    base = f"http://127.0.0.1:{server.port}/"
    script = f"""
.libPaths(c("{rlib}", .libPaths()))
suppressPackageStartupMessages(library(cranlogs))
assignInNamespace("daily_url", paste0("{base}", "downloads/daily/"), "cranlogs")
assignInNamespace("top_url", paste0("{base}", "top/"), "cranlogs")
warned <- character()
answer <- function(x) {{
  force(x)
  cat(jsonlite::toJSON(list(value = x, warnings = as.list(warned)),
                       dataframe = "rows", Date = "ISO8601", digits = NA, auto_unbox = TRUE))
}}
withCallingHandlers({{
{code}
}}, warning = function(w) {{ warned <<- c(warned, conditionMessage(w)); invokeRestart("muffleWarning") }})
"""
    done = subprocess.run([str(RSCRIPT), "-e", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr  # httr's "No encoding supplied" and any other message
    got = json.loads(done.stdout)
    assert got["warnings"] == list(warnings)
    return got["value"]


def days(first: str, last: str) -> list[str]:
    start, end = date.fromisoformat(first), date.fromisoformat(last)
    return [(start + timedelta(days=n)).isoformat() for n in range((end - start).days + 1)]


def per_day(truth: dict[str, Counter[str]], package: str, first: str, last: str) -> list[dict[str, Any]]:
    """The client's rows for ``package`` over ``first``..``last``, from the count made here."""
    return [{"date": day, "count": truth.get(day, Counter())[package], "package": package} for day in days(first, last)]


# -- cran_downloads ---------------------------------------------------------------------------


def test_cran_downloads_of_all_packages_with_its_defaults_counts_every_row(
    rlib: Path, server: Server, truth: dict[str, Counter[str]]
) -> None:
    got = run_r(
        rlib,
        server,
        """answer(list(defaults = cran_downloads(), from_only = cran_downloads(from = "2014-05-04"),
                       week = cran_downloads(when = "last-week")))""",
    )
    # The public service's rule: an all-package total counts every row of the day, the rows
    # with no package (bare NA) included: 77,107 on 2014-05-04, 7 of them without a package.
    # The only expectation of this file on the rows with no package.
    every_row = {day: counts.total() for day, counts in truth.items()}
    assert got["defaults"] == [{"date": SECOND, "count": every_row[SECOND]}]
    assert got["from_only"] == [{"date": day, "count": every_row.get(day, 0)} for day in days(DAY, SECOND)]
    assert got["week"] == [{"date": day, "count": every_row.get(day, 0)} for day in days("2014-04-30", SECOND)]


def test_cran_downloads_of_a_package_with_its_defaults_is_the_last_day(
    rlib: Path, server: Server, truth: dict[str, Counter[str]]
) -> None:
    got = run_r(rlib, server, 'answer(cran_downloads("ggplot2"))')
    assert got == per_day(truth, "ggplot2", SECOND, SECOND)
    assert got[0]["count"] > 0


def test_cran_downloads_from_a_day_with_to_at_its_default_ends_on_the_last_day(
    rlib: Path, server: Server, truth: dict[str, Counter[str]]
) -> None:
    got = run_r(rlib, server, 'answer(cran_downloads("ggplot2", from = "2014-05-04"))')  # sends 2014-05-04:last-day
    assert got == per_day(truth, "ggplot2", DAY, SECOND)
    several = run_r(
        rlib, server, 'answer(cran_downloads(c("Rcpp", "data.table", "nosuchpackage"), from = "2014-05-01"))'
    )
    assert several == [
        row for name in ("Rcpp", "data.table", "nosuchpackage") for row in per_day(truth, name, "2014-05-01", SECOND)
    ]


@pytest.mark.parametrize(
    ("when", "first"), [("last-day", SECOND), ("last-week", "2014-04-30"), ("last-month", "2014-04-07")]
)
def test_cran_downloads_when_ends_on_the_last_day_with_data(
    rlib: Path, server: Server, truth: dict[str, Counter[str]], when: str, first: str
) -> None:
    got = run_r(rlib, server, f'answer(cran_downloads(c("Rcpp", "ggplot2"), when = "{when}"))')
    assert got == per_day(truth, "Rcpp", first, SECOND) + per_day(truth, "ggplot2", first, SECOND)


def test_cran_downloads_of_several_packages_over_a_range_with_empty_days(
    rlib: Path, server: Server, truth: dict[str, Counter[str]]
) -> None:
    packages = ["ggplot2", "data.table", "Rcpp", "nosuchpackage"]
    names = ", ".join(f'"{name}"' for name in packages)
    got = run_r(rlib, server, f'answer(cran_downloads(c({names}), from = "2014-05-02", to = "2014-05-07"))')
    assert got == [row for package in packages for row in per_day(truth, package, "2014-05-02", "2014-05-07")]
    assert sum(row["count"] for row in got if row["package"] == "Rcpp") > 0


# -- cran_top_downloads -----------------------------------------------------------------------


def top_rows(counts: Counter[str], limit: int, first: str) -> list[dict[str, Any]]:
    return [
        {"rank": rank, "package": name, "count": n, "from": first, "to": SECOND}
        for rank, (name, n) in enumerate(ranked(counts, limit), start=1)
    ]


def test_cran_top_downloads_with_its_defaults_is_the_last_days_top_10(
    rlib: Path, server: Server, truth: dict[str, Counter[str]]
) -> None:
    got = run_r(rlib, server, "answer(cran_top_downloads())")
    assert got == top_rows(truth[SECOND], 10, SECOND)


@pytest.mark.parametrize(
    ("when", "count", "first"), [("last-week", 20, "2014-04-30"), ("last-month", 100, "2014-04-07")]
)
def test_cran_top_downloads_of_a_period(
    rlib: Path, server: Server, truth: dict[str, Counter[str]], when: str, count: int, first: str
) -> None:
    got = run_r(rlib, server, f'answer(cran_top_downloads("{when}", {count}))')
    assert got == top_rows(truth[DAY] + truth[SECOND], count, first)


def test_cran_top_downloads_of_more_than_100_gets_100_and_the_clients_warning(
    rlib: Path, server: Server, truth: dict[str, Counter[str]]
) -> None:
    got = run_r(
        rlib, server, 'answer(cran_top_downloads("last-week", 150))', ["Requested 150 packages, returned only 100"]
    )
    assert got == top_rows(truth[DAY] + truth[SECOND], 100, "2014-04-30")
    assert len(ranked(truth[DAY] + truth[SECOND], 150)) == 150  # there were more than 100 to give


# -- cranlogs_badge: the Markdown's badge, served here ---------------------------------------


@pytest.mark.parametrize(
    ("call", "summary", "fill"),
    [  # the examples of its own documentation, and a colour with its '#'
        ('cranlogs_badge("Rcpp")', "last-month", "#007ec6"),
        ('cranlogs_badge("Rcpp", summary = "grand-total")', "grand-total", "#007ec6"),
        ('cranlogs_badge("ggplot2", summary = "last-week", color = "orange")', "last-week", "#fe7d37"),
        ('cranlogs_badge("ggplot2", color = "ff8c69")', "last-month", "#ff8c69"),
        ('cranlogs_badge("plyr", summary = "last-day", color = "%23ff69b4")', "last-day", "#ff69b4"),
    ],
)
def test_the_badge_of_cranlogs_badges_markdown_is_served_with_its_count(
    rlib: Path, server: Server, truth: dict[str, Counter[str]], call: str, summary: str, fill: str
) -> None:
    markdown = run_r(rlib, server, f"answer({call})")
    url = re.search(r"\]\((https://cranlogs\.r-pkg\.org(/badges/[^)]+))\)\]", markdown)
    assert url is not None, markdown
    response = server.request("GET", url.group(2))
    assert response.status == 200, response.body
    assert response.headers["content-type"] == "image/svg+xml"
    package = url.group(2).split("/")[3].split("?")[0]
    count = truth[SECOND][package] if summary == "last-day" else truth[DAY][package] + truth[SECOND][package]
    shown = badges.text(count, {"last-day": "day", "last-week": "week", "last-month": "month"}.get(summary, ""))
    svg = ET.fromstring(response.body)
    assert [t.text for t in svg.iter() if t.tag.endswith("text")][2:] == [shown, shown]
    assert svg.get("aria-label") == f"CRAN downloads: {shown}"
    assert f'fill="{fill}"'.encode() in response.body


# -- errors -------------------------------------------------------------------------------------


def test_an_error_status_stops_the_client_with_httrs_message(rlib: Path, server: Server) -> None:
    got = run_r(
        rlib,
        server,
        """
        caught <- function(expr) tryCatch({ expr; "no error" }, error = function(e) conditionMessage(e))
        answer(list(
          r = caught(cran_downloads("R")),
          reversed = caught(cran_downloads("Rcpp", from = "2014-05-06", to = "2014-05-04")),
          after_the_last_day = caught(cran_downloads("Rcpp", from = "2014-05-07"))
        ))
        """,
    )
    assert "Not Found (HTTP 404)" in got["r"]
    assert "Bad Request (HTTP 400)" in got["reversed"]
    assert "Bad Request (HTTP 400)" in got["after_the_last_day"]  # 2014-05-07:last-day ends before it starts


def test_the_clients_offline_tests_pass_as_they_are(rlib: Path, server: Server) -> None:
    tests = rlib.parent / "src" / "cranlogs" / "tests" / "testthat"
    got = run_r(
        rlib,
        server,
        f"""
        results <- as.data.frame(testthat::test_dir("{tests}", filter = "badge|check_date", package = "cranlogs",
          load_package = "installed", reporter = "silent", stop_on_failure = FALSE))
        answer(results[, c("file", "test", "nb", "failed", "skipped", "error")])
        """,
    )
    assert {row["file"] for row in got} == {"test-badge.R", "test-check_date.R"}
    assert len(got) == 4
    for row in got:
        assert row["nb"] > 0 and row["failed"] == 0 and not row["skipped"] and not row["error"], row

"""The real client: the `cranlogs` R package (../shared/clients) against a server, as R users run it.

The package is installed from its tarball into a library of this test run (`R CMD INSTALL -l`,
no network) and pointed at the server through its namespace's ``daily_url`` and ``top_url``,
as ../shared/clients/README.md says. The server holds the sample day and a second day made
from it (every third row, dated 2014-05-06), both posted over HTTP by tiny.replay; every
number the client returns is compared with a count made here (tests.support.package_counts).
Needs Debian's r-base-core, r-cran-httr, r-cran-jsonlite and r-cran-testthat (`make sysdeps`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from collections import Counter
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, SAMPLE_DAY, Server, package_counts, second_day_csv
from tiny.replay import Options, replay

CLIENT = ROOT.parent / "shared" / "clients" / "cranlogs_2.1.1.9000.tar.gz"
RSCRIPT = shutil.which("Rscript")
DAY, SECOND = "2014-05-04", "2014-05-06"
pytestmark = [
    pytest.mark.skipif(RSCRIPT is None, reason="R is not installed (`make sysdeps` installs r-base-core and friends)"),
    pytest.mark.skipif(not CLIENT.exists(), reason=f"the client is not at {CLIENT}"),
    pytest.mark.timeout(300),
]


@pytest.fixture(scope="module")
def truth() -> dict[str, Counter[str]]:
    return package_counts()


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
        yield running


def run_r(rlib: Path, server: Server, code: str) -> Any:
    """``code`` in Rscript with the client pointed at ``server``; the JSON it prints, parsed."""
    base = f"http://127.0.0.1:{server.port}/"
    script = f"""
.libPaths(c("{rlib}", .libPaths()))
suppressPackageStartupMessages(library(cranlogs))
assignInNamespace("daily_url", paste0("{base}", "downloads/daily/"), "cranlogs")
assignInNamespace("top_url", paste0("{base}", "top/"), "cranlogs")
answer <- function(x) cat(jsonlite::toJSON(x, dataframe = "rows", Date = "ISO8601", digits = NA, auto_unbox = TRUE))
{code}
"""
    done = subprocess.run([str(RSCRIPT), "-e", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def days(first: str, last: str) -> list[str]:
    start, end = date.fromisoformat(first), date.fromisoformat(last)
    return [(start + timedelta(days=n)).isoformat() for n in range((end - start).days + 1)]


def test_cran_downloads_of_several_packages_over_a_range_with_empty_days(
    rlib: Path, server: Server, truth: dict[str, Counter[str]]
) -> None:
    packages = ["ggplot2", "data.table", "Rcpp", "nosuchpackage"]
    names = ", ".join(f'"{name}"' for name in packages)
    got = run_r(rlib, server, f'answer(cran_downloads(c({names}), from = "2014-05-02", to = "2014-05-07"))')
    expected = [
        {"date": day, "count": truth.get(day, Counter())[package], "package": package}
        for package in packages
        for day in days("2014-05-02", "2014-05-07")
    ]
    assert got == expected
    assert sum(row["count"] for row in got if row["package"] == "Rcpp") > 0


def test_cran_downloads_of_all_packages(rlib: Path, server: Server, truth: dict[str, Counter[str]]) -> None:
    got = run_r(rlib, server, 'answer(cran_downloads(from = "2014-05-04", to = "2014-05-06"))')
    assert got == [
        {"date": DAY, "count": sum(truth[DAY].values())},
        {"date": "2014-05-05", "count": 0},
        {"date": SECOND, "count": sum(truth[SECOND].values())},
    ]


def test_cran_downloads_of_the_last_week(rlib: Path, server: Server, truth: dict[str, Counter[str]]) -> None:
    got = run_r(rlib, server, 'answer(cran_downloads("Rcpp", when = "last-week"))')
    assert [row["date"] for row in got] == days("2014-04-30", SECOND)  # the week ending on the last day with data
    assert {row["date"]: row["count"] for row in got if row["count"]} == {
        DAY: truth[DAY]["Rcpp"],
        SECOND: truth[SECOND]["Rcpp"],
    }


def test_cran_top_downloads(rlib: Path, server: Server, truth: dict[str, Counter[str]]) -> None:
    got = run_r(rlib, server, 'answer(cran_top_downloads("last-week", 20))')
    both = truth[DAY] + truth[SECOND]
    ranked = sorted(both.items(), key=lambda kv: (-kv[1], kv[0]))[:20]
    assert got == [
        {"rank": rank, "package": name, "count": count, "from": "2014-04-30", "to": SECOND}
        for rank, (name, count) in enumerate(ranked, start=1)
    ]
    last_day = run_r(rlib, server, 'answer(cran_top_downloads("last-day", 5))')
    assert [row["count"] for row in last_day] == sorted(truth[SECOND].values(), reverse=True)[:5]


def test_an_error_status_stops_the_client_with_httrs_message(rlib: Path, server: Server) -> None:
    got = run_r(
        rlib,
        server,
        """
        caught <- function(expr) tryCatch({ expr; "no error" }, error = function(e) conditionMessage(e))
        answer(list(
          r = caught(cran_downloads("R")),
          reversed = caught(cran_downloads("Rcpp", from = "2014-05-06", to = "2014-05-04"))
        ))
        """,
    )
    assert "Not Found (HTTP 404)" in got["r"]
    assert "Bad Request (HTTP 400)" in got["reversed"]


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

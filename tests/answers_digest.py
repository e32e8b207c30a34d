"""Every read API's answer on the real day, as digests: to hold two trees' answers equal byte for byte.

Usage:
    python tests/answers_digest.py TREE OUT.json   # TREE: a checkout (its app.py serves)
    python tests/answers_digest.py --compare A.json B.json

Serves the sample day (tiny.testing.SAMPLE_DAY, 2014-05-04) and a second day made of every
third of its rows (2014-05-06) from ``TREE/app.py`` with ``--public-downloads``, asks every
query of the dashboard's API and of the CRAN downloads API (summaries, whales, charts, one
whale's downloads, totals, daily, top, trending, monthly totals, badges), and writes each
answer's status, content type, length and SHA-256. ``--compare`` lists the answers that
differ and exits 1 if any does. A refactoring keeps every answer: run it on the tree before
(``git archive main | tar -x -C /tmp/before``, with the codec's .so copied in) and after.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import second_day_csv
from tiny.testing import Server, sample_csv

DAYS = ("2014-05-04", "2014-05-06")
_PACKAGES = "Rcpp,ggplot2,plyr,NOSUCHPKG"


def paths(biggest: dict[str, int]) -> list[str]:
    """The queries asked, ``biggest`` being each day's biggest whale's ip_id."""
    asked = ["/api/days", "/api/days?limit=1", "/api/days?after=2014-05-04"]
    for day in DAYS:
        for top in ("", "?top=1", "?top=6", "?top=100"):
            asked += [
                f"/api/days/{day}/summary{top}",
                f"/api/days/{day}/whales{top}",
                f"/api/days/{day}/whales/hourly{top}",
            ]
            asked += [f"/api/days/{day}/charts/{view}.svg{top}" for view in ("traffic", "whales", "hourly", "detail")]
        asked += [
            f"/api/days/{day}/whales/{biggest[day]}/downloads",
            f"/api/days/{day}/whales/{biggest[day]}/downloads?limit=5",
        ]
        asked += [f"/api/days/{day}/charts/detail.svg?ip_id={biggest[day]}"]
    for period in ("last-day", "last-week", "last-month", "2014-05-04", "2014-05-01:2014-05-06", "2014-05-04:last-day"):
        asked += [f"/downloads/total/{period}", f"/downloads/daily/{period}"]
        asked += [f"/downloads/total/{period}/{_PACKAGES}", f"/downloads/daily/{period}/{_PACKAGES}"]
        asked += [f"/top/{period}", f"/top/{period}/3", f"/top/{period}/500"]
    asked += ["/downloads/monthly-totals", "/trending"]
    for badge in ("Rcpp", "last-day/Rcpp", "last-week/ggplot2", "grand-total/plyr", "last-month/Rcpp?color=blue"):
        asked.append(f"/badges/{badge}")
    return asked


def digests(tree: Path) -> dict[str, list[object]]:
    """``{path: [status, content type, length, sha256]}`` of every query, served by ``tree``."""
    with tempfile.TemporaryDirectory(prefix="answers-") as scratch:
        data = Path(scratch) / "data"
        data.mkdir()
        (data / f"{DAYS[0]}.csv").write_bytes(sample_csv())
        (data / f"{DAYS[1]}.csv").write_bytes(second_day_csv())
        with Server(data, "--public-downloads", script=tree / "app.py") as server:
            biggest = {
                day: server.request("GET", f"/api/days/{day}/whales?top=1").json()["whales"][0]["ip_id"] for day in DAYS
            }
            found: dict[str, list[object]] = {}
            for path in paths(biggest):
                response = server.request("GET", path, timeout=60)
                body = response.body
                found[path] = [
                    response.status,
                    response.headers.get("content-type"),
                    len(body),
                    hashlib.sha256(body).hexdigest(),
                ]
            return found


def main(argv: list[str]) -> int:
    if argv[:1] == ["--compare"]:
        before, after = (json.loads(Path(name).read_text()) for name in argv[1:3])
        differ = sorted(path for path in before.keys() | after.keys() if before.get(path) != after.get(path))
        for path in differ:
            print(f"differs: {path}: {before.get(path)} != {after.get(path)}")
        print(f"{len(before.keys() & after.keys()) - len(differ)} of {len(before)} answers the same byte for byte")
        return 1 if differ else 0
    tree, out = Path(argv[0]).resolve(), Path(argv[1])
    out.write_text(json.dumps(digests(tree), indent=1, sort_keys=True) + "\n")
    print(f"{out}: {len(json.loads(out.read_text()))} answers")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The analytics API (tiny.handlers.analytics): every endpoint and error, against a real server and real day files.

The server holds the sample day (2014-05-04, 77,107 rows, written straight into its data
dir); every number is checked against an independent count of the same file with
collections.Counter over tiny.cranlog.iter_records. It runs in this process
(tiny.testing.InProcessServer: its app, HTTP server and analytics pool as a worker builds
them, over real sockets and files); a test where processes are the point (a worker's memory,
its pool killed or stopped, a SIGTERM, two workers, the CPU quota of their pools) starts the
server in processes of its own (tiny.testing.Server).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.support import SAMPLE_DAY, Response, Server, record, sample_csv, wait_for
from tiny.analytics import cpu
from tiny.analytics.names import whale_name
from tiny.analytics.service import Analytics, Busy
from tiny.cranlog import iter_records
from tiny.layout import HEADER
from tiny.testing import InProcessServer, memory

DAY = "2014-05-04"
TOKEN = "api-s3cret"
pytestmark = pytest.mark.timeout(120)
Served = Server | InProcessServer


@dataclass
class Truth:
    """The sample day, counted in this process by tiny.cranlog.iter_records, apart from the server."""

    rows: int = 0
    bytes: int = 0
    per_ip: Counter[int] = field(default_factory=Counter)
    bytes_per_ip: Counter[int] = field(default_factory=Counter)
    hourly: Counter[int] = field(default_factory=Counter)
    ip_hourly: Counter[tuple[int, int]] = field(default_factory=Counter)
    countries: dict[int, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    downloads: dict[int, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))

    def ranked(self, top: int) -> list[int]:
        """ip_ids by downloads, most first, ties by smaller ip_id."""
        return [ip for ip, _ in sorted(self.per_ip.items(), key=lambda kv: (-kv[1], kv[0]))[:top]]

    def country(self, ip: int) -> str | None:
        seen = self.countries[ip]
        if not seen:
            return None
        return min(seen, key=lambda c: (-seen[c], c))

    def timeline(self, ip: int) -> list[dict[str, Any]]:
        """The ip's downloads sorted by time; Python's sort is stable, so file order within a second."""
        return sorted(self.downloads[ip], key=lambda d: d["time"])


@pytest.fixture(scope="module")
def truth() -> Truth:
    counted = Truth()
    for rec in iter_records(SAMPLE_DAY):
        ip, hour = rec["ip_id"], int(rec["time"][:2])
        counted.rows += 1
        counted.bytes += rec["size"]
        counted.per_ip[ip] += 1
        counted.bytes_per_ip[ip] += rec["size"]
        counted.hourly[hour] += 1
        counted.ip_hourly[ip, hour] += 1
        if rec["country"] is not None:
            counted.countries[ip][rec["country"]] += 1
        counted.downloads[ip].append({k: rec[k] for k in ("time", "package", "version", "size")})
    return counted


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    data = tmp_path_factory.mktemp("api") / "data"
    data.mkdir()
    (data / f"{DAY}.csv").write_bytes(sample_csv())
    with InProcessServer(data) as running:
        yield running


@pytest.fixture(scope="module")
def processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The sample day served by a server in processes of its own (its pool's to kill)."""
    data = tmp_path_factory.mktemp("api-processes") / "data"
    data.mkdir()
    (data / f"{DAY}.csv").write_bytes(sample_csv())
    with Server(data) as running:
        yield running


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    data = tmp_path_factory.mktemp("api-token") / "data"
    data.mkdir()
    (data / "2014-05-09.csv").write_bytes(HEADER + _row(ip_id=5))
    with InProcessServer(data, env={"TINY_TOKEN": TOKEN}) as running:
        yield running


def _row(ip_id: int, time: str = "10:00:00", package: str = "caret", country: str = "MX") -> bytes:
    return f'"2014-05-09","{time}",100,NA,NA,NA,"{package}","1.0","{country}",{ip_id}\n'.encode()


def get(server: Served, path: str, headers: dict[str, str] | None = None) -> Response:
    return server.request("GET", path, headers=headers)


def ok(server: Served, path: str) -> Any:
    response = get(server, path)
    assert response.status == 200, (path, response.body[:300])
    assert response.headers["content-type"] == "application/json; charset=utf-8"
    return response.json()


def error(response: Response) -> tuple[int, str]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"status", "message"}
    assert body["error"]["status"] == response.status
    return body["error"]["status"], body["error"]["message"]


def ids_in_svg(svg: bytes, prefix: str) -> list[str]:
    root = ET.fromstring(svg)
    return [el.get("id", "") for el in root.iter() if el.get("id", "").startswith(prefix)]


def test_days_lists_day_files_with_row_counts(server: InProcessServer, truth: Truth) -> None:
    body = ok(server, "/api/days")
    assert body == {"days": [{"date": DAY, "rows": truth.rows, "bytes": len(sample_csv())}], "next": None}
    assert truth.rows == 77_107


def test_summary_totals_and_hourly_all_vs_whales(server: InProcessServer, truth: Truth) -> None:
    for top in (1, 6, 100):
        body = ok(server, f"/api/days/{DAY}/summary?top={top}")
        whales = truth.ranked(top)
        assert body["date"] == DAY and body["top"] == top
        assert body["downloads"] == truth.rows
        assert body["bytes"] == truth.bytes
        assert body["downloaders"] == len(truth.per_ip)
        assert body["whale_downloads"] == sum(truth.per_ip[ip] for ip in whales)
        assert body["hourly"] == [
            {"hour": h, "all": truth.hourly[h], "whales": sum(truth.ip_hourly[ip, h] for ip in whales)}
            for h in range(24)
        ]
    assert ok(server, f"/api/days/{DAY}/summary")["top"] == 6


def test_whales_ranked_with_names_countries_and_bytes(server: InProcessServer, truth: Truth) -> None:
    body = ok(server, f"/api/days/{DAY}/whales")
    assert body["date"] == DAY and body["top"] == 6 and len(body["whales"]) == 6
    for top in (6, 25):
        whales = ok(server, f"/api/days/{DAY}/whales?top={top}")["whales"]
        assert [w["ip_id"] for w in whales] == truth.ranked(top)
        for w in whales:
            assert set(w) == {"ip_id", "name", "country", "downloads", "bytes"}
            assert w["downloads"] == truth.per_ip[w["ip_id"]]
            assert w["bytes"] == truth.bytes_per_ip[w["ip_id"]]
            assert w["country"] == truth.country(w["ip_id"])
            assert re.fullmatch(r"[a-z]+_[a-z]+", w["name"])
            assert w["name"] == whale_name(DAY, w["ip_id"])  # same name in the server's processes and here


def test_whale_names_are_stable_across_runs() -> None:
    """Pinned: a name, once shown to people, must not change with a release or a restart."""
    assert whale_name(DAY, 371) == "dazzling_cougar"
    assert whale_name(DAY, 3859) == "daring_turtle"


def test_hourly_per_whale(server: InProcessServer, truth: Truth) -> None:
    body = ok(server, f"/api/days/{DAY}/whales/hourly?top=8")
    assert body["date"] == DAY and body["top"] == 8
    assert [w["ip_id"] for w in body["whales"]] == truth.ranked(8)
    for w in body["whales"]:
        assert w["hourly"] == [truth.ip_hourly[w["ip_id"], h] for h in range(24)]
        assert sum(w["hourly"]) == w["downloads"] == truth.per_ip[w["ip_id"]]
        assert w["name"] == whale_name(DAY, w["ip_id"])


def test_downloads_of_one_whale_in_time_order(server: InProcessServer, truth: Truth) -> None:
    whale = truth.ranked(2)[1]
    body = ok(server, f"/api/days/{DAY}/whales/{whale}/downloads?limit=50")
    expected = truth.timeline(whale)
    assert body["downloads"] == expected[:50]
    assert body["total"] == len(expected) == truth.per_ip[whale]
    assert body["truncated"] is True and body["limit"] == 50
    assert body["bytes"] == truth.bytes_per_ip[whale]
    assert body["packages"] == len({d["package"] for d in expected})
    assert (body["ip_id"], body["name"], body["country"]) == (whale, whale_name(DAY, whale), truth.country(whale))
    default = ok(server, f"/api/days/{DAY}/whales/{whale}/downloads")
    assert default["limit"] == 1000 and default["downloads"] == expected[:1000]


def test_downloads_of_any_ip_id_not_only_whales(server: InProcessServer, truth: Truth) -> None:
    small = next(ip for ip, n in sorted(truth.per_ip.items()) if n == 3)
    body = ok(server, f"/api/days/{DAY}/whales/{small}/downloads?limit=100000")
    assert body["downloads"] == truth.timeline(small) and body["truncated"] is False and body["total"] == 3


def test_chart_traffic_has_24_hours_of_whales_and_others(server: InProcessServer, truth: Truth) -> None:
    response = get(server, f"/api/days/{DAY}/charts/traffic.svg?top=6")
    assert response.status == 200
    assert response.headers["content-type"] == "image/svg+xml"
    assert "default-src 'none'" in response.headers["content-security-policy"]
    assert len(ids_in_svg(response.body, "traffic-whales-")) == 24
    assert len(ids_in_svg(response.body, "traffic-others-")) == 24
    assert b"top 6 whales" in response.body


def test_chart_whales_has_one_bar_per_whale(server: InProcessServer, truth: Truth) -> None:
    for top in (3, 12):
        svg = get(server, f"/api/days/{DAY}/charts/whales.svg?top={top}").body
        assert ids_in_svg(svg, "whale-bar-") == [f"whale-bar-{i}" for i in range(top)]
        for ip in truth.ranked(top):
            assert whale_name(DAY, ip).encode() in svg


def test_chart_hourly_small_multiples_then_heatmap(server: InProcessServer) -> None:
    svg = get(server, f"/api/days/{DAY}/charts/hourly.svg?top=5").body
    assert len(ids_in_svg(svg, "whale-panel-")) == 5
    svg = get(server, f"/api/days/{DAY}/charts/hourly.svg?top=30").body
    assert ids_in_svg(svg, "whale-panel-") == [] and ids_in_svg(svg, "whale-heatmap")


def test_chart_detail_of_a_whale_and_default_to_the_biggest(server: InProcessServer, truth: Truth) -> None:
    whale = truth.ranked(3)[2]
    svg = get(server, f"/api/days/{DAY}/charts/detail.svg?ip_id={whale}").body
    assert f"{whale_name(DAY, whale)} (ip_id {whale})".encode() in svg
    assert f"{truth.per_ip[whale]:,} downloads".encode() in svg
    assert b"<image" in svg  # the rasterized points
    biggest = truth.ranked(1)[0]
    svg = get(server, f"/api/days/{DAY}/charts/detail.svg").body
    assert f"(ip_id {biggest})".encode() in svg


@pytest.mark.parametrize(
    "path",
    [
        "/api/days/2014-5-4/summary",
        "/api/days/2014-02-30/whales",
        "/api/days/0000-01-01/whales",
        "/api/days/yesterday/whales/hourly",
        "/api/days/2014-05-04x/charts/traffic.svg",
        f"/api/days/{DAY}/summary?top=0",
        f"/api/days/{DAY}/whales?top=101",
        f"/api/days/{DAY}/whales?top=abc",
        f"/api/days/{DAY}/whales?top=-1",
        f"/api/days/{DAY}/whales?top=1.5",
        f"/api/days/{DAY}/whales?top=",
        f"/api/days/{DAY}/whales/hourly?top=1000000000000",
        f"/api/days/{DAY}/whales/0/downloads",
        f"/api/days/{DAY}/whales/abc/downloads",
        f"/api/days/{DAY}/whales/371/downloads?limit=0",
        f"/api/days/{DAY}/whales/371/downloads?limit=100001",
        f"/api/days/{DAY}/charts/detail.svg?ip_id=-2",
        f"/api/days/{DAY}/charts/traffic.svg?top=x",
    ],
)
def test_bad_date_or_numbers_are_400(server: InProcessServer, path: str) -> None:
    status, message = error(get(server, path))
    assert status == 400 and message


@pytest.mark.parametrize(
    "path",
    [
        "/api/days/2014-05-05/summary",
        "/api/days/2014-05-05/whales",
        "/api/days/2014-05-05/whales/hourly",
        "/api/days/2014-05-05/whales/371/downloads",
        "/api/days/2014-05-05/charts/traffic.svg",
        f"/api/days/{DAY}/whales/99999999/downloads",
        f"/api/days/{DAY}/charts/detail.svg?ip_id=99999999",
        f"/api/days/{DAY}/charts/pie.svg",
        f"/api/days/{DAY}/whatever",
        "/api/nothing",
    ],
)
def test_unknown_day_ip_or_view_is_404(server: InProcessServer, path: str) -> None:
    status, _ = error(get(server, path))
    assert status == 404


def test_other_methods_are_405(server: InProcessServer) -> None:
    response = server.request("POST", "/api/days", b"{}")
    assert error(response)[0] == 405 and response.headers["allow"] == "GET, HEAD"
    assert error(server.request("DELETE", f"/api/days/{DAY}/whales"))[0] == 405


def test_token_rule_like_ingest(locked: InProcessServer) -> None:
    for path in ("/api/days", "/api/days/2014-05-09/whales", "/api/days/2014-05-09/charts/traffic.svg"):
        response = get(locked, path)
        assert error(response) == (401, "missing or wrong bearer token")
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert error(get(locked, path, {"Authorization": "Bearer wrong"}))[0] == 401
        assert get(locked, path, {"Authorization": f"Bearer {TOKEN}"}).status == 200
    page = get(locked, "/")  # the page holds no data; its API calls send the token
    assert page.status == 200 and page.headers["content-type"].startswith("text/html")


def test_dashboard_page_is_self_contained(server: InProcessServer) -> None:
    response = get(server, "/")
    assert response.status == 200 and response.headers["content-type"] == "text/html; charset=utf-8"
    page = response.body.decode()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "no external asset"
    assert "@import" not in page and "url(" not in page
    policy = response.headers["content-security-policy"]
    assert "script-src 'sha256-" in policy and "'unsafe-inline'" not in policy.split("style-src")[0]
    for view in ("traffic", "whales", "hourly", "detail"):
        assert f'id="chart-{view}"' in page


def test_results_follow_the_file_as_it_grows(server: InProcessServer) -> None:
    """Cached per version of the day file: an ingest that appends shows in the next answer."""
    day = "2014-05-06"
    body = b"".join(json.dumps(record(date=day, ip_id=7, time="03:00:00")).encode() + b"\n" for _ in range(3))
    assert server.ingest(body).status == 200
    assert ok(server, f"/api/days/{day}/whales?top=1")["whales"][0]["downloads"] == 3
    assert ok(server, f"/api/days/{day}/whales?top=1")["whales"][0]["downloads"] == 3  # cached
    more = b"".join(json.dumps(record(date=day, ip_id=8, time="05:00:00")).encode() + b"\n" for _ in range(5))
    assert server.ingest(more).status == 200
    whales = ok(server, f"/api/days/{day}/whales?top=2")["whales"]
    assert [(w["ip_id"], w["downloads"]) for w in whales] == [(8, 5), (7, 3)]
    summary = ok(server, f"/api/days/{day}/summary?top=1")
    assert summary["downloads"] == 8 and summary["hourly"][5] == {"hour": 5, "all": 5, "whales": 5}
    assert {"date": day, "rows": 8, "bytes": (server.data_dir / f"{day}.csv").stat().st_size} in ok(
        server, "/api/days"
    )["days"]
    svg = get(server, f"/api/days/{day}/charts/whales.svg?top=2").body
    assert len(ids_in_svg(svg, "whale-bar-")) == 2


def test_a_row_being_written_is_not_counted_until_complete(server: InProcessServer) -> None:
    path = server.data_dir / "2014-05-07.csv"
    path.write_bytes(HEADER + _row(1) + _row(2) + _row(3)[:20])  # a writer in the middle of a row
    assert {"date": "2014-05-07", "rows": 2, "bytes": path.stat().st_size} in ok(server, "/api/days")["days"]
    assert ok(server, "/api/days/2014-05-07/summary")["downloads"] == 2
    with path.open("ab") as handle:
        handle.write(_row(3)[20:])
    assert ok(server, "/api/days/2014-05-07/summary")["downloads"] == 3
    assert {"date": "2014-05-07", "rows": 3, "bytes": path.stat().st_size} in ok(server, "/api/days")["days"]
    path.write_bytes(HEADER + _row(1) + _row(9, package="x") * 4)  # cut back and written anew (a failed flush)
    assert {"date": "2014-05-07", "rows": 5, "bytes": path.stat().st_size} in ok(server, "/api/days")["days"]


@pytest.mark.parametrize("day, odd", [("2014-05-08", "NA"), ("2014-05-11", 'a,"b"')])
def test_quoted_na_is_a_string_and_bare_na_is_missing(server: InProcessServer, day: str, odd: str) -> None:
    """Namibia's country code is "NA", a bare NA is a missing value; also when a string holds a comma
    (2014-05-11: a quoted comma, which a split on commas would take for a field's end)."""
    path = server.data_dir / f"{day}.csv"
    quoted = '"' + odd.replace('"', '""') + '"'
    rows = [_row(1, country="NA"), _row(1, country="NA"), _row(2).replace(b'"caret"', quoted.encode())]
    path.write_bytes(HEADER + b"".join(rows) + b'"2014-05-08","11:00:00",5,NA,NA,NA,NA,NA,NA,3\n')
    whales = {w["ip_id"]: w for w in ok(server, f"/api/days/{day}/whales?top=3")["whales"]}
    assert whales[1]["country"] == "NA" and whales[3]["country"] is None
    downloads = ok(server, f"/api/days/{day}/whales/2/downloads")["downloads"]
    assert downloads == [{"time": "10:00:00", "package": odd, "version": "1.0", "size": 100}]
    assert ok(server, f"/api/days/{day}/whales/3/downloads")["downloads"][0]["package"] is None


def test_ingest_does_not_wait_for_analytics(tmp_path: Path) -> None:
    """Four days never counted, each of four times the sample day's 77,107 rows, asked for at once: their
    folds queue in the pool (seconds of work within the quota; a query not answered within
    10 s of its arrival gets its 503 "catching up"); /ingest answers meanwhile."""
    days = [f"2014-04-{n:02d}" for n in range(1, 5)]
    (tmp_path / "data").mkdir()
    rows = sample_csv().split(b"\n", 1)[1]
    for day in days:
        # four times the sample day's rows a day: one copy each was counted within 0.5 s on a fast machine
        (tmp_path / "data" / f"{day}.csv").write_bytes(sample_csv() + 3 * rows)
    with InProcessServer(tmp_path / "data") as server:
        _ingest_beside(server, [f"/api/days/{day}/summary" for day in days])


def _ingest_beside(server: Served, paths: list[str]) -> None:
    latencies: list[float] = []
    with ThreadPoolExecutor(len(paths)) as pool:
        started = time.monotonic()
        # idle-priority work: on a busy machine it may wait long for the CPU, which is the point
        reads = [pool.submit(server.request, "GET", path, None, None, 180.0) for path in paths]
        time.sleep(0.2)
        while not all(read.done() for read in reads):
            begin = time.monotonic()
            assert server.ingest(json.dumps(record(date="2014-05-10")).encode()).status == 200
            latencies.append(time.monotonic() - begin)
            time.sleep(0.02)
        busy = time.monotonic() - started
        for read in reads:
            answer = read.result()
            # A read the pool could not serve in time is refused with its reason and a Retry-After
            # ("catching up", or "busy" on a machine too loaded to start it): the point is ingest.
            refused = answer.status == 503 and "retry-after" in answer.headers
            assert answer.status == 200 or (refused and (b"catching up" in answer.body or b"busy" in answer.body)), (
                answer.body
            )
    assert busy > 0.5 and latencies, busy
    assert max(latencies) < 0.5, f"ingest took {max(latencies):.3f} s while analytics ran for {busy:.2f} s"


def _pool_processes(server: Server) -> list[int]:
    """The pids of the server's analytics pool processes (spawned children running spawn_main)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text()
            command = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent in server.worker_pids() and b"spawn_main" in command:
            pids.append(int(proc.name))
    return pids


@pytest.mark.parametrize("path", [f"/api/days/{DAY}/whales?top=2", f"/api/days/{DAY}/whales/1/downloads?limit=2"])
def test_a_killed_pool_process_is_replaced(processes: Server, path: str) -> None:
    """kill -9 of the analytics processes (both lanes): at worst a 503 + Retry-After, never a
    500; then answers again."""
    # Both pools up: an answer, and a row query not made before (a pool killed by an earlier
    # case is replaced on its first use after: that one is a 503).
    for top in range(60, 100):
        get(processes, f"/api/days/{DAY}/summary?top={top}")
        get(processes, f"/api/days/{DAY}/whales/1/downloads?limit={top}")
        if len(_pool_processes(processes)) == 2:
            break
    killed = _pool_processes(processes)
    assert len(killed) == 2  # one per lane
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    statuses = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        _bump(Path(str(processes.data_dir)) / f"{DAY}.csv")  # uncached: it must reach the pool
        response = get(processes, path)
        statuses.append(response.status)
        if response.status == 200:
            break
        assert response.status == 503 and response.headers["retry-after"] == "1", response.body
        time.sleep(0.1)
    assert statuses[-1] == 200, statuses
    assert _pool_processes(processes) and not set(_pool_processes(processes)) & set(killed)


def _bump(path: Path) -> None:
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000))


def _get_quietly(server: Server, path: str) -> None:
    with contextlib.suppress(OSError, http.client.HTTPException):
        get(server, path)


def _busy_pool(running: Server, data: Path) -> threading.Thread:
    """A query whose job keeps the pool busy for seconds (a day never counted), under way."""
    (data / "2014-04-01.csv").write_bytes(sample_csv())
    busy = threading.Thread(target=_get_quietly, args=(running, "/api/days/2014-04-01/summary"))
    busy.start()
    time.sleep(0.3)
    return busy


@pytest.mark.parametrize("whom", ["parent", "group"])
def test_worker_stops_its_pool_on_shutdown(tmp_path: Path, whom: str) -> None:
    """SIGTERM: the worker drains, stops its analytics process (even a busy one) and exits 0
    promptly. Sent to the whole process group (supervisord's stopasgroup, a terminal's hangup),
    it reaches the pool too, which leaves its end to the worker: never "died; starting a new one"."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / f"{DAY}.csv").write_bytes(sample_csv())
    with Server(tmp_path / "data") as running:
        assert ok(running, f"/api/days/{DAY}/whales")
        (pool,) = _pool_processes(running)
        busy = _busy_pool(running, tmp_path / "data")
        started = time.monotonic()
        assert running.proc is not None
        if whom == "group":
            os.killpg(running.proc.pid, signal.SIGTERM)
        assert (running.proc.wait(15) if whom == "group" else running.stop()) == 0
        assert time.monotonic() - started < 5
        busy.join(30)
        # not killed by the test's clean-up: gone by itself
        assert wait_for(lambda: not Path(f"/proc/{pool}").exists(), 5)
    assert "leaked semaphore" not in running.log()  # the pool's queues were released before the exit
    assert "died; starting a new one" not in running.log(), running.log()[-2000:]


def test_days_counts_many_new_files_in_one_job(tmp_path: Path) -> None:
    """40 uncounted day files are one pool job, not 40: /api/days works with a queue limit of 2."""
    (tmp_path / "data").mkdir()
    for n in range(40):
        day = date(2015, 1, 1) + timedelta(days=n)
        (tmp_path / "data" / f"{day}.csv").write_bytes(HEADER + _row(1) * n)
    with InProcessServer(tmp_path / "data", env={"TINY_ANALYTICS_MAX_QUEUED": "2"}) as small:
        days = ok(small, "/api/days")["days"]
    assert [d["rows"] for d in days] == list(range(40))
    assert [d["date"] for d in days] == sorted(d["date"] for d in days)


def test_too_many_queued_queries_are_503(tmp_path: Path) -> None:
    """At most TINY_ANALYTICS_MAX_QUEUED distinct computations queue per worker; the rest get 503."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / f"{DAY}.csv").write_bytes(sample_csv())
    paths = [f"/api/days/{DAY}/charts/whales.svg?top={top}" for top in range(1, 9)]
    barrier = threading.Barrier(len(paths))
    with InProcessServer(tmp_path / "data", env={"TINY_ANALYTICS_MAX_QUEUED": "2"}) as small:

        def fetch(path: str) -> Response:
            barrier.wait()
            return get(small, path)

        with ThreadPoolExecutor(len(paths)) as pool:
            responses = list(pool.map(fetch, paths))
    busy = [r for r in responses if r.status == 503]
    assert {r.status for r in responses} == {200, 503} and busy
    message = error(busy[0])[1]
    assert message.startswith("analytics are busy: ") and "queued" in message and message.endswith("; try again")
    assert busy[0].headers["retry-after"] == "1"


HOSTILE = [
    r"$\bar$",  # broken mathtext: this alone made every chart of its day a 500
    r"$x^2$",  # valid mathtext: drawn as the text itself
    r"\frac{1}{2} % & # _ { } ~ ^ \\",  # TeX specials
    "$",
    "x" * 1024,  # the longest string a record may hold
    "مرحبا بالعالم",  # right to left
    "🐳🐋 whale",  # emoji
]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    """A day whose biggest whales carry hostile countries, packages and versions."""
    with InProcessServer(tmp_path_factory.mktemp("hostile") / "data") as running:
        lines = []
        for n, text in enumerate(HOSTILE):
            for k in range(len(HOSTILE) - n + 1):  # distinct download counts: a fixed ranking
                fields = {"package": text, "version": text, "country": text, "time": f"{n:02d}:{k:02d}:00"}
                lines.append(json.dumps(record(date="2014-06-01", ip_id=n + 1, **fields)).encode())
        assert running.ingest(b"\n".join(lines)).json()["result"]["stats"]["records"]["invalid"] == 0
        yield running


@pytest.mark.hardening("around 1: a chart answered 500 when a label held matplotlib mathtext")
@pytest.mark.parametrize(
    "path",
    [
        "/api/days/2014-06-01/summary",
        "/api/days/2014-06-01/whales?top=10",
        "/api/days/2014-06-01/whales/hourly?top=10",
        *(f"/api/days/2014-06-01/whales/{n + 1}/downloads" for n in range(len(HOSTILE))),
        "/api/days/2014-06-01/charts/traffic.svg?top=10",
        "/api/days/2014-06-01/charts/whales.svg?top=10",
        "/api/days/2014-06-01/charts/hourly.svg?top=10",
        "/api/days/2014-06-01/charts/hourly.svg?top=4",
        *(f"/api/days/2014-06-01/charts/detail.svg?ip_id={n + 1}" for n in range(len(HOSTILE))),
    ],
)
def test_hostile_labels_are_drawn_as_plain_text_in_every_view(hostile: InProcessServer, path: str) -> None:
    response = get(hostile, path)
    assert response.status == 200, (path, response.body[:300])
    if path.endswith(".svg"):
        ET.fromstring(response.body)  # well-formed
    if "whales.svg" in path:
        assert b"($x^2$)" in response.body  # the label as typed, not typeset as x squared


@pytest.mark.hardening("around 5: byte totals wrapped at 2^64")
def test_byte_totals_are_exact_past_2_to_the_64(tmp_path: Path) -> None:
    big = 2**64 - 1
    with InProcessServer(tmp_path / "data") as running:
        body = b"\n".join(json.dumps(record(date="2014-06-02", size=big, ip_id=7)).encode() for _ in range(3))
        assert running.ingest(body).status == 200
        summary = ok(running, "/api/days/2014-06-02/summary")
        whales = ok(running, "/api/days/2014-06-02/whales")["whales"]
        downloads = ok(running, "/api/days/2014-06-02/whales/7/downloads")
    assert summary["bytes"] == whales[0]["bytes"] == downloads["bytes"] == 3 * big


@pytest.mark.hardening("around 2: the analytics cache was bounded by entry count, not bytes")
def test_the_analytics_cache_is_bounded_in_bytes(tmp_path: Path, truth: Truth, figures: dict[str, Any]) -> None:
    """64 distinct big downloads answers of the sample day's biggest whale: the worker keeps at
    most its share of --analytics-cache-bytes of them (a cache bounded by entry count would keep
    every one, as Python objects, ~10x its JSON)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / f"{DAY}.csv").write_bytes(sample_csv())
    whale = truth.ranked(1)[0]
    with Server(tmp_path / "data", "--analytics-cache-bytes", "4MiB") as running:
        ok(running, f"/api/days/{DAY}/whales/{whale}/downloads")
        worker = running.worker_pid()
        before = memory(worker)
        sizes = [
            len(get(running, f"/api/days/{DAY}/whales/{whale}/downloads?limit={100_000 - i}").body) for i in range(64)
        ]
        grown = memory(worker) - before
    figures.update(
        case="64 distinct downloads answers of the biggest whale, cache 4 MiB",
        answer_bytes=sizes[0],
        answers_bytes_total=sum(sizes),
        worker_rss_growth_mb=round(grown / 1e6, 1),
    )
    assert sum(sizes) > 20 * 4 * 1024**2 / 10  # the answers together are far more than the cache
    assert grown < 40 * 1024**2, f"the worker grew by {grown / 1e6:.0f} MB"


@pytest.mark.hardening("around 3: /api/days blocked the event loop when there were many day files")
def test_days_are_listed_page_by_page_off_the_event_loop(tmp_path: Path, figures: dict[str, Any]) -> None:
    """15,000 day files: /api/days pages through them, and /healthz answers meanwhile."""
    data = tmp_path / "data"
    data.mkdir()
    first = date(1980, 1, 1)
    for n in range(15_000):
        (data / f"{first + timedelta(days=n)}.csv").write_bytes(HEADER + _row(1) * (n % 3))
    with InProcessServer(data) as running:
        pages, latencies, seen = 0, [], []
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                started = time.monotonic()
                assert get(running, "/healthz").status == 200
                latencies.append(time.monotonic() - started)
                time.sleep(0.005)

        poller = threading.Thread(target=poll)
        poller.start()
        try:
            after = ""
            while True:
                page = ok(running, "/api/days?limit=1000" + (f"&after={after}" if after else ""))
                pages += 1
                seen += page["days"]
                if page["next"] is None:
                    break
                after = page["next"]
        finally:
            stop.set()
            poller.join(10)
        assert error(get(running, "/api/days?limit=1001"))[0] == 400
        assert error(get(running, "/api/days?after=1980-02-30"))[0] == 400
    figures.update(case="/api/days over 15,000 day files", pages=pages, healthz_max_ms=round(max(latencies) * 1000, 1))
    assert pages == 15 and len(seen) == 15_000
    assert [d["date"] for d in seen] == sorted(d["date"] for d in seen)
    assert [d["rows"] for d in seen] == [n % 3 for n in range(15_000)]
    # A listing on the event loop would hold most /healthz answers behind the pages; one answer
    # slow on a machine busy with other tests (0.30 s seen, once) is the machine, not the loop.
    slow = [round(latency, 2) for latency in latencies if latency >= 0.3]
    assert len(latencies) >= 20 and len(slow) <= 1, f"/healthz waited behind /api/days: {slow}"
    assert sorted(latencies)[len(latencies) * 9 // 10] < 0.1, sorted(latencies)[-10:]


def test_a_query_reading_a_second_days_rows_at_once_is_503_saying_so(tmp_path: Path, truth: Truth) -> None:
    """The rows of one day file at a time per worker: a query of another day is refused at
    once, and says why; queries of the day being read share its rows and are answered."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / f"{DAY}.csv").write_bytes(sample_csv())
    (tmp_path / "data" / "2014-05-05.csv").write_bytes(sample_csv())
    first, second = truth.ranked(2)
    paths = [
        f"/api/days/{DAY}/whales/{first}/downloads",
        f"/api/days/{DAY}/charts/detail.svg?ip_id={second}",
        f"/api/days/2014-05-05/whales/{first}/downloads",
    ]
    with Server(tmp_path / "data") as running:  # its pool within the CPU quota: a read takes long enough
        barrier = threading.Barrier(len(paths))

        def fetch(path: str) -> Response:
            barrier.wait()
            if "05-05" in path:
                time.sleep(0.2)  # the other two are in first
            return get(running, path)

        with ThreadPoolExecutor(len(paths)) as pool:
            responses = list(pool.map(fetch, paths))
    assert [r.status for r in responses] == [200, 200, 503]
    assert "a query reading another day's rows is running in this process (at most 1 at once" in error(responses[2])[1]


_needs_cgroup_v1 = pytest.mark.skipif(
    not os.access("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", os.W_OK)
    or not Path("/proc/self/cgroup").read_text().count(":cpu:/\n"),
    reason="needs a writable cgroup v1 cpu controller with this test in its root group (this machine kind has one)",
)


def _cpu_group_of(pid: int) -> str:
    """The cgroup v1 cpu group of ``pid`` ("/" for the root group)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    return "/"


@_needs_cgroup_v1
def test_the_analytics_processes_of_all_workers_share_one_cpu_quota(tmp_path: Path) -> None:
    """One quota for the server's pools; within it the answers lane first, row reads idle."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / f"{DAY}.csv").write_bytes(sample_csv())
    with Server(tmp_path / "data", "--analytics-cpu", "0.3", processes=2) as running:
        for _ in range(8):  # both workers start both lanes
            ok(running, f"/api/days/{DAY}/summary?top={random.randint(1, 100)}")
            assert get(running, f"/api/days/{DAY}/charts/traffic.svg?top={random.randint(1, 100)}").status == 200
            assert get(running, f"/api/days/{DAY}/whales/1/downloads?limit={random.randint(1, 100)}").status == 200
        pools = _pool_processes(running)
        groups = {_cpu_group_of(pid) for pid in pools}
        workers = {_cpu_group_of(pid) for pid in running.worker_pids()}
        policies = {os.sched_getscheduler(pid) for pid in pools}
        root = Path("/sys/fs/cgroup/cpu")
        (parent,) = {group.rsplit("/", 1)[0] for group in groups}
        quota = int((root / parent.lstrip("/") / "cpu.cfs_quota_us").read_text())
        idle = {g.rsplit("/", 1)[1]: (root / g.lstrip("/") / "cpu.idle").read_text().strip() for g in groups}
        assert "analytics CPU: cgroup v1" in running.log()
    assert len(pools) == 4  # 2 workers x 2 lanes
    assert policies == {os.SCHED_IDLE}
    assert parent.startswith("/tiny-analytics-") and quota == 30_000
    assert idle == {"answers": "0", "rows": "1"}
    assert workers == {"/"}  # the workers that serve /ingest are not limited
    assert not (root / parent.lstrip("/")).exists()  # removed when the server stopped


def test_a_pool_process_imports_none_of_the_servers_modules_with_the_main_script() -> None:
    """A spawned pool process runs the __main__ script again as __mp_main__: app.py and the
    console script (which imports tiny.main) leave the server's modules to main()."""
    root = Path(__file__).resolve().parents[1]
    probe = (
        "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__mp_main__'); import tiny.main; "
        "print(sorted(m for m in ('tornado', 'tiny.prefork', 'tiny.config', 'prometheus_client') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe, str(root / "app.py")], capture_output=True, text=True, cwd=root)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@_needs_cgroup_v1
def test_a_pool_process_is_confined_before_its_interpreter_has_started() -> None:
    """Its start-up (re-importing the worker's modules, ~0.2 CPU-s) runs within the quota, at SCHED_IDLE.
    Three processes: on a busy machine the one read right after its start may have had 30 ms of
    CPU before the test reads it (the bare interpreter's start); a confinement made only once the
    process had started would show more in every one."""
    group = Path("/sys/fs/cgroup/cpu") / f"tiny-test-confine-{os.getpid()}"
    (group / "answers").mkdir(parents=True)
    try:
        ticks = []
        for _ in range(3):
            # Alive while it is read: an exited task of cgroup v1 reads as the root group.
            process = cpu.ConfinedContext(group, "answers", "idle").Process(target=time.sleep, args=(0.5,))
            process.start()
            assert process.pid is not None
            stat = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks.append(int(stat[11]) + int(stat[12]))  # utime + stime in ticks
            assert _cpu_group_of(process.pid) == f"/{group.name}/answers"
            assert os.sched_getscheduler(process.pid) == os.SCHED_IDLE
            assert os.getpriority(os.PRIO_PROCESS, process.pid) == 19
            process.join(30)
            assert process.exitcode == 0
        assert min(ticks) <= 2, ticks  # still starting
    finally:
        for path in (group / "answers", group):
            with contextlib.suppress(OSError):
                path.rmdir()


@_needs_cgroup_v1
def test_a_killed_servers_cpu_group_is_removed_by_the_next_start(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that is no process now
    stale = Path("/sys/fs/cgroup/cpu") / f"tiny-analytics-{gone.pid}"
    lanes = ("answers", "rows", "drawing")  # "drawing": the lane's name before this version
    for lane in lanes:
        (stale / lane).mkdir(parents=True)
    try:
        with Server(tmp_path / "data"):
            assert not stale.exists()
    finally:
        for path in (*(stale / lane for lane in lanes), stale):
            with contextlib.suppress(OSError):
                path.rmdir()


def test_the_dashboard_reads_its_writes_from_any_process(tmp_path: Path) -> None:
    """Two workers: each answer given after a POST's 200 counts that POST's rows."""
    day = "2014-05-12"
    with Server(tmp_path / "data", processes=2) as running:
        expected = 0
        for n in range(1, 13):
            body = b"\n".join(json.dumps(record(date=day, ip_id=n % 3 + 1)).encode() for _ in range(n))
            assert running.ingest(body).status == 200
            expected += n
            assert ok(running, f"/api/days/{day}/summary?top=3")["downloads"] == expected
            whales = ok(running, f"/api/days/{day}/whales?top=3")["whales"]
            assert sum(w["downloads"] for w in whales) == expected
        assert len({get(running, "/healthz").json()["instance"] for _ in range(40)}) == 2


def test_an_answer_is_kept_while_other_days_are_written(tmp_path: Path) -> None:
    """Answers are versioned by the files they read: with the pool process stopped, a day's
    cached summary is still answered after rows landed in another day."""
    with InProcessServer(tmp_path / "data") as running:
        for day in ("2014-05-20", "2014-05-21"):
            assert running.ingest(json.dumps(record(date=day)).encode()).status == 200
        assert ok(running, "/api/days/2014-05-20/summary")["downloads"] == 1
        analytics = running.deps.analytics
        pool = running.call(lambda: analytics.call("test: its pid", os.getpid))  # the one answers process
        os.kill(pool, signal.SIGSTOP)
        try:
            assert running.ingest(json.dumps(record(date="2014-05-21")).encode()).status == 200
            response = running.request("GET", "/api/days/2014-05-20/summary", timeout=5)
            assert response.status == 200 and response.json()["downloads"] == 1
        finally:
            os.kill(pool, signal.SIGCONT)
        assert ok(running, "/api/days/2014-05-21/summary")["downloads"] == 2


def test_a_smaller_top_after_a_larger_one_is_its_prefix_until_the_day_changes(tmp_path: Path) -> None:
    """A pool process computes a day's aggregate once per version of the day for every top up
    to the one asked: a smaller top is the larger one's first whales, and a new row is seen."""
    with InProcessServer(tmp_path / "data") as running:
        body = b"\n".join(json.dumps(record(date="2014-06-03", ip_id=n % 7 + 1)).encode() for n in range(40))
        assert running.ingest(body).status == 200
        many = ok(running, "/api/days/2014-06-03/whales?top=100")["whales"]
        assert len(many) == 7 and ok(running, "/api/days/2014-06-03/whales?top=2")["whales"] == many[:2]
        more = b"\n".join(json.dumps(record(date="2014-06-03", ip_id=99)).encode() for _ in range(50))
        assert running.ingest(more).status == 200
        whales = ok(running, "/api/days/2014-06-03/whales?top=2")["whales"]
        assert whales[0]["ip_id"] == 99 and whales[0]["downloads"] == 50 and whales[1] == many[0]
        assert ok(running, "/api/days/2014-06-03/summary?top=1")["downloads"] == 90


# -- the pool's time bound and its end with its worker ---------------------------------------------


@pytest.mark.hardening("third 12: a day file that is a FIFO blocked the analytics pool for good")
def test_a_day_file_that_is_a_fifo_is_refused_at_once_and_blocks_nothing(tmp_path: Path) -> None:
    """A FIFO named as a day file: every query that would read it gets a 503 naming it at once
    (the pool never opens it for reading), and the other days are answered meanwhile and after."""
    data = tmp_path / "data"
    data.mkdir()
    (data / f"{DAY}.csv").write_bytes(HEADER + _row(ip_id=5).replace(b"2014-05-09", DAY.encode()))
    fifo = data / "2014-05-10.csv"
    os.mkfifo(fifo)
    paths = [
        "/api/days/2014-05-10/summary",
        "/api/days",
        "/api/days/2014-05-10/whales/1/downloads",
        "/downloads/total/2014-05-10/caret",
        "/downloads/total/2014-05-01:2014-05-31",
    ]
    with InProcessServer(data, "--public-downloads") as server:
        assert ok(server, f"/api/days/{DAY}/summary")["downloads"] == 1  # the pool has started
        for path in paths:
            started = time.monotonic()
            response = server.request("GET", path, timeout=15)
            assert time.monotonic() - started < 5, path
            assert response.status == 503 and response.headers["retry-after"], (path, response.body)
            assert "2014-05-10.csv is not a regular file but a FIFO" in error(response)[1], path
        assert ok(server, f"/api/days/{DAY}/summary")["downloads"] == 1
        fifo.unlink()
        assert ok(server, "/api/days")["days"] == [
            {"date": DAY, "rows": 1, "bytes": (data / f"{DAY}.csv").stat().st_size}
        ]


async def _stuck_job(analytics: Analytics) -> dict[str, Any]:
    """A query whose pool process is stopped in its job, and one waiting behind it: what each
    got and how long that took, /healthz's reason meanwhile, and the pids of the old and new pool."""
    pid = await analytics.call(("pid",), os.getpid)
    stuck = asyncio.ensure_future(analytics.call(("nap",), time.sleep, 1.0, what="a nap"))
    await asyncio.sleep(0.3)  # the nap is running
    os.kill(pid, signal.SIGSTOP)
    behind = asyncio.ensure_future(analytics.call(("pid", 2), os.getpid))
    started = time.monotonic()
    outcomes = await asyncio.wait_for(asyncio.gather(stuck, behind, return_exceptions=True), 30)
    took = time.monotonic() - started
    trouble = analytics.trouble()
    return {
        "pid": pid,
        "outcomes": outcomes,
        "took": took,
        "trouble": trouble,
        "new": await analytics.call(("pid", 3), os.getpid),
    }


@pytest.mark.hardening("third 12: analytics pool jobs had no time bound")
def test_a_stuck_pool_process_is_killed_and_the_queries_waiting_on_it_get_503_naming_it(tmp_path: Path) -> None:
    analytics = Analytics(tmp_path, processes=1, job_seconds=2.0)
    try:
        found = asyncio.run(_stuck_job(analytics))
    finally:
        analytics.close()
    for outcome in found["outcomes"]:
        assert isinstance(outcome, Busy), outcome
        assert "an analytics job (a nap) ran past its 2 s deadline" in str(outcome)
    assert found["took"] < 2.0 + 0.3 + 1.5
    assert "a nap" in found["trouble"] and "killed and replaced" in found["trouble"]
    assert found["new"] != found["pid"]
    deadline = time.monotonic() + 5
    while Path(f"/proc/{found['pid']}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{found['pid']}").exists()  # killed though stopped, and reaped


@pytest.mark.hardening("third 16: a stopped pool process outlived its server killed with -9")
def test_a_stopped_pool_process_dies_with_its_server_killed_with_9(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / f"{DAY}.csv").write_bytes(HEADER + _row(ip_id=5).replace(b"2014-05-09", DAY.encode()))
    with Server(tmp_path / "data") as server:
        ok(server, f"/api/days/{DAY}/summary")
        (pool,) = _pool_processes(server)
        os.kill(pool, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 5
            while _state(pool) != "T" and time.monotonic() < deadline:
                time.sleep(0.01)
            assert _state(pool) == "T"  # stopped
            for pid in (*server.worker_pids(), server.pid):  # the server, not its session: not the pool
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while _alive(pool) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not _alive(pool)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pool, signal.SIGKILL)


def _state(pid: int) -> str:
    """The process's state letter (R, S, T for stopped, Z...), or "" when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs or is stopped (a zombie waiting to be reaped is dead)."""
    return _state(pid) not in ("", "Z", "X")


def test_a_day_still_being_counted_is_a_503_whose_body_says_what_is_left(tmp_path: Path) -> None:
    """The sample day never counted and no time to count it (the worker's fold bound at 0 s):
    the 503 carries what is left as figures, ``counting``, beside its message, on the
    dashboard's API and on the CRAN API alike."""
    from tiny import codec

    data = tmp_path / "data"
    data.mkdir()
    (data / f"{DAY}.csv").write_bytes(sample_csv())
    size = (data / f"{DAY}.csv").stat().st_size
    with InProcessServer(data, "--public-downloads") as running:
        running.deps.live.fold_seconds = 0.0
        for path in (f"/api/days/{DAY}/summary", f"/downloads/total/{DAY}"):
            for _ in range(10):  # a pool still starting on a busy machine answers "busy" first (seen once)
                response = get(running, path)
                if b"has not answered" not in response.body:
                    break
            assert response.status == 503 and response.headers["retry-after"] == "5", response.body
            body = response.json()["error"]
            assert set(body) == {"status", "message", "counting"} and body["status"] == 503
            assert body["message"].startswith(f"the aggregates of {DAY} are catching up")
            counting = body["counting"]
            assert counting["day"] == DAY and 0 < counting["bytes_left"] <= size
            if codec.CODEC == "rust":  # counted exactly (below 64 MiB left); the Python codec estimates or says none
                assert counting["rows_left"] == 77_107 or counting["bytes_left"] < size
            else:
                assert counting["rows_left"] is None or counting["rows_left"] > 0
        running.deps.live.fold_seconds = 60.0
        assert ok(running, f"/api/days/{DAY}/summary")["downloads"] == 77_107

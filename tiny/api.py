"""HTTP handlers of the analytics API (``/api/...``) and of the dashboard page (``/``).

Every handler only validates, stats files and awaits :class:`tiny.analytics.Analytics`:
the parsing, aggregation and drawing run in the worker's analytics process pool, so these
requests never hold up ``/ingest`` on the same event loop.

Auth: when ``--token`` is set, every ``/api/...`` request needs ``Authorization: Bearer
<token>`` like ``/ingest`` (401 otherwise). The page at ``/`` is public: it holds no data,
asks for the token when the API answers 401, keeps it in the tab's sessionStorage, and sends
it in the Authorization header (charts too: fetched, then shown from blob: URLs). The token
never goes into a URL, a cookie or a log.

Errors use the JSON shape of tiny.handlers: 400 bad date / ``top`` / ``limit`` / ``ip_id``,
401 token, 404 no such day (or ip_id on that day, or chart), 405 other methods, 503 +
Retry-After when too many analytics queries are queued, the analytics process died (it is
restarted on the next query) or has been stopped because the server is shutting down.
"""

from __future__ import annotations

import hashlib
import re
from base64 import b64encode
from collections.abc import Awaitable
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import orjson

from tiny import analytics
from tiny.analytics import Analytics
from tiny.config import Config
from tiny.handlers import APIError, JSONHandler, ServerState
from tiny.metrics import Metrics
from tiny.sink import DailyFileSink

_PAGE = Path(__file__).with_name("dashboard.html")
T = TypeVar("T")
_DATE = r"([^/]+)"  # anything up to the next slash: a malformed date gets a 400, not a 404


def routes(deps: dict[str, Any]) -> list[tuple[str, type, dict[str, Any]]]:
    """The URL specs of the dashboard and the analytics API, for tiny.server.make_app.

    ``deps`` are make_app's four handler dependencies; one :class:`Analytics` (whose pool
    starts on the first query) is added for this worker process.
    """
    api = {**deps, "analytics": Analytics(deps["config"].data_dir)}
    return [
        (r"/", DashboardHandler, deps),
        (r"/api/days", DaysHandler, api),
        (rf"/api/days/{_DATE}/summary", SummaryHandler, api),
        (rf"/api/days/{_DATE}/whales", WhalesHandler, api),
        (rf"/api/days/{_DATE}/whales/hourly", HourlyHandler, api),
        (rf"/api/days/{_DATE}/whales/([^/]+)/downloads", DownloadsHandler, api),
        (rf"/api/days/{_DATE}/charts/([^/]+)\.svg", ChartHandler, api),
    ]


class AnalyticsHandler(JSONHandler):
    """Base of the ``/api`` handlers: GET only, token, argument checks, analytics errors."""

    name = "api"

    def initialize(  # type: ignore[override]
        self, config: Config, state: ServerState, metrics: Metrics, sink: DailyFileSink, analytics: Analytics
    ) -> None:
        super().initialize(config, state, metrics, sink)
        self.analytics = analytics

    def prepare(self) -> None:
        super().prepare()
        if self.state.draining:  # served during the drain grace, like /ingest; the client should reconnect
            self.set_header("Connection", "close")
        self.check_token()
        self.set_header("Cache-Control", "no-cache")  # a day file may grow at any time

    def date(self, text: str) -> str:
        try:
            return analytics.parse_date(text)
        except ValueError:
            raise APIError(400, f"not a date YYYY-MM-DD: {text!r}") from None

    def number(self, name: str, default: int, maximum: int) -> int:
        """The query argument ``name``: an integer in 1..maximum (400 otherwise)."""
        text = self.get_query_argument(name, None)
        if text is None:
            return default
        if not re.fullmatch(r"[0-9]{1,9}", text.strip()) or not 1 <= int(text) <= maximum:
            raise APIError(400, f"{name} must be an integer from 1 to {maximum}")
        return int(text)

    def top(self) -> int:
        return self.number("top", analytics.DEFAULT_TOP, analytics.MAX_TOP)

    def ip_id(self, text: str) -> int:
        if not re.fullmatch(r"[0-9]{1,20}", text) or not 1 <= int(text) < 2**64:
            raise APIError(400, f"ip_id must be an integer >= 1: {text!r}")
        return int(text)

    async def answer(self, query: Awaitable[T]) -> T:
        """The analytics result, its errors turned into client answers in the one JSON shape."""
        try:
            return await query
        except analytics.DayNotFound as exc:
            raise APIError(404, f"no data for day {exc.args[0]}") from None
        except analytics.WhaleNotFound as exc:
            raise APIError(404, f"ip_id {exc.args[0]} downloaded nothing that day") from None
        except analytics.Busy:
            raise APIError(503, "analytics are busy; try again", {"Retry-After": "1"}) from None

    def send_json(self, body: Any) -> None:
        self.finish(orjson.dumps(body))


class DaysHandler(AnalyticsHandler):
    """``GET /api/days``: 200 ``{"days": [{"date", "rows", "bytes"}, ...]}``, oldest first.

    ``rows`` counts complete rows (a row being appended is not counted yet).
    """

    async def get(self) -> None:
        self.send_json({"days": await self.answer(self.analytics.days())})


class SummaryHandler(AnalyticsHandler):
    """``GET /api/days/<date>/summary?top=N`` (N 1..100, default 6).

    200 ``{"date", "top", "downloads", "bytes", "downloaders", "whale_downloads", "hourly":
    [{"hour": 0, "all": n, "whales": m}, ... 24]}``: totals, distinct ip_ids, and downloads per
    UTC hour of all traffic and of the top N whales. 400 bad date or N, 404 no such day.
    """

    async def get(self, date: str) -> None:
        self.send_json(await self.answer(self.analytics.summary(self.date(date), self.top())))


class WhalesHandler(AnalyticsHandler):
    """``GET /api/days/<date>/whales?top=N`` (N 1..100, default 6).

    200 ``{"date", "top", "whales": [{"ip_id", "name", "country", "downloads", "bytes"}, ...]}``,
    most downloads first (ties: smaller ip_id first); ``name`` is a stable adjective_animal per
    (date, ip_id), ``country`` the most frequent one (null if never known). 400, 404.
    """

    async def get(self, date: str) -> None:
        self.send_json(await self.answer(self.analytics.whales(self.date(date), self.top())))


class HourlyHandler(AnalyticsHandler):
    """``GET /api/days/<date>/whales/hourly?top=N``: 200 ``{"date", "top", "whales": [{"ip_id",
    "name", "country", "downloads", "hourly": [24 counts, UTC hours 0..23]}, ...]}``. 400, 404.
    """

    async def get(self, date: str) -> None:
        self.send_json(await self.answer(self.analytics.hourly(self.date(date), self.top())))


class DownloadsHandler(AnalyticsHandler):
    """``GET /api/days/<date>/whales/<ip_id>/downloads?limit=L`` (L 1..100000, default 1000).

    200 ``{"date", "ip_id", "name", "country", "total", "bytes", "packages", "limit",
    "truncated", "downloads": [{"time", "package", "version", "size"}, ...]}``: the first L
    downloads in time order (file order within a second). Any ip_id, not only the top N.
    400 bad date, ip_id or L; 404 no such day, or the ip_id downloaded nothing that day.
    """

    async def get(self, date: str, ip_id: str) -> None:
        day, ip = self.date(date), self.ip_id(ip_id)
        limit = self.number("limit", analytics.DEFAULT_LIMIT, analytics.MAX_LIMIT)
        self.send_json(await self.answer(self.analytics.downloads(day, ip, limit)))


class ChartHandler(AnalyticsHandler):
    """``GET /api/days/<date>/charts/<view>.svg?top=N[&ip_id=I]``: 200 ``image/svg+xml``.

    Views (drawn by matplotlib in the pool): ``traffic`` all traffic by hour vs the top N
    whales; ``whales`` the top N as bars; ``hourly`` each whale by hour (small multiples, a
    heatmap past 12); ``detail`` one ip_id's downloads, time x package (I defaults to the
    biggest whale). 400 bad date, N or I; 404 no such day, view, or downloads of I.
    """

    name = "chart"

    async def get(self, date: str, view: str) -> None:
        day, top = self.date(date), self.top()
        if view not in analytics.CHART_VIEWS:
            raise APIError(404, f"no chart {view!r}; charts: {', '.join(analytics.CHART_VIEWS)}")
        text = self.get_query_argument("ip_id", None)
        ip_id = self.ip_id(text) if text is not None else None
        svg = await self.answer(self.analytics.chart(day, view, top, ip_id))
        self.set_header("Content-Type", "image/svg+xml")
        # Opened on its own, an SVG is a document: it may run nothing and load nothing.
        self.set_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.finish(svg)


@cache
def _page() -> tuple[bytes, str]:
    """The dashboard's bytes and the CSP hash of its one inline script."""
    page = _PAGE.read_bytes()
    match = re.search(rb"<script>(.*?)</script>", page, re.S)
    assert match is not None, "dashboard.html has no inline <script>"
    return page, "sha256-" + b64encode(hashlib.sha256(match.group(1)).digest()).decode()


class DashboardHandler(JSONHandler):
    """``GET /``: the dashboard page (text/html, no external assets). Public: it holds no data.

    Content-Security-Policy: only its own inline script (by hash) runs, and it may only talk
    to this origin; images come from blob: URLs the script makes from the chart endpoints.
    """

    name = "dashboard"

    def get(self) -> None:
        page, script_hash = _page()
        if self.state.draining:
            self.set_header("Connection", "close")
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header(
            "Content-Security-Policy",
            f"default-src 'none'; script-src '{script_hash}'; style-src 'unsafe-inline'; "
            "img-src 'self' blob: data:; connect-src 'self'; base-uri 'none'; form-action 'none'",
        )
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Referrer-Policy", "no-referrer")
        self.finish(page)

"""The analytics API, ``GET /api/...``: validate, then await the live aggregates or the pool.

The days, summaries, whales and the ``traffic``, ``whales`` and ``hourly`` charts are
answered from the live aggregate store (tiny.live, tiny.analytics.answers: an index read of a
day's aggregates, the charts written as SVG from them and kept per version); one ip_id's downloads
and the ``detail`` chart read that ip_id's rows of the day file (tiny.analytics.service, bounded
in CPU and concurrency). Both run in the worker's analytics pool: these requests never hold
up ``/ingest`` on the same event loop. Like every answer from the aggregates, an answer
given after a POST's 200 counts that POST's rows.

Auth: when ``--token`` is set, every ``/api/...`` request needs ``Authorization: Bearer
<token>`` like ``/ingest`` (401 otherwise); the dashboard page (tiny.handlers.dashboard)
sends it.

Errors use the JSON shape of tiny.handlers.base: 400 bad date / ``top`` / ``limit`` /
``ip_id``, 401 token, 404 no such day (or ip_id on that day, or chart), 405 other methods,
503 + Retry-After when too many analytics queries are queued, a query that reads rows is already running in this
process, the data dir's lock or the store is busy, the analytics process died (it is
restarted on the next query) or the server is shutting down; and while the day is still
being counted, with what is left beside the message: ``"counting": {"day", "rows_left",
"bytes_left"}`` (tiny.aggregate_errors.Behind.counting).
"""

from __future__ import annotations

import bisect
import re
import sqlite3
from collections.abc import Awaitable
from typing import Any, TypeVar

import orjson

from tiny import layout, limits
from tiny.aggregate_errors import Behind, Unavailable
from tiny.analytics import answers, charts, json_bytes, service
from tiny.handlers.base import APIError, JSONHandler
from tiny.sink import SinkError

T = TypeVar("T")
DATE = r"([^/]+)"  # anything up to the next slash in a URL pattern: a malformed date gets a 400, not a 404


class AnalyticsHandler(JSONHandler):
    """Base of the ``/api`` handlers: GET only, token, argument checks, analytics errors."""

    name = "api"

    async def prepare(self) -> None:
        super().prepare()
        self.check_token()
        self.set_header("Cache-Control", "no-cache")  # a day file may grow at any time
        await self.pace()

    def compute_etag(self) -> None:
        # Tornado hashes every GET answer (SHA-1, on the event loop) for an Etag: for one
        # whale's downloads, megabytes, that held ingest up for milliseconds. No Etag here.
        return None

    def date(self, text: str) -> str:
        try:
            return layout.parse_day(text)
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
        return self.number("top", limits.WHALES_DEFAULT_TOP, limits.WHALES_MAX_TOP)

    def ip_id(self, text: str) -> int:
        if not re.fullmatch(r"[0-9]{1,20}", text) or not 1 <= int(text) < 2**64:
            raise APIError(400, f"ip_id must be an integer >= 1: {text!r}")
        return int(text)

    async def answer(self, query: Awaitable[T]) -> T:
        """The analytics result, its errors turned into client answers in the one JSON shape."""
        try:
            return await query
        except service.DayNotFound as exc:
            raise APIError(404, f"no data for day {exc.args[0]}") from None
        except service.WhaleNotFound as exc:
            raise APIError(404, f"ip_id {exc.args[0]} downloaded nothing that day") from None
        except service.Busy as exc:
            raise APIError(503, f"analytics are busy: {exc}; try again", {"Retry-After": "1"}) from None
        except Behind as exc:  # the figures of what is left, for the page to show
            raise APIError(503, f"{exc}; try again", {"Retry-After": "5"}, {"counting": exc.counting()}) from None
        except (SinkError, Unavailable) as exc:
            raise APIError(503, f"{exc}; try again", {"Retry-After": "5"}) from None
        except sqlite3.OperationalError as exc:  # the store's write lock held too long (a rebuild)
            raise APIError(503, f"the aggregate store is busy ({exc}); try again", {"Retry-After": "5"}) from None

    async def aggregated(self, query: answers.OfDay) -> bytes:
        """The answer to a dashboard query from the live aggregates of its day (JSON or SVG);
        404 when the day has no file."""
        answer = await self.answer(self.deps.live.answer(query))
        if answer.body in (b"null", b""):
            raise APIError(404, f"no data for day {query.date}")
        return answer.body

    async def listed(self, days: list[str]) -> list[dict[str, Any]]:
        """``{"date", "rows", "bytes"}`` of each of ``days`` from the live aggregates."""
        if not days:
            return []
        # The rows of a day being written are counted from its new bytes (8 GB/s compiled): the
        # answers' lane, where a visit's first query does not wait behind another's row read.
        answer = await self.answer(self.deps.live.answer(answers.Days(tuple(days))))
        return list(orjson.loads(answer.body))

    def send_json(self, body: Any) -> None:
        """Finish with ``body`` as JSON (integers of any size: byte totals may pass 2^64)."""
        self.finish(json_bytes.dumps(body))

    def send_body(self, body: bytes) -> None:
        """Finish with JSON ``body`` serialised already (in the pool)."""
        self.finish(body)


class DaysHandler(AnalyticsHandler):
    """``GET /api/days?limit=L&after=D`` (L 1..1000, default 100; D a date): 200 ``{"days":
    [{"date", "rows", "bytes"}, ...], "next": D2 | null}``, oldest first, the days after D;
    ``next`` is the ``after`` of the next page, null on the last one.

    ``rows`` counts complete rows (a row being appended is not counted yet). 400 bad L or D.
    """

    async def get(self) -> None:
        limit = self.number("limit", limits.DAYS_PAGE_DEFAULT, limits.DAYS_PAGE_MAX)
        after = self.get_query_argument("after", "")
        after = self.date(after) if after else ""
        live = self.deps.live
        names = live.days(live.version())
        start = bisect.bisect_right(names, after) if after else 0
        page = names[start : start + limit]
        self.send_json({"days": await self.listed(page), "next": page[-1] if start + limit < len(names) else None})


class SummaryHandler(AnalyticsHandler):
    """``GET /api/days/<date>/summary?top=N`` (N 1..100, default 6).

    200 ``{"date", "top", "downloads", "bytes", "downloaders", "whale_downloads", "hourly":
    [{"hour": 0, "all": n, "whales": m}, ... 24]}``: totals, distinct ip_ids, and downloads per
    UTC hour of all traffic and of the top N whales. 400 bad date or N, 404 no such day.
    """

    async def get(self, date: str) -> None:
        day = self.date(date)
        self.send_body(await self.aggregated(answers.Summary(day, self.top())))


class WhalesHandler(AnalyticsHandler):
    """``GET /api/days/<date>/whales?top=N`` (N 1..100, default 6).

    200 ``{"date", "top", "whales": [{"ip_id", "name", "country", "downloads", "bytes"}, ...]}``,
    most downloads first (ties: smaller ip_id first); ``name`` is a stable adjective_animal per
    (date, ip_id), ``country`` the most frequent one (null if never known). 400, 404.
    """

    async def get(self, date: str) -> None:
        day = self.date(date)
        self.send_body(await self.aggregated(answers.Whales(day, self.top())))


class HourlyHandler(AnalyticsHandler):
    """``GET /api/days/<date>/whales/hourly?top=N``: 200 ``{"date", "top", "whales": [{"ip_id",
    "name", "country", "downloads", "hourly": [24 counts, UTC hours 0..23]}, ...]}``. 400, 404.
    """

    async def get(self, date: str) -> None:
        day = self.date(date)
        self.send_body(await self.aggregated(answers.Hourly(day, self.top())))


class WhaleDownloadsHandler(AnalyticsHandler):
    """``GET /api/days/<date>/whales/<ip_id>/downloads?limit=L`` (L 1..100000, default 1000).

    200 ``{"date", "ip_id", "name", "country", "total", "bytes", "packages", "limit",
    "truncated", "downloads": [{"time", "package", "version", "size"}, ...]}``: the first L
    downloads in time order (file order within a second). Any ip_id, not only the top N.
    400 bad date, ip_id or L; 404 no such day, or the ip_id downloaded nothing that day.
    """

    async def get(self, date: str, ip_id: str) -> None:
        day, ip = self.date(date), self.ip_id(ip_id)
        limit = self.number("limit", limits.WHALE_DOWNLOADS_DEFAULT_LIMIT, limits.WHALE_DOWNLOADS_MAX_LIMIT)
        self.finish(await self.answer(self.deps.analytics.whale_downloads(day, ip, limit)))  # JSON from the pool


class ChartHandler(AnalyticsHandler):
    """``GET /api/days/<date>/charts/<view>.svg?top=N[&ip_id=I]``: 200 ``image/svg+xml``.

    Views (drawn in the pool, tiny.analytics.charts): ``traffic`` all traffic by hour vs the
    top N whales; ``whales`` the top N as bars (the first 20 of them); ``hourly`` each whale by
    hour (small multiples up to 6 whales, beyond a heatmap on a log colour scale); ``detail``
    one ip_id's downloads, time x package (I defaults to the biggest whale; read from the
    rows). The SVG's root element says what it is of: ``data-view``, ``data-day``, and
    ``data-whales`` (how many whales it is of) or ``data-ip-id``. 400 bad date, N or I; 404
    no such day, view, or downloads of I.
    """

    name = "chart"

    async def get(self, date: str, view: str) -> None:
        day, top = self.date(date), self.top()
        if view not in charts.VIEWS:
            raise APIError(404, f"no chart {view!r}; charts: {', '.join(charts.VIEWS)}")
        text = self.get_query_argument("ip_id", None)
        ip_id = self.ip_id(text) if text is not None else None
        if view in charts.FROM_AGGREGATES:
            svg = await self.aggregated(answers.Chart(day, view, top))
        else:  # detail: one ip_id's downloads, from the rows
            if ip_id is None:
                biggest = orjson.loads(await self.aggregated(answers.Biggest(day)))
                if biggest is None:
                    raise APIError(404, f"nobody downloaded anything on {day}")
                ip_id = int(biggest)
            svg = await self.answer(self.deps.analytics.detail(day, ip_id))
        self.set_header("Content-Type", "image/svg+xml")
        # Opened on its own, an SVG is a document: it may run nothing and load nothing.
        self.set_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.finish(svg)

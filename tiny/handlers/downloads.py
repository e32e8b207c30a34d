"""The CRAN downloads API, ``GET /downloads``, ``/top``, ``/badges``, ``/trending`` (tiny.downloads answers).

The paths and JSON shapes of the public service (r-hub/cranlogs.app), so that its R client
works unchanged. Errors in the project's JSON shape: 400 a bad period, package name, count or
colour, or a range that ends before it starts; 404 for ``R`` (downloads of R itself come from
another log than the package downloads Tiny ingests); 503 with Retry-After when the data dir's
lock is held too long or the analytics pool is busy. The token rule of ``/api`` applies,
unless ``--public-downloads`` makes these read-only aggregates public (badges in public READMEs
need that); no answer ever names an ip_id.

Caching: every answer carries an ETag; a request whose If-None-Match holds it gets 304.
JSON answers say ``Cache-Control: no-cache`` (revalidate: counts change within seconds of an
ingest); badges ``public, max-age=300``, like the images they are.
"""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from typing import Any

from tiny import badges
from tiny.aggregates import Behind, Unavailable
from tiny.analytics.service import Busy
from tiny.downloads import DEFAULT_TOP, MAX_TOP, SUMMARIES, Period, parse_packages, parse_period
from tiny.handlers.base import APIError, JSONHandler
from tiny.live import Answer, etag_of
from tiny.sink import SinkError

_R = "downloads of R itself are not in the package download logs this server ingests"


class DownloadsBase(JSONHandler):
    """GET only; the token unless --public-downloads; ETag and Cache-Control; the errors."""

    name = "downloads"
    cache_control = "no-cache"

    async def prepare(self) -> None:
        super().prepare()
        if not self.config.public_downloads:
            self.check_token()
        await self.pace()

    def compute_etag(self) -> None:
        return None  # ours comes with the answer (tiny.live.Answer.etag)

    async def answer(self, query: tuple[Any, ...], needed: list[str] | None) -> Answer:
        try:
            return await self.deps.live.answer(query, needed)
        except (SinkError, Behind, Unavailable) as exc:
            raise APIError(503, f"{exc}; try again", {"Retry-After": "5"}) from None
        except Busy as exc:
            raise APIError(503, f"{exc}; try again", {"Retry-After": "1"}) from None
        except sqlite3.OperationalError as exc:  # the store's write lock held too long (a rebuild)
            raise APIError(503, f"the downloads store is busy ({exc}); try again", {"Retry-After": "5"}) from None

    def send(self, answer: Answer, body: bytes | None = None, content_type: str = "application/json") -> None:
        """``body`` (the answer's own when None) with its ETag, or 304 when the client holds it."""
        etag = answer.etag if body is None else etag_of(body)
        self.set_header("Content-Type", content_type)
        self.set_header("Cache-Control", self.cache_control)
        self.set_header("ETag", etag)
        if etag in (self.request.headers.get("If-None-Match") or ""):
            self.set_status(304)
            self.finish()
            return
        self.finish(answer.body if body is None else body)

    def period(self, text: str) -> Period:
        version = self.deps.live.version()
        try:
            return parse_period(text, self.deps.live.last_day(version))
        except ValueError as exc:
            raise APIError(400, str(exc)) from None

    def packages(self, text: str | None) -> list[str] | None:
        if not text:
            return None
        if "R" in text.split(","):
            raise APIError(404, _R)
        try:
            return parse_packages(text)
        except ValueError as exc:
            raise APIError(400, str(exc)) from None


class PackageDownloadsHandler(DownloadsBase):
    """``GET /downloads/{total,daily}/{period}[/{pkg1,pkg2,...}]``."""

    async def get(self, kind: str, period_text: str, packages_text: str | None = None) -> None:
        period = self.period(period_text)
        packages = self.packages(packages_text)
        answer = await self.answer((kind, period, tuple(packages) if packages else None), period.days())
        self.send(answer)


class TopHandler(DownloadsBase):
    """``GET /top/{period}[/{count}]``: the ``count`` (1-100, default 10) most downloaded
    packages, most first, ties by name; the counts as JSON strings, as the public service."""

    async def get(self, period_text: str, count_text: str | None = None) -> None:
        period = self.period(period_text)
        count = DEFAULT_TOP
        if count_text is not None:
            if not count_text.isdigit() or not 1 <= int(count_text) <= MAX_TOP:
                raise APIError(400, f"the count must be an integer from 1 to {MAX_TOP}")
            count = int(count_text)
        self.send(await self.answer(("top", period, count), period.days()))


class TrendingHandler(DownloadsBase):
    """``GET /trending``: see tiny.downloads.trending."""

    async def get(self) -> None:
        live = self.deps.live
        last = live.last_day(live.version())
        needed = Period(last - timedelta(days=6 + 7 * 24), last).days()
        self.send(await self.answer(("trending", last), needed))


class BadgeHandler(DownloadsBase):
    """``GET /badges[/{summary}]/{package}[?color=...]``: an SVG badge (tiny.badges)."""

    name = "badges"
    cache_control = "public, max-age=300"

    async def get(self, first: str, second: str | None = None) -> None:
        summary, package = ("last-month", first) if second is None else (first, second)
        if summary not in SUMMARIES:
            raise APIError(400, f"not a badge summary: {summary!r} ({', '.join(SUMMARIES)})")
        (name,) = self.packages(package) or [""]
        try:
            fill = badges.color(self.get_query_argument("color", None))
        except ValueError as exc:
            raise APIError(400, str(exc)) from None
        if summary == "grand-total":
            query: tuple[Any, ...] = ("count", name, "0001-01-01", "9999-12-31")
            needed = None
        else:
            period = self.period(summary)
            query = ("count", name, period.start.isoformat(), period.end.isoformat())
            needed = period.days()
        answer = await self.answer(query, needed)
        svg = badges.svg(badges.text(int(answer.body), SUMMARIES[summary]), fill)
        self.send(answer, svg, "image/svg+xml")

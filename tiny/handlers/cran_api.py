"""The CRAN downloads API, ``GET /downloads``, ``/top``, ``/badges``, ``/trending``, ``/ping``, ``/check``.

The routes, paths and JSON shapes of the public service (r-hub/cranlogs.app, routes/*.js), so
that its R client works unchanged; tiny.cran_api answers. Errors in the project's JSON shape:
400 a bad period, package name, count or colour, or a range that ends before it starts; 404
for ``R`` (downloads of R itself come from another log than the package downloads Tiny
ingests); 503 with Retry-After when the data dir's lock is held too long or the analytics
pool is busy. The token rule of ``/api`` applies, unless ``--public-downloads`` makes these
read-only aggregates public (badges in public READMEs need that); no answer ever names an
ip_id. ``/ping``, ``/check`` and ``/downloads/`` (the API's pointer to its documentation) hold
no data and need no token.

Caching: every answer carries an ETag; a request whose If-None-Match names it (or is ``*``) gets 304.
JSON answers say ``Cache-Control: no-cache`` (revalidate: counts change within seconds of an
ingest); badges ``public, max-age=300``, like the images they are.
"""

from __future__ import annotations

import re
import sqlite3

import orjson

from tiny import badges, limits
from tiny.aggregate_errors import Behind, Unavailable
from tiny.analytics.service import Busy
from tiny.cran_api import (
    SUMMARIES,
    Count,
    Daily,
    MonthlyTotals,
    Period,
    Top,
    Total,
    Trending,
    check_name_length,
    keyword_of,
    parse_packages,
    parse_period,
)
from tiny.handlers.base import JSON, APIError, JSONHandler
from tiny.live import Answer, Query, etag_of
from tiny.protocol import clipped
from tiny.sink import SinkError

_R = "downloads of R itself are not in the package download logs this server ingests"
_COUNT = re.compile(r"[0-9]+\Z")
_BADGE_PACKAGE = re.compile(r"[A-Za-z0-9_.,]+\Z")  # what the public badges' route takes
INFO = "https://github.com/r-hub/cranlogs.app"  # the API's documentation, as /downloads/ points to it


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

    async def answer(self, query: Query) -> Answer:
        try:
            return await self.deps.live.answer(query)
        except Behind as exc:
            raise APIError(503, f"{exc}; try again", {"Retry-After": "5"}, {"counting": exc.counting()}) from None
        except (SinkError, Unavailable) as exc:
            raise APIError(503, f"{exc}; try again", {"Retry-After": "5"}) from None
        except Busy as exc:
            raise APIError(503, f"{exc}; try again", {"Retry-After": "1"}) from None
        except sqlite3.OperationalError as exc:  # the store's write lock held too long (a rebuild)
            raise APIError(503, f"the downloads store is busy ({exc}); try again", {"Retry-After": "5"}) from None

    def send(self, answer: Answer, body: bytes | None = None, content_type: str = JSON) -> None:
        """``body`` (the answer's own when None) with its ETag, or 304 when the client holds it."""
        etag = answer.etag if body is None else etag_of(body)
        self.set_header("Content-Type", content_type)
        self.set_header("Cache-Control", self.cache_control)
        self.set_header("ETag", etag)
        if none_match(self.request.headers.get("If-None-Match"), etag):
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
        names = tuple(packages) if packages else None
        if names and len(names) > limits.CRAN_MAX_PACKAGES:
            raise APIError(400, f"{len(names):,} packages in one request; at most {limits.CRAN_MAX_PACKAGES:,}")
        counts = ((period.end - period.start).days + 1) * len(names or ("all",))
        if kind == "daily" and counts > limits.CRAN_MAX_DAILY_COUNTS:
            # One answer is built whole in an analytics process: a century for 200 packages in
            # a 1 KB URL held the pool for its whole deadline and grew it past a gigabyte.
            raise APIError(
                400,
                f"{counts:,} daily counts (days x packages) asked for in one answer; at most "
                f"{limits.CRAN_MAX_DAILY_COUNTS:,}: ask for fewer days or packages at a time",
            )
        self.send(await self.answer(Total(period, names) if kind == "total" else Daily(period, names)))


class TopHandler(DownloadsBase):
    """``GET /top/{period}[/{count}]``: the ``count`` most downloaded packages, most first, ties
    by name, as the public service: ``count`` digits, 9 when absent, 100 when more (it keeps
    the top 100 of a period); the counts as JSON strings."""

    async def get(self, period_text: str, count_text: str | None = None) -> None:
        period = self.period(period_text)
        self.send(await self.answer(Top(period, top_count(count_text))))


def top_count(text: str | None) -> int:
    """``/top``'s count: CRAN_DEFAULT_TOP (tiny.limits) for None, at most CRAN_MAX_TOP; APIError 400 for anything but
    ASCII digits, or 0. (Its length is bounded before ``int``: a long string of digits is
    quadratic to convert, and past 4,300 digits Python refuses it.)"""
    if text is None:
        return limits.CRAN_DEFAULT_TOP
    if not _COUNT.match(text) or not text.strip("0"):
        most = limits.CRAN_MAX_TOP
        raise APIError(400, f"the count must be a whole number from 1 (more than {most} gives {most})")
    digits = text.lstrip("0")
    return limits.CRAN_MAX_TOP if len(digits) > len(str(limits.CRAN_MAX_TOP)) else min(int(digits), limits.CRAN_MAX_TOP)


class MonthlyTotalsHandler(DownloadsBase):
    """``GET /downloads/monthly-totals``: every package's downloads in the last month (the last
    day with data and the 29 before), most first: ``[{"package", "count"}]``, counts as strings."""

    async def get(self) -> None:
        period = self.period("last-month")
        self.send(await self.answer(MonthlyTotals(period)))


class TrendingHandler(DownloadsBase):
    """``GET /trending``: see tiny.cran_api.trending."""

    async def get(self) -> None:
        live = self.deps.live
        self.send(await self.answer(Trending(live.last_day(live.version()))))


class BadgeHandler(DownloadsBase):
    """``GET /badges[/{summary}]/{package}[?color=...]``: an SVG badge (tiny.badges).

    As the public badges: the summary in any case; the package as their route takes it
    (letters, digits, ``_``, ``.`` and ``,``) and counted under exactly that name, so
    ``Rcpp,ggplot2``, no package's name, shows 0; a summary alone (``/badges/last-week``) is
    that summary of the package of that name (0). ``R`` is 404, as in the rest of the API."""

    name = "badges"
    cache_control = "public, max-age=300"

    async def get(self, first: str, second: str | None = None) -> None:
        summary, name = summary_and_package(first, second)
        try:
            fill = badges.color(self.get_query_argument("color", None))
        except ValueError as exc:
            raise APIError(400, str(exc)) from None
        answer = await self.answer(Count(name, None if summary == "grand-total" else self.period(summary)))
        svg = badges.svg(badges.text(int(answer.body), SUMMARIES[summary]), fill)
        self.send(answer, svg, "image/svg+xml")


def none_match(header: str | None, etag: str) -> bool:
    """Whether an ``If-None-Match`` header matches ``etag`` (RFC 9110, 13.1.2): ``*``, or one of
    its comma-separated entity tags, weak or not, equal to it (not merely within the header)."""
    if header is None:
        return False
    if header.strip() == "*":
        return True
    return any(tag.strip().removeprefix("W/") == etag for tag in header.split(","))


def summary_and_package(first: str, second: str | None) -> tuple[str, str]:
    """The summary and the package name of ``/badges/{first}[/{second}]``; APIError else."""
    if second is None:
        if keyword_of(first) in SUMMARIES:  # a summary alone: the package of that name (none)
            return keyword_of(first), first
        summary, name = "last-month", first
    else:
        summary, name = keyword_of(first), second
    if summary not in SUMMARIES:
        raise APIError(400, f"not a badge summary: {clipped(first)!r} ({', '.join(SUMMARIES)})")
    try:
        check_name_length(name)
    except ValueError as exc:
        raise APIError(400, str(exc)) from None
    if not _BADGE_PACKAGE.match(name):
        raise APIError(400, f"not a package name: {name!r}")
    if name == "R":
        raise APIError(404, _R)
    return summary, name


class PingHandler(JSONHandler):
    """``GET /ping``: the public service's ping answer (no token: it holds no data)."""

    name = "ping"

    def get(self) -> None:
        self.finish(orjson.dumps({"operation": "ping", "message": "Thanks! Live long and prosper!"}))


class CheckHandler(JSONHandler):
    """``GET /check``: the public service's liveness check, ``I am alive`` in plain text."""

    name = "ping"

    def get(self) -> None:
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(b"I am alive")


class InfoHandler(JSONHandler):
    """``GET /downloads/``: where the API is documented, as the public service answers it."""

    name = "downloads"

    def get(self) -> None:
        self.finish(orjson.dumps({"info": INFO}))

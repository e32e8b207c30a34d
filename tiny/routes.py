"""The URL map: which handler answers which path, all with the same typed dependencies."""

from __future__ import annotations

from tornado import web

from tiny.handlers.analytics import (
    DATE,
    ChartHandler,
    DaysHandler,
    HourlyHandler,
    SummaryHandler,
    WhaleDownloadsHandler,
    WhalesHandler,
)
from tiny.handlers.base import Deps, log_request
from tiny.handlers.cran_api import (
    BadgeHandler,
    CheckHandler,
    InfoHandler,
    MonthlyTotalsHandler,
    PackageDownloadsHandler,
    PingHandler,
    TopHandler,
    TrendingHandler,
)
from tiny.handlers.dashboard import DashboardHandler
from tiny.handlers.status import HealthHandler, MetricsHandler, NotFoundHandler


def make_app(deps: Deps) -> web.Application:
    """The Tornado application of one worker process: every path but /ingest, which the server
    hands to its own delegate whichever way its head was read (tiny.handlers.ingest.route)."""
    args = {"deps": deps}
    return web.Application(
        [
            (r"/healthz", HealthHandler, args),
            (r"/metrics", MetricsHandler, args),
            (r"/", DashboardHandler, args),
            (r"/api/days", DaysHandler, args),
            (rf"/api/days/{DATE}/summary", SummaryHandler, args),
            (rf"/api/days/{DATE}/whales", WhalesHandler, args),
            (rf"/api/days/{DATE}/whales/hourly", HourlyHandler, args),
            (rf"/api/days/{DATE}/whales/([^/]+)/downloads", WhaleDownloadsHandler, args),
            (rf"/api/days/{DATE}/charts/([^/]+)\.svg", ChartHandler, args),
            (r"/downloads/?", InfoHandler, args),
            (r"/downloads/(total|daily)/([^/]+)(?:/([^/]+))?", PackageDownloadsHandler, args),
            (r"/downloads/monthly-totals", MonthlyTotalsHandler, args),
            (r"/top/([^/]+)(?:/([^/]+))?", TopHandler, args),
            (r"/trending/?", TrendingHandler, args),
            (r"/badges/([^/]+)(?:/([^/]+))?", BadgeHandler, args),
            (r"/ping/?", PingHandler, args),
            (r"/check/?", CheckHandler, args),
        ],
        default_handler_class=NotFoundHandler,
        default_handler_args=args,
        log_function=log_request,
    )

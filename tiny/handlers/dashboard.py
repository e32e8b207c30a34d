"""``GET /``: the whales dashboard page (tiny/handlers/dashboard.html), public because it holds no data.

What the page holds to: each view (totals, traffic, biggest whales, whales by hour, the whale
table, one whale's detail) is captioned with the day it is of and shows nothing of another
day or N. Choosing a day or N empties every view at once and aborts what is on its way; an
answer is shown only if the choice is unchanged and the answer says it is of that day (the
``date`` of a JSON answer, the ``data-day`` of a chart's root element). A 503 is asked again
after its Retry-After (1-60 s), the view saying meanwhile what the server said is left to
count ("counting <day>, N rows left"); an answer not there within 60 s is asked again.
Layout: two columns from 900 px, one below; the whale table and a heatmap of many whales
scroll within their views, so the page's height hardly grows with N.

The page asks for the token when the API answers 401, keeps it in the tab's sessionStorage,
and sends it in the Authorization header (charts too: fetched, then shown from blob: URLs).
The token never goes into a URL, a cookie or a log.
"""

from __future__ import annotations

import hashlib
import re
from base64 import b64encode
from functools import cache
from pathlib import Path

from tiny.handlers.base import JSONHandler

_PAGE = Path(__file__).with_name("dashboard.html")


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
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header(
            "Content-Security-Policy",
            f"default-src 'none'; script-src '{script_hash}'; style-src 'unsafe-inline'; "
            "img-src 'self' blob: data:; connect-src 'self'; base-uri 'none'; form-action 'none'",
        )
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Referrer-Policy", "no-referrer")
        self.finish(page)

"""The dashboard in a real browser: Debian's headless Chromium against a real server with the sample day.

Two ways in: the command line (``--dump-dom`` after the page's scripts ran), and the DevTools
protocol over ``--remote-debugging-pipe`` to set the window's width, click a whale like a
person would (a mouse press and release at the row), choose days and N, and watch what each
view shows while answers arrive. Skipped, with the reason, when chromium is not installed
(``make sysdeps`` installs it).

``TINY_UPDATE_SCREENSHOT=1`` saves the screenshots at both widths to images/dashboard.png
and images/dashboard-narrow.png for the README.
"""

from __future__ import annotations

import base64
import fcntl
import io
import json
import os
import random
import re
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests.support import ROOT, Server, record, sample_csv, second_day_csv
from tiny.analytics import charts, cpu

DAY = "2014-05-04"
OTHER = "2014-05-06"  # second_day_csv: every third row of DAY
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)"),
    pytest.mark.timeout(120),
]
_BROWSER_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--hide-scrollbars",
    "--window-size=1400,1800",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--mute-audio",
)
VIEWS = ("summary", "traffic", "whales", "hourly", "table", "detail")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data = tmp_path_factory.mktemp("dashboard") / "data"
    data.mkdir()
    (data / f"{DAY}.csv").write_bytes(sample_csv())
    (data / f"{OTHER}.csv").write_bytes(second_day_csv())
    with Server(data, processes=2) as running:
        yield running


@pytest.fixture(scope="module")
def whales(server: Server) -> list[dict[str, Any]]:
    """The top 8, as the API (tested against an independent count in test_api.py) gives them:
    asked again after each 503's Retry-After while the cold store counts (10 s a query)."""
    deadline = time.monotonic() + 120
    response = server.request("GET", f"/api/days/{DAY}/whales?top=8", timeout=60)
    while response.status == 503 and time.monotonic() < deadline:
        time.sleep(float(response.headers["retry-after"]))
        response = server.request("GET", f"/api/days/{DAY}/whales?top=8", timeout=60)
    assert response.status == 200, response.body
    return list(response.json()["whales"])


def run_chromium(profile: Path, *args: str, timeout: float = 45.0) -> subprocess.CompletedProcess[bytes]:
    assert CHROMIUM is not None
    command = [CHROMIUM, *_BROWSER_FLAGS, f"--user-data-dir={profile}", *args]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        _kill_group(proc)
    return subprocess.CompletedProcess(command, proc.returncode, out, b"")


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    """Chromium's zygote and renderers are in its session: none may outlive the test."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)


class _Dom(HTMLParser):
    """The few things the test reads off a dumped DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: dict[str, str] = {}
        self._open: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        self.elements.append((tag, values))
        self._open = values.get("id")

    def handle_data(self, data: str) -> None:
        if self._open:
            self.text[self._open] = self.text.get(self._open, "") + data

    def find(self, tag: str, **attrs: str) -> list[dict[str, str]]:
        return [a for t, a in self.elements if t == tag and all(a.get(k) == v for k, v in attrs.items())]


def test_views_are_drawn_after_the_scripts_ran(server: Server, whales: list[dict[str, Any]], tmp_path: Path) -> None:
    """--dump-dom: the whale table, the four charts (loaded from blob: URLs, each of the day
    asked for), the detail view of the whale named in the URL, the value boxes."""
    second = whales[1]
    url = f"http://127.0.0.1:{server.port}/#day={DAY}&top=8&ip={second['ip_id']}"
    result = run_chromium(tmp_path / "profile", "--virtual-time-budget=30000", "--dump-dom", url)
    dom = _Dom()
    dom.feed(result.stdout.decode())
    assert dom.find("body", **{"data-ready": "1", "data-day": DAY}), "not loaded:\n" + result.stdout.decode()[-2000:]
    rows = [a["data-ip-id"] for t, a in dom.elements if t == "tr" and "data-ip-id" in a]
    assert rows == [str(w["ip_id"]) for w in whales]
    assert dom.find("tr", **{"data-ip-id": str(second["ip_id"]), "class": "selected"})
    images = [a for t, a in dom.elements if t == "img" and "chart" in a.get("class", "")]
    assert len(images) == 4 and all(a["data-day"] == DAY for a in images)
    assert all(a["src"].startswith(f"blob:http://127.0.0.1:{server.port}/") for a in images)
    for view in VIEWS:
        assert dom.find("section", id=f"view-{view}", **{"data-state": "ready", "data-day": DAY})
    assert dom.find("section", id="view-detail", **{"data-ip-id": str(second["ip_id"])})
    assert dom.text["detail-title"].startswith(f"{second['name']} ({second['country']}), ip_id {second['ip_id']}: ")
    assert dom.text["downloads"] == "77,107" and dom.text["downloaders"] == "7,469"
    assert "top 8" in dom.text["share-label"]


class DevTools:
    """A minimal Chrome DevTools Protocol client over --remote-debugging-pipe (fds 3 and 4)."""

    def __init__(self, profile: Path) -> None:
        assert CHROMIUM is not None
        to_browser, self._to_browser = os.pipe()
        self._from_browser, from_browser = os.pipe()

        def wire() -> None:  # in the child: the browser reads commands on fd 3, writes on fd 4
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser, from_browser)]
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, *_BROWSER_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=wire,
            pass_fds=(3, 4),
        )
        os.close(to_browser)
        os.close(from_browser)
        self._buffer = b""
        self._next_id = 0
        self.session = ""

    def call(self, method: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if self.session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._from_browser], [], [], max(left, 0))
            if not ready:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise EOFError("chromium closed the pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return dict(json.loads(message))

    def open(self, url: str, width: int = 1400, height: int = 1800) -> None:
        """A new tab of ``width`` x ``height`` CSS pixels, at ``url``."""
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str, timeout: float = 30.0) -> Any:
        result = self.call("Runtime.evaluate", timeout, expression=expression, awaitPromise=True, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def wait_for(self, condition: str, timeout: float = 30.0) -> None:
        waited = f"""new Promise((done, fail) => {{
            const until = Date.now() + {int(timeout * 1000)};
            const holds = () => {{ try {{ return {condition}; }} catch (error) {{ return false; }} }};
            const poll = () => holds() ? done(true) : Date.now() > until ? fail(new Error("timeout")) :
                setTimeout(poll, 50);
            poll(); }})"""
        deadline = time.monotonic() + timeout
        while True:
            try:
                assert self.evaluate(waited, timeout + 5) is True
                return
            except RuntimeError as exc:  # the page navigated away under the evaluation: try again
                if "context" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def click(self, selector: str) -> None:
        """A real mouse click (press and release) in the middle of the element."""
        box = self.evaluate(f"""(() => {{ const el = document.querySelector({json.dumps(selector)});
            el.scrollIntoView({{block: "center"}}); const r = el.getBoundingClientRect();
            return [r.x + r.width / 2, r.y + r.height / 2]; }})()""")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    def choose(self, day: str | None = None, top: int | None = None) -> None:
        """Choose a day and/or N as a person does: the control's value, then its change event."""
        for control, value in (("day", day), ("top", top)):
            if value is not None:
                self.evaluate(f"""(() => {{ const el = document.getElementById("{control}");
                    el.value = {json.dumps(str(value))}; el.dispatchEvent(new Event("change")); }})()""")

    def screenshot(self) -> bytes:
        """A PNG of the whole page, as tall as it is."""
        height = self.evaluate("document.documentElement.scrollHeight")
        width = self.evaluate("window.innerWidth")
        clip = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True, clip=clip)
        return base64.b64decode(shot["data"])

    def close(self) -> None:
        _kill_group(self.proc)
        os.close(self._to_browser)
        os.close(self._from_browser)


# What every view shows, recorded by the page itself at each change of its DOM (a
# MutationObserver runs after the script that changed it, never halfway through a change):
# the day and N chosen in the controls, each view's state, day, caption and notes, the days
# its charts say they are of, the downloads box and the whales listed in the table.
_RECORDER = """(() => {
    window.__seen = [];
    let last = "";
    const text = (el) => el ? el.textContent : null;
    const record = () => {
        const views = {};
        for (const v of document.querySelectorAll("section.view")) {
            views[v.dataset.view] = {
                state: v.dataset.state, day: v.dataset.day, top: v.dataset.top, tag: text(v.querySelector(".tag")),
                note: text(v.querySelector(".note")), charts: [...v.querySelectorAll("img")].map((i) => i.dataset.day),
            };
        }
        const seen = JSON.stringify({
            day: document.getElementById("day").value, top: document.getElementById("top").value,
            status: text(document.getElementById("status")), downloads: text(document.getElementById("downloads")),
            whales: [...document.querySelectorAll("#whales tbody tr")].map((r) => r.cells[1].textContent),
            views,
        });
        if (seen !== last && window.__seen.length < 50000) { window.__seen.push(seen); last = seen; }
    };
    const all = { subtree: true, childList: true, attributes: true, characterData: true };
    new MutationObserver(record).observe(document.body, all);
    record();
})()"""


class Truth:
    """What the API says each (day, N) is: its downloads and its whales' names, from the server."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self._known: dict[tuple[str, str], tuple[str, list[str]]] = {}

    def of(self, day: str, top: str) -> tuple[str, list[str]]:
        if (day, top) not in self._known:
            summary = self.server.request("GET", f"/api/days/{day}/summary?top={top}", timeout=60).json()
            listed = self.server.request("GET", f"/api/days/{day}/whales?top={top}", timeout=60).json()
            self._known[day, top] = (f"{summary['downloads']:,}", [w["name"] for w in listed["whales"]])
        return self._known[day, top]


def held_to_the_choice(seen: list[dict[str, Any]], truth: Truth) -> list[str]:
    """Every moment at which some view showed anything of a day or N other than the one chosen."""
    wrong = []
    for n, moment in enumerate(seen):
        day, top = moment["day"], moment["top"]
        downloads, names = truth.of(day, top)
        if moment["downloads"] not in ("–", downloads):
            wrong.append(f"{n}: downloads {moment['downloads']} on {day} top {top}")
        if moment["whales"] and moment["whales"] != names:
            wrong.append(f"{n}: whales {moment['whales'][:3]}... on {day} top {top}")
        for name, view in moment["views"].items():
            if view["day"] != day or view["tag"] != day or any(chart != day for chart in view["charts"]):
                wrong.append(
                    f"{n}: view {name} of {view['day']} captioned {view['tag']}, charts {view['charts']}, on {day}"
                )
            if view["state"] == "ready" and view["top"] != top:
                wrong.append(f"{n}: view {name} of top {view['top']} on top {top}")
    return wrong


def test_clicking_a_whale_shows_its_detail_view(server: Server, whales: list[dict[str, Any]], tmp_path: Path) -> None:
    browser = DevTools(tmp_path / "profile")
    try:
        browser.open(f"http://127.0.0.1:{server.port}/#day={DAY}&top=8")
        browser.wait_for('document.body.dataset.ready === "1"')
        first, third = whales[0], whales[2]
        assert browser.evaluate('document.getElementById("view-detail").dataset.ipId') == str(first["ip_id"])
        browser.click(f'#whales tr[data-ip-id="{third["ip_id"]}"]')
        browser.wait_for(
            f'document.getElementById("view-detail").dataset.ipId === "{third["ip_id"]}"'
            ' && document.getElementById("view-detail").dataset.state === "ready"'
        )
        title = browser.evaluate('document.getElementById("detail-title").textContent')
        assert title.startswith(f"{third['name']} ({third['country']}), ip_id {third['ip_id']}: ")
        selected = browser.evaluate('[...document.querySelectorAll("#whales tr.selected")].map(r => r.dataset.ipId)')
        assert selected == [str(third["ip_id"])]
        rows = browser.evaluate('document.querySelectorAll("#downloads-table tbody tr").length')
        assert rows == min(500, third["downloads"])
        assert re.search(rf"ip={third['ip_id']}\b", browser.evaluate("location.hash"))
        chart = browser.evaluate(
            '[...document.querySelectorAll("#chart-detail img")].map(i => [i.naturalWidth, i.dataset.day])'
        )
        assert len(chart) == 1 and chart[0][0] > 300 and chart[0][1] == DAY, "the detail chart of that day was drawn"
    finally:
        browser.close()


@pytest.mark.hardening("around 5: the dashboard showed the wrong whale for an ip_id past 2^53")
def test_ip_ids_past_2_to_the_53_are_shown_and_followed_exactly(server: Server, tmp_path: Path) -> None:
    """2^53+1 and 2^53+3 are no JavaScript numbers (they round to 2^53 and 2^53+4): the page
    keeps ip_ids as strings, so it shows and asks for the right whales."""
    top, second = 2**53 + 1, 2**53 + 3
    rows = [(top, n) for n in range(3)] + [(second, n) for n in range(2)]
    body = "\n".join(
        json.dumps({"date": "2014-06-03", "time": f"10:0{n}:00", "size": 1, "package": "p", "ip_id": ip})
        for ip, n in rows
    )
    assert server.request("POST", "/ingest", body.encode()).status == 200
    browser = DevTools(tmp_path / "profile")
    try:
        browser.open(f"http://127.0.0.1:{server.port}/#day=2014-06-03&top=2")
        browser.wait_for('document.body.dataset.ready === "1"')
        shown = browser.evaluate('[...document.querySelectorAll("#whales tbody tr")].map(r => r.cells[3].textContent)')
        assert shown == [str(top), str(second)]
        assert browser.evaluate('document.getElementById("view-detail").dataset.ipId') == str(top)
        browser.click(f'#whales tr[data-ip-id="{second}"]')
        browser.wait_for(f'document.getElementById("view-detail").dataset.ipId === "{second}"')
        browser.wait_for('document.querySelectorAll("#downloads-table tbody tr").length === 2')
        assert f"ip_id {second}: 2 downloads" in browser.evaluate('document.getElementById("detail-title").textContent')
    finally:
        browser.close()


def test_switching_days_and_n_quickly_never_shows_another_choices_data(server: Server, tmp_path: Path) -> None:
    """Days and N chosen faster than their answers come (0-0.3 s apart, 32 times): at no
    moment does any view show, or caption, a day or N other than the one chosen, and the
    page ends on the last choice's numbers."""
    rng = random.Random(43)
    choices = [(day, top) for day in (DAY, OTHER) for top in (1, 6, 20, 100)]
    browser = DevTools(tmp_path / "profile")
    try:
        browser.open(f"http://127.0.0.1:{server.port}/#day={DAY}&top=6")
        browser.wait_for(f'document.body.dataset.day === "{DAY}"')  # the days are listed, the first choice made
        browser.evaluate(_RECORDER)
        for _ in range(2):
            for _ in range(16):
                day, top = rng.choice(choices)
                browser.choose(day=day, top=top)
                time.sleep(rng.uniform(0.0, 0.3))
            browser.wait_for('document.body.dataset.ready === "1"', 90)
        seen = [json.loads(moment) for moment in browser.evaluate("window.__seen")]
        superseded = browser.evaluate("Number(document.body.dataset.aborted) + Number(document.body.dataset.discarded)")
        final = seen[-1]
    finally:
        browser.close()
    assert superseded > 0, "no answer was still on its way when the choice changed: no race was run"
    assert len(seen) > 100
    assert held_to_the_choice(seen, Truth(server)) == []
    downloads, names = Truth(server).of(final["day"], final["top"])
    assert final["downloads"] == downloads and final["whales"] == names
    assert all(view["state"] == "ready" for view in final["views"].values())


_GROUP = re.compile(r"analytics CPU: cgroup (v1|v2) (\S+): ([0-9.]+) CPU")


def _analytics_group(server: Server) -> tuple[str, Path]:
    """The cgroup version and group of ``server``'s analytics quota, as its start logged them."""
    found = _GROUP.search(server.log())
    assert found, "no CPU quota here: counting would not take seconds"
    return found.group(1), Path(found.group(2))


def _analytics_quota(server: Server, cpus: float) -> None:
    """Set the CPU quota of ``server``'s analytics group to ``cpus``, as a machine that many
    times slower (or faster) would count."""
    version, group = _analytics_group(server)
    cpu.set_quota(group, version, cpus)


def _throttled(server: Server) -> int:
    """How many periods the kernel has held ``server``'s analytics group to its quota."""
    _, group = _analytics_group(server)
    stat = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines())
    return int(stat.get("nr_throttled", 0))


@pytest.mark.timeout(300)
def test_a_day_still_counting_is_asked_again_and_shown_once_counted(tmp_path: Path) -> None:
    """A cold store and a CPU quota of 0.01 until the first 503, a whole CPU after it: the day's
    first answers are 503s that say how much is left to count. The page shows that in each view ("counting
    <day>, N left"), asks again after the Retry-After, never shows the day seen before
    meanwhile, and ends on the chosen day's true numbers."""
    data = tmp_path / "data"
    data.mkdir()
    rows = sample_csv().split(b"\n", 1)[1]
    # Eight times the real day's rows (52 MB), counted at 0.01 CPU until the first 503: a fast
    # machine counted 19.5 MB within the 10 s deadline at 0.05, and answered no first 503.
    (data / f"{DAY}.csv").write_bytes(sample_csv() + 7 * rows)
    first_503 = re.compile(rf"503 GET /api/days/{DAY}/\S+: the aggregates of {DAY} are catching up")
    with Server(data, "--analytics-cpu", "0.05", processes=2) as server:
        small = "\n".join(json.dumps(record(date="2014-05-05", ip_id=n % 3 + 1)) for n in range(20))
        assert server.ingest(small.encode()).status == 200
        browser = DevTools(tmp_path / "profile")
        try:
            browser.open(f"http://127.0.0.1:{server.port}/#day=2014-05-05&top=6")
            browser.wait_for('document.body.dataset.ready === "1"', 90)
            browser.evaluate(_RECORDER)
            _analytics_quota(server, 0.01)
            try:
                browser.choose(day=DAY)
                deadline = time.monotonic() + 60
                while not first_503.search(server.log()) and time.monotonic() < deadline:
                    time.sleep(0.1)
            finally:
                # The rest is counted in seconds, not the minute that the server's 0.05 takes:
                # what the page does while a day counts is shown; how long it counts is not.
                _analytics_quota(server, 1.0)
            browser.wait_for('document.body.dataset.ready === "1"', 240)
            seen = [json.loads(moment) for moment in browser.evaluate("window.__seen")]
            retries = int(browser.evaluate("document.body.dataset.retries"))
        finally:
            browser.close()
        assert _throttled(server) > 0, "the quota held nothing back: counting did not take seconds"
        assert first_503.search(server.log()), server.log()[-6000:]
        truth = Truth(server)
        assert truth.of(DAY, "6")[0] == f"{8 * 77_107:,}"
        assert held_to_the_choice(seen, truth) == []
    counting = re.compile(
        rf"counting {DAY}, [\d,.]+ (rows|bytes|[kMGT]?B) left; (asking again in \d+ s|asked again) \(try \d+\)"
    )
    notes = {view["note"] for moment in seen for view in moment["views"].values() if view["state"] == "counting"}
    assert notes and all(counting.fullmatch(note) for note in notes), notes
    assert any(counting.fullmatch(moment["status"]) for moment in seen), "the header says so too"
    assert retries >= 1
    assert seen[-1]["downloads"] == f"{8 * 77_107:,}" and seen[-1]["day"] == DAY


_LAYOUT = """(() => {
    const width = window.innerWidth;
    const described = (el) => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") + "." + el.className;
    const visible = [...document.querySelectorAll("body *")].filter((el) => el.getBoundingClientRect().width > 0);
    const heights = (el) => [el.clientHeight, el.scrollHeight];
    const direct = (el) => [...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
    return {
        width, height: document.documentElement.scrollHeight, scrollWidth: document.documentElement.scrollWidth,
        wider: visible.filter((el) => {
            const r = el.getBoundingClientRect();
            return r.left < -0.5 || r.right > width + 0.5;
        }).map(described),
        smallest: Math.min(...visible.filter(direct).map((el) => parseFloat(getComputedStyle(el).fontSize))),
        views: [...document.querySelectorAll("section.view")].map((v) => ({
            view: v.dataset.view, day: v.dataset.day, state: v.dataset.state,
            tag: v.querySelector(".tag").textContent,
            tagShown: v.querySelector(".tag").getBoundingClientRect().width > 0,
        })),
        charts: [...document.querySelectorAll("img.chart")].map((i) => ({
            day: i.dataset.day, shown: i.getBoundingClientRect().width,
        })),
        table: heights(document.querySelector("#view-table .scroll")),
        hourly: heights(document.querySelector("#view-hourly .body")),
    };
})()"""


@pytest.mark.parametrize(
    ("width", "tallest", "shot"),
    [(1280, 2600, "dashboard.png"), (420, 3600, "dashboard-narrow.png")],
)
def test_the_page_of_100_whales_fits_the_width_in_a_bounded_height(
    server: Server, tmp_path: Path, width: int, tallest: int, shot: str
) -> None:
    """At a desktop's 1280 px and a phone's 420 px, N = 100 (the page was 8,587 px tall with
    the chart and table repeating each other): no element is wider than the window, the
    page's height is bounded (the table and the heatmap scroll within their views), every
    view is captioned with the chosen day, and no text is smaller than 9 px (a chart's
    smallest text is SMALL_TEXT units of its WIDTH, scaled to the view)."""
    browser = DevTools(tmp_path / "profile")
    try:
        browser.open(f"http://127.0.0.1:{server.port}/#day={DAY}&top=100", width=width, height=900)
        browser.wait_for('document.body.dataset.ready === "1"', 90)
        layout = browser.evaluate(_LAYOUT)
        browser.choose(top=10)
        browser.wait_for('document.body.dataset.ready === "1" && document.body.dataset.top === "10"', 60)
        png = browser.screenshot()
    finally:
        browser.close()
    assert layout["width"] == width and layout["scrollWidth"] == width and layout["wider"] == []
    assert layout["height"] <= tallest, layout["height"]
    assert [(v["view"], v["day"], v["state"], v["tag"], v["tagShown"]) for v in layout["views"]] == [
        (view, DAY, "ready", DAY, True) for view in VIEWS
    ]
    assert len(layout["charts"]) == 4 and {c["day"] for c in layout["charts"]} == {DAY}
    assert min(c["shown"] for c in layout["charts"]) / charts.WIDTH * charts.SMALL_TEXT >= 9
    assert layout["smallest"] >= 11
    assert layout["table"][0] < layout["table"][1], "the 100 whales scroll within the table's view"
    assert layout["hourly"][0] < layout["hourly"][1], "the heatmap of 100 whales scrolls within its view"
    image = Image.open(io.BytesIO(png))
    assert image.width == width and image.height >= 900
    if os.environ.get("TINY_UPDATE_SCREENSHOT") == "1":
        small = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        small.save(ROOT / "images" / shot, optimize=True)

"""The dashboard in a real browser: Debian's headless Chromium against a real server with the sample day.

Two ways in: the command line (``--dump-dom`` after the page's scripts ran, ``--screenshot``),
and the DevTools protocol over ``--remote-debugging-pipe`` to click a whale like a person
would (a mouse press and release at the row) and see its detail view appear. Skipped, with
the reason, when chromium is not installed (``make sysdeps`` installs it).

``TINY_UPDATE_SCREENSHOT=1`` copies the screenshot to images/dashboard.png for the README.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
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

from tests.support import ROOT, Server, sample_csv

DAY = "2014-05-04"
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


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data = tmp_path_factory.mktemp("dashboard") / "data"
    data.mkdir()
    (data / f"{DAY}.csv").write_bytes(sample_csv())
    with Server(data, processes=2) as running:
        yield running


@pytest.fixture(scope="module")
def whales(server: Server) -> list[dict[str, Any]]:
    """The top 8, as the API (tested against an independent count in test_api.py) gives them."""
    response = server.request("GET", f"/api/days/{DAY}/whales?top=8")
    assert response.status == 200
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
    """--dump-dom: the whale table, the four charts (loaded from blob: URLs), the detail view of the
    whale named in the URL, the value boxes."""
    second = whales[1]
    url = f"http://127.0.0.1:{server.port}/#day={DAY}&top=8&ip={second['ip_id']}"
    result = run_chromium(tmp_path / "profile", "--virtual-time-budget=30000", "--dump-dom", url)
    dom = _Dom()
    dom.feed(result.stdout.decode())
    assert dom.find("body", **{"data-ready": "1"}), "not loaded:\n" + result.stdout.decode()[-2000:]
    rows = [a["data-ip-id"] for t, a in dom.elements if t == "tr" and "data-ip-id" in a]
    assert rows == [str(w["ip_id"]) for w in whales]
    assert dom.find("tr", **{"data-ip-id": str(second["ip_id"]), "class": "selected"})
    for view in ("traffic", "whales", "hourly", "detail"):
        (img,) = dom.find("img", id=f"chart-{view}")
        assert img["data-loaded"] == "1" and img["src"].startswith(f"blob:http://127.0.0.1:{server.port}/")
    assert dom.find("section", id="view-detail", **{"data-ip-id": str(second["ip_id"])})
    assert dom.text["detail-title"].startswith(f"{second['name']} ({second['country']}), ip_id {second['ip_id']}: ")
    assert dom.text["downloads"] == "77,107" and dom.text["downloaders"] == "7,469"
    assert "top 8" in dom.text["share-label"]


def test_screenshot_shows_the_dashboard(server: Server, tmp_path: Path) -> None:
    shot = tmp_path / "dashboard.png"
    url = f"http://127.0.0.1:{server.port}/#day={DAY}&top=8"
    run_chromium(tmp_path / "profile", "--virtual-time-budget=30000", f"--screenshot={shot}", url)
    png = shot.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (1400, 1800)
    assert len(png) > 100_000, "a page of charts compresses to more than a blank page"
    if os.environ.get("TINY_UPDATE_SCREENSHOT") == "1":
        (ROOT / "images").mkdir(exist_ok=True)
        shutil.copyfile(shot, ROOT / "images" / "dashboard.png")


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

    def open(self, url: str) -> None:
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
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

    def close(self) -> None:
        _kill_group(self.proc)
        os.close(self._to_browser)
        os.close(self._from_browser)


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
            ' && document.getElementById("chart-detail").dataset.loaded === "1"'
        )
        title = browser.evaluate('document.getElementById("detail-title").textContent')
        assert title.startswith(f"{third['name']} ({third['country']}), ip_id {third['ip_id']}: ")
        selected = browser.evaluate('[...document.querySelectorAll("#whales tr.selected")].map(r => r.dataset.ipId)')
        assert selected == [str(third["ip_id"])]
        rows = browser.evaluate('document.querySelectorAll("#downloads-table tbody tr").length')
        assert rows == min(500, third["downloads"])
        assert re.search(rf"ip={third['ip_id']}\b", browser.evaluate("location.hash"))
        natural = browser.evaluate('document.getElementById("chart-detail").naturalWidth')
        assert natural > 300, "the detail chart was drawn"
        png = base64.b64decode(browser.call("Page.captureScreenshot", format="png")["data"])
        (tmp_path / "clicked.png").write_bytes(png)
        assert png.startswith(b"\x89PNG")
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
        shown = browser.evaluate('[...document.querySelectorAll("#whales tbody tr")].map(r => r.cells[2].textContent)')
        assert shown == [str(top), str(second)]
        assert browser.evaluate('document.getElementById("view-detail").dataset.ipId') == str(top)
        browser.click(f'#whales tr[data-ip-id="{second}"]')
        browser.wait_for(f'document.getElementById("view-detail").dataset.ipId === "{second}"')
        browser.wait_for('document.querySelectorAll("#downloads-table tbody tr").length === 2')
        assert f"ip_id {second}: 2 downloads" in browser.evaluate('document.getElementById("detail-title").textContent')
    finally:
        browser.close()

"""/healthz and /metrics (tiny.handlers.status): what they report, on the in-process server."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import orjson
import pytest

from tiny.testing import InProcessServer


@pytest.mark.hardening("third 12: analytics pool jobs had no time bound")
def test_healthz_names_a_stuck_analytics_job_and_its_replacement_and_stays_200(tmp_path: Path) -> None:
    """A pool process stopped in its job: /healthz says so (ingest is fine: still 200), then
    that the pool was killed and replaced; before, it said nothing while every query hung."""
    with InProcessServer(tmp_path / "data") as server:
        analytics = server.deps.analytics
        analytics.job_seconds = 2.0
        pid = server.call(lambda: analytics.call(("pid",), os.getpid))
        nap = asyncio.run_coroutine_threadsafe(analytics.call(("nap",), time.sleep, 1.0, what="a nap"), server._loop)
        time.sleep(0.3)  # the nap is running
        os.kill(pid, signal.SIGSTOP)
        seen = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            answer = server.request("GET", "/healthz")
            assert answer.status == 200, answer.body
            seen.append(orjson.loads(answer.body).get("analytics", ""))
            if "killed and replaced" in seen[-1]:
                break
            time.sleep(0.2)
        with pytest.raises(Exception, match="deadline"):
            nap.result(5)
    assert any("an analytics job (a nap) has run for" in reason for reason in seen), seen
    assert "a nap" in seen[-1] and "killed and replaced" in seen[-1], seen

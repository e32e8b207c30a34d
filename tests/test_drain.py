"""The drain state of a worker (tiny.drain.Drain): Connection: close, a grace, the requests in flight."""

from __future__ import annotations

import asyncio
import time

from tiny.drain import GRACE_SECONDS, Drain


def test_answers_close_their_connection_once_draining_begins() -> None:
    drain = Drain()
    assert not drain.closes_connection() and not drain.draining
    drain.begin()
    assert drain.closes_connection() and drain.draining


def test_settle_serves_on_for_the_grace_when_nothing_is_in_flight() -> None:
    drain = Drain()
    started = time.monotonic()
    assert asyncio.run(drain.settle(timeout=10)) == 0
    assert GRACE_SECONDS <= time.monotonic() - started < GRACE_SECONDS + 0.5


def test_settle_waits_for_the_requests_in_flight() -> None:
    async def go() -> tuple[int, float]:
        drain = Drain()
        drain.in_flight = 1
        asyncio.get_running_loop().call_later(GRACE_SECONDS + 0.3, lambda: setattr(drain, "in_flight", 0))
        started = time.monotonic()
        left = await drain.settle(timeout=10)
        return left, time.monotonic() - started

    left, took = asyncio.run(go())
    assert left == 0 and took >= GRACE_SECONDS + 0.3


def test_settle_gives_up_at_its_timeout_and_says_how_many_are_left() -> None:
    drain = Drain()
    drain.in_flight = 2
    started = time.monotonic()
    assert asyncio.run(drain.settle(timeout=0.4)) == 2
    assert time.monotonic() - started < 1.0  # the grace is at most half the timeout

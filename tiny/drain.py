"""Draining: a worker's graceful shutdown, and the one rule for ``Connection: close`` it implies.

Shutdown (SIGTERM, SIGINT, or the parent process gone; driven by :mod:`tiny.worker`):
:meth:`Drain.begin` turns /healthz 503 and every answer from then on says ``Connection:
close`` (a proxy or client should reconnect, to another instance); the listening socket stops
accepting; requests on connections already open are still served for a short grace;
:meth:`Drain.settle` waits for the ingest requests in flight (up to ``drain_timeout``), then
the worker flushes its sink and closes every connection.
"""

from __future__ import annotations

import asyncio
import time

from tiny.limits import DRAIN_GRACE as GRACE_SECONDS  # requests on open connections are served this long


class Drain:
    """The drain state of one worker process, shared by all its handlers."""

    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0  # ingest requests between prepare() and their answer or disconnect

    def begin(self) -> None:
        """Start draining: /healthz answers 503, and every answer closes its connection."""
        self.draining = True

    def closes_connection(self) -> bool:
        """Whether an answer sent now must say ``Connection: close``."""
        return self.draining

    async def settle(self, timeout: float) -> int:
        """Serve on for the grace (at most half of ``timeout``) and until no ingest request is
        in flight, for at most ``timeout`` seconds; returns the requests still in flight."""
        started = time.monotonic()
        deadline = started + timeout
        grace_end = started + min(GRACE_SECONDS, timeout / 2)
        while (self.in_flight or time.monotonic() < grace_end) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return self.in_flight

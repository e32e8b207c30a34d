"""The operator's endpoints: ``GET /healthz`` and ``GET /metrics``, and the JSON 404 for any other path."""

from __future__ import annotations

import os
import time

import orjson

from tiny import codec, metrics
from tiny.handlers.base import APIError, JSONHandler
from tiny.protocol import clipped


class HealthHandler(JSONHandler):
    """``GET /healthz``: 200 ``{"status": "ok", "instance": ...}``; 503 with ``"status":
    "draining"`` while shutting down, or ``"failing"`` and the ``reason`` while writes fail or
    wait (the journal refused, the flush lock held by another process for over a second,
    whether or not a request of this worker waits for it, the last flush failed): whatever
    would make a POST answer 503 now. Never blocks the event loop (tiny.sink ``trouble``).

    Cluster mode adds ``"cluster"``: this host's role and follower name, the position its
    files hold (``applied``), the log's head its follower last saw, the lag (positions, and
    seconds behind); and 503 also when this host cannot serve its role: an ingest host that
    reaches no primary (its last flush, or a probe of the way in, failed), or a host whose
    follower cannot follow (not running, stuck in one operation, or an error it has had for
    a second: no primary, the log trimmed past it, a disk that refuses its files).

    ``"analytics"`` names what makes the reads that need the analytics pool wait or fail now or
    lately (a job past half its deadline, a pool killed and replaced for a stuck job): reported,
    not a 503, since ingest is not affected and a balancer must not take this instance out."""

    name = "healthz"

    def get(self) -> None:
        draining = self.deps.drain.draining
        self.deps.sink.probe()  # a fault that went away clears without a request (tried once a second)
        trouble = self.deps.sink.trouble()
        cluster = self._cluster()
        if cluster is not None and not trouble and cluster["follower"] != "ok":
            trouble = str(cluster["follower"])
        status = "draining" if draining else "failing" if trouble else "ok"
        if status != "ok":
            self.set_status(503)
        self.finish(
            orjson.dumps(
                {
                    "status": status,
                    **({"reason": trouble} if trouble else {}),
                    "instance": self.deps.instance,
                    "pid": os.getpid(),
                    "codec": codec.CODEC,
                    "codec_build": codec.build_id(),
                    "durability": self.config.durability,
                    "backlog_bytes": self.deps.sink.backlog,
                    "uptime_seconds": round(time.monotonic() - self.deps.started, 3),
                    **({"cluster": cluster} if cluster is not None else {}),
                    **({"analytics": analytics} if (analytics := self.deps.analytics.trouble()) else {}),
                }
            )
        )

    def _cluster(self) -> dict[str, object] | None:
        positions = self.deps.positions
        if positions is None:
            return None
        progress = positions.status.progress()
        return {
            "role": self.config.role,
            "host_name": self.config.follower_name(),
            "applied": progress.applied,
            "head": progress.head,
            "lag": progress.lag(),
            "lag_seconds": round(progress.lag_seconds(), 3),
            "follower": positions.status.trouble(positions.busy_bound) or "ok",
        }


class MetricsHandler(JSONHandler):
    """``GET /metrics``: Prometheus text format, summed over all worker processes."""

    name = "metrics"

    def get(self) -> None:
        self.set_header("Content-Type", metrics.CONTENT_TYPE)
        self.finish(metrics.render())


class NotFoundHandler(JSONHandler):
    """Any other path: 404 in the JSON error shape."""

    def prepare(self) -> None:
        super().prepare()
        raise APIError(404, f"no such endpoint: {clipped(self.request.path)}")

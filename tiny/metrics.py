"""Prometheus metrics, summed over every worker process of one server.

prometheus-client's multiprocess mode: each process writes its values to mmap files in one
directory, and a scrape merges all files. :func:`setup` turns it on explicitly, before any
:class:`Metrics` is built (tiny.prefork.serve calls it first): it sets the value class
prometheus-client would otherwise pick from ``PROMETHEUS_MULTIPROC_DIR`` when first
imported, so the order of imports does not matter.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess, values
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
PARSERS = ("fast", "tornado")  # what read a request's head: tiny.fasthead, or Tornado's HTTP1Connection
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


_pid = os.getpid()


def _process() -> int:
    return _pid


def _forked() -> None:
    global _pid
    _pid = os.getpid()


def setup(directory: str) -> None:
    """Keep this process's metrics, and those of the processes it forks, in ``directory``
    (the multiprocess mode); a scrape (:func:`render`) merges them.

    The values know their process by a pid kept up to date at fork (os.register_at_fork),
    not by asking the kernel at every increment (prometheus-client's default: a getpid(2) per
    value written, six per request)."""
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory  # read by the collector and mark_process_dead
    if values.ValueClass is not None and getattr(setup, "done", False):
        return
    setup.done = True  # type: ignore[attr-defined]
    os.register_at_fork(after_in_child=_forked)
    _forked()
    values.ValueClass = values.MultiProcessValue(process_identifier=_process)


class Metrics:
    """The server's metrics; one instance per worker process, built after the fork."""

    def __init__(self) -> None:
        # registry=None: the values live in the multiprocess files, a scrape builds its own
        # registry (prometheus-client's documented pattern), so nothing is registered here.
        self.requests = Counter(
            "tiny_requests", "HTTP requests answered, by handler and status", ["handler", "status"], registry=None
        )
        self.records = Counter("tiny_records", "Ingested lines, by result", ["result"], registry=None)
        self.bytes_in = Counter("tiny_received_bytes", "Request body bytes received on /ingest", registry=None)
        self.request_seconds = Histogram(
            "tiny_request_duration_seconds",
            "Time to answer a request",
            ["handler"],
            buckets=_LATENCY_BUCKETS,
            registry=None,
        )
        self.flush_seconds = Histogram(
            "tiny_flush_duration_seconds",
            "Time of one group-commit flush to disk",
            buckets=_LATENCY_BUCKETS,
            registry=None,
        )
        self.flush_bytes = Counter("tiny_flushed_bytes", "Bytes written by flushes", registry=None)
        self.flush_errors = Counter("tiny_flush_errors", "Flushes the disk refused", registry=None)
        self.backlog = Gauge(
            "tiny_backlog_bytes", "Bytes accepted and not yet written", registry=None, multiprocess_mode="livesum"
        )
        self.connections = Gauge(
            "tiny_open_connections", "Open client connections", registry=None, multiprocess_mode="livesum"
        )
        self.replayed = Counter(
            "tiny_idempotent_replays", "Answers replayed for an Idempotency-Key already stored", registry=None
        )
        self.conflicts = Counter(
            "tiny_idempotency_conflicts",
            "Idempotency-Keys refused, by status (422: another body)",
            ["status"],
            registry=None,
        )
        self.keys_held = Gauge(
            "tiny_idempotency_keys",
            "Idempotency-Keys in the data dir's journal, as of this process's last commit with keys",
            registry=None,
            multiprocess_mode="max",
        )
        self.paced = Counter(
            "tiny_paced_reads",
            "Reads paced while ingest was busy (tiny.pacing), by outcome: waited for their turn, or refused (503)",
            ["outcome"],
            registry=None,
        )
        self.ingest_heads = Counter(
            "tiny_ingest_heads",
            "Requests to /ingest by the parser that read their head: fast (tiny.fasthead) or tornado (HTTP1Connection)",
            ["parser"],
            registry=None,
        )
        self.heads = {parser: self.ingest_heads.labels(parser) for parser in PARSERS}
        self.cluster_commits = Counter(
            "tiny_cluster_commits",
            "Cluster mode: flushes sent to the commit log, by outcome: written, unavailable (nothing kept), "
            "unknown (may or may not have been written), refused",
            ["outcome"],
            registry=None,
        )
        self._children: dict[tuple[str, int], tuple[Counter, Histogram]] = {}
        self.valid = self.records.labels("valid")
        self.invalid = self.records.labels("invalid")

    def observe_request(self, handler: str, status: int, seconds: float) -> None:
        """Count one answered request and its latency."""
        # .labels() hashes and locks on every call; the hot path reuses the children.
        children = self._children.get((handler, status))
        if children is None:
            children = (self.requests.labels(handler, str(status)), self.request_seconds.labels(handler))
            self._children[(handler, status)] = children
        children[0].inc()
        children[1].observe(seconds)

    def heads_read(self) -> dict[str, float]:
        """Requests to /ingest this process counted so far, by the parser that read their head
        (its samples of ``tiny_ingest_heads_total``)."""
        return {
            sample.labels["parser"]: sample.value
            for family in self.ingest_heads.collect()
            for sample in family.samples
            if sample.name.endswith("_total")
        }

    def observe_flush(self, seconds: float, nbytes: int, ok: bool) -> None:
        """Record one sink flush (the sink's ``on_flush`` callback)."""
        self.flush_seconds.observe(seconds)
        if ok:
            self.flush_bytes.inc(nbytes)
        else:
            self.flush_errors.inc()


class FollowerMetrics:
    """Cluster mode: the metrics of a host's follower (tiny.follower), one process per host.
    Its gauges are those of the live follower (a dead one's are dropped: tiny.prefork)."""

    def __init__(self) -> None:
        def gauge(name: str, text: str) -> Gauge:
            return Gauge(name, text, registry=None, multiprocess_mode="livemostrecent")

        self.applied = gauge("tiny_cluster_applied_position", "The log's position this host's files hold")
        self.head = gauge("tiny_cluster_head_position", "The newest position of the log the follower last saw")
        self.lag = gauge("tiny_cluster_lag_positions", "Positions this host is behind the head it last saw")
        self.lag_seconds = gauge("tiny_cluster_lag_seconds", "Seconds this host has been behind the log's head")
        self.batches = Counter(
            "tiny_cluster_applied_batches", "Batches of the log applied to this host's files", registry=None
        )
        self.bytes = Counter(
            "tiny_cluster_applied_bytes", "Bytes of the log appended to this host's files", registry=None
        )
        self.errors = Counter(
            "tiny_cluster_follower_errors", "Turns of the follower that failed (and were retried)", registry=None
        )
        self.name_clash = gauge(
            "tiny_cluster_follower_name_clash",
            "1: another host reports to the log under this host's --host-name (its follower saw a position it never "
            "reported); give each host its own",
        )

    def observe(self, applied: int, head: int, lag_seconds: float) -> None:
        self.applied.set(applied)
        self.head.set(head)
        self.lag.set(max(0, head - applied))
        self.lag_seconds.set(lag_seconds)


def render() -> bytes:
    """The Prometheus text exposition of every process's metrics, merged."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return generate_latest(registry)


def mark_dead(pid: int) -> None:
    """Drop a dead worker's live gauges (its counters keep counting in the sums)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.mark_process_dead(pid)

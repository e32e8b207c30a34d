"""One worker process: its sink, analytics and metrics, the Tornado app on a listening socket, and its shutdown.

At start the worker opens the data dir's journal; if it cannot (the parent opened it a moment
ago, so something changed since), it serves anyway and answers every write 503 with the
reason, trying the journal again at most once a second, until it works. While it runs, its
event loop writes its heartbeat (tiny.heartbeat) for the parent.

Shutdown (SIGTERM, SIGINT, or the parent process gone) follows :mod:`tiny.drain`: the
socket stops accepting, requests on connections already open are still served for a short
grace (answered with ``Connection: close``), requests in flight finish (up to
``drain_timeout``), the sink writes everything still pending within what is left of
``drain_timeout`` (at least a second), the analytics pool stops, connections close. Then
:func:`run_worker` returns 0, or 1 when some request could not be written (it was answered
503) or the sink thread hung in a flush (its requests get no answer; the process exits
without waiting for it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import sqlite3
import time
from pathlib import Path

from tiny import affinity, codec, descriptors, layout, limits
from tiny.aggregate_errors import Unavailable
from tiny.aggregates import Aggregates
from tiny.analytics.service import Analytics
from tiny.commit import CommitError, CommitPoint
from tiny.commit.local import LocalCommit
from tiny.config import Config
from tiny.drain import Drain
from tiny.follower_status import FollowerStatus, busy_bound
from tiny.handlers import ingest
from tiny.handlers.base import Deps, instance_name
from tiny.handlers.rules import IngestRules
from tiny.heartbeat import BEAT_SECONDS, Heartbeats
from tiny.httpserver import TinyHTTPServer
from tiny.live import Live, warm_job
from tiny.metrics import Metrics
from tiny.pacing import ReadPacer
from tiny.readwait import HeadReader, ReadWait
from tiny.routes import make_app
from tiny.sink import DailyFileSink

log = logging.getLogger("tiny.worker")
_PARENT_POLL_SECONDS = 0.5
_STUCK = -1  # _serve's code when the sink thread hung in a flush
_SYNC_WAIT = 2.0  # seconds a stopping worker waits for the aggregate store's write lock
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # SIGHUP: a terminal hung up


def run_worker(
    config: Config,
    sock: socket.socket,
    parent_pid: int | None = None,
    beat: tuple[Heartbeats, int] | None = None,
    follower: FollowerStatus | None = None,
    cpu: int | None = None,
) -> int:
    """Serve on ``sock`` until told to stop; returns the process exit code (0 = clean).

    ``parent_pid``: the supervising parent; when it goes away the worker shuts down
    instead of serving on as an orphan. ``beat``: the parent's heartbeat slots and this
    worker's index in them. ``follower``: cluster mode's follower status (tiny.follower_status).
    ``cpu``: the core the parent's plan pins this worker to (tiny.affinity; None: unpinned),
    first thing: every thread the worker starts shares it.
    """
    affinity.pin(cpu, beat[1] if beat is not None else 0)
    # A write past RLIMIT_FSIZE must fail with EFBIG (-> 503), not kill the worker.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    code = asyncio.run(_serve(config, sock, parent_pid, beat, follower))
    if code == _STUCK:  # the sink thread cannot be joined: leave without the interpreter's exit
        logging.shutdown()
        os._exit(1)
    return code


def _sink(config: Config, metrics: Metrics) -> DailyFileSink:
    def on_flush(seconds: float, nbytes: int, ok: bool) -> None:
        metrics.observe_flush(seconds, nbytes, ok)
        metrics.backlog.set(sink.backlog)
        if journal is not None:
            metrics.keys_held.set(journal.key_count)

    journal: LocalCommit | None = None
    commit_point: CommitPoint
    if config.cluster:  # psycopg is imported in cluster mode only
        from tiny.commit.cluster import ClusterCommit

        outcomes = {
            name: metrics.cluster_commits.labels(name) for name in ("written", "unavailable", "unknown", "refused")
        }
        commit_point = ClusterCommit(
            config.data_dir,
            config.cluster,
            window=config.idempotency_window,
            max_keys=config.idempotency_max_keys,
            wait_bound=config.lock_timeout,
            on_outcome=lambda outcome: outcomes[outcome].inc(),
        )
    else:
        commit_point = journal = LocalCommit.from_config(
            config, headers={layout.DAY_SUFFIX: layout.HEADER}, crash_at=config.crash_at
        )
    sink = DailyFileSink(
        commit_point,
        max_backlog=config.max_backlog,
        max_files=descriptors.sink_files(config),
        on_flush=on_flush,
        idle_probes=not config.cluster,
    )
    return sink


def _positions(config: Config, follower: FollowerStatus | None) -> ReadWait | None:
    """Cluster mode: the reads' wait for this host's follower (``follower``: its status, shared
    by the parent; a new, unwritten one when there is none: every read then says so)."""
    if not config.cluster:
        return None
    status = follower if follower is not None else FollowerStatus()
    return ReadWait(status, HeadReader(config.cluster), config.read_wait, busy_bound(config.lock_timeout))


def make_deps(config: Config, port: int, follower: FollowerStatus | None = None) -> Deps:
    """Everything the handlers of one worker share, built from ``config``; the journal opened
    (or, when it cannot be, the sink starting faulty: every write then gets 503 until it can).
    ``follower``: cluster mode's follower status, which the parent shares."""
    metrics = Metrics()
    sink = _sink(config, metrics)
    try:
        sink.open()
    except CommitError as exc:
        log.error("the journal cannot be used (every write gets 503 until it can): %s", exc)
    analytics = Analytics.from_config(config)
    drain = Drain()
    return Deps(
        config=config,
        metrics=metrics,
        sink=sink,
        analytics=analytics,
        live=Live(config.data_dir, sink, analytics),
        drain=drain,
        pacer=ReadPacer(config.read_rate, lambda: drain.in_flight > 0, limits.READ_WAIT),
        rules=IngestRules(config.max_body, config.token),
        instance=instance_name(port),
        started=time.monotonic(),
        positions=_positions(config, follower),
    )


def make_server(deps: Deps) -> TinyHTTPServer:
    """The HTTP server of one worker over the app of ``deps`` (no socket yet: add_sockets)."""
    config = deps.config
    return TinyHTTPServer(
        make_app(deps),
        max_body_size=limits.MAX_OTHER_BODY,  # /ingest lifts it: its rules hold --max-body
        idle_connection_timeout=config.idle_timeout,  # also bounds the time to send headers
        body_timeout=config.body_timeout,
        max_header_size=limits.HEADER_READ_LIMIT,
        max_connections=config.max_connections or descriptors.connection_limit(config, descriptors.sink_files(config)),
        on_connections=deps.metrics.connections.set,
        ingest=functools.partial(ingest.route, deps),  # every request to /ingest, whichever parser reads it
        fast=config.lean,  # the fast head parser for the commonest POST /ingest
    )


def _reap_resource_tracker() -> None:
    """Stop and reap multiprocessing's resource tracker, the other child the analytics pool's
    queues gave this worker: left to exit with the worker, it stayed a zombie until an init
    reaped it (4 in supervisord's session after a shutdown). Only as the process leaves: the
    tracker serves every pool of the process."""
    from multiprocessing import resource_tracker

    # _stop: the tracker has no public way to stop; it closes its pipe, then waits for it.
    with contextlib.suppress(AttributeError, OSError):
        resource_tracker._resource_tracker._stop()  # type: ignore[attr-defined]


async def _serve(
    config: Config,
    sock: socket.socket,
    parent_pid: int | None,
    beat: tuple[Heartbeats, int] | None,
    follower: FollowerStatus | None,
) -> int:
    if config.crash_at.startswith("worker-start"):  # the crash tests' worker that dies as it starts
        os.kill(os.getpid(), signal.SIGKILL)
    loop = asyncio.get_running_loop()
    deps = make_deps(config, sock.getsockname()[1], follower)
    sink, drain = deps.sink, deps.drain
    server = make_server(deps)
    server.add_sockets([sock])
    deps.analytics.start(warm_job)  # the answers' pool process, so no query waits for it

    stop = asyncio.Event()
    for signum in _STOP_SIGNALS:
        loop.add_signal_handler(signum, stop.set)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)  # blocked by the parent across fork
    watcher = loop.create_task(_watch_parent(parent_pid, stop)) if parent_pid else None
    beater = loop.create_task(_beat(beat[0], beat[1], sink)) if beat else None
    log.info("worker %s ready (codec %s)", deps.instance, codec.CODEC)
    await stop.wait()

    started = time.monotonic()
    drain.begin()
    server.stop()  # stop accepting; the parent holds its copy of the socket, closed on its own stop
    # A proxy may still send a request on a keep-alive connection it opened before: it is
    # served (with "Connection: close") rather than cut off mid-send.
    left = await drain.settle(config.drain_timeout)
    if left:
        log.warning("%d requests still in flight after %.1f s; closing them", left, config.drain_timeout)
    failures = sink.failures
    written = await sink.close(max(1.0, config.drain_timeout - (time.monotonic() - started)))
    # Kept-alive connections closed now (a proxy retries a request it sends meanwhile on
    # another upstream; one that got through is refused by the closed sink: 503).
    try:
        await asyncio.wait_for(server.close_all_connections(), timeout=1.0)
    except TimeoutError:
        pass
    deps.analytics.close()  # its pool processes are gone: this worker writes the store no more
    if deps.positions is not None:
        deps.positions.close()
    await _sync_store(config.data_dir)
    _reap_resource_tracker()
    for task in (watcher, beater):
        if task is not None:
            task.cancel()
    took = time.monotonic() - started
    if sink.busy_since:
        log.error(
            "worker %s stopped after %.2f s; its disk thread hung in a flush, left unanswered", deps.instance, took
        )
        return _STUCK
    if not written:
        log.error(
            "worker %s stopped after %.2f s; %d request(s) could not be written while it stopped "
            "(each was answered 503; nothing of them was kept)",
            deps.instance,
            took,
            sink.failures - failures,
        )
        return 1
    log.info("worker %s stopped after %.2f s of draining", deps.instance, took)
    return 0


async def _sync_store(data_dir: Path) -> None:
    """The aggregate store on disk and marked so (tiny.unsynced), so that the next boot keeps
    it instead of counting the day files again; at most a few seconds, on a thread."""
    store = Aggregates(data_dir, busy_timeout=_SYNC_WAIT)
    try:
        if not await asyncio.to_thread(store.sync) and store.path.exists():
            log.warning("the aggregate store was busy for %.0f s: left unsynced (a reboot counts it again)", _SYNC_WAIT)
    except (OSError, sqlite3.Error, Unavailable) as exc:
        log.warning("the aggregate store could not be synced: %s (a reboot counts it again)", exc)
    finally:
        store.close()


async def _beat(heartbeats: Heartbeats, index: int, sink: DailyFileSink) -> None:
    while True:
        heartbeats.beat(index, sink.busy_since)
        await asyncio.sleep(BEAT_SECONDS)


async def _watch_parent(parent_pid: int, stop: asyncio.Event) -> None:
    while os.getppid() == parent_pid:
        await asyncio.sleep(_PARENT_POLL_SECONDS)
    log.warning("parent process %d is gone; shutting down", parent_pid)
    stop.set()

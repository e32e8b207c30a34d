"""A host's follower: the log's batches appended, in the log's order, to this host's own day files, exactly once.

Cluster mode (``--cluster``) runs one follower per host, on ingest and read hosts alike, as a
process of the server's parent (tiny.prefork starts it, restarts it when it dies, replaces it
when it stops beating or stays in one operation past its bound, and stops it with the
workers). One process, not a task of each worker: one reader of the log and one writer of the
files per host, whose stalls never hold a worker's event loop or sink thread, so ingest never
waits for it; it shares nothing with the workers but the data dir (under its flush lock) and
its status (tiny.follower_status).

What it does, over and over (:meth:`Follower.run`):

1. read the batches after its position (tiny.cluster.log ``read``: in order, gapless, and only
   those the synchronous standbys have, so no failover can take back what it wrote);
2. check every file name a batch holds: a day file or a rejects file (tiny.layout), in ASCII,
   at most :data:`MAX_BATCH_FILES` of them; anything else (the log is input too) stops it
   loudly, naming the position, and it writes nothing of that batch;
3. append them under the data dir's flush lock, a group of consecutive batches per flush
   (at most :data:`MAX_FLUSH_FILES` files and :data:`MAX_FLUSH_BYTES` bytes; a batch goes
   whole), with the pieces of the local journal (tiny.appender, tiny.intent): the intent
   records the files with their sizes and the positions before and after the group, the files
   are written (a new day file opened by its CSV header, written here: every host writes it
   the same way, so all hosts' files are byte-identical at any common position), and the
   intent's mark commits the bytes and the new position together. A crash anywhere before the
   mark is cut back by the next holder of the lock, and the position stays the one before;
   after it, the position is the new one: nothing is skipped or applied twice;
4. publish its position for this host's reads and /healthz, and report it to the log (at most
   once a second, and at least every :data:`SEEN_EVERY` s while it is unchanged, so that an idle
   host is still seen; tiny.cluster.retention keeps the batches until every follower seen within
   ``--follower-retention`` has applied them). A position the log held for its name that it
   never reported means another host reports under the same name: it logs an error and sets
   ``tiny_cluster_follower_name_clash`` to 1 until it restarts, and goes on (its host's reads
   and /healthz are unchanged: its files are right);
5. when there is nothing to read, look at the log's head (once a second), run a step of
   retention (every :data:`RETAIN_EVERY` s, on every host: its steps are harmless together),
   and wait for the log's NOTIFY (tiny.cluster.log ``CHANNEL``), or :data:`POLL` seconds.

A data dir the log no longer holds positions for (a host back after the log was trimmed past
it) cannot catch up from the log: the follower says which positions are missing and how to
copy a peer's data dir (docs/scaling-out.md), and waits. Errors (no primary, the disk) are
published with the position and retried every :data:`RETRY` seconds.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import psycopg

from tiny import layout
from tiny.appender import LockLost
from tiny.cluster.errors import ClusterError, LogTrimmed
from tiny.cluster.errors import Unavailable as LogUnavailable
from tiny.cluster.log import CHANNEL, Batch
from tiny.cluster.session import conninfo
from tiny.commit import CommitError, Unavailable
from tiny.commit.cluster import TIMEOUTS, ClusterCommit
from tiny.config import Config
from tiny.follower_status import FollowerStatus
from tiny.heartbeat import BEAT_SECONDS
from tiny.metrics import FollowerMetrics

log = logging.getLogger("tiny.follower")

MAX_READ_BYTES = 16 * 1024**2  # bytes of batches one read asks for (at least one batch)
MAX_FLUSH_FILES = 32  # files one flush of the follower appends to at most (a batch goes whole)
MAX_FLUSH_BYTES = 16 * 1024**2  # bytes one flush appends at most (a batch goes whole)
MAX_BATCH_FILES = 256  # files one batch may name: the sink's flushes name at most --max-days + 1 per append
POLL = 1.0  # seconds the follower waits for a NOTIFY before it reads anyway
HEAD_EVERY = 1.0  # seconds between two looks at the log's head while there is nothing to read
REPORT_EVERY = 1.0  # seconds between two reports of its position to the log
_OWN_REPORTS = 1024  # the last positions it reported, that the log may hold (a failover loses the newest)
SEEN_EVERY = 30.0  # seconds at most between two reports of an unchanged position (a quarter of
# --follower-retention when that is less): retention keeps the log only for followers seen within
# it, so an idle host that is alive must still be seen, or a host down when traffic resumes is trimmed past
RETAIN_EVERY = 10.0  # seconds between two rounds of retention (each host; with jitter)
RETAIN_STEPS = 20  # steps of one round at most (each deletes at most tiny.cluster.retention.STEP rows a kind)
RETAIN_SECONDS = 2.0  # seconds one round goes on taking steps at most
RETRY = 1.0  # seconds before trying again after an error
TRIMMED_RETRY = 10.0  # seconds before looking again when the log cannot be followed from here


class Unfollowable(ClusterError):
    """A batch of the log that this host will not write (a name that is not a data file, too
    many files): following stops at its position, loudly."""


class Stop:
    """Set by a signal handler, read by the loops: a flag, not a lock (a handler that takes a
    lock its own thread holds would deadlock)."""

    def __init__(self) -> None:
        self.requested = False

    def set(self, *_: Any) -> None:
        self.requested = True

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, in short turns that end once a stop is requested."""
        end = time.monotonic() + seconds
        while not self.requested and (left := end - time.monotonic()) > 0:
            time.sleep(min(left, 0.1))


class Listener:
    """A LISTEN connection to the primary: :meth:`wait` returns early when a flush commits.
    Every failure leaves it closed (the follower then polls) and it reconnects at most once a
    second; :meth:`reconnect` when a poll found work that no NOTIFY announced (the connection
    may be to a frozen old primary, whose kernel keeps it open)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: psycopg.Connection[Any] | None = None
        self._retry_at = 0.0

    def wait(self, seconds: float) -> bool:
        """Wait at most ``seconds`` for a NOTIFY (those already queued are all taken); whether one came."""
        if self._conn is None and time.monotonic() >= self._retry_at:
            self._connect()
        if self._conn is None:
            time.sleep(seconds)
            return False
        try:
            return any(True for _ in self._conn.notifies(timeout=seconds, stop_after=1))
        except psycopg.Error:
            self.reconnect()
            return False

    def _connect(self) -> None:
        self._retry_at = time.monotonic() + 1.0
        try:
            self._conn = psycopg.connect(conninfo(self.dsn, TIMEOUTS, "tiny-follower"), autocommit=True)
            self._conn.execute(f"LISTEN {CHANNEL}")
        except psycopg.Error as exc:
            log.debug("cannot LISTEN to the log (polling meanwhile): %s", exc)
            self.reconnect()

    def reconnect(self) -> None:
        """Drop the connection; the next wait opens a new one (at most once a second)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass


class Follower:
    """The follower of ``config.data_dir`` (see the module docstring); ``status``: where it
    publishes its progress (a fresh one when None)."""

    def __init__(self, config: Config, status: FollowerStatus | None = None, listen: bool = True) -> None:
        self.config = config
        self.name = config.follower_name()
        self.commit = commit_point(config)
        self.local, self.log = self.commit.local, self.commit.log
        self.status = status or FollowerStatus()
        self.listener = Listener(config.cluster) if listen else None
        self.metrics = FollowerMetrics()
        self.metrics.name_clash.set(0)
        self.applied = -1  # the position the files hold; -1 until first read
        self.opened = False  # the data dir and the log are open, the position read
        self.head = 0  # the newest position seen in the log
        self.busy_since = 0.0  # time.monotonic() since the main thread is in one operation; 0 waiting
        self.error = ""
        self.clash = ""  # another host reports under this one's name: logged, and a gauge, until it restarts
        self._own: deque[int] = deque(maxlen=_OWN_REPORTS)  # positions this process reported, newest last
        self._answered = False  # a report of this process returned: the log's position for its name is checked
        self._looked = self._reported = self._retained = 0.0
        self._reported_at = -1
        self._seen_every = min(SEEN_EVERY, config.follower_retention / 4)

    # -- one turn ---------------------------------------------------------------------------

    def open(self) -> None:
        """Open the data dir (binding it to the cluster at its first start), read the position
        committed with the files (recovering a flush a crash left) and publish it, then open
        the log (a bound data dir's position is known, and read, without a primary)."""
        self.commit.open()
        with self.local.locked():
            self.local.recover()
            self.applied = self.local.intent.committed_position() or 0
        self.head = max(self.head, self.applied)
        log.info("follower %s of %s at position %d", self.name, self.config.data_dir, self.applied)
        self._publish()
        self.commit.open_log()
        self.opened = True
        self._report(force=True)

    def step(self) -> bool:
        """Read and apply what follows the position (one read); whether anything was applied."""
        batches = self.log.read(self.applied, MAX_READ_BYTES)
        if not batches:
            return False
        for batch in batches:
            check(batch)
        self.head = max(self.head, batches[-1].position)
        for group in groups(batches):
            self.apply(group)
        self._report()
        self._publish()
        return True

    def apply(self, group: list[Batch]) -> None:
        """Append consecutive batches as one flush, its position committed with its bytes."""
        files: dict[str, list[bytes]] = {}
        for batch in group:
            for name, data in batch.files.items():
                files.setdefault(name, []).append(data)
        before, after = group[0].position - 1, group[-1].position
        local = self.local
        with local.locked():
            local.recover()
            at = local.intent.committed_position() or 0
            if at != before:
                raise Unfollowable(f"the data dir holds position {at}, not {before}: something else writes to it")
            flush = local.appender.flush()
            try:
                flush.write(files, position=(before, after), crash=local.crash.reach)
                local.crash.reach("follower-after-append")
                flush.confirm()
                flush.finish()  # the commit point: the bytes and the position together
            except LockLost:
                raise  # another writer may hold the lock now: its recovery cuts this flush
            except BaseException:
                _roll_back(flush)
                raise
            finally:
                flush.close()
        self.applied = after
        self.metrics.batches.inc(len(group))
        self.metrics.bytes.inc(sum(len(data) for parts in files.values() for data in parts))
        local.crash.reach("follower-after-position")

    def idle(self) -> None:
        """Nothing to read: look at the head, report, run retention when due."""
        now = time.monotonic()
        if now - self._looked >= HEAD_EVERY:
            self._looked = now
            self.head = max(self.log.head(), self.applied)
        self._report()
        if now >= self._retained:
            self._retained = now + RETAIN_EVERY * random.uniform(0.5, 1.5)
            self.retain()
        self._publish()

    def retain(self) -> None:
        """One round of retention: steps until one deletes nothing, at most RETAIN_STEPS and
        RETAIN_SECONDS (each step bounded by the log's statement bound)."""
        end = time.monotonic() + RETAIN_SECONDS
        for _ in range(RETAIN_STEPS):
            done = self.log.retain(stale_after=self.config.follower_retention)
            if not (done.keys or done.batches or done.flush_ids) or time.monotonic() > end:
                return

    # -- the loop ---------------------------------------------------------------------------

    def run(self, stop: Stop) -> None:
        """Follow until ``stop`` is requested (see the module docstring)."""
        silent = False  # the last wait ended without a NOTIFY
        while not stop.requested:
            self.busy_since = time.monotonic()
            try:
                if not self.opened:
                    self.open()
                if self.step():
                    if silent and self.listener is not None:
                        self.listener.reconnect()  # work came without a NOTIFY: it may listen to a gone primary
                    silent = False
                    self._clear()
                    continue
                self.idle()
                self._clear()
            except Exception as exc:  # every failure is published and retried; none ends the follower
                self._failed(exc, stop)
                continue
            finally:
                self.busy_since = 0.0
            if self.listener is None:
                stop.sleep(POLL)
            else:
                silent = not self.listener.wait(POLL)

    def _failed(self, exc: Exception, stop: Stop) -> None:
        if isinstance(exc, LogTrimmed | Unfollowable):
            why, pause = str(exc), TRIMMED_RETRY
        elif isinstance(exc, LogUnavailable):
            why, pause = f"no PostgreSQL primary answers: {exc}", RETRY
        elif isinstance(exc, OSError):
            why, pause = f"cannot write its files: {exc.strerror or exc}", RETRY
        elif isinstance(exc, CommitError | ClusterError):
            why, pause = str(exc), RETRY
        else:
            log.exception("the follower failed unexpectedly")
            why, pause = f"an unexpected error: {exc!r}", RETRY
        first = why.splitlines()[0] if why else why
        if first != self.error:
            log.error("follower %s cannot follow the log: %s", self.name, why)
        self.error = first
        self.metrics.errors.inc()
        if isinstance(exc, CommitError | Unfollowable):
            self.commit.close()  # opened again, with every check and its position read again, next turn
            self.opened = False
        self._publish()
        stop.sleep(pause)

    def _clear(self) -> None:
        if self.error:
            log.info("follower %s follows the log again at position %d", self.name, self.applied)
            self.error = ""
            self._publish()

    def _report(self, force: bool = False) -> None:
        now = time.monotonic()
        since = now - self._reported
        changed = self.applied != self._reported_at
        if (changed and (force or since >= REPORT_EVERY)) or (self.opened and since >= self._seen_every):
            self._own.append(self.applied)  # before: a report whose answer is lost may have committed
            before = self.log.report(self.name, self.applied)
            if not self._answered and before is not None:
                # The position this run found: its previous run's last (or, which it cannot tell,
                # another host's). A failover may yet lose this run's report and show it again.
                self._own.appendleft(before)
            checked, self._answered = self._answered, True
            if checked and before is not None and before not in self._own and not self.clash:
                self.clash = (
                    f"another host reports to the log as follower {self.name!r}: it held position {before}, "
                    f"which this host never reported. Retention keeps the log's batches until the lowest position "
                    "reported under each name, so the host further behind may find them trimmed: give every host "
                    "its own --host-name (the hostname by default), then restart them"
                )
                log.error("follower %s: %s", self.name, self.clash)
                self.metrics.name_clash.set(1)
            self._reported, self._reported_at = now, self.applied

    def _publish(self) -> None:
        known = max(self.applied, -1)
        self.status.publish(known, max(self.head, known), self.error)
        if known >= 0:
            self.metrics.observe(known, max(self.head, known), self.status.progress().lag_seconds())

    def close(self) -> None:
        if self.listener is not None:
            self.listener.reconnect()
        self.commit.close()


def commit_point(config: Config) -> ClusterCommit:
    """The follower's commit point: the data dir (its checks, its binding, the appender with
    the day files' header) and the log."""
    return ClusterCommit(
        config.data_dir,
        config.cluster,
        window=config.idempotency_window,
        max_keys=config.idempotency_max_keys,
        wait_bound=config.lock_timeout,
        fsync=config.durability == "fsync",
        headers={layout.DAY_SUFFIX: layout.HEADER},
        crash_at=config.crash_at,
    )


def check_at_start(config: Config) -> bool:
    """Before the server's workers and follower start: the data dir opened with every check,
    bound to the cluster (when a primary answers: an unbound data dir is bound by the first
    process that reaches one), and the log still holding the positions after the data dir's.
    False when refused (logged with the reason); a cluster without a primary is no refusal."""
    commit = commit_point(config)
    try:
        try:
            commit.open()
            commit.open_log()
            with commit.local.locked():
                commit.local.recover()
                applied = commit.local.intent.committed_position() or 0
            commit.log.read(applied, 1)  # LogTrimmed when the log lacks what follows
        except (Unavailable, LogUnavailable) as exc:
            log.warning("no PostgreSQL primary answers yet (%s); this host follows the log once one does", exc)
            return True
    except (CommitError, LogTrimmed) as exc:
        log.error("cannot start: %s", exc)
        return False
    finally:
        commit.close()
    log.info("data dir %s follows the cluster at position %d", config.data_dir, applied)
    return True


def check(batch: Batch) -> None:
    """Unfollowable unless every file ``batch`` names is a day file or a rejects file (in
    ASCII: no path, no traversal), at most MAX_BATCH_FILES of them."""
    if len(batch.files) > MAX_BATCH_FILES:
        raise Unfollowable(
            f"the log's batch at position {batch.position} names {len(batch.files)} files, more than "
            f"{MAX_BATCH_FILES}: this host stops following there"
        )
    for name in batch.files:
        if not (name.isascii() and layout.is_data_file(name)):
            raise Unfollowable(
                f"the log's batch at position {batch.position} names {name[:80]!r}, which is not a day file or a "
                "rejects file: this host writes nothing of it, and stops following there"
            )


def groups(batches: list[Batch]) -> list[list[Batch]]:
    """``batches`` cut, in order, into flushes of at most MAX_FLUSH_FILES files and
    MAX_FLUSH_BYTES bytes (a batch goes whole, alone if it must)."""
    cut: list[list[Batch]] = []
    files: set[str] = set()
    size = 0
    for batch in batches:
        more = sum(len(data) for data in batch.files.values())
        if cut and len(files | batch.files.keys()) <= MAX_FLUSH_FILES and size + more <= MAX_FLUSH_BYTES:
            cut[-1].append(batch)
            files |= batch.files.keys()
            size += more
        else:
            cut.append([batch])
            files, size = set(batch.files), more
    return cut


def _roll_back(flush: Any) -> None:
    """Cut a failed flush back; if that fails too, its intent stays live for the next recovery."""
    try:
        flush.roll_back()
    except OSError as exc:
        log.critical("could not roll back a failed follower flush (the next flush will): %s", exc)


def run_follower(config: Config, status: FollowerStatus, parent_pid: int | None) -> int:
    """The follower process's body (tiny.prefork forks it): follow until SIGTERM or SIGINT,
    or until the parent is gone; beat meanwhile. Returns the exit code."""
    stop = Stop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop.set)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})  # blocked across the fork
    follower = Follower(config, status)
    beating = threading.Thread(target=_beat, args=(follower, status, stop, parent_pid), daemon=True)
    beating.start()
    try:
        follower.run(stop)
    finally:
        follower.close()
    log.info("follower %s stopped at position %d", follower.name, follower.applied)
    return 0


def _beat(follower: Follower, status: FollowerStatus, stop: Stop, parent_pid: int | None) -> None:
    alive: Callable[[], bool] = (lambda: os.getppid() == parent_pid) if parent_pid else (lambda: True)
    while not stop.requested:
        status.beat(follower.busy_since)
        if not alive():
            log.warning("the server's parent is gone; the follower stops")
            stop.set()
        time.sleep(BEAT_SECONDS)

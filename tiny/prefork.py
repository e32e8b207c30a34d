"""Processes: bind the sockets, fork one worker per core, keep them running, stop them.

Bind first, then fork: the parent binds one listening socket per worker, all on the same
address and port with SO_REUSEPORT, so that the kernel spreads new connections evenly over
the workers (one shared accept socket put every keep-alive connection of `ab -k` on one
worker). Worker i serves socket i. The parent keeps its copy of every socket open, so a
worker that dies loses no queued connection: its replacement takes over the same socket.

Only this server's workers share the port: SO_REUSEPORT lets any process of the same user
join a port, and the kernel then splits the connections between the two servers without a
word. So binding first checks that nobody listens there (a bind without SO_REUSEPORT), and
afterwards that every listening socket on the port is one of ours; otherwise the start fails
with "address already in use".

The parent restarts any worker that dies, and kills and replaces one whose heartbeat
(tiny.heartbeat) shows its event loop stalled for ``--stall-timeout`` seconds, or its disk
thread in one flush for that plus ``--lock-timeout`` (a stopped process holding the data
dir's lock among them): its socket, and the connections queued on it, go to the replacement.
The parent's own pause does not count against its workers: after a gap in its loop (the
whole process group stopped, ``docker pause``) it judges their heartbeats, and a stop's
deadline, from the moment it runs again. A worker that dies at its start (before its event
loop ever ran) 5 times in a row stops the server (exit 1, its log says why) instead of
looping. SIGTERM/SIGINT: the parent forwards it to the workers, waits for them to drain
(``--drain-timeout`` plus 2 s, then SIGKILL), and exits 0 when they all exited 0. Workers
whose parent disappears (kill -9) notice within half a second and shut down cleanly.

Before any worker starts, the parent opens the data dir's journal once (tiny.commit.local): a
journal that cannot be used stops the start with its reason (exit 1). ``--no-fork`` (or
running under kernprof) serves in this process instead, with no parent.

Cluster mode (``--cluster``): the start checks the data dir, its binding to the cluster and
that the log still holds what follows its position (tiny.follower ``check_at_start``; a cluster
with no primary yet does not stop it), then the parent also runs the host's follower
(tiny.follower) as one more child, in the slot after the workers': restarted when it dies
(with the same budget of deaths at start), killed and replaced when it stops beating for
``--stall-timeout`` or stays in one operation past that plus its bound
(tiny.follower_status ``busy_bound``), stopped with the workers. Its status, made here before
any fork, is shared with every worker (their reads wait on it). Cluster mode needs the parent:
not under kernprof, not with ``--no-fork``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from types import FrameType
from typing import Any

from tiny import __version__, affinity, codec, descriptors, metrics, profiling
from tiny.analytics import cpu
from tiny.commit import CommitError
from tiny.commit.local import LocalCommit
from tiny.config import Config
from tiny.follower_status import FollowerStatus, busy_bound
from tiny.heartbeat import Heartbeats
from tiny.worker import run_worker

log = logging.getLogger("tiny.prefork")
_RESTART_BACKOFF_SECONDS = 1.0
_KILL_GRACE_SECONDS = 2.0
_RESTART_BUDGET = 5  # deaths in a row of one worker before its loop ever ran that stop the server
_LOOP_SECONDS = 0.25  # the parent's loop wakes at least this often (signals wake it at once)
_PAUSED_SECONDS = _LOOP_SECONDS + 0.25  # a longer gap between two turns of the loop: the parent did not run
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}  # SIGHUP: a terminal hung up


class AddressInUse(OSError):
    """Another process listens on the address and port (answered by exit status 1)."""


def bind_sockets(config: Config, count: int) -> list[socket.socket]:
    """``count`` listening sockets on ``config.address:config.port`` (SO_REUSEPORT) that no
    other process shares; :class:`AddressInUse` when one listens there."""
    infos = socket.getaddrinfo(config.address, config.port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    if config.port:
        _check_free(family, address)
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(address)
            sock.listen(1024)
            sock.setblocking(False)
            address = sock.getsockname()  # port 0: the others join the port the first one got
        _check_alone(sockets)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _check_free(family: int, address: Any) -> None:
    """AddressInUse if any socket listens on ``address``: a bind without SO_REUSEPORT fails
    then, also next to SO_REUSEPORT listeners. (SO_REUSEADDR: a port the last server left in
    TIME_WAIT is free.)"""
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise AddressInUse(errno.EADDRINUSE, f"address already in use: {address[0]}:{address[1]}") from None
            raise


def _check_alone(sockets: list[socket.socket]) -> None:
    """AddressInUse if a listening socket that overlaps ours (same port, same or wildcard
    address) is not one of ``sockets``: another server bound between the probe and our
    binds. Linux: /proc/net/tcp{,6}."""
    family = sockets[0].family
    ip, port = sockets[0].getsockname()[:2]
    ours = {os.fstat(sock.fileno()).st_ino for sock in sockets}
    mine = _proc_address(family, ip)
    wildcard = _proc_address(family, "0.0.0.0" if family == socket.AF_INET else "::")
    table = "/proc/net/tcp" if family == socket.AF_INET else "/proc/net/tcp6"
    try:
        with open(table) as handle:
            lines = handle.read().splitlines()[1:]
    except OSError:
        return
    for line in lines:
        fields = line.split()  # sl local_address rem_address st ... inode (field 9)
        address, hex_port = fields[1].rsplit(":", 1)
        listening = fields[3] == "0A"
        overlaps = address in (mine, wildcard) or mine == wildcard
        if listening and overlaps and int(hex_port, 16) == port and int(fields[9]) not in ours:
            raise AddressInUse(errno.EADDRINUSE, f"address already in use: {ip}:{port} has another listener")


def _proc_address(family: int, ip: str) -> str:
    """An IP address as /proc/net/tcp{,6} writes it: 32-bit words in host (little-endian) order."""
    packed = socket.inet_pton(family, ip)
    return "".join(packed[i : i + 4][::-1].hex().upper() for i in range(0, len(packed), 4))


def serve(config: Config) -> int:
    """Run the server until it is stopped; returns the process exit code."""
    metrics_dir = tempfile.mkdtemp(prefix="tiny-metrics-")
    metrics.setup(metrics_dir)
    try:
        stale = codec.stale_build()
        if stale:
            log.error("cannot start: %s", stale)
            return 1
        try:
            config.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a file of that name, a read-only file system, no permission
            log.error("cannot start: the data dir %s cannot be made: %s", config.data_dir, exc.strerror or exc)
            return 1
        if not _data_dir_usable(config):
            return 1
        nofile = descriptors.raise_limit()
        try:
            config = dataclasses.replace(
                config, max_connections=descriptors.connection_limit(config, descriptors.sink_files(config), nofile)
            )
        except ValueError as exc:
            log.error("%s", exc)
            return 2
        in_process = config.no_fork or profiling.active()
        if in_process and config.cluster:
            log.error("cannot start: cluster mode runs its follower as a child of the server's parent (no kernprof)")
            return 2
        count = config.worker_count()
        if in_process and count > 1:
            # kernprof -l app.py without --processes 1: one worker, here, on one socket. (Bound
            # for every worker, the sockets no one accepted on took their share of the
            # connections, and left them waiting.)
            log.warning("under kernprof one worker serves, in this process: --processes %d is not used", count)
            count = 1
        try:
            sockets = bind_sockets(config, count)
        except AddressInUse as exc:
            log.error("cannot listen: %s", exc.strerror)
            return 1
        except OSError as exc:  # a name that does not resolve, an address not of this host
            log.error("cannot listen on %s:%d: %s", config.address, config.port, exc.strerror or exc)
            return 1
        if config.token_source == "command line":
            log.warning(
                "the token was given with --token: every user of this machine sees it in ps; "
                "prefer --token-file or TINY_TOKEN"
            )
        host, port = sockets[0].getsockname()[:2]
        log.info(
            "tiny %s listening on http://%s:%d with %d worker process(es)%s, codec %s (%s), data dir %s, "
            "durability %s, at most %d connections per worker (RLIMIT_NOFILE %d), %s, %s",
            __version__,
            host,
            port,
            count,
            " in this process" if in_process else "",
            codec.CODEC,
            codec.build_id() or "pure Python",
            config.data_dir.resolve(),
            config.durability,
            config.max_connections,
            nofile,
            f"bearer token from the {config.token_source}" if config.token else "no token",
            f"cluster mode ({config.role} host, follower {config.follower_name()})" if config.cluster else "one host",
        )
        # before the fork: every worker's pool processes share the one quota
        cpu.prepare(config.analytics_cpu, f"{cpu.PREFIX}{os.getpid()}")
        log.info("analytics CPU: %s", cpu.MODE)
        cpus = affinity.plan(config.cpu_affinity, count)  # once, from the affinity the server started with
        if in_process:  # no fork: kernprof and debuggers see the work in this process
            return run_worker(config, sockets[0], cpu=cpus[0])
        return _Supervisor(config, sockets, cpus).run()
    finally:
        cpu.remove(cpu.CGROUP)
        shutil.rmtree(metrics_dir, ignore_errors=True)


def _data_dir_usable(config: Config) -> bool:
    """Open the data dir's journal once before any worker starts (creating it in a new data
    dir; with --new-journal, replacing one found wrong), so that a journal that cannot be
    used stops the start with its reason instead of failing every request. Cluster mode:
    tiny.follower ``check_at_start`` (the data dir, its binding to the cluster, the log's
    positions after it)."""
    if config.cluster:
        from tiny.follower import check_at_start  # psycopg: cluster mode only

        return check_at_start(config)
    journal = LocalCommit.from_config(config)
    try:
        journal.open(accept_new=config.new_journal, keys=False)
    except CommitError as exc:
        log.error("cannot start: %s", exc)
        return False
    finally:
        journal.close()
    return True


@dataclasses.dataclass
class _Worker:
    index: int
    started: float  # time.monotonic()


class _Supervisor:
    """The parent of the workers; see the module docstring.

    Its signal handlers only record the signal (and wake the loop through
    ``signal.set_wakeup_fd``); :meth:`run`'s loop does everything: reaps exited workers,
    restarts them (after a back-off, within a budget), replaces a worker whose heartbeat
    stalled, and stops the workers, with a deadline, when asked to.
    """

    def __init__(self, config: Config, sockets: list[socket.socket], cpus: list[int | None]) -> None:
        self.config = config
        self.sockets = sockets
        self.cpus = cpus  # each worker's core (tiny.affinity), the same for its replacements
        self.heartbeats = Heartbeats(len(sockets))
        # cluster mode: the follower, in the slot after the workers', its status shared with them
        self.follower = FollowerStatus() if config.cluster else None
        self.follower_index = len(sockets)
        self.children: dict[int, _Worker] = {}  # pid -> its slot and start
        self.restart_at: dict[int, float] = {}  # slot -> when to start its next worker
        self.early_deaths: dict[int, int] = {}  # slot -> workers in a row that died soon after start
        self.received: list[int] = []  # signals recorded by the handlers, acted on by the loop
        self.stopping = False
        self.deadline = 0.0
        self.failed = False
        self.last_turn = 0.0  # when the loop last looked at the clock
        self.judged_from = 0.0  # heartbeats count from here: the end of this process's last pause

    def run(self) -> int:
        wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        previous_fd = signal.set_wakeup_fd(wake_write)
        previous = {signum: signal.signal(signum, self._record) for signum in (*_STOP_SIGNALS, signal.SIGCHLD)}
        try:
            for index in range(len(self.sockets) + (self.follower is not None)):
                self._spawn(index)
            self.last_turn = time.monotonic()
            while self.children or (self.restart_at and not self.stopping):
                self._reap(metrics.mark_dead)
                self._act_on_signals()
                now = time.monotonic()
                self._excuse_own_pause(now)
                if self.stopping:
                    if now > self.deadline and self.children:
                        log.error("workers %s did not stop in time; killing them", sorted(self.children))
                        self.failed = True
                        self._kill_all(signal.SIGKILL)
                        self.deadline = float("inf")
                else:
                    self._replace_stalled(now)
                    for index, when in list(self.restart_at.items()):
                        if now >= when:
                            del self.restart_at[index]
                            self._spawn(index)
                select.select([wake_read], [], [], _LOOP_SECONDS)
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_read, 512):
                        pass
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            signal.set_wakeup_fd(previous_fd)
            os.close(wake_read)
            os.close(wake_write)
        return 1 if self.failed else 0

    def _record(self, signum: int, frame: FrameType | None) -> None:
        if signum != signal.SIGCHLD:
            self.received.append(signum)

    def _act_on_signals(self) -> None:
        while self.received:
            signum = self.received.pop(0)
            if self.stopping:  # a second Ctrl-C or SIGTERM: stop now
                log.warning("got %s again; killing the workers", signal.Signals(signum).name)
                self._kill_all(signal.SIGKILL)
                continue
            log.info("got %s; draining %d worker(s)", signal.Signals(signum).name, len(self.children))
            self._stop()

    def _stop(self) -> None:
        self.stopping = True
        self.restart_at.clear()
        for sock in self.sockets:  # new connections are refused now, not queued for nobody
            sock.close()
        self._kill_all(signal.SIGTERM)
        self.deadline = time.monotonic() + self.config.drain_timeout + _KILL_GRACE_SECONDS

    def _reap(self, mark_dead: Callable[[int], None]) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            worker = self.children.pop(pid, None)
            if worker is None:
                continue
            mark_dead(pid)
            code = os.waitstatus_to_exitcode(status)
            if self.stopping:
                if code != 0:
                    log.warning("worker %d (pid %d) exited with %d while stopping", worker.index, pid, code)
                    self.failed = True
                continue
            lived = time.monotonic() - worker.started
            # died at start: before its event loop ever ran (it never served)
            at_start = not self._beaten_since(worker.index, worker.started)
            early = self.early_deaths.get(worker.index, 0) + 1 if at_start else 0
            self.early_deaths[worker.index] = early
            if early >= _RESTART_BUDGET:
                log.error(
                    "%s died at its start %d times in a row (last: pid %d, exit code %d; its log above "
                    "says why); stopping the server",
                    "the follower" if worker.index == self.follower_index else f"worker {worker.index}",
                    early,
                    pid,
                    code,
                )
                self.failed = True
                self._stop()
                continue
            what = "the follower" if worker.index == self.follower_index else f"worker {worker.index}"
            log.error("%s (pid %d) exited with %d; restarting it", what, pid, code)
            # a worker that dies at once must not spin: its replacement waits a moment
            self.restart_at[worker.index] = time.monotonic() + (_RESTART_BACKOFF_SECONDS if lived < 1.0 else 0.0)

    def _excuse_own_pause(self, now: float) -> None:
        """After a gap in this loop longer than its turn (this process was stopped or frozen:
        SIGSTOP of the process group, ``docker pause``; CLOCK_MONOTONIC counts on meanwhile),
        count the workers' heartbeats, and the stop's deadline, from ``now``: the workers
        were most likely stopped with it, and had no chance to beat. A worker stopped alone
        while this process runs is still judged on time."""
        gap, self.last_turn = now - self.last_turn, now
        if gap <= _PAUSED_SECONDS:
            return
        log.warning(
            "this process did not run for %.1f s (stopped or frozen?): its workers' heartbeats count from now", gap
        )
        self.judged_from = now
        if self.stopping:
            self.deadline += gap

    def _beaten_since(self, index: int, since: float) -> bool:
        if index == self.follower_index and self.follower is not None:
            return self.follower.life()[0] > since
        return self.heartbeats.beaten_since(index, since)

    def _stalled(self, index: int, now: float, started: bool) -> str | None:
        stall, lock = self.config.stall_timeout, self.config.lock_timeout
        if index == self.follower_index and self.follower is not None:
            beat, busy = self.follower.life()
            beat = max(beat, self.judged_from)
            if now - beat > stall:
                return f"it has not run for {now - beat:.1f} s"
            if busy and now - max(busy, self.judged_from) > stall + busy_bound(lock):
                return f"it has been in one operation for {now - busy:.1f} s"
            return None
        loop_bound = stall + (lock if started else 0.0)
        return self.heartbeats.stalled(index, loop_bound, stall + lock, now=now, since=self.judged_from)

    def _replace_stalled(self, now: float) -> None:
        stall, lock = self.config.stall_timeout, self.config.lock_timeout
        for pid, worker in list(self.children.items()):
            # before its loop first runs, a worker may wait for the lock to open the journal
            # (a pause of this process ends with a fresh start's bound)
            started = now - max(worker.started, self.judged_from) < stall + lock
            why = self._stalled(worker.index, now, started)
            if why is None:
                continue
            what = "the follower" if worker.index == self.follower_index else f"worker {worker.index}"
            log.error("%s (pid %d) stalled: %s; killing it, a new one takes its place", what, pid, why)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # also ends a stopped process, releasing its locks
            self._reset(worker.index)  # not killed twice while it dies

    def _reset(self, index: int) -> None:
        if index == self.follower_index and self.follower is not None:
            self.follower.reset()
        else:
            self.heartbeats.reset(index)

    def _spawn(self, index: int) -> None:
        parent = os.getpid()
        self._reset(index)
        # Block the stop signals across the fork: the child must not run the parent's
        # handlers, and it unblocks them only once its event loop handles them
        # (tiny.worker), so a SIGTERM that comes early waits instead of killing it.
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        pid = os.fork()
        if pid:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
            self.children[pid] = _Worker(index, time.monotonic())
            return
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            for signum in (*_STOP_SIGNALS, signal.SIGCHLD):
                signal.signal(signum, signal.SIG_DFL)
            for other, sock in enumerate(self.sockets):
                if other != index:
                    sock.close()
            if index == self.follower_index and self.follower is not None:
                from tiny.follower import run_follower  # psycopg: cluster mode only

                code = run_follower(self.config, self.follower, parent)
            else:
                code = run_worker(
                    self.config,
                    self.sockets[index],
                    parent_pid=parent,
                    beat=(self.heartbeats, index),
                    follower=self.follower,
                    cpu=self.cpus[index],
                )
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)  # never return into the parent's loop or run its atexit hooks

    def _kill_all(self, signum: int) -> None:
        for pid in list(self.children):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

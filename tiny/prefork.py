"""Processes: bind the sockets, fork one worker per core, keep them running, stop them.

Bind first, then fork: the parent binds one listening socket per worker, all on the same
address and port with SO_REUSEPORT, so that the kernel spreads new connections evenly over
the workers (one shared accept socket put every keep-alive connection of `ab -k` on one
worker). Worker i serves socket i. The parent keeps its copy of every socket open, so a
worker that dies loses no queued connection: its replacement takes over the same socket.

The parent restarts any worker that dies, forwards SIGTERM/SIGINT to the workers, waits for
them to drain, and exits 0 when they all exited 0. Workers whose parent disappears (kill -9)
notice within half a second and shut down cleanly.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from types import FrameType

from tiny import __version__
from tiny.config import Config

log = logging.getLogger("tiny.prefork")
_RESTART_BACKOFF_SECONDS = 1.0
_KILL_GRACE_SECONDS = 2.0
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def bind_sockets(config: Config, count: int) -> list[socket.socket]:
    """``count`` listening sockets on ``config.address:config.port`` (SO_REUSEPORT)."""
    infos = socket.getaddrinfo(config.address, config.port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sockets: list[socket.socket] = []
    for _ in range(count):
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        sock.listen(1024)
        sock.setblocking(False)
        sockets.append(sock)
        address = sock.getsockname()  # port 0: the others join the port the first one got
    return sockets


def serve(config: Config) -> int:
    """Run the server until it is stopped; returns the process exit code."""
    metrics_dir = tempfile.mkdtemp(prefix="tiny-metrics-")
    # prometheus-client reads this when first imported, so it is set before tiny.worker loads.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        config.data_dir.mkdir(parents=True, exist_ok=True)
        count = config.worker_count()
        sockets = bind_sockets(config, count)
        from tiny import codec

        host, port = sockets[0].getsockname()[:2]
        log.info(
            "tiny %s listening on http://%s:%d with %d worker process(es), codec %s, data dir %s, durability %s",
            __version__,
            host,
            port,
            count,
            codec.CODEC,
            config.data_dir.resolve(),
            config.durability,
        )
        if count == 1:  # no fork: kernprof and debuggers see the work in this process
            from tiny.worker import run_worker

            return run_worker(config, sockets[0])
        return _Supervisor(config, sockets).run()
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


class _Supervisor:
    """The parent of the workers; see the module docstring."""

    def __init__(self, config: Config, sockets: list[socket.socket]) -> None:
        self.config = config
        self.sockets = sockets
        self.children: dict[int, tuple[int, float]] = {}  # pid -> (worker index, started)
        self.stopping = False
        self.failed = False

    def run(self) -> int:
        from tiny import metrics

        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGALRM, self._on_alarm)
        for index in range(len(self.sockets)):
            self._spawn(index)
        while self.children:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            if pid not in self.children:
                continue
            index, started = self.children.pop(pid)
            metrics.mark_dead(pid)
            code = os.waitstatus_to_exitcode(status)
            if self.stopping:
                if code != 0:
                    log.warning("worker %d (pid %d) exited with %d while stopping", index, pid, code)
                    self.failed = True
                continue
            log.error("worker %d (pid %d) exited with %d; restarting it", index, pid, code)
            if time.monotonic() - started < _RESTART_BACKOFF_SECONDS:
                time.sleep(_RESTART_BACKOFF_SECONDS)  # a worker that dies at once must not spin
            if not self.stopping:
                self._spawn(index)
        signal.alarm(0)
        return 1 if self.failed else 0

    def _spawn(self, index: int) -> None:
        parent = os.getpid()
        # Block the stop signals across the fork: the child must not run the parent's
        # handlers, and it unblocks them only once its event loop handles them
        # (tiny.worker), so a SIGTERM that comes early waits instead of killing it.
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        pid = os.fork()
        if pid:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
            self.children[pid] = (index, time.monotonic())
            return
        code = 1
        try:
            for signum in (*_STOP_SIGNALS, signal.SIGALRM):
                signal.signal(signum, signal.SIG_DFL)
            for other, sock in enumerate(self.sockets):
                if other != index:
                    sock.close()
            from tiny.worker import run_worker

            code = run_worker(self.config, self.sockets[index], parent_pid=parent)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)  # never return into the parent's loop or run its atexit hooks

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        if self.stopping:  # a second Ctrl-C: stop now
            self._kill_all(signal.SIGKILL)
            return
        self.stopping = True
        log.info("got %s; draining %d worker(s)", signal.Signals(signum).name, len(self.children))
        for sock in self.sockets:  # new connections are refused now, not queued for nobody
            sock.close()
        self._kill_all(signal.SIGTERM)
        signal.alarm(int(self.config.drain_timeout + _KILL_GRACE_SECONDS + 1))

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        if self.children:
            log.error("workers %s did not stop in time; killing them", sorted(self.children))
            self.failed = True
            self._kill_all(signal.SIGKILL)

    def _kill_all(self, signum: int) -> None:
        for pid in list(self.children):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

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

The parent restarts any worker that dies, forwards SIGTERM/SIGINT to the workers, waits for
them to drain, and exits 0 when they all exited 0. Workers whose parent disappears (kill -9)
notice within half a second and shut down cleanly.
"""

from __future__ import annotations

import dataclasses
import errno
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
from typing import Any

from tiny import __version__, descriptors
from tiny.config import Config

log = logging.getLogger("tiny.prefork")
_RESTART_BACKOFF_SECONDS = 1.0
_KILL_GRACE_SECONDS = 2.0
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


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
    # prometheus-client reads this when first imported, so it is set before tiny.worker loads.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        config.data_dir.mkdir(parents=True, exist_ok=True)
        nofile = descriptors.raise_limit()
        try:
            config = dataclasses.replace(
                config, max_connections=descriptors.connection_limit(config, descriptors.sink_files(config), nofile)
            )
        except ValueError as exc:
            log.error("%s", exc)
            return 2
        count = config.worker_count()
        try:
            sockets = bind_sockets(config, count)
        except AddressInUse as exc:
            log.error("cannot listen: %s", exc.strerror)
            return 1
        if config.token_source == "command line":
            log.warning(
                "the token was given with --token: every user of this machine sees it in ps; "
                "prefer --token-file or TINY_TOKEN"
            )
        from tiny import codec

        host, port = sockets[0].getsockname()[:2]
        log.info(
            "tiny %s listening on http://%s:%d with %d worker process(es), codec %s, data dir %s, durability %s, "
            "at most %d connections per worker (RLIMIT_NOFILE %d), %s",
            __version__,
            host,
            port,
            count,
            codec.CODEC,
            config.data_dir.resolve(),
            config.durability,
            config.max_connections,
            nofile,
            f"bearer token from the {config.token_source}" if config.token else "no token",
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

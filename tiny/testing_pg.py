"""A PostgreSQL cluster for tests and benchmarks: etcd and three PostgreSQL 15 nodes under Patroni, on loopback.

Like :mod:`tiny.testing`, it ships in the package but the server never imports it.
:class:`PgCluster` starts, in a temporary directory of its own:

- one etcd member (etcd's v2 API enabled: Debian's Patroni 3.0.2 is configured with the
  ``etcd:`` section, which speaks v2; with ``etcd3:`` a frozen primary once let two nodes be
  primary, fixed in Patroni 3.1; see tiny.cluster). One member is enough for what the tests
  exercise: PostgreSQL nodes killed, stopped and brought back, and what a client of the
  cluster sees. The safety of
  Patroni's leader key rests on etcd's compare-and-swap, which one member gives as much as
  three; three members would only add etcd's own failover (measured apart: a killed etcd
  leader adds about 4 s) and three processes on a 2-core machine;
- three PostgreSQL nodes ``pg1``, ``pg2``, ``pg3``, each its own Patroni (which starts, stops,
  promotes, demotes and rewinds its PostgreSQL), with the settings of
  tiny.patroni_settings (:data:`~tiny.patroni_settings.DCS_SETTINGS`):
  ttl 10, loop_wait 2, retry_timeout 4, synchronous_mode with synchronous_mode_strict,
  synchronous_node_count 1, synchronous_commit on, pg_rewind (wal_log_hints on),
  wal_retrieve_retry_interval 1s. So one synchronous standby acknowledges every commit, a
  commit without one waits, and a dead or frozen primary is replaced in 10-16 s.

PostgreSQL and Patroni refuse to run as root: under root every process runs as the
``postgres`` user (``Popen(user=...)``), in directories it owns; otherwise as the caller.
Ports come from :func:`tiny.testing.free_port_block` (below the ephemeral range). Passwords
are drawn per cluster; ``pg_hba`` admits only 127.0.0.1 with SCRAM.

Processes: each Patroni starts in a session of its own (with pg_rewind, pg_basebackup and
the other tools it runs), and detaches its postmaster (a session of its own, reparented to
init, so that PostgreSQL survives Patroni), whose children each call ``setsid`` too. So a
node's processes are found in ``/proc``, not by a process group: its Patroni's session (only
while the harness has not reaped Patroni: a reaped pid may be anyone's by now, and is never
signalled), every ``postgres`` process whose command line names the node's data dir (its
postmasters, a single-user recovery), and their children. :meth:`PgCluster.kill` signals all
of them together, Patroni first (so it restarts nothing), then the postmaster (so it forks
nothing). :meth:`PgCluster.close` kills every one, waits for them (bounded), and removes the
System V shared memory segment that a killed postmaster leaves behind (its ``postmaster.pid``
names it), whatever state the test left the nodes in. The context manager always closes.

Not thread-safe, except :meth:`PgCluster.primary`, :meth:`PgCluster.sync_standby` and
:attr:`PgCluster.dsn`, which read etcd or constants.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tiny import patroni_settings, procfs
from tiny.patroni_settings import DCS_SETTINGS, SUPERUSER
from tiny.testing import free_port_block

PG_BIN = Path(os.environ.get("TINY_PG_BIN", "/usr/lib/postgresql/15/bin"))
PATRONI = shutil.which("patroni") or "/usr/bin/patroni"
ETCD = shutil.which("etcd") or "/usr/bin/etcd"
NODES = ("pg1", "pg2", "pg3")

_API_TIMEOUT = 1.0  # seconds for one HTTP call to etcd
_SQL_TIMEOUT = 2  # connect_timeout (seconds) of the harness's own checks
_KILL_WAIT = 5.0  # seconds close() waits for killed processes to go
_FAST_STOP = 2.0  # seconds close() gives the postmasters to exit by themselves (they remove their shm)


@dataclass
class Node:
    """One PostgreSQL node: its Patroni, its ports and directory, the shared memory its postmasters made."""

    name: str
    pg_port: int
    api_port: int
    home: Path
    proc: subprocess.Popen[bytes] | None = None
    shm_ids: set[int] = field(default_factory=set)  # System V segments its postmasters made

    @property
    def data_dir(self) -> Path:
        return self.home / "data"


class PgCluster:
    """etcd and three Patroni-managed PostgreSQL 15 nodes on 127.0.0.1, for one test or module.

    ``PgCluster(tmp_path)`` as a context manager starts them all and waits until the cluster
    is healthy (:meth:`wait_healthy`); leaving it kills every process and removes the
    cluster's directory (its logs are copied under ``tmp_path / "pg-logs"`` first).
    :attr:`started_in` and :attr:`stopped_in` are the seconds start and close took.
    """

    def __init__(self, tmp_path: Path, nodes: int = 3, dcs: dict[str, Any] | None = None) -> None:
        self.tmp_path = Path(tmp_path)
        self.scope = "tiny-" + secrets.token_hex(4)
        self.password = secrets.token_hex(16)
        self._replication_password = secrets.token_hex(16)
        self._rewind_password = secrets.token_hex(16)
        self._dcs = {**DCS_SETTINGS, **(dcs or {})}
        self.home = Path(tempfile.mkdtemp(prefix="tiny-pg-"))  # not under tmp_path: postgres must reach it
        base = free_port_block(2 + 2 * nodes)
        self.etcd_port, self._etcd_peer_port = base, base + 1
        self.nodes = {
            name: Node(name, base + 2 + 2 * i, base + 3 + 2 * i, self.home / name)
            for i, name in enumerate(NODES[:nodes])
        }
        self._etcd: subprocess.Popen[bytes] | None = None
        self._user = _run_as()
        self.started_in = 0.0
        self.stopped_in = 0.0

    # -- start and stop ----------------------------------------------------------------------

    def start(self, timeout: float = 90.0) -> PgCluster:
        """Start etcd and every node; return once :meth:`wait_healthy` holds. On any failure,
        everything started is killed before the error propagates."""
        began = time.monotonic()
        try:
            self._own(self.home)
            self._start_etcd(timeout)
            for node in self.nodes.values():
                self.restart(node.name)
            self.wait_healthy(timeout - (time.monotonic() - began), starting=True)
        except BaseException:
            self.close()
            raise
        self.started_in = time.monotonic() - began
        return self

    def close(self) -> None:
        """Kill every process of the cluster, wait for them (bounded), remove the shared memory
        their postmasters left and the cluster's directory. Idempotent; raises RuntimeError
        only when a process outlived SIGKILL for :data:`_KILL_WAIT` seconds."""
        began = time.monotonic()
        for node in self.nodes.values():
            self._signal_patroni(node, signal.SIGKILL)  # first: it would restart its PostgreSQL
        procs = procfs.processes()
        for pid in self._node_pids(procs):  # a frozen child would hold its postmaster's stop
            procfs.send_signal(pid, signal.SIGCONT)
        for node in self.nodes.values():  # SIGQUIT: an immediate stop, which removes its shm segment
            for pid in self._postmasters(node, procs):
                procfs.send_signal(pid, signal.SIGQUIT)
        procfs.wait_gone(self._node_pids(procfs.processes()), _FAST_STOP, self._children())
        procs = procfs.processes()
        for pid in self._node_pids(procs):
            procfs.send_signal(pid, signal.SIGKILL)
        etcd = procfs.unreaped(self._etcd)
        if etcd > 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(etcd, signal.SIGKILL)
        left = procfs.wait_gone(self._node_pids(procfs.processes()) | {etcd}, _KILL_WAIT, self._children())
        for child in self._children():  # every Popen reaped: none is left to warn, or to reuse its pid
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(0.5)
        self._remove_shm()
        self._keep_logs()
        _remove_tree(self.home)
        self.stopped_in = time.monotonic() - began
        if left:
            raise RuntimeError(f"processes of the PostgreSQL cluster outlived SIGKILL: {sorted(left)}")

    def __enter__(self) -> PgCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def restart(self, name: str) -> None:
        """Start node ``name``'s Patroni (again, after :meth:`kill`): it starts its PostgreSQL,
        as a new primary, a standby, or a rewound old primary. Does not wait."""
        node = self.nodes[name]
        if node.proc is not None and node.proc.poll() is None:
            raise RuntimeError(f"{name}'s Patroni is running already")
        node.home.mkdir(exist_ok=True)
        self._own(node.home)
        config = node.home / "patroni.yml"
        config.write_text(json.dumps(self._patroni_config(node), indent=1))  # JSON is YAML
        self._own(config)
        with open(node.home / "patroni.log", "ab") as log:
            node.proc = subprocess.Popen(
                [PATRONI, str(config)],
                cwd=node.home,
                env=self._env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                **self._user,
            )

    # -- what the tests ask ------------------------------------------------------------------

    @property
    def dsn(self) -> str:
        """A libpq connection string naming every node, for whichever is primary
        (``target_session_attrs=read-write``), with a connect timeout of 2 s per node."""
        hosts = ",".join("127.0.0.1" for _ in self.nodes)
        ports = ",".join(str(n.pg_port) for n in self.nodes.values())
        return (
            f"host={hosts} port={ports} dbname=postgres user={SUPERUSER} password={self.password} "
            "target_session_attrs=read-write connect_timeout=2"
        )

    def node_dsn(self, name: str) -> str:
        """A connection string for node ``name`` alone, primary or standby."""
        node = self.nodes[name]
        return (
            f"host=127.0.0.1 port={node.pg_port} dbname=postgres user={SUPERUSER} password={self.password} "
            f"connect_timeout={_SQL_TIMEOUT}"
        )

    def primary(self) -> str | None:
        """The node that holds Patroni's leader key in etcd now, or None."""
        return self._etcd_value("leader")

    def sync_standby(self) -> str | None:
        """The synchronous standby Patroni's ``/sync`` key names now, or None."""
        value = self._etcd_value("sync")
        if not value:
            return None
        standby = json.loads(value).get("sync_standby")
        return str(standby) if standby else None

    def wait_primary(self, timeout: float = 30.0) -> str:
        """Wait until a node holds the leader key and accepts writes; its name. Raises
        TimeoutError past ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            leader = self.primary()
            if leader is not None and self._query(leader, "SELECT NOT pg_is_in_recovery()") == [(True,)]:
                return leader
            if time.monotonic() > deadline:
                raise TimeoutError(f"no primary within {timeout:.0f} s (leader key: {leader})")
            time.sleep(0.1)

    def wait_healthy(self, timeout: float = 60.0, starting: bool = False) -> str:
        """Wait until every node runs, the primary streams to all the others and the one its
        ``/sync`` key names is its synchronous standby; the primary's name. Raises TimeoutError
        past ``timeout``, saying what was last seen; ``starting``: RuntimeError as soon as a
        Patroni exits (it gave up: its log's tail says why)."""
        deadline = time.monotonic() + timeout
        seen = "nothing"
        while time.monotonic() < deadline:
            for node in self.nodes.values():
                if starting and node.proc is not None and node.proc.poll() is not None:
                    log = _tail(node.home / "patroni.log")
                    raise RuntimeError(f"{node.name}'s Patroni exited ({node.proc.returncode}):\n{log}")
            seen = self._health()
            if seen == "healthy":
                return str(self.primary())
            time.sleep(0.1)
        raise TimeoutError(f"the cluster was not healthy within {timeout:.0f} s; last seen: {seen}")

    def kill(self, name: str, signum: int = signal.SIGKILL) -> None:
        """Send ``signum`` to every process of node ``name``: its Patroni first, then its
        postmaster, then the postmaster's children (so that none is spawned meanwhile). With
        SIGKILL, return once they are gone (at most :data:`_KILL_WAIT` seconds)."""
        node = self.nodes[name]
        self._signal_node(node, signum)
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            self._signal_node(node, signum)  # any child forked between the scan and the signal
        if signum == signal.SIGKILL:
            procfs.wait_gone(set(self._pids(node)), _KILL_WAIT, self._children())

    def stop(self, name: str) -> None:
        """Freeze node ``name`` (Patroni and PostgreSQL) with SIGSTOP."""
        self.kill(name, signal.SIGSTOP)

    def cont(self, name: str) -> None:
        """Let a frozen node go on (SIGCONT)."""
        self.kill(name, signal.SIGCONT)

    def alive(self, name: str) -> bool:
        """Whether node ``name`` has any process left."""
        return bool(self._pids(self.nodes[name]))

    def query(self, name: str, sql: str) -> list[tuple[Any, ...]] | None:
        """``sql`` on node ``name`` alone (autocommit); None when it cannot be reached."""
        return self._query(name, sql)

    # -- internals ---------------------------------------------------------------------------

    def _health(self) -> str:
        leader, standby = self.primary(), self.sync_standby()
        if leader is None or standby is None:
            return f"leader key {leader}, sync key {standby}"
        rows = self._query(
            leader,
            "SELECT application_name, state, sync_state FROM pg_stat_replication WHERE NOT pg_is_in_recovery()",
        )
        if rows is None:
            return f"{leader} (leader) does not answer"
        streaming = {name: sync for name, state, sync in rows if state == "streaming"}
        others = set(self.nodes) - {leader}
        if set(streaming) != others or streaming.get(standby) != "sync":
            return f"{leader} streams to {streaming}; sync key names {standby}"
        for name in others:
            if self._query(name, "SELECT pg_is_in_recovery()") != [(True,)]:
                return f"{name} is not a standby that answers"
        return "healthy"

    def _query(self, name: str, sql: str) -> list[tuple[Any, ...]] | None:
        import psycopg

        try:
            with psycopg.connect(self.node_dsn(name), autocommit=True) as conn:
                return conn.execute(sql).fetchall()  # type: ignore[arg-type]
        except psycopg.Error:
            return None

    def _etcd_value(self, key: str) -> str | None:
        url = f"http://127.0.0.1:{self.etcd_port}/v2/keys/service/{self.scope}/{key}"
        try:
            with urllib.request.urlopen(url, timeout=_API_TIMEOUT) as answer:
                return str(json.loads(answer.read())["node"]["value"])
        except (OSError, ValueError, KeyError):
            return None

    def _start_etcd(self, timeout: float) -> None:
        home = self.home / "etcd"
        home.mkdir()
        self._own(home)
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{self._etcd_peer_port}"
        with open(self.home / "etcd.log", "ab") as log:
            self._etcd = subprocess.Popen(
                [
                    ETCD, "--name", "etcd1", "--data-dir", str(home / "data"),
                    "--listen-client-urls", client, "--advertise-client-urls", client,
                    "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                    "--initial-cluster", f"etcd1={peer}", "--initial-cluster-state", "new",
                    "--enable-v2=true",  # Patroni's `etcd:` section speaks the v2 API
                ],
                cwd=home, env=self._env(), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, **self._user,
            )  # fmt: skip
        deadline = time.monotonic() + min(timeout, 20.0)
        while True:
            try:
                with urllib.request.urlopen(client + "/health", timeout=_API_TIMEOUT) as answer:
                    if json.loads(answer.read()).get("health") == "true":
                        return
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline or self._etcd.poll() is not None:
                raise RuntimeError("etcd did not start:\n" + _tail(self.home / "etcd.log"))
            time.sleep(0.05)

    def _patroni_config(self, node: Node) -> dict[str, Any]:
        return patroni_settings.node_config(
            patroni_settings.NodePlace(node.name, node.pg_port, node.api_port, node.home, PG_BIN),
            scope=self.scope,
            etcd_port=self.etcd_port,
            passwords=(self.password, self._replication_password, self._rewind_password),
            dcs=self._dcs,
        )

    def _env(self) -> dict[str, str]:
        home = str(self.home)
        return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8", "TZ": "UTC"}

    def _own(self, path: Path) -> None:
        """Hand ``path`` to the user PostgreSQL runs as (a directory: 0700, as PostgreSQL wants)."""
        if "user" in self._user:
            entry = pwd.getpwnam(self._user["user"])
            os.chown(path, entry.pw_uid, entry.pw_gid)
        if path.is_dir():
            path.chmod(0o700)

    def _note_shm(self, node: Node) -> None:
        """Note the System V segment that the node's ``postmaster.pid`` names (a killed postmaster leaves it)."""
        with contextlib.suppress(OSError, ValueError, IndexError):
            node.shm_ids.add(int((node.data_dir / "postmaster.pid").read_text().splitlines()[6].split()[1]))

    def _postmasters(self, node: Node, procs: list[procfs.Proc]) -> list[int]:
        """The node's postmasters (and single-user postgres): those naming its data dir."""
        marker = f" -D {node.data_dir} "
        return [p.pid for p in procs if p.comm == "postgres" and marker in procfs.cmdline(p.pid)]

    def _pids(self, node: Node, procs: list[procfs.Proc] | None = None) -> list[int]:
        """The node's live processes (of the snapshot ``procs``, or now): its Patroni first,
        then its postmasters, then the rest (so that, signalled in this order, none of them
        is restarted or forked meanwhile)."""
        self._note_shm(node)
        procs = procfs.processes() if procs is None else procs
        patroni = procfs.unreaped(node.proc)
        postmasters = self._postmasters(node, procs)
        rest = [p.pid for p in procs if p.pid not in postmasters and (p.session == patroni or p.ppid in postmasters)]
        first = [patroni] if patroni in rest else []
        return first + postmasters + [pid for pid in rest if pid != patroni]

    def _node_pids(self, procs: list[procfs.Proc]) -> set[int]:
        return {pid for node in self.nodes.values() for pid in self._pids(node, procs)}

    def _children(self) -> list[subprocess.Popen[bytes]]:
        return [proc for proc in [self._etcd, *(n.proc for n in self.nodes.values())] if proc is not None]

    def _signal_node(self, node: Node, signum: int) -> None:
        for pid in self._pids(node):
            procfs.send_signal(pid, signum)

    def _signal_patroni(self, node: Node, signum: int) -> None:
        patroni = procfs.unreaped(node.proc)
        if patroni > 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(patroni, signum)

    def _remove_shm(self) -> None:
        for node in self.nodes.values():
            for shm_id in node.shm_ids:
                subprocess.run(["ipcrm", "-m", str(shm_id)], capture_output=True, timeout=5, check=False)

    def _keep_logs(self) -> None:
        target = self.tmp_path / "pg-logs"
        with contextlib.suppress(OSError):
            target.mkdir(parents=True, exist_ok=True)
            for log in [self.home / "etcd.log", *self.home.glob("pg*/patroni.log"), *self.home.glob("pg*/log/*")]:
                if log.is_file():
                    node = log.relative_to(self.home).parts[0]
                    shutil.copyfile(log, target / f"{node}-{log.name}")


def _run_as() -> dict[str, Any]:
    """Popen's user/group for PostgreSQL and Patroni: ``postgres`` under root (both refuse root)."""
    if os.geteuid() != 0:
        return {}
    return {"user": "postgres", "group": "postgres", "extra_groups": []}


def _remove_tree(path: Path) -> None:
    """rmtree, one thread per top-level entry: unlinking PostgreSQL's ~1,000 files per data
    dir one by one takes 1.5-2 s on this machine's disk."""
    entries = list(path.iterdir()) if path.is_dir() else []
    threads = [
        threading.Thread(target=shutil.rmtree, args=(entry,), kwargs={"ignore_errors": True})
        for entry in entries
        if entry.is_dir()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    shutil.rmtree(path, ignore_errors=True)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""

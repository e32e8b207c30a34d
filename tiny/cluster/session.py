"""One connection to the cluster's primary: a bounded connect, deadlines that never cancel, warnings, who answered.

Every wait is bounded without ever cancelling a query: a cancelled COMMIT waiting for the
synchronous standby returns success with only a WARNING while the rows are on the primary
alone (../docs: the commit log's notes). So:

- connecting tries each host of the libpq string once, each for at most ``connect_timeout``
  seconds (libpq's per-host bound, at least 2), asking for a primary
  (``target_session_attrs=read-write``): :func:`connect` fails within ``connect_timeout`` x
  hosts with :class:`~tiny.cluster.errors.Unavailable`;
- a statement's result is awaited for at most its bound; past it, :class:`Watchdog` shuts the
  connection's socket down (``shutdown(2)``: no cancel request, no query is interrupted on the
  server's side by us) and the statement raises :class:`Lost`. A frozen primary (SIGSTOP, a
  paused container) keeps its TCP connections open and its kernel acknowledges every packet,
  so no TCP-level timeout can see it: only this deadline does. ``tcp_user_timeout`` and
  keepalives cover a host that stopped answering at the TCP level (powered off, cut off);
- the server's own bounds end what it can end cleanly, before our deadline: ``statement_timeout``
  and ``lock_timeout`` (never applied to COMMIT's wait for the standby: PostgreSQL disables the
  statement timeout before it commits), ``idle_in_transaction_session_timeout`` (a client frozen
  in the middle of a flush holds the log's head row at most that long), and
  ``client_connection_check_interval`` (a backend whose client went away stops waiting for a
  lock within a second).

:class:`Origin` is who answered a connection: the backend's pid and start, the server's
address and the primary's timeline; resolving a lost COMMIT compares them
(tiny.cluster.resolve). Not thread-safe: a session belongs to one thread, except that its
watchdog runs on a thread of its own.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tiny.cluster.errors import Unavailable

_CHECK_CLIENT_MS = 1000  # client_connection_check_interval: a backend whose client left stops within 1 s
_SERVER_MARGIN = 1.0  # seconds the server's own timeouts end before our deadline


@dataclass(frozen=True, slots=True)
class Timeouts:
    """The bounds of every wait of the commit log, in seconds."""

    connect: int = 2  # per host (libpq's connect_timeout; at least 2): a connect takes at most this x hosts
    statement: float = 5.0  # a statement other than COMMIT: the server's statement/lock timeout is 1 s less
    commit: float = 10.0  # COMMIT, its wait for the synchronous standby included
    resolve: float = 5.0  # settling a COMMIT whose answer was lost (reconnects included)
    read_wait: float = 2.0  # a follower's read, or head(), waiting for the synchronous standby
    retry_after: int = 2  # what Unavailable tells a client to wait before retrying

    def __post_init__(self) -> None:
        if self.connect < 2 or self.statement <= _SERVER_MARGIN or self.commit <= 0 or self.resolve <= 0:
            raise ValueError(f"timeouts out of range: {self}")


@dataclass(frozen=True, slots=True)
class Origin:
    """Who answered a connection: enough to tell, after a lost COMMIT, the same primary (same
    timeline, the same backend perhaps still running) from a new one."""

    backend_pid: int
    backend_start: datetime
    timeline: int
    server: str  # the server's own address and port, as it reports them


class Lost(Exception):
    """The connection is gone (closed by the server or the network, or shut down by its
    deadline): what was sent may or may not have run."""


class Watchdog:
    """Shuts a connection's socket down when the statement it guards outlives its deadline.

    One thread, waiting on a condition: :meth:`arm` before a statement, :meth:`disarm` after
    (it says whether the deadline fired). A deadline that passes while disarmed does nothing,
    so a statement that finished in time never loses its connection.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._fd = -1
        self._deadline: float | None = None
        self._fired = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="tiny-cluster-watchdog", daemon=True)
        self._thread.start()

    def arm(self, fd: int, seconds: float) -> None:
        """Guard the socket ``fd`` for ``seconds``. The watchdog keeps a duplicate of it until
        :meth:`disarm`: were the connection to close ``fd`` meanwhile and the number be reused,
        the deadline still shuts down this socket and no other."""
        own = os.dup(fd)
        with self._cond:
            self._fd, self._deadline, self._fired = own, time.monotonic() + seconds, False
            self._cond.notify()

    def disarm(self) -> bool:
        """Stop guarding; True when the deadline fired (the socket is shut down)."""
        with self._cond:
            self._deadline = None
            fired, own, self._fd = self._fired, self._fd, -1
        if own >= 0:
            os.close(own)
        return fired

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(5)

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._deadline, self._fired = None, True
                _shutdown(self._fd)


class Session:
    """A connection to the primary (autocommit: the log writes its own BEGIN and COMMIT), the
    warnings of the last statement, its :class:`Origin`."""

    def __init__(self, conn: psycopg.Connection[Any], origin: Origin, watchdog: Watchdog, timeouts: Timeouts) -> None:
        self.conn = conn
        self.origin = origin
        self.timeouts = timeouts
        self.warnings: list[str] = []
        self._watchdog = watchdog
        self._until: float | None = None  # a budget several statements share (monotonic time)
        conn.add_notice_handler(self._notice)

    @contextlib.contextmanager
    def budget(self, seconds: float) -> Iterator[None]:
        """Statements run inside share one deadline, ``seconds`` from now (each still at most
        its own bound)."""
        self._until = time.monotonic() + seconds
        try:
            yield
        finally:
            self._until = None

    def execute(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] = (), seconds: float | None = None
    ) -> list[tuple[Any, ...]]:
        """Run one statement and return its rows (none for a statement without); wait at most
        ``seconds`` (default: the statement bound), and no later than the current
        :meth:`budget`. Raises :class:`Lost` when the connection is gone, psycopg.Error when
        the server refused the statement (its transaction is then aborted, the connection
        usable)."""
        self.warnings = []
        try:
            self._watchdog.arm(self.conn.fileno(), self._limit(seconds))
            cursor = self.conn.execute(sql, params)  # type: ignore[arg-type]  # the log's own SQL, no user text
            rows = cursor.fetchall() if cursor.description is not None else []
        except psycopg.Error as exc:
            self._failed(exc)
            raise
        if self._watchdog.disarm():  # the deadline fired as the answer came: the answer stands, the socket is gone
            self.close()
        return rows

    def run(self, statements: Sequence[tuple[str, Any]], seconds: float | None = None) -> list[list[tuple[Any, ...]]]:
        """Send ``statements`` (each ``(sql, params)``) together in libpq's pipeline mode (one
        round trip) and return each one's rows. Bounded as :meth:`execute`, for the whole. A
        statement the server refuses raises its psycopg.Error, and the statements after it
        were not run (the server skips them); Lost as :meth:`execute`."""
        self.warnings = []
        try:
            self._watchdog.arm(self.conn.fileno(), self._limit(seconds))
            with self.conn.pipeline() as pipeline:
                cursors = [self.conn.cursor() for _ in statements]
                for cursor, (sql, params) in zip(cursors, statements, strict=True):
                    cursor.execute(sql, params)
                pipeline.sync()
                rows = [cursor.fetchall() if cursor.description is not None else [] for cursor in cursors]
        except psycopg.Error as exc:
            self._failed(exc)
            raise
        if self._watchdog.disarm():
            self.close()
        return rows

    def _limit(self, seconds: float | None) -> float:
        limit = self.timeouts.statement if seconds is None else seconds
        if self._until is not None:
            limit = min(limit, max(0.001, self._until - time.monotonic()))
        return limit

    def _failed(self, exc: psycopg.Error) -> None:
        """After a statement raised: Lost if the connection is gone (or shut by its deadline)."""
        fired = self._watchdog.disarm()
        if fired or self.conn.broken or self.conn.closed:
            self.close()
            raise Lost(f"{'no answer within the bound' if fired else 'connection lost'}: {exc}") from exc

    @property
    def usable(self) -> bool:
        return not (self.conn.closed or self.conn.broken)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()

    def _notice(self, diag: psycopg.errors.Diagnostic) -> None:
        if diag.severity_nonlocalized == "WARNING" and diag.message_primary:
            self.warnings.append(diag.message_primary)


def conninfo(dsn: str, timeouts: Timeouts, application_name: str = "tiny") -> str:
    """``dsn`` (a libpq string or URI naming every node) with the commit log's settings:
    primary only, the connect bound, keepalives, tcp_user_timeout, and the server-side bounds
    (see the module's docstring). The caller's own ``options`` come first; ours win."""
    params = conninfo_to_dict(dsn)
    server_ms = int((timeouts.statement - _SERVER_MARGIN) * 1000)
    ours = (
        f"-c synchronous_commit=on -c statement_timeout={server_ms} -c lock_timeout={server_ms} "
        f"-c idle_in_transaction_session_timeout={server_ms} -c client_connection_check_interval={_CHECK_CLIENT_MS}"
    )
    params.update(
        target_session_attrs="read-write",
        connect_timeout=str(timeouts.connect),
        keepalives="1",
        keepalives_idle="5",
        keepalives_interval="1",
        keepalives_count="3",
        tcp_user_timeout=str(int(timeouts.statement * 1000)),
        application_name=str(params.get("application_name") or application_name),
        options=f"{params.get('options') or ''} {ours}".strip(),
    )
    return make_conninfo("", **params)


def host_count(dsn: str) -> int:
    """How many hosts ``dsn`` names (a connect tries each once)."""
    params = conninfo_to_dict(dsn)
    hosts = str(params.get("host") or params.get("hostaddr") or "")
    return max(1, len(hosts.split(",")))


def connect(dsn: str, timeouts: Timeouts, watchdog: Watchdog) -> Session:
    """A session on whichever node is primary now. Raises Unavailable, within
    ``timeouts.connect`` x hosts, when none accepts writes."""
    info = conninfo(dsn, timeouts)
    try:
        conn = psycopg.connect(info, autocommit=True)
    except psycopg.Error as exc:
        bound = timeouts.connect * host_count(dsn)
        said = " ".join(str(exc).split())  # one line: libpq lists each host's failure on a line of its own
        raise Unavailable(
            f"no PostgreSQL primary reachable (tried every host, {bound} s at most): {said}", timeouts.retry_after
        ) from None
    try:
        origin = _origin(conn)
    except psycopg.Error as exc:
        conn.close()
        raise Unavailable(f"the primary did not answer: {exc}", timeouts.retry_after) from None
    return Session(conn, origin, watchdog, timeouts)


def _origin(conn: psycopg.Connection[Any]) -> Origin:
    row = conn.execute(
        "SELECT pg_backend_pid(), a.backend_start, pg_walfile_name(pg_current_wal_insert_lsn()), "
        "coalesce(host(inet_server_addr()), 'local') || ':' || coalesce(inet_server_port(), 0) "
        "FROM pg_stat_activity a WHERE a.pid = pg_backend_pid()"
    ).fetchone()
    assert row is not None
    return Origin(int(row[0]), row[1], int(str(row[2])[:8], 16), str(row[3]))


def _shutdown(fd: int) -> None:
    """shutdown(2) the socket ``fd``: the peer sees the end of the stream and our side's pending
    read returns at once. Never raises: the socket may be gone already."""
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=fd)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.detach()  # the descriptor stays the watchdog's, closed by disarm

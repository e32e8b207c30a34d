"""What the cluster tests share: fresh databases, a frozen WAL receiver, a host's files and position, bounds."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tiny import layout
from tiny.testing import Server
from tiny.testing_pg import ETCD, PATRONI, PG_BIN, PgCluster

MISSING = [
    name
    for name, path in (("patroni", PATRONI), ("etcd", ETCD), ("postgresql-15", str(PG_BIN / "postgres")))
    if not (shutil.which(path) or os.path.exists(path))
]
try:
    import psycopg  # noqa: F401
except ImportError:  # pragma: no cover - requirements.txt pins it
    MISSING.append("psycopg")

NEEDS_CLUSTER = pytest.mark.skipif(
    bool(MISSING), reason=f"needs {', '.join(MISSING)} (`make sysdeps` and requirements.txt install them)"
)


def fresh_database(cluster: PgCluster) -> str:
    """A new, empty database on the cluster; the cluster's DSN naming it."""
    name = "t_" + uuid.uuid4().hex[:12]
    on_primary(cluster.dsn, f"CREATE DATABASE {name}")
    return with_params(cluster.dsn, dbname=name)


def with_params(dsn: str, **params: str) -> str:
    """``dsn`` with ``params`` set (host, port, user, password, dbname...)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    return make_conninfo("", **{**conninfo_to_dict(dsn), **params})


def on_primary(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """``sql`` on the primary of ``dsn``, autocommit; its rows."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(sql, params)  # type: ignore[arg-type]
        return cursor.fetchall() if cursor.description else []


@contextlib.contextmanager
def wal_receiver_stopped(cluster: PgCluster, node: str) -> Iterator[int]:
    """SIGSTOP node's WAL receiver (it stops flushing what the primary sends, while the primary
    and Patroni still see it streaming, as synchronous standby); SIGCONT on leaving. Yields its pid."""
    rows = cluster.query(node, "SELECT pid FROM pg_stat_wal_receiver")
    assert rows, f"{node} has no WAL receiver"
    pid = int(rows[0][0])
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        os.kill(pid, signal.SIGCONT)


def eventually(check: Callable[[], Any], timeout: float, pause: float = 0.05) -> Any:
    """``check()``'s first truthy result within ``timeout`` seconds; AssertionError past it."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {check}")
        time.sleep(pause)


def without_password(cluster: PgCluster, dsn: str, folder: Path) -> str:
    """``dsn`` with its password moved to a passfile in ``folder`` (``passfile=``): the way
    ``--cluster`` takes one (it refuses a password in the string)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    passfile = folder / "pgpass"
    lines = [f"127.0.0.1:{node.pg_port}:*:*:{cluster.password}" for node in cluster.nodes.values()]
    passfile.write_text("\n".join(lines) + "\n")
    passfile.chmod(0o600)
    params = {k: v for k, v in conninfo_to_dict(dsn).items() if k != "password"}
    return make_conninfo("", **{**params, "passfile": str(passfile)})


# -- hosts in cluster mode (tiny.testing.Server with --cluster) --------------------------------


def host_flags(dsn: str, name: str, role: str) -> list[str]:
    """The flags of a test's Tiny host: cluster mode on ``dsn`` as ``name`` in ``role``, its
    analytics pool without CPU quota and idle priority (on a loaded 2-core machine those starve
    it past the reads' 10 s, which is not what the cluster tests measure)."""
    return ["--cluster", dsn, "--host-name", name, "--role", role, "--analytics-cpu", "0", "--analytics-nice", "0"]


def health(server: Server) -> dict[str, Any]:
    return server.request("GET", "/healthz").json()  # type: ignore[no-any-return]


def applied(server: Server) -> int:
    return int(health(server)["cluster"]["applied"])


def wait_applied(position: int, *servers: Server, timeout: float = 30.0) -> None:
    for server in servers:
        eventually(lambda server=server: applied(server) >= position, timeout)  # type: ignore[misc]


def data_files(server: Server) -> dict[str, bytes]:
    """Every day file and rejects file of a host's data dir: name -> bytes."""
    assert server.data_dir is not None
    root = server.data_dir
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and layout.is_data_file(str(path.relative_to(root)))
    }


def a_requests_bound() -> float:
    """The longest a POST may take: its wait for a primary (--lock-timeout, 5 s) and one commit
    (tiny.cluster.log CommitLog.bound with cluster mode's timeouts, three nodes)."""
    from tiny.cluster.log import CommitLog
    from tiny.commit.cluster import TIMEOUTS

    return 5.0 + CommitLog("host=a,b,c", timeouts=TIMEOUTS).bound

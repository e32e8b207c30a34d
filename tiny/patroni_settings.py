"""Patroni's settings for the test clusters: the cluster-wide ones and one node's configuration.

tiny.testing_pg writes :func:`node_config` for each node it starts; the ``make hosts`` PostgreSQL
image (docker/pg/) runs :data:`DCS_SETTINGS` too (tests/test_docker_hosts.py holds the two equal).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

SUPERUSER = "postgres"

# Patroni's cluster-wide settings (stored in etcd at bootstrap), as ../shared/postgres-ha-measured.md
# measured them: 0 acknowledged commits lost in 35 runs, a dead or frozen primary replaced in 10-16 s.
DCS_SETTINGS: dict[str, Any] = {
    "ttl": 10,  # seconds the leader key lives without renewal (default 30: 25-31 s without commits)
    "loop_wait": 2,  # seconds between two runs of Patroni's loop (default 10)
    "retry_timeout": 4,  # seconds Patroni retries etcd and PostgreSQL before it demotes (default 10)
    "maximum_lag_on_failover": 1048576,
    "synchronous_mode": True,
    "synchronous_mode_strict": True,  # no synchronous standby: commits wait, never go asynchronous
    "synchronous_node_count": 1,
    "postgresql": {
        "use_pg_rewind": True,  # an old primary rejoins as a standby by itself
        "use_slots": True,
        "parameters": {
            "synchronous_commit": "on",  # COMMIT returns once the synchronous standby flushed its WAL
            "wal_log_hints": "on",  # pg_rewind needs it (or data checksums)
            "wal_retrieve_retry_interval": "1s",  # default 5 s: a standby's retry after a failover
            "wal_level": "replica",
            "hot_standby": "on",
            "max_wal_senders": 10,
            "max_replication_slots": 10,
            "max_connections": 100,
        },
    },
}


class NodePlace(NamedTuple):
    """Where one node lives: its name, PostgreSQL and REST API ports on 127.0.0.1, its home
    (the data dir is ``home/data``) and the PostgreSQL binaries' directory."""

    name: str
    pg_port: int
    api_port: int
    home: Path
    bin_dir: Path


def node_config(
    place: NodePlace, *, scope: str, etcd_port: int, passwords: tuple[str, str, str], dcs: dict[str, Any]
) -> dict[str, Any]:
    """The Patroni configuration of the node at ``place`` in cluster ``scope`` (etcd's v2 API on
    ``etcd_port``): ``passwords`` of the superuser, the replication and the rewind users;
    ``dcs``: the cluster-wide settings its bootstrap stores (DCS_SETTINGS and the test's own)."""
    superuser, replication, rewind = passwords
    auth = {
        "superuser": {"username": SUPERUSER, "password": superuser},
        "replication": {"username": "replicator", "password": replication},
        "rewind": {"username": "rewind", "password": rewind},
    }
    return {
        "scope": scope,
        "namespace": "/service/",
        "name": place.name,
        "restapi": {"listen": f"127.0.0.1:{place.api_port}", "connect_address": f"127.0.0.1:{place.api_port}"},
        "etcd": {"host": f"127.0.0.1:{etcd_port}"},
        "bootstrap": {
            "dcs": dcs,
            "initdb": [{"encoding": "UTF8"}, {"locale": "C"}],
        },
        "postgresql": {
            "listen": f"127.0.0.1:{place.pg_port}",
            "connect_address": f"127.0.0.1:{place.pg_port}",
            "data_dir": str(place.home / "data"),
            "bin_dir": str(place.bin_dir),
            "pgpass": str(place.home / "pgpass"),
            "authentication": auth,
            "basebackup": [{"checkpoint": "fast"}],  # a replica's copy starts at once
            "pg_hba": [
                "local all all trust",
                "host replication replicator 127.0.0.1/32 scram-sha-256",
                "host all all 127.0.0.1/32 scram-sha-256",
            ],
            "parameters": {
                "unix_socket_directories": str(place.home),
                "logging_collector": "on",
                "log_directory": str(place.home / "log"),
                "log_min_messages": "warning",
                "log_line_prefix": "%m [%p] %a ",
            },
        },
        "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False, "nosync": False},
    }

"""Patroni's settings for the test clusters (tiny/patroni_settings.py); tests/test_testing_pg.py runs them."""

from __future__ import annotations

from pathlib import Path

from tiny.patroni_settings import DCS_SETTINGS, NodePlace, node_config


def _config(name: str, port: int) -> dict:
    place = NodePlace(name, port, port + 1, Path(f"/tmp/pg/{name}"), Path("/usr/lib/postgresql/15/bin"))
    return node_config(place, scope="tiny-x", etcd_port=2379, passwords=("s", "r", "w"), dcs=DCS_SETTINGS)


def test_a_commit_waits_for_one_synchronous_standby_and_never_goes_asynchronous() -> None:
    assert DCS_SETTINGS["synchronous_mode"] and DCS_SETTINGS["synchronous_mode_strict"]
    assert DCS_SETTINGS["synchronous_node_count"] == 1
    assert DCS_SETTINGS["postgresql"]["parameters"]["synchronous_commit"] == "on"


def test_nodes_differ_only_in_their_name_ports_and_directories() -> None:
    one, two = _config("pg1", 5500), _config("pg2", 5600)
    assert one["scope"] == two["scope"] and one["bootstrap"] == two["bootstrap"]
    assert one["postgresql"]["data_dir"] == "/tmp/pg/pg1/data" and one["postgresql"]["listen"] == "127.0.0.1:5500"
    assert one["restapi"]["listen"] == "127.0.0.1:5501" and two["name"] == "pg2"


def test_only_loopback_clients_with_a_password_are_admitted() -> None:
    hba = _config("pg1", 5500)["postgresql"]["pg_hba"]
    assert [line for line in hba if line.startswith("host")] == [
        "host replication replicator 127.0.0.1/32 scram-sha-256",
        "host all all 127.0.0.1/32 scram-sha-256",
    ]

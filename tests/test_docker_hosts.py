"""docker/hosts.yml for real: etcd and three PostgreSQL nodes under Patroni in containers come up,
elect a primary with a synchronous standby, and fail over when the primary's container is killed.

The image is built by `make images-cluster` (docker/build-cluster.sh, offline). Each compose
found (v2, and docker-compose 1.29) runs the file under its own project name, with the
password in a temp file; a CommitLog on the host commits through the containers' addresses
throughout, so the failover's gap is what a Tiny host would see. `down -v` removes the
containers, network and volumes whatever happens. Skipped, with the reason, unless `docker
info` works; TINY_DOCKER_TESTS=0 skips it too.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT
from tiny.testing import compose_variants, docker_unavailable
from tiny.testing_pg import DCS_SETTINGS

_REASON = "TINY_DOCKER_TESTS=0" if os.environ.get("TINY_DOCKER_TESTS") == "0" else docker_unavailable()
_COMPOSES = {} if _REASON else compose_variants()
_FILE = ROOT / "docker" / "hosts.yml"
_NODES = ("pg1", "pg2", "pg3")


def _run(args: list[str], timeout: float = 120.0, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)


class Hosts:
    """One compose project of docker/hosts.yml."""

    def __init__(self, home: Path, variant: str) -> None:
        command, extra = _COMPOSES[variant]
        self.project = "tinyhosts" + uuid.uuid4().hex[:8]
        self.password = secrets.token_hex(16)
        secret = home / "pg-password"
        secret.write_text(self.password)
        secret.chmod(0o644)  # compose bind-mounts it; the postgres user reads it
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TINY_")}
        self.env.update(TINY_PG_PASSWORD_FILE=str(secret), **extra)
        self.base = [*command, "-f", str(_FILE), "-p", self.project]

    def compose(self, *args: str, timeout: float = 180.0) -> str:
        done = _run([*self.base, *args], timeout=timeout, cwd=ROOT, env=self.env)
        assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}{done.stderr}"
        return done.stdout

    def container(self, service: str) -> str:
        args = ["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={self.project}"]
        args += ["--filter", f"label=com.docker.compose.service={service}"]
        return _run(args, timeout=30).stdout.split()[0]

    def address(self, service: str) -> str:
        fmt = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
        return _run(["docker", "inspect", "-f", fmt, self.container(service)], timeout=30).stdout.strip()

    def members(self) -> list[dict[str, Any]]:
        """Patroni's view (patronictl list), asked of the first node that answers."""
        for node in _NODES:
            done = _run(
                [
                    "docker",
                    "exec",
                    self.container(node),
                    "patronictl",
                    "-c",
                    "/etc/tiny/patroni.yml",
                    "list",
                    "-f",
                    "json",
                ],
                timeout=20,
            )
            if done.returncode == 0 and done.stdout.strip().startswith("["):
                return list(json.loads(done.stdout))
        return []

    def wait(self, healthy: bool, timeout: float, without: str | None = None) -> tuple[str, float]:
        """Until a leader other than ``without`` runs (``healthy``: and a synchronous standby and
        a replica, all three streaming); the leader's name and how long that took."""
        began = time.monotonic()
        while time.monotonic() - began < timeout:
            members = {m["Member"]: m for m in self.members()}
            leaders = [name for name, m in members.items() if m["Role"] == "Leader" and m["State"] == "running"]
            roles = sorted(m["Role"] for m in members.values() if m["State"] in ("running", "streaming"))
            if leaders and leaders[0] != without and (not healthy or roles == ["Leader", "Replica", "Sync Standby"]):
                return leaders[0], time.monotonic() - began
            time.sleep(0.5)
        raise AssertionError(f"no {'healthy cluster' if healthy else 'leader'} within {timeout} s: {self.members()}")

    def dsn(self) -> str:
        hosts = ",".join(self.address(node) for node in _NODES)
        return f"host={hosts} port=5432,5432,5432 dbname=postgres user=postgres password={self.password}"

    def down(self) -> None:
        _run([*self.base, "down", "-v", "--remove-orphans", "-t", "10"], timeout=120, cwd=ROOT, env=self.env)


@pytest.fixture(scope="module")
def image() -> float:
    began = time.monotonic()
    done = _run(["make", "images-cluster"], timeout=900, cwd=ROOT)
    assert done.returncode == 0, "make images-cluster failed:\n" + (done.stdout + done.stderr)[-4000:]
    return round(time.monotonic() - began, 1)


@pytest.fixture(params=sorted(_COMPOSES) or ["none"])
def hosts(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Hosts]:
    running = Hosts(tmp_path, request.param)
    try:
        yield running
    finally:
        running.down()


def commit_throughout(dsn: str, stop: threading.Event, acks: list[tuple[float, bytes]]) -> None:
    """Commit one small unkeyed batch after another, retrying what was not kept; record each ack."""
    from tiny.cluster.errors import OutcomeUnknown, Unavailable
    from tiny.cluster.log import CommitLog

    log = CommitLog(dsn)
    n = 0
    try:
        while not stop.is_set():
            body = f"batch {n}\n".encode()
            try:
                if log.digest_key is None:
                    log.open()
                log.commit([({"2014-05-04.csv": body}, None)])
            except Unavailable:  # nothing kept: the same batch again
                time.sleep(0.2)
                continue
            except OutcomeUnknown:  # may be in the log once: not retried, never acknowledged
                n += 1
                continue
            acks.append((time.monotonic(), body))
            n += 1
    finally:
        log.close()


def test_the_image_runs_the_settings_the_tests_run() -> None:
    config = json.loads((ROOT / "docker" / "pg" / "patroni.yml").read_text())
    assert config["bootstrap"]["dcs"] == DCS_SETTINGS
    assert "etcd" in config and "etcd3" not in config  # the v2 API: see tiny.testing_pg


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(900)
@pytest.mark.skipif(bool(_REASON), reason=str(_REASON))
def test_three_nodes_come_up_elect_a_primary_and_fail_over_when_its_container_is_killed(
    hosts: Hosts, image: float, figures: dict[str, Any]
) -> None:
    """docker/hosts.yml up, a CommitLog committing through it, the primary's container killed."""
    began = time.monotonic()
    hosts.compose("up", "-d")
    leader, _ = hosts.wait(healthy=True, timeout=120)
    figures.update(image_build_s=image, up_to_healthy_s=round(time.monotonic() - began, 1))
    stop, acks = threading.Event(), []
    writer = threading.Thread(target=commit_throughout, args=(hosts.dsn(), stop, acks))
    writer.start()
    try:
        time.sleep(3)
        killed_at = time.monotonic()
        assert _run(["docker", "kill", hosts.container(leader)], timeout=30).returncode == 0
        promoted, to_leader = hosts.wait(healthy=False, timeout=60, without=leader)
        deadline = time.monotonic() + 30
        while not any(t > killed_at + to_leader for t, _ in acks) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2)
    finally:
        stop.set()
        writer.join(60)
    times = sorted([killed_at, *(t for t, _ in acks)])
    gap = max(b - a for a, b in zip(times, times[1:], strict=False))
    assert promoted != leader and gap <= 30
    restarted = time.monotonic()
    assert _run(["docker", "start", hosts.container(leader)], timeout=60).returncode == 0
    hosts.wait(healthy=True, timeout=120)
    figures.update(
        acknowledged=len(acks),
        new_leader_after_s=round(to_leader, 1),
        longest_without_ack_s=round(gap, 1),
        old_primary_back_s=round(time.monotonic() - restarted, 1),
    )
    _check_log(hosts.dsn(), [body for _, body in acks])


def _check_log(dsn: str, acknowledged: list[bytes]) -> None:
    from tiny.cluster.log import CommitLog

    log = CommitLog(dsn)
    log.open()
    try:
        got: list[bytes] = []
        while more := log.read(len(got)):
            got += [b.files["2014-05-04.csv"] for b in more]
    finally:
        log.close()
    assert len(set(got)) == len(got)  # none twice
    assert set(acknowledged) <= set(got)  # none acknowledged lost

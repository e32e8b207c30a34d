"""`make hosts` for real: three Tiny hosts in cluster mode, PostgreSQL under Patroni, etcd and nginx
in containers (docker/hosts.yml), every one of them killed under load, then `make hosts-down`.

`make images-offline` builds the images (TARGETS=ingest: the app, nginx, PostgreSQL), unless
TINY_IMAGE, TINY_NGINX_IMAGE and TINY_PG_IMAGE name images to run instead. Each
rehearsal runs under its own project name, host port and password files (never the user's
`tiny-hosts` or build/hosts), with the compose it is given: `COMPOSE` set for docker/hosts.sh,
v2 from build/docker-config (`make compose-v2`) or docker-compose 1.29. `make hosts-down` runs
whatever happens, and the Docker objects of the project are removed by label after it.

The load (tests.hosts_support.Load) posts through nginx: keyed clients send each batch with its
own key until a 200 (no answer or a 5xx: the same key again), unkeyed clients send each batch
once. The checks: every acknowledged row on every host exactly once and each batch whole, no row
twice, every host's day files byte-identical once all have applied the log's head, no HTTP
request longer than nginx's bound, and the longest stretch without a 200 around each kill.

Skipped, with the reason, unless `docker info` works; TINY_DOCKER_TESTS=0 skips it too.
"""

from __future__ import annotations

import functools
import hashlib
import http.client
import json
import os
import secrets
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hosts_support import HOSTS, IMAGES, NODES, REQUEST_BOUND, RESUME_BOUND, Hosts, Load, check_hosts, run
from tests.support import ROOT, record
from tiny.patroni_settings import DCS_SETTINGS
from tiny.testing import compose_variants, docker_unavailable, free_port

_REASON = "TINY_DOCKER_TESTS=0" if os.environ.get("TINY_DOCKER_TESTS") == "0" else docker_unavailable()
_COMPOSES = {} if _REASON else compose_variants()

pytestmark = [pytest.mark.skipif(bool(_REASON), reason=str(_REASON))]


class Rehearsal(Hosts):
    """One `make hosts` project: its own name, port and password files; see the module doc."""

    def __init__(self, home: Path, variant: str) -> None:
        command, extra = _COMPOSES[variant]
        self.variant = variant
        self.project = "tinyhosts" + uuid.uuid4().hex[:8]
        self.port = free_port()
        self.secrets = home / "secrets"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TINY_") or k in IMAGES}
        self.env.update(
            COMPOSE=" ".join(command),
            TINY_HOSTS_PROJECT=self.project,
            TINY_HOSTS_PORT=str(self.port),
            TINY_HOSTS_SECRETS=str(self.secrets),
            **extra,
        )
        self.timings: dict[str, float] = {}

    def make(self, target: str, timeout: float = 400.0) -> str:
        began = time.monotonic()
        done = run(["make", target, f"TINY_HOSTS_PORT={self.port}"], timeout=timeout, cwd=ROOT, env=self.env)
        self.timings[f"make {target}"] = round(time.monotonic() - began, 1)
        assert done.returncode == 0, f"make {target} failed:\n{(done.stdout + done.stderr)[-8000:]}"
        return done.stdout

    def objects(self) -> dict[str, list[str]]:
        """The project's containers, networks and volumes that Docker still has."""
        label = f"label=com.docker.compose.project={self.project}"
        return {
            kind: run(["docker", *args, "--filter", label], timeout=30).stdout.split()
            for kind, args in (
                ("containers", ["ps", "-aq"]),
                ("networks", ["network", "ls", "-q"]),
                ("volumes", ["volume", "ls", "-q"]),
            )
        }

    def remove(self) -> None:
        """`make hosts-down`, then whatever it left, by label."""
        run(["make", "hosts-down"], timeout=180, cwd=ROOT, env=self.env)
        left = self.objects()
        if left["containers"]:
            run(["docker", "rm", "-f", "-v", *left["containers"]], timeout=60)
        for kind in ("volumes", "networks"):
            if left[kind]:
                run(["docker", kind[:-1], "rm", *left[kind]], timeout=60)

    def filters(self, service: str) -> list[str]:
        return [
            "--filter",
            f"label=com.docker.compose.project={self.project}",
            "--filter",
            f"label=com.docker.compose.service={service}",
        ]


@pytest.fixture(scope="module")
def images() -> float:
    if all(os.environ.get(name) for name in IMAGES):
        return 0.0
    began = time.monotonic()
    done = run(["make", "images-offline"], timeout=900, cwd=ROOT, env={**os.environ, "TARGETS": "ingest"})
    assert done.returncode == 0, "make images-offline failed:\n" + (done.stdout + done.stderr)[-4000:]
    return round(time.monotonic() - began, 1)


def _variant(preferred: str) -> str:
    return preferred if preferred in _COMPOSES else sorted(_COMPOSES or ["none"])[0]


@pytest.fixture
def rehearsal(request: pytest.FixtureRequest, tmp_path: Path, images: float) -> Iterator[Rehearsal]:
    running = Rehearsal(tmp_path, _variant(request.param))
    running.timings["make images-offline"] = images
    try:
        yield running
    finally:
        print(f"\n{running.variant} timings (s): {running.timings}")
        running.remove()


def test_the_image_runs_the_settings_the_tests_run_and_failsafe_mode() -> None:
    """The loopback tests' Patroni settings (tiny.testing_pg), plus failsafe_mode: with one etcd
    member, a primary that still reaches both standbys keeps writing while etcd is down."""
    config = json.loads((ROOT / "docker" / "pg" / "patroni.yml").read_text())
    dcs = dict(config["bootstrap"]["dcs"])
    assert dcs.pop("failsafe_mode") is True
    assert dcs == {k: v for k, v in DCS_SETTINGS.items() if k != "failsafe_mode"}
    assert "etcd" in config and "etcd3" not in config  # the v2 API: see tiny.testing_pg


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.extended  # the same kills on processes run by default: tests/test_cluster_faults.py
@pytest.mark.timeout(900)
@pytest.mark.parametrize("rehearsal", ["v2"], indirect=True)
def test_any_one_container_killed_under_load_loses_no_acknowledged_row_and_ingest_goes_on(
    rehearsal: Rehearsal, figures: dict[str, Any]
) -> None:
    """`make hosts`; 3 keyed and 1 unkeyed clients through nginx; docker kill (SIGKILL) of the
    primary's PostgreSQL, then the synchronous standby's, an ingest host, etcd, each started
    again and back before the next; then every host caught up and compared; `make hosts-down`."""
    rehearsal.make("hosts")
    assert rehearsal.replicated() and rehearsal.caught_up()  # what `make hosts` waited for
    load = Load(rehearsal.port, keyed=3, unkeyed=1).start()
    gaps: dict[str, float] = {}
    back: dict[str, float] = {}
    try:
        load.wait_acks(40, since=0, timeout=60)
        for victim in ("primary", "sync standby", "ingest host", "etcd"):
            service = {"primary": "leader", "sync standby": "sync_standby"}.get(victim)
            service = rehearsal.role(service) if service else "host1" if victim == "ingest host" else "etcd"
            leader = rehearsal.role("leader")
            if victim == "ingest host":
                assert rehearsal.metric("host1", "tiny_received_bytes_total") > 0  # it took ingest
            killed = time.monotonic()
            assert run(["docker", "kill", rehearsal.container(service)], timeout=30).returncode == 0
            load.wait_acks(20, since=killed, timeout=60)
            _while_down(rehearsal, load, victim, service, leader, killed)
            assert run(["docker", "start", rehearsal.container(service)], timeout=60).returncode == 0
            back[victim] = round(
                rehearsal.wait_for(f"{service} back", functools.partial(_back, rehearsal, service), 120), 1
            )
            restarted = time.monotonic()
            load.wait_acks(20, since=restarted, timeout=60)
            gaps[victim] = round(load.longest_without_ack(killed, time.monotonic()), 1)
    finally:
        load.stop()
    assert rehearsal.metric("host3", "tiny_received_bytes_total") == 0  # the read host took no ingest
    caught = rehearsal.wait_for("every host applied the head", rehearsal.caught_up, 120)
    assert all(status == "200" for status, _ in load.outcomes[True]), load.statuses()  # every keyed batch got its 200
    counts = check_hosts(rehearsal, load)
    longest = max(load.attempts)
    figures.update(
        case=f"make hosts ({rehearsal.variant}): docker kill of each kind of container, 3 keyed + 1 unkeyed clients",
        statuses=load.statuses(),
        rows=counts,
        longest_without_a_200_s=gaps,
        back_after_s=back,
        caught_up_after_s=round(caught, 1),
        longest_request_s=round(longest, 2),
        timings=rehearsal.timings,
    )
    print(json.dumps(figures, indent=1))
    assert longest <= REQUEST_BOUND, f"a request took {longest:.1f} s"
    assert gaps["primary"] <= RESUME_BOUND, gaps
    assert all(gap <= RESUME_BOUND for gap in gaps.values()), gaps
    rehearsal.make("hosts-down")
    assert rehearsal.objects() == {"containers": [], "networks": [], "volumes": []}


def _while_down(rehearsal: Rehearsal, load: Load, victim: str, service: str, leader: str, killed: float) -> None:
    """Prove what the kill did, while ``service`` is down, 20 200s after it: another node leads
    (primary), another is the synchronous standby (sync standby); with etcd, the primary stays
    the same and goes on committing, in Patroni's failsafe mode, for two leader-key lives (ttl)."""
    if victim == "primary":
        rehearsal.wait_for("a new leader", lambda: rehearsal.holder("leader") not in (None, service), 30)
    elif victim == "sync standby":
        rehearsal.wait_for("a new sync standby", lambda: rehearsal.holder("sync_standby") not in (None, service), 30)
        assert rehearsal.role("leader") == leader
    elif victim == "etcd":
        rehearsal.wait_for("failsafe mode", lambda: bool(rehearsal.patroni(leader).get("failsafe_mode_is_active")), 30)
        while time.monotonic() < killed + 2 * DCS_SETTINGS["ttl"]:
            time.sleep(1)
            assert load.acked_since(time.monotonic() - 1) > 0, "no 200 within a second while etcd is down"
        assert rehearsal.patroni(leader)["role"] == "master"  # Patroni 3.0's name for the primary


def _back(rehearsal: Rehearsal, service: str) -> bool:
    """``service`` is running and healthy again, and the whole rehearsal with it."""
    if rehearsal.health(service) != "running healthy":
        return False
    if service in NODES or service == "etcd":
        return rehearsal.replicated()
    return rehearsal.healthz(service)[0] == 200


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(600)
@pytest.mark.parametrize("rehearsal", ["v1"], indirect=True)
def test_make_hosts_serves_every_host_routes_ingest_to_ingest_hosts_and_hosts_down_removes_it_all(
    rehearsal: Rehearsal,
) -> None:
    """With docker-compose 1.29 where it is installed: `make hosts` writes the password files,
    nginx answers on 127.0.0.1 only, a batch posted through nginx reaches every host's files
    (and a read that waits for its position sees it), the read host refuses /ingest, nginx's
    own errors are JSON with a charset; `make hosts-down` leaves nothing, password files included."""
    rehearsal.make("hosts")
    assert rehearsal.caught_up()
    assert sorted(p.name for p in rehearsal.secrets.iterdir()) == ["pg-password", "tiny-pg-password"]
    assert rehearsal.secrets.stat().st_mode & 0o777 == 0o700
    ports = run(["docker", "port", rehearsal.container("nginx")], timeout=30).stdout.split()
    assert ports == ["8890/tcp", "->", f"127.0.0.1:{rehearsal.port}"], ports
    body = b"\n".join(json.dumps(record(date="2014-05-22", ip_id=i + 1)).encode() for i in range(50))
    conn = http.client.HTTPConnection("127.0.0.1", rehearsal.port, timeout=30)
    try:
        conn.request("POST", "/ingest", body, {"Idempotency-Key": secrets.token_hex(8)})
        answer = conn.getresponse()
        assert answer.status == 200, answer.read()
        answer.read()
        position = answer.getheader("Tiny-Position")
        assert position is not None and int(position) > 0
        for _ in range(6):  # reaches every host: each waits for the position, then counts the 50
            conn.request("GET", "/api/days/2014-05-22/summary", headers={"Tiny-Wait-Position": position})
            answer = conn.getresponse()
            assert answer.status == 200 and json.loads(answer.read())["downloads"] == 50
        conn.request("GET", "/%00")  # nginx answers it itself
        answer = conn.getresponse()
        assert answer.status == 400 and answer.getheader("Content-Type") == "application/json; charset=utf-8"
        answer.read()
    finally:
        conn.close()
    rehearsal.wait_for("every host applied the head", rehearsal.caught_up, 60)
    day = {host: rehearsal.files(host)["/data/2014-05-22.csv"] for host in HOSTS}
    assert len(set(day.values())) == 1, day
    assert hashlib.sha256(rehearsal.read("host3", "/data/2014-05-22.csv")).hexdigest() == day["host3"]
    refused = run(
        ["docker", "exec", rehearsal.container("host3"), "python3", "-S", "-c",
         "import urllib.request as u, urllib.error as e\n"
         "try: u.urlopen(u.Request('http://127.0.0.1:8000/ingest', data=b'', method='POST'), timeout=5)\n"
         "except e.HTTPError as x: print(x.code)"],
        timeout=30,
    )  # fmt: skip
    assert refused.stdout.strip() == "421", refused
    rehearsal.make("hosts-down")
    assert rehearsal.objects() == {"containers": [], "networks": [], "volumes": []}
    assert list(rehearsal.secrets.iterdir()) == []

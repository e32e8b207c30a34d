"""docker stack deploy on a one-node Swarm, with the same files that compose runs: docker-compose.yml
(replicas of the app over one data dir) and docker/hosts.yml (Tiny hosts in cluster mode).

Skipped, with the reason, unless `docker info` works and this Docker is not in a Swarm
already (the tests init one and leave it: they must not take over someone else's);
TINY_DOCKER_TESTS=0 skips it too. The images come from `make images-offline` (both app
targets); TINY_IMAGE, TINY_NGINX_IMAGE and TINY_PG_IMAGE, when all set, name those
docker/hosts.yml runs instead.

What this machine's kernel cannot do is not tried: it has no IPVS, so service VIPs and the
routing mesh never answer; both files use `endpoint_mode: dnsrr` and a host-mode port for
nginx, which is what is tested. Several nodes could not be tried here either (one node
carries every placement label; no data dir shared across nodes): docs/scaling-out.md says
what was tested and what was not.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hosts_support import HOSTS, IMAGES, REQUEST_BOUND, RESUME_BOUND, Hosts, check_hosts
from tests.hosts_support import Load as HostsLoad
from tests.support import ROOT, Load, http_get
from tiny.testing import docker_unavailable, free_port, request


def _run(args: list[str], timeout: float = 120.0, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)  # type: ignore[call-overload,no-any-return]


def _skip_reason() -> str | None:
    if os.environ.get("TINY_DOCKER_TESTS") == "0":
        return "TINY_DOCKER_TESTS=0"
    reason = docker_unavailable()
    if reason:
        return reason
    state = _run(["docker", "info", "--format", "{{.Swarm.LocalNodeState}}"], timeout=30).stdout.strip()
    if state not in ("inactive", ""):
        return f"this Docker is in a Swarm already ({state}): the test will not touch it"
    return None


_REASON = _skip_reason()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.extended,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(bool(_REASON), reason=str(_REASON)),
]
TOKEN = "swarm-s3cret"


class Stack:
    """One `docker stack deploy` of docker-compose.yml plus docker/token.yml, on its own Swarm."""

    def __init__(self, home: Path) -> None:
        self.name = "tinyswarm" + uuid.uuid4().hex[:6]
        self.port = free_port()
        self.data = home / "data"
        self.data.mkdir()
        secret = home / "token"
        secret.write_text(TOKEN + "\n")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TINY_")}
        self.env.update(
            TINY_DATA_DIR=str(self.data),
            TINY_HTTP_PORT=str(self.port),
            TINY_HEALTH_INTERVAL="1s",
            TINY_TOKEN_SECRET=str(secret),
        )
        self.service = f"{self.name}_tiny"

    def docker(self, *args: str, timeout: float = 180.0) -> str:
        done = _run(["docker", *args], timeout=timeout, cwd=ROOT, env=self.env)
        assert done.returncode == 0, f"docker {' '.join(args)} failed:\n{done.stdout}{done.stderr}"
        return done.stdout

    def deploy(self) -> None:
        compose, token = str(ROOT / "docker-compose.yml"), str(ROOT / "docker" / "token.yml")
        self.docker("stack", "deploy", "-c", compose, "-c", token, self.name)

    def tasks(self) -> list[str]:
        """The hostnames (container ids, 12 digits) of the app's running tasks."""
        ids = self.docker("ps", "-q", "--filter", f"label=com.docker.swarm.service.name={self.service}")
        return [line[:12] for line in ids.split()]

    def wait_spread(self, replicas: int, timeout: float = 60.0) -> None:
        """Until health checks through nginx reach exactly ``replicas`` running tasks."""
        deadline = time.monotonic() + timeout
        while True:
            running = set(self.tasks())
            seen = set()
            for _ in range(8 * replicas):
                try:
                    status, _, body = http_get(self.port, "/healthz", timeout=5)
                except OSError:
                    break
                if status == 200:
                    seen.add(json.loads(body)["instance"].split(":")[0])
            if len(running) == replicas and seen == running:
                return
            assert time.monotonic() < deadline, f"nginx does not reach {replicas} tasks: {seen} of {running}"
            time.sleep(0.5)


@pytest.fixture(scope="module")
def swarm() -> Iterator[str]:
    """The images built, a one-node Swarm of this Docker (left at the end); its node's id."""
    built = _run(["make", "images-offline"], timeout=900, cwd=ROOT, env={**os.environ, "TARGETS": "ingest analytics"})
    assert built.returncode == 0, "make images-offline failed:\n" + (built.stdout + built.stderr)[-4000:]
    init = _run(["docker", "swarm", "init", "--advertise-addr", "127.0.0.1"], timeout=120)
    assert init.returncode == 0, init.stderr
    try:
        yield _run(["docker", "info", "--format", "{{.Swarm.NodeID}}"], timeout=30).stdout.strip()
    finally:
        _run(["docker", "swarm", "leave", "--force"], timeout=120)


def _remove_stack(name: str) -> None:
    """`docker stack rm`, then, once its containers are gone, its volumes (stack rm keeps them)."""
    _run(["docker", "stack", "rm", name], timeout=120)
    label = f"label=com.docker.stack.namespace={name}"
    deadline = time.monotonic() + 90
    while _run(["docker", "ps", "-aq", "--filter", label], timeout=30).stdout.split() and time.monotonic() < deadline:
        time.sleep(0.5)
    volumes = _run(["docker", "volume", "ls", "-q", "--filter", label], timeout=30).stdout.split()
    if volumes:
        _run(["docker", "volume", "rm", "-f", *volumes], timeout=60)


@pytest.fixture(scope="module")
def stack(swarm: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = Stack(tmp_path_factory.mktemp("swarm"))
    try:
        running.deploy()
        running.wait_spread(4, timeout=120)
        yield running
    finally:
        _remove_stack(running.name)


class HostsStack(Hosts):
    """docker/hosts.yml as a stack on the one-node Swarm, whose node carries every placement
    label of it (on several nodes each label goes to the node that is to run that service)."""

    LABELS = ("etcd", "pg1", "pg2", "pg3", "host1", "host2", "host3", "edge")

    def __init__(self, home: Path, node: str) -> None:
        self.name = "tinyhosts" + uuid.uuid4().hex[:6]
        self.node = node
        self.port = free_port()
        for secret in ("pg-password", "tiny-pg-password"):
            (home / secret).write_text(secrets.token_hex(16) + "\n")
            (home / secret).chmod(0o644)  # each service reads its secret as its own user
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TINY_") or k in IMAGES}
        self.env.update(
            TINY_HOSTS_PORT=str(self.port),
            TINY_PG_PASSWORD_FILE=str(home / "pg-password"),
            TINY_HOSTS_PASSWORD_FILE=str(home / "tiny-pg-password"),
        )

    def filters(self, service: str) -> list[str]:
        return ["--filter", f"label=com.docker.swarm.service.name={self.name}_{service}"]

    def docker(self, *args: str, timeout: float = 180.0) -> str:
        done = _run(["docker", *args], timeout=timeout, cwd=ROOT, env=self.env)
        assert done.returncode == 0, f"docker {' '.join(args)} failed:\n{done.stdout}{done.stderr}"
        return done.stdout

    def label(self, add: bool) -> None:
        flag = "--label-add" if add else "--label-rm"
        self.docker(
            "node", "update", *(f"{flag}={f'tiny.{n}=true' if add else f'tiny.{n}'}" for n in self.LABELS), self.node
        )

    def ready(self) -> bool:
        """Every service runs one task, a leader has a synchronous standby, every host serves, nginx answers."""
        replicas = self.docker("service", "ls", "--filter", f"name={self.name}_", "--format", "{{.Replicas}}").split()
        if len(replicas) != 8 or set(replicas) != {"1/1"} or not self.replicated():
            return False
        if any(self.healthz(host)[0] != 200 for host in HOSTS):
            return False
        try:
            return http_get(self.port, "/healthz", timeout=5)[0] == 200
        except OSError:
            return False


def _replaced(stack: HostsStack, service: str, old: str) -> bool:
    return stack.container(service) != old


@pytest.fixture
def hosts_stack(swarm: str, tmp_path: Path) -> Iterator[HostsStack]:
    running = HostsStack(tmp_path, swarm)
    running.label(add=True)
    try:
        yield running
    finally:
        _remove_stack(running.name)
        running.label(add=False)


def test_hosts_deploy_on_the_swarm_and_survive_a_host_and_the_primary_killed(
    hosts_stack: HostsStack, figures: dict[str, object]
) -> None:
    """`docker stack deploy -c docker/hosts.yml`: every service up (placement by node labels, the
    passwords as Swarm secrets, in no environment variable), nginx on its host-mode port; 2 keyed
    clients through it while a Tiny host's task and then the primary's are killed and Swarm
    replaces them (new containers on the same volumes): every keyed batch acknowledged, every
    host's files identical and each acknowledged row in them once."""
    began = time.monotonic()
    hosts_stack.docker("stack", "deploy", "-c", str(ROOT / "docker" / "hosts.yml"), hosts_stack.name)
    ready = hosts_stack.wait_for("the stack ready", hosts_stack.ready, 300)
    env = hosts_stack.docker("inspect", "-f", "{{json .Config.Env}}", hosts_stack.container("host1"))
    secret = Path(hosts_stack.env["TINY_HOSTS_PASSWORD_FILE"]).read_text().strip()
    assert secret not in env and "PG_PASSWORD_FILE=/run/secrets/tiny_pg_password" in env
    load = HostsLoad(hosts_stack.port, keyed=2, unkeyed=0).start()
    gaps: dict[str, float] = {}
    try:
        load.wait_acks(40, since=0, timeout=60)
        for victim in ("host1", "primary"):
            service = hosts_stack.role("leader") if victim == "primary" else victim
            old = hosts_stack.container(service)
            killed = time.monotonic()
            hosts_stack.docker("kill", old)
            load.wait_acks(20, since=killed, timeout=60)
            hosts_stack.wait_for(f"a new {service} task", functools.partial(_replaced, hosts_stack, service, old), 120)
            hosts_stack.wait_for("the stack ready again", hosts_stack.ready, 180)
            gaps[victim] = round(load.longest_without_ack(killed, time.monotonic()), 1)
    finally:
        load.stop()
    hosts_stack.wait_for("every host applied the head", hosts_stack.caught_up, 120)
    assert all(status == "200" for status, _ in load.outcomes[True]), load.statuses()
    counts = check_hosts(hosts_stack, load)
    figures.update(
        case="docker stack deploy -c docker/hosts.yml (one-node Swarm, 2 keyed clients)",
        ready_after_s=round(ready, 1),
        statuses=load.statuses(),
        rows=counts,
        longest_without_a_200_s=gaps,
        longest_request_s=round(max(load.attempts), 2),
        total_s=round(time.monotonic() - began, 1),
    )
    print(figures)
    assert max(load.attempts) <= REQUEST_BOUND
    assert all(gap <= RESUME_BOUND for gap in gaps.values()), gaps


@pytest.mark.hardening("exactly once: no batch could be retried safely")
def test_scale_and_a_rolling_update_fail_no_request_and_write_every_row_once(
    stack: Stack, figures: dict[str, object]
) -> None:
    """4 clients post throughout (each batch with its key, the token from a Docker secret):
    scale 4 -> 2 -> 4, then `docker service update --force`, one task at a time."""
    load = Load(
        stack.port, "2014-05-13", clients=4, size=50, max_seconds=600, retries=5,
        headers={"Authorization": f"Bearer {TOKEN}"},
    ).start()  # fmt: skip
    steps: dict[str, float] = {}
    try:
        load.wait_acked(20, timeout=30)
        for step, args in (
            ("scale to 2", ["service", "scale", "--detach=false", f"{stack.service}=2"]),
            ("scale to 4", ["service", "scale", "--detach=false", f"{stack.service}=4"]),
            ("rolling update", ["service", "update", "--detach=false", "--force", stack.service]),
        ):
            started = time.monotonic()
            stack.docker(*args, timeout=600)
            stack.wait_spread(2 if step == "scale to 2" else 4)
            steps[step] = round(time.monotonic() - started, 1)
            load.wait_acked(len(load.acked()) + 20, timeout=30)
    finally:
        load.stop()
    slowest = max(seconds for _, seconds, _, _ in load.requests)
    figures.update(
        case="docker stack deploy, scale 4 -> 2 -> 4, rolling update (one-node Swarm, 4 clients)",
        statuses=load.statuses(),
        steps_seconds=steps,
        slowest_answer_seconds=round(slowest, 2),
    )
    assert load.statuses() == {"200": len(load.requests)}, load.statuses()
    assert slowest < 10, f"a request took {slowest:.1f} s"
    load.check_day_file(stack.data)


def test_the_token_comes_from_a_docker_secret(stack: Stack) -> None:
    assert http_get(stack.port, "/healthz")[0] == 200
    task = stack.tasks()[0]
    env = stack.docker("inspect", "-f", "{{json .Config.Env}}", task)
    assert TOKEN not in env and "TINY_TOKEN_FILE=/run/secrets/tiny_token" in env
    assert request(stack.port, "POST", "/ingest", b"").status == 401
    assert request(stack.port, "POST", "/ingest", b"", {"Authorization": f"Bearer {TOKEN}"}).status == 200

"""docker stack deploy on a one-node Swarm, with the same docker-compose.yml that compose runs.

Skipped, with the reason, unless `docker info` works and this Docker is not in a Swarm
already (the test inits one and leaves it: it must not take over someone else's);
TINY_DOCKER_TESTS=0 skips it too. The images come from `make images-offline`.

What this machine's kernel cannot do is not tried: it has no IPVS, so service VIPs and the
routing mesh never answer; the compose file uses `endpoint_mode: dnsrr` for the app and a
host-mode port for nginx, which is what is tested. Several nodes (and a data dir shared
across them) could not be tried here either: docs/scaling-out.md says what they need.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

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
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200), pytest.mark.skipif(bool(_REASON), reason=str(_REASON))]
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
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    built = _run(["make", "images-offline"], timeout=900, cwd=ROOT)
    assert built.returncode == 0, "make images-offline failed:\n" + (built.stdout + built.stderr)[-4000:]
    running = Stack(tmp_path_factory.mktemp("swarm"))
    running.docker("swarm", "init", "--advertise-addr", "127.0.0.1")
    try:
        running.deploy()
        running.wait_spread(4, timeout=120)
        yield running
    finally:
        _run(["docker", "stack", "rm", running.name], timeout=120)
        deadline = time.monotonic() + 60
        while running.tasks() and time.monotonic() < deadline:
            time.sleep(0.5)
        _run(["docker", "swarm", "leave", "--force"], timeout=120)


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

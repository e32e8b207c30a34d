"""docker compose for real: `make images-offline`, then docker-compose.yml with four replicas
of the app behind nginx, scaled to two and back to four, then stopped.

Skipped, with the reason, unless `docker info` works; TINY_DOCKER_TESTS=0 skips it too.
Uses `docker compose` (v2) when `docker compose version` works, else `docker-compose` (v1),
with its own project name, a free host port on 127.0.0.1 and a temp dir as the bind-mounted
data dir; `down -v` removes its containers and network whatever happens.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ROOT, Load, http_get, record
from tiny.testing import compose_variants, docker_unavailable, free_port, request

_TIMEOUT = 10.0
_BUILD_TIMEOUT = 900.0  # a cold `make images-offline` (Debian root, Rust codec, app + nginx) takes about 5 min


def _run(args: list[str], timeout: float = 120.0, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)  # type: ignore[call-overload,no-any-return]


_REASON = "TINY_DOCKER_TESTS=0" if os.environ.get("TINY_DOCKER_TESTS") == "0" else docker_unavailable()
_COMPOSES = {} if _REASON else compose_variants()  # v2 and v1: the file must work with both
if _REASON:
    print(f"tests/test_docker.py skipped: {_REASON}")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200), pytest.mark.skipif(bool(_REASON), reason=str(_REASON))]


class Stack:
    """One compose project of docker-compose.yml; see the module docstring."""

    def __init__(self, home: Path, variant: str) -> None:
        command, extra = _COMPOSES[variant]
        self.variant = variant
        self.project = "tinytest" + uuid.uuid4().hex[:8]
        self.port = free_port()
        self.data = home / "data"
        self.data.mkdir()
        # TINY_IMAGE_TARGET stays: `make images-offline` built that target's image
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TINY_") or k == "TINY_IMAGE_TARGET"}
        self.env.update(
            TINY_DATA_DIR=str(self.data),
            TINY_HTTP_PORT=str(self.port),
            TINY_HEALTH_INTERVAL="1s",  # healthy, and nginx started, a second after start
            **extra,
        )
        self.base = [*command, "-f", str(ROOT / "docker-compose.yml"), "-p", self.project]
        self.timings: dict[str, float] = {}

    def compose(self, *args: str, timeout: float = 180.0, check: bool = True) -> str:
        started = time.monotonic()
        done = _run([*self.base, *args], timeout=timeout, cwd=ROOT, env=self.env)
        self.timings[" ".join(args)] = round(time.monotonic() - started, 1)
        output = done.stdout + done.stderr
        if check:
            assert done.returncode == 0, f"{' '.join(args)} failed:\n{output}"
        return output

    def containers(self, service: str | None = None, running: bool = True) -> list[str]:
        """Ids (12 hex digits, which are also the hostnames) of this project's containers."""
        args = ["docker", "ps", "-q", "--no-trunc", "--filter", f"label=com.docker.compose.project={self.project}"]
        if service:
            args += ["--filter", f"label=com.docker.compose.service={service}"]
        if not running:
            args.append("-a")
        return [line[:12] for line in _run(args, timeout=30).stdout.split()]

    def hosts_seen(self, requests: int) -> list[str]:
        """The replica (hostname) that answered each of ``requests`` health checks through nginx."""
        hosts = []
        for _ in range(requests):
            status, _, body = http_get(self.port, "/healthz", _TIMEOUT)
            assert status == 200, body
            hosts.append(json.loads(body)["instance"].split(":")[0])
        return hosts

    def wait_spread(self, replicas: int, timeout: float = 30.0) -> list[str]:
        """Until 8 health checks per replica reach exactly the running replicas, each at least twice."""
        deadline = time.monotonic() + timeout
        while True:
            expected = set(self.containers("tiny"))
            try:
                hosts = self.hosts_seen(8 * replicas)
                if len(expected) == replicas and set(hosts) == expected and min(map(hosts.count, expected)) >= 2:
                    return hosts
            except (OSError, http.client.HTTPException, AssertionError):
                hosts = []
            assert time.monotonic() < deadline, f"nginx does not spread over {sorted(expected)}: {hosts}"
            time.sleep(0.2)

    def logs(self) -> str:
        return self.compose("logs", "--no-color", "--tail", "40", check=False)

    def down(self) -> None:
        try:
            self.compose("down", "-v", "--remove-orphans", "-t", "10", timeout=120, check=False)
        finally:  # whatever down left, by this project's label
            left = self.containers(running=False)
            if left:
                _run(["docker", "rm", "-f", "-v", *left], timeout=60)
            _run(["docker", "network", "rm", f"{self.project}_default"], timeout=30)


def _without_cargo() -> dict[str, str]:
    """Our environment with every directory that holds cargo or rustc taken off PATH."""
    kept = [d for d in os.environ.get("PATH", "").split(os.pathsep) if not shutil.which("cargo", path=d)]
    kept = [d for d in kept if not shutil.which("rustc", path=d)]
    return {**os.environ, "PATH": os.pathsep.join(kept)}


@pytest.fixture(scope="module")
def images() -> dict[str, float]:
    """Both app targets and nginx, by the Dockerfiles alone: the host's cargo is out of reach."""
    env = {**_without_cargo(), "TARGETS": "ingest analytics"}
    assert shutil.which("cargo", path=env["PATH"]) is None
    started = time.monotonic()
    done = _run(["make", "images-offline"], timeout=_BUILD_TIMEOUT, cwd=ROOT, env=env)
    assert done.returncode == 0, "make images-offline failed:\n" + (done.stdout + done.stderr)[-6000:]
    return {"make images-offline": round(time.monotonic() - started, 1)}


def _image_size(tag: str) -> int:
    return int(_run(["docker", "image", "inspect", "-f", "{{.Size}}", tag], timeout=30).stdout)


def _image_id(tag: str) -> str:
    return _run(["docker", "image", "inspect", "-f", "{{.Id}}", tag], timeout=30).stdout.strip()


def test_the_ingest_image_is_at_most_200_mb_and_serves_with_the_compiled_codec(
    images: dict[str, float], tmp_path: Path, figures: dict[str, object]
) -> None:
    """The compiled codec built in the image; every answer works there: from the aggregates,
    and from one whale's rows (read with the standard library). `analytics` is the same image."""
    ingest, analytics = "tiny-data-server-ingest:local", "tiny-data-server-analytics:local"
    figures.update(
        case="image sizes", ingest_mb=round(_image_size(ingest) / 1e6), analytics_mb=round(_image_size(analytics) / 1e6)
    )
    assert _image_size(ingest) <= 200 * 10**6
    assert _image_id(analytics) == _image_id(ingest)
    port = free_port()
    data = tmp_path / "data"
    data.mkdir()
    os.chown(data, 10001, 10001)  # the image's user (compose hands ./data over by its entrypoint)
    started = _run(
        ["docker", "run", "-d", "--rm", "--read-only", "--tmpfs", "/tmp", "-p", f"127.0.0.1:{port}:8000",
         "-v", f"{data}:/data", ingest],
        timeout=60,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    container = started.stdout.strip()
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                status, _, body = http_get(port, "/healthz", _TIMEOUT)
                if status == 200:
                    break
            except (OSError, http.client.HTTPException):
                pass
            assert time.monotonic() < deadline, _run(["docker", "logs", container], timeout=30).stdout
            time.sleep(0.2)
        assert json.loads(body)["codec"] == "rust"
        line = json.dumps(record(date="2014-05-14")).encode()
        assert request(port, "POST", "/ingest", line).status == 200
        assert json.loads(http_get(port, "/api/days")[2])["days"][0]["rows"] == 1
        assert json.loads(http_get(port, "/api/days/2014-05-14/summary")[2])["downloads"] == 1
        status, _, body = http_get(port, "/api/days/2014-05-14/charts/traffic.svg")  # from the aggregates
        assert status == 200 and body.startswith(b"<?xml")
        status, _, body = http_get(port, "/api/days/2014-05-14/charts/detail.svg")  # from the rows
        assert status == 200 and body.startswith(b"<?xml")
        status, _, body = http_get(port, "/api/days/2014-05-14/whales/1/downloads")
        assert status == 200 and json.loads(body)["total"] == 1
    finally:
        _run(["docker", "stop", "-t", "10", container], timeout=60)


@pytest.fixture(scope="module", params=sorted(_COMPOSES) or ["none"])
def stack(
    images: dict[str, float], tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Stack]:
    running = Stack(tmp_path_factory.mktemp("compose"), request.param)
    running.timings.update(images)
    try:
        running.compose("up", "-d", "--no-build", "--scale", "tiny=4")
        yield running
    finally:
        print(f"\ncompose {request.param} timings (s): {running.timings}")
        running.down()


def test_requests_through_nginx_reach_all_four_replicas(stack: Stack) -> None:
    hosts = stack.wait_spread(4, timeout=30)
    assert len(set(hosts)) == 4
    assert json.loads(http_get(stack.port, "/healthz", _TIMEOUT)[2])["codec"] == "rust"  # built in the image


def test_posted_rows_land_once_in_the_bind_mounted_data_dir(stack: Stack) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", stack.port, timeout=_TIMEOUT)
    try:
        for number in range(40):
            lines = [json.dumps(record(date="2014-05-09", ip_id=number * 1000 + i + 1)) for i in range(50)]
            conn.request("POST", "/ingest", "\n".join(lines).encode())
            response = conn.getresponse()
            assert response.status == 200, response.read()
            response.read()
    finally:
        conn.close()
    rows = (stack.data / "2014-05-09.csv").read_bytes().splitlines()[1:]
    assert len(rows) == 40 * 50 and len(set(rows)) == len(rows)


def test_scale_to_two_and_back_to_four_while_clients_post(stack: Stack) -> None:
    load = Load(stack.port, "2014-05-10", clients=4, size=50, max_seconds=120).start()
    try:
        load.wait_acked(20, timeout=_TIMEOUT)
        stack.compose("up", "-d", "--no-build", "--scale", "tiny=2")
        assert len(stack.wait_spread(2, timeout=30)) == 16
        load.wait_acked(len(load.acked()) + 20, timeout=_TIMEOUT)
        stack.compose("up", "-d", "--no-build", "--scale", "tiny=4")
        assert len(set(stack.wait_spread(4, timeout=30))) == 4
        load.wait_acked(len(load.acked()) + 20, timeout=_TIMEOUT)
    finally:
        load.stop()
    slowest = max(seconds for _, seconds, _, _ in load.requests)
    print(f"scale 4 -> 2 -> 4 under load: {load.statuses()}, slowest answer {slowest:.2f} s")
    assert slowest < 5.0, "a request hung on a replica that was gone"
    # What a scale-down may cost (docs/scaling-out.md), rarely, and never a replayed POST:
    # no answer: nginx's reload closes idle client keep-alive connections (nothing was proxied);
    # 503: a request reached a replica while it drained (nothing kept, Retry-After);
    # 502: nginx sent a POST on a kept-alive connection just as the stopping replica closed it.
    statuses = load.statuses()
    assert set(statuses) <= {"200", "502", "503", "no answer"}, statuses
    assert len(load.requests) - statuses["200"] <= 0.02 * len(load.requests) + 10, statuses
    load.check_day_file(stack.data)


def _wait_healthy(containers: list[str], timeout: float = 30.0) -> None:
    """Until Docker's health check (every second here) passes in each of ``containers``."""
    deadline = time.monotonic() + timeout
    while True:
        args = ["docker", "inspect", "-f", "{{.State.Health.Status}}", *containers]
        states = _run(args, timeout=30).stdout.split()
        if states == ["healthy"] * len(containers):
            return
        assert time.monotonic() < deadline, f"not healthy after {timeout} s: {states}"
        time.sleep(0.2)


def test_replicas_restarted_two_at_a_time_under_load_fail_no_post(stack: Stack) -> None:
    """Every replica restarted, two at a time, the second pair as soon as the first is healthy
    again: their addresses do not change, so nginx is not reloaded and must not have written off
    the first pair (the compose nginx did, for 5 s: max_fails=1, then 502 "no live upstreams"
    while two replicas were up; one scale test in about ten hit it with over 900 502s)."""
    load = Load(stack.port, "2014-05-15", clients=4, size=50, max_seconds=120, retries=5).start()
    try:
        load.wait_acked(20, timeout=_TIMEOUT)
        replicas = stack.containers("tiny")
        for pair in (replicas[:2], replicas[2:]):
            _run(["docker", "restart", "-t", "10", *pair], timeout=60)
            _wait_healthy(pair)
        load.wait_acked(len(load.acked()) + 20, timeout=_TIMEOUT)
    finally:
        load.stop()
    print(f"4 replicas restarted two at a time under load: {load.statuses()}")
    assert load.statuses() == {"200": len(load.requests)}, load.statuses()
    load.check_day_file(stack.data)


@pytest.mark.hardening("exactly once: no batch could be retried safely")
def test_kill9_of_replicas_under_load_fails_no_post_and_writes_every_row_once(
    stack: Stack, figures: dict[str, object]
) -> None:
    """docker kill -s KILL of two of the four replicas under 4 clients (each batch with its key,
    sent again after no answer or a 5xx): nginx passes what was in flight to a live replica,
    which writes it unless it was stored; then the two come back."""
    load = Load(stack.port, "2014-05-12", clients=4, size=50, max_seconds=120, retries=5).start()
    try:
        load.wait_acked(20, timeout=_TIMEOUT)
        for victim in stack.containers("tiny")[:2]:
            _run(["docker", "kill", "-s", "KILL", victim], timeout=30)
            load.wait_acked(len(load.acked()) + 20, timeout=30)
        stack.compose("up", "-d", "--no-build", "--scale", "tiny=4")
        stack.wait_spread(4, timeout=30)
        load.wait_acked(len(load.acked()) + 20, timeout=_TIMEOUT)
    finally:
        load.stop()
    figures.update(
        case=f"docker kill of 2 of 4 replicas (compose {stack.variant}, 4 clients)", statuses=load.statuses()
    )
    assert load.statuses() == {"200": len(load.requests)}, load.statuses()
    load.check_day_file(stack.data)


def _app_processes(container: str) -> list[int]:
    """Host pids of the app's processes in ``container`` (its parent and workers; not init, nor
    a health check that `docker exec` runs as root meanwhile)."""
    top = _run(["docker", "top", container, "-eo", "pid,args"], timeout=30).stdout.splitlines()[1:]
    return [int(line.split()[0]) for line in top if "tiny-data-server" in line and "docker-init" not in line]


@pytest.mark.hardening("around 8: the containers ran with a writable root and default capabilities")
def test_the_containers_are_locked_down(stack: Stack) -> None:
    """Read-only root filesystems, every capability dropped but what the entrypoints need,
    no-new-privileges; the app itself runs with no capability at all, as the data dir's owner."""
    for container in stack.containers():
        config = json.loads(_run(["docker", "inspect", container], timeout=30).stdout)[0]["HostConfig"]
        assert config["ReadonlyRootfs"] is True, container
        added = sorted(cap.removeprefix("CAP_") for cap in config["CapAdd"])  # v2 writes CAP_CHOWN, v1 CHOWN
        assert [cap.removeprefix("CAP_") for cap in config["CapDrop"]] == ["ALL"]
        assert added == ["CHOWN", "KILL", "SETGID", "SETUID"]
        assert "no-new-privileges:true" in config["SecurityOpt"]
    app = stack.containers("tiny")[0]
    pids = _app_processes(app)
    assert pids
    for pid in pids:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        assert int(fields["CapEff"], 16) == 0 and int(fields["CapPrm"], 16) == 0, fields["CapPrm"]
        assert fields["NoNewPrivs"].strip() == "1"
        assert fields["Uid"].split()[0] == str(stack.data.stat().st_uid)
    write = _run(["docker", "exec", app, "sh", "-c", "echo x > /app/x"], timeout=30)
    assert write.returncode != 0 and "Read-only file system" in write.stderr


def test_stop_exits_every_container_with_0_and_loses_no_acked_row(stack: Stack) -> None:
    containers = stack.containers()
    assert len(containers) == 5  # four replicas and nginx
    load = Load(stack.port, "2014-05-11", clients=4, size=50, max_seconds=60).start()
    try:
        load.wait_acked(20, timeout=_TIMEOUT)
        stack.compose("stop", "-t", "15", timeout=120)
    finally:
        load.stop()
    inspect = ["docker", "inspect", "-f", "{{.State.ExitCode}} {{.State.Running}}"]
    codes = {name: _run([*inspect, name], timeout=30).stdout.split() for name in containers}
    assert all(code == ["0", "false"] for code in codes.values()), f"{codes}\n{stack.logs()}"
    load.check_day_file(stack.data)

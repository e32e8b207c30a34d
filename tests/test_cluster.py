"""The supervisord cluster for real: supervisor/supervisord.conf with nginx/local.conf and
nginx/proxy.conf, four single-process instances behind nginx.

The configs run from a copy of the repo's layout in a temp dir (app.py, tiny/ and .venv
are symlinks), so their %(here)s-relative data/ and var/ land there, unchanged, on a free
block of ports instead of 8888 and 8889-8892 (TINY_CLUSTER_PORT, as `make cluster` sets it),
so a `make cluster` already running is untouched.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, Load, http_get, record
from tiny.layout import HEADER
from tiny.testing import free_port_block, raw_exchange

_SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])
_MISSING = [name for name in ("supervisord", "supervisorctl", "nginx") if shutil.which(name, path=_SBIN_PATH) is None]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.reliability,
    pytest.mark.timeout(180),
    pytest.mark.skipif(bool(_MISSING), reason=f"needs {', '.join(_MISSING)} (`make sysdeps` installs them)"),
]

INSTANCES = 4
_TIMEOUT = 10.0  # seconds for any one HTTP request in these tests


def _session_members(sid: int) -> list[tuple[int, str]]:
    """(pid, state) of every process in session ``sid``: supervisord and all it started."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid:
            members.append((int(stat.parent.name), fields[0]))
    return members


def assert_json_error(status: int, headers: dict[str, str], body: bytes, expected: int) -> None:
    assert status == expected, body
    assert headers["content-type"] == "application/json; charset=utf-8"
    error = json.loads(body)["error"]
    assert error["status"] == expected and error["message"]


class Cluster:
    """supervisord -n with the repo's configs in a temp copy of the layout; see the module doc."""

    def __init__(self, home: Path, instances: int = INSTANCES, env: dict[str, str] | None = None) -> None:
        self.home = home
        self.extra_env = env or {}
        self.instances = instances
        self.base = free_port_block(instances + 1)
        self.port = self.base  # nginx
        self.instance_ports = [self.base + n for n in range(1, instances + 1)]
        self.data = home / "data"
        self.conf = home / "supervisor" / "supervisord.conf"
        for name in ("supervisor", "nginx", "data", "var/log", "var/nginx"):  # `make cluster` makes var/
            (home / name).mkdir(parents=True, exist_ok=True)
        for name in ("app.py", "tiny", ".venv"):
            (home / name).symlink_to(ROOT / name)
        shutil.copy(ROOT / "supervisor" / "supervisord.conf", self.conf)
        for name in ("local.conf", "proxy.conf", "cluster-entrypoint.sh"):
            shutil.copy(ROOT / "nginx" / name, home / "nginx" / name)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> Cluster:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TINY_")}
        env.update(PATH=_SBIN_PATH, TINY_CLUSTER_PORT=str(self.base), TINY_CLUSTER_SIZE=str(self.instances))
        env.update(self.extra_env)
        self.output = (self.home / "supervisord.out").open("wb")
        self.proc = subprocess.Popen(
            [shutil.which("supervisord", path=_SBIN_PATH) or "supervisord", "-n", "-c", str(self.conf)],
            cwd=self.home,
            env=env,
            stdout=self.output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its session holds every process it starts: see stop()
        )
        try:
            self.wait_serving(timeout)
        except BaseException:
            self.stop()  # a cluster that did not come up is not left running (its caller has no handle yet)
            raise
        return self

    def wait_serving(self, timeout: float = 30.0) -> None:
        """Until nginx answers and its health checks reach every instance."""
        deadline = time.monotonic() + timeout
        seen: set[int] = set()
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, self.logs()
            try:
                status, _, body = http_get(self.port, "/healthz", timeout=2)
                if status == 200:
                    seen.add(int(json.loads(body)["instance"].split(":")[1].split("/")[0]))
            except OSError:
                pass
            if seen == set(self.instance_ports):
                if self.ctl("status").count("RUNNING") == self.instances + 1:  # supervisord's startsecs are over too
                    return
            time.sleep(0.02)
        raise AssertionError(f"cluster not serving on all instances (saw {sorted(seen)}):\n{self.logs()}")

    def ctl(self, *args: str, timeout: float = 30.0) -> str:
        ctl = shutil.which("supervisorctl", path=_SBIN_PATH) or "supervisorctl"
        done = subprocess.run(
            [ctl, "-c", str(self.conf), *args], cwd=self.home, capture_output=True, text=True, timeout=timeout
        )
        return done.stdout + done.stderr

    def pid(self, name: str) -> int:
        return int(self.ctl("pid", name).strip() or 0)

    def logs(self) -> str:
        parts = []
        for path in [self.home / "supervisord.out", *sorted((self.home / "var" / "log").glob("*.log"))]:
            if path.exists():
                parts.append(f"--- {path.name}\n" + path.read_text(errors="replace")[-3000:])
        return "\n".join(parts)

    def stop(self) -> None:
        """Leave no process behind, whatever state the cluster is in."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self.ctl("shutdown", timeout=10)
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        for pid, _ in _session_members(self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.wait(10)
        self.output.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    running = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield running.start()
    finally:
        running.stop()


def instance_port(body: bytes) -> int:
    """The instance's own port from /healthz's ``<hostname>:<port>/<pid>``."""
    return int(json.loads(body)["instance"].rsplit(":", 1)[1].split("/")[0])


def test_health_checks_through_nginx_reach_all_four_instances(cluster: Cluster) -> None:
    assert "RUNNING" in cluster.ctl("status", "nginx")
    ports = [instance_port(http_get(cluster.port, "/healthz")[2]) for _ in range(8 * INSTANCES)]
    assert set(ports) == set(cluster.instance_ports)
    assert all(ports.count(port) >= 4 for port in cluster.instance_ports), sorted(ports)  # round robin


@pytest.mark.hardening("exactly once 12: a doubled or empty key was 400 directly but written through nginx")
@pytest.mark.parametrize("values", [["a", "b"], [""]])
def test_a_doubled_or_empty_key_is_refused_through_nginx_as_it_is_directly(cluster: Cluster, values: list[str]) -> None:
    lines = [f"Idempotency-Key: {value}".rstrip() + "\r\n" for value in values]
    request = (
        "POST /ingest HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n" + "".join(lines) + "\r\n"
    ).encode()
    for port in (cluster.port, cluster.instance_ports[0]):
        answer = raw_exchange(port, request)
        assert answer.startswith(b"HTTP/1.1 400 "), answer
        assert b"Idempotency-Key" in answer


def test_any_number_of_instances_gets_a_port_of_its_own(tmp_path: Path) -> None:
    """TINY_CLUSTER_SIZE=12: twelve instances on twelve consecutive ports, every one reached
    through nginx (the former pattern 800%(process_num)d gave the tenth port 80010)."""
    running = Cluster(tmp_path, instances=12)
    try:
        running.start(timeout=90)  # waits until nginx has reached every one of the twelve ports
        upstreams = (tmp_path / "var" / "nginx" / "upstreams.conf").read_text()
        assert upstreams.count("max_fails=1 fail_timeout=10s;") == upstreams.count("backup max_fails=0;") == 12
    finally:
        running.stop()


def _ingest_counts(cluster: Cluster) -> list[int]:
    counts = []
    for port in cluster.instance_ports:
        text = http_get(port, "/metrics")[2].decode()
        found = re.search(r'^tiny_requests_total\{handler="ingest",status="200"\} ([0-9.e+]+)$', text, re.M)
        counts.append(int(float(found.group(1))) if found else 0)
    return counts


def test_batches_posted_through_nginx_all_land(cluster: Cluster) -> None:
    before = _ingest_counts(cluster)
    conn = http.client.HTTPConnection("127.0.0.1", cluster.port, timeout=_TIMEOUT)
    try:
        for number in range(40):
            lines = [json.dumps(record(date="2014-05-05", ip_id=number * 1000 + i + 1)) for i in range(100)]
            conn.request("POST", "/ingest", "\n".join(lines).encode())
            response = conn.getresponse()
            answer = json.loads(response.read())
            assert response.status == 200, answer
            assert answer["result"]["stats"]["records"] == {"valid": 100, "invalid": 0, "total": 100}
    finally:
        conn.close()
    rows = (cluster.data / "2014-05-05.csv").read_bytes().splitlines()
    assert rows[0] + b"\n" == HEADER and len(rows) - 1 == 4000
    assert len(set(rows)) == len(rows)
    spread = [after - was for after, was in zip(_ingest_counts(cluster), before, strict=True)]
    assert sum(spread) == 40 and all(spread), spread  # every instance took some of them


def _raw(port: int, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes to 127.0.0.1:port; the one answer: (status, lower-cased headers, body)."""
    head, _, body = raw_exchange(port, data, _TIMEOUT).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


@pytest.mark.hardening("around 6: nginx's own errors were HTML, and a malformed request line a 500")
@pytest.mark.parametrize(
    "request_bytes, status",
    [
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n", 400),
        (b"POST /ingest HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n", 501),
        (b"TRACE / HTTP/1.1\r\nHost: x\r\n\r\n", 405),
        (b"GET / HTTP/3.0\r\nHost: x\r\n\r\n", 505),
        (b"G@T / HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"get / HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"GET /%00 HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400),
        (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\x00" * 40, 400),  # TLS to a plain port
        (b"GET /.tiny-error/502 HTTP/1.1\r\nHost: x\r\n\r\n", 404),
    ],
)
def test_every_answer_nginx_makes_itself_is_json(cluster: Cluster, request_bytes: bytes, status: int) -> None:
    log = cluster.home / "var" / "log" / "nginx-error.log"
    before = log.stat().st_size if log.exists() else 0
    got, headers, body = _raw(cluster.port, request_bytes)
    assert_json_error(got, headers, body, status)
    added = log.read_bytes()[before:].decode(errors="replace") if log.exists() else ""
    assert "empty URI" not in added and "[crit]" not in added and "[alert]" not in added, added


def test_nginx_refuses_an_oversized_body_with_a_json_413(cluster: Cluster) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", cluster.port, timeout=_TIMEOUT)
    try:
        conn.putrequest("POST", "/ingest")
        conn.putheader("Content-Length", str(64 * 1024**2 + 1))  # one byte over client_max_body_size 64m
        conn.endheaders()
        conn.send(b"{}\n" * 1000)  # nginx answers on the header, before reading the body
        response = conn.getresponse()
        assert_json_error(
            response.status, {"content-type": response.getheader("Content-Type", "")}, response.read(), 413
        )
    finally:
        conn.close()


@pytest.mark.hardening("exactly once: no batch could be retried safely")
def test_kill9_of_instances_under_load_fails_no_post_and_writes_every_row_once(
    cluster: Cluster, figures: dict[str, Any]
) -> None:
    """kill -9 of three of the 4 instances, one after the other, while 6 clients post 100-record
    batches through nginx: a POST that was in flight on a killed instance is passed to another
    with its Idempotency-Key (nginx's $request_id), which writes it unless it was stored."""
    load = Load(cluster.port, "2014-05-06").start()
    restarts = []
    try:
        load.wait_acked(30)
        for name in ("tiny:tiny-2", "tiny:tiny-3", "tiny:tiny-1"):
            victim = cluster.pid(name)
            killed = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            deadline = killed + 15
            while cluster.pid(name) in (0, victim) or "RUNNING" not in cluster.ctl("status", name):
                assert time.monotonic() < deadline, cluster.logs()
                time.sleep(0.05)
            restarts.append(round(time.monotonic() - killed, 2))
            load.wait_acked(len(load.acked()) + 30)
    finally:
        load.stop()
    figures.update(
        case="kill -9 of 3 of 4 instances behind nginx, one after the other (supervisord, 6 clients)",
        requests=len(load.requests),
        statuses=load.statuses(),
        restart_seconds=restarts,
    )
    assert load.statuses() == {"200": len(load.requests)}, load.statuses()
    figures.update(load.check_day_file(cluster.data))  # every acked row once, no row twice


def test_nginx_answers_a_json_502_when_no_instance_is_up(cluster: Cluster) -> None:
    assert "stopped" in cluster.ctl("stop", "tiny:*")
    try:
        assert_json_error(*http_get(cluster.port, "/healthz"), 502)
    finally:
        cluster.ctl("start", "tiny:*")
    cluster.wait_serving()


def test_shutdown_under_load_leaves_nothing_running_and_loses_no_acked_row(
    cluster: Cluster, figures: dict[str, Any]
) -> None:
    """`supervisorctl shutdown` of the whole cluster while 6 clients post through nginx."""
    assert cluster.proc is not None
    before = [pid for pid, _ in _session_members(cluster.proc.pid)]
    assert len(before) >= 1 + INSTANCES + 2  # supervisord, instances, nginx master and worker(s)
    load = Load(cluster.port, "2014-05-07").start()
    try:
        load.wait_acked(30)
        log_file = cluster.home / "var" / "log" / "supervisord.log"
        log_start = log_file.stat().st_size
        started = time.monotonic()
        assert "Shut down" in cluster.ctl("shutdown")
        code = cluster.proc.wait(30)
        stopped = time.monotonic()
    finally:
        load.stop()
    figures.update(
        case="supervisorctl shutdown under load (4 instances, 6 clients)",
        requests=len(load.requests),
        statuses=load.statuses(),
        exit_code=code,
        stop_seconds=round(stopped - started, 2),
    )
    assert code == 0, cluster.logs()
    assert _session_members(cluster.proc.pid) == []
    for pid in before:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    log = log_file.read_bytes()[log_start:].decode()
    assert len(re.findall(r"stopped: (tiny-\d|nginx) \(exit status 0\)", log)) == 1 + INSTANCES, log
    assert set(load.statuses()) <= {"200", "no answer"}, load.statuses()  # nginx stops first, then they drain
    figures.update(load.check_day_file(cluster.data))


def _hammer(port: int, stop: threading.Event, sent: list[int]) -> None:
    """POST with a wrong token as fast as the answers come, on keep-alive connections."""
    conn: http.client.HTTPConnection | None = None
    body = json.dumps(record(date="2014-05-06")).encode()
    while not stop.is_set():
        try:
            conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=_TIMEOUT)
            conn.request("POST", "/ingest", body, {"Authorization": "Bearer wrong"})
            response = conn.getresponse()
            response.read()
            sent.append(response.status)
            if response.will_close:
                conn.close()
                conn = None
        except (OSError, http.client.HTTPException):
            if conn is not None:
                conn.close()
            conn = None
    if conn is not None:
        conn.close()


@pytest.mark.hardening("ingest 2: an early refusal left nginx a connection the app was closing")
def test_a_wrong_token_client_hammering_costs_honest_clients_nothing(tmp_path: Path, figures: dict[str, Any]) -> None:
    """Early refusals (401 before the body is read) say Connection: close, so nginx never reuses
    a connection the app is closing: 3 honest keep-alive clients, 2 unthrottled wrong-token ones."""
    token = "cluster-s3cret"
    running = Cluster(tmp_path, env={"TINY_TOKEN": token}).start()
    stop = threading.Event()
    wrong: list[int] = []
    hammers = [threading.Thread(target=_hammer, args=(running.port, stop, wrong)) for _ in range(2)]
    try:
        load = Load(running.port, "2014-05-07", clients=3, size=50, headers={"Authorization": f"Bearer {token}"})
        load.start()
        for hammer in hammers:
            hammer.start()
        time.sleep(6)
        load.stop()
    finally:
        stop.set()
        for hammer in hammers:
            hammer.join(_TIMEOUT + 5)
        running.stop()
    figures.update(
        case="a wrong-token client hammering nginx next to honest keep-alive clients",
        honest=load.statuses(),
        wrong_token={str(status): wrong.count(status) for status in sorted(set(wrong))},
    )
    assert set(load.statuses()) == {"200"}, load.statuses()
    assert len(load.acked()) > 20 and set(wrong) == {401} and len(wrong) > 100
    load.check_day_file(running.data)


@pytest.mark.hardening("exactly once 3: nginx never passed a timed-out POST on from a hung instance")
def test_a_hung_instance_costs_a_request_at_most_the_read_timeout_and_writes_nothing_twice(
    tmp_path: Path, figures: dict[str, Any]
) -> None:
    """One instance SIGSTOPped (its parent and worker: nothing can replace it) behind nginx,
    under 4 clients: a request sent to it waits nginx's read timeout (15 s) and goes on to
    another instance with its key; the instance is then skipped. The old config answered about
    1 request in 4 with a 504 after 60 s, never passed on.

    The flush lock may wait 30 s here, not 5: this is about nginx and a hung instance. On a CI
    machine running another heavy test beside it, a running instance once held the lock 5 s
    (its log: no error, only slow), and another's flush got the lock timeout's 503, which this
    load does not retry (tests/test_stalls.py holds the lock timeout itself to its word)."""
    running = Cluster(tmp_path, env={"TINY_LOCK_TIMEOUT": "30"}).start()
    victim = os.getpgid(running.pid("tiny:tiny-2"))
    try:
        os.killpg(victim, signal.SIGSTOP)
        load = Load(running.port, "2014-05-08", clients=4, size=20, max_seconds=22, timeout=60).start()
        time.sleep(22)
        load.stop()
    finally:
        os.killpg(victim, signal.SIGCONT)
    try:
        slowest = load.slowest()
        figures.update(
            case="one of 4 instances SIGSTOPped behind nginx for 22 s (4 clients, nginx's keys only)",
            requests=len(load.requests),
            statuses=load.statuses(),
            slowest_seconds=round(slowest, 1),
        )
        assert load.statuses() == {"200": len(load.requests)}, load.statuses()
        assert 14 < slowest < 15 + 3  # the read timeout, then the next instance
        figures.update(load.check_day_file(running.data))  # every acked row once, no row twice
    finally:
        running.stop()

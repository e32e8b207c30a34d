"""What the tests of docker/hosts.yml share (compose: tests/test_docker_hosts.py; Swarm:
tests/test_swarm.py): a view of a running rehearsal from outside, a load through its nginx, and
the checks of every host's day files.

:class:`Hosts` finds each service's container by labels (compose's or Swarm's: a subclass says
which) and asks everything from inside the containers with ``docker exec`` (a Swarm's overlay
addresses are not reachable from the Docker host). :class:`Load` keeps every HTTP request's
duration, every 200's arrival and every batch's outcome; :func:`check_day` is the exactly-once
check of one day file against them.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from tests.support import record

NODES = ("pg1", "pg2", "pg3")
HOSTS = ("host1", "host2", "host3")
# One HTTP request through nginx takes at most this long (nginx/proxy.conf: passing on ends
# 45 s in, and the try under way then has its 15 s read timeout): past it, a request hung.
REQUEST_BOUND = 45.0 + 15.0
RESUME_BOUND = 30.0  # issue 46: ingest resumes within 30 s of a primary's death
KEYED_DAY, UNKEYED_DAY = "2014-05-20", "2014-05-21"
# Images of one's own (docker/hosts.yml's variables): when all three are set, they run and none is built.
IMAGES = ("TINY_IMAGE", "TINY_NGINX_IMAGE", "TINY_PG_IMAGE")


def run(args: list[str], timeout: float = 120.0, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)


class Hosts:
    """A running docker/hosts.yml, seen from outside; :meth:`filters` says how its containers
    are labelled."""

    def filters(self, service: str) -> list[str]:
        """``docker ps`` filters that select the containers of ``service``."""
        raise NotImplementedError

    def container(self, service: str) -> str:
        """The running container of ``service``, else its newest one."""
        base = ["docker", "ps", "-q", *self.filters(service)]
        found = run([*base, "--filter", "status=running"], timeout=30).stdout.split()
        found = found or run([*base, "-a"], timeout=30).stdout.split()
        assert found, f"{service}: no container"
        return found[0]

    def exec_python(self, service: str, script: str, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
        return run(["docker", "exec", self.container(service), "python3", "-S", "-c", script], timeout=timeout)

    def get(self, service: str, url: str) -> tuple[int, bytes]:
        """GET ``url`` from inside ``service``'s container: (status, body); (0, b"") when it fails."""
        script = (
            "import sys, urllib.request as u, urllib.error as e\n"
            "try: a = u.urlopen(sys.argv[1], timeout=5); s, b = a.status, a.read()\n"
            "except e.HTTPError as x: s, b = x.code, x.read()\n"
            "print(s); sys.stdout.flush(); sys.stdout.buffer.write(b)\n"
        )
        done = subprocess.run(
            ["docker", "exec", self.container(service), "python3", "-S", "-c", script, url],
            capture_output=True,
            timeout=30,
            check=False,
        )
        if done.returncode != 0:
            return 0, b""
        status, _, body = done.stdout.partition(b"\n")
        return int(status), body

    def health(self, service: str) -> str:
        fmt = "{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}healthy{{end}}"
        return run(["docker", "inspect", "-f", fmt, self.container(service)], timeout=30).stdout.strip()

    def healthz(self, host: str) -> tuple[int, dict[str, Any]]:
        """A Tiny host's own /healthz."""
        status, body = self.get(host, "http://127.0.0.1:8000/healthz")
        try:
            return status, dict(json.loads(body))
        except ValueError:
            return 0, {}

    def metric(self, host: str, name: str) -> float:
        """One sample of a Tiny host's /metrics (0 when it has none)."""
        status, body = self.get(host, "http://127.0.0.1:8000/metrics")
        assert status == 200, body
        for line in body.decode().splitlines():
            if line.split(" ")[0] == name:
                return float(line.split(" ")[1])
        return 0.0

    def members(self) -> dict[str, dict[str, Any]]:
        """Patroni's members (GET /cluster), asked of the first node that answers."""
        for node in NODES:
            status, body = self.get(node, "http://127.0.0.1:8008/cluster")
            if status == 200:
                return {m["name"]: m for m in json.loads(body)["members"]}
        return {}

    def patroni(self, node: str) -> dict[str, Any]:
        """A node's own view (GET /patroni), empty when it does not answer."""
        status, body = self.get(node, "http://127.0.0.1:8008/patroni")
        return dict(json.loads(body)) if status == 200 else {}

    def holder(self, role: str) -> str | None:
        """The one node Patroni names for ``role`` (leader, sync_standby) now, else None."""
        names = [name for name, m in self.members().items() if m["role"] == role]
        return names[0] if len(names) == 1 else None

    def role(self, role: str) -> str:
        """The node Patroni names for ``role``, waiting for there to be one (a failover, a switch
        of the synchronous standby, or a view of a node that is behind)."""
        self.wait_for(f"a single {role}", lambda: self.holder(role) is not None, 30)
        return str(self.holder(role))

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float) -> float:
        began = time.monotonic()
        while not check():
            assert time.monotonic() - began < timeout, f"{what}: not within {timeout} s\n{self.logs()}"
            time.sleep(0.5)
        return time.monotonic() - began

    def replicated(self) -> bool:
        """A leader and a synchronous standby, all three nodes running."""
        members = self.members().values()
        running = [m for m in members if m.get("state") in ("running", "streaming")]
        return len(running) == 3 and {"leader", "sync_standby"} <= {m["role"] for m in running}

    def caught_up(self) -> bool:
        """Every Tiny host serves (/healthz 200) and has applied the log's head as the primary has it."""
        answers = [self.healthz(host) for host in HOSTS]
        if any(status != 200 for status, _ in answers):
            return False
        head = self.log_head()
        return all(body["cluster"]["applied"] == head for _, body in answers)

    def log_head(self) -> int:
        """The log's head, read on the primary as the superuser (tiny.cluster.schema's table)."""
        sql = "SELECT position FROM tiny.head"
        leader = self.container(self.role("leader"))
        done = run(["docker", "exec", leader, "psql", "-h", "/tmp", "-d", "tiny", "-Atc", sql], timeout=30)
        assert done.returncode == 0, done.stderr
        return int(done.stdout)

    def files(self, host: str) -> dict[str, str]:
        """sha256 of every file under a host's /data but its own state (the dot files and folders)."""
        script = (
            "import hashlib, os, json\n"
            "out = {}\n"
            "for top, dirs, names in os.walk('/data'):\n"
            "    dirs[:] = [d for d in dirs if not d.startswith('.')]\n"
            "    for n in (n for n in names if not n.startswith('.')):\n"
            "        p = os.path.join(top, n)\n"
            "        out[p] = hashlib.sha256(open(p, 'rb').read()).hexdigest()\n"
            "print(json.dumps(out))\n"
        )
        done = self.exec_python(host, script, timeout=60)
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))

    def read(self, host: str, path: str) -> bytes:
        done = subprocess.run(["docker", "exec", self.container(host), "cat", path], capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def logs(self) -> str:
        lines = []
        for service in ("nginx", *HOSTS, *NODES, "etcd"):
            try:
                tail = run(["docker", "logs", "--tail", "15", self.container(service)], timeout=30)
            except AssertionError:
                continue
            lines.append(f"---- {service}\n{tail.stdout}{tail.stderr}")
        return "\n".join(lines)


class Load:
    """Clients posting unique batches through nginx until stopped (each at most ``batches``).

    ``keyed`` clients send each batch with its own Idempotency-Key until a 200 (no answer or a
    5xx: again after 0.25 s, the same key), for at most 120 s; ``unkeyed`` ones send each batch
    once. Every HTTP request's duration is kept, every 200's arrival time, and every batch's
    lines and final status.
    """

    def __init__(self, port: int, keyed: int, unkeyed: int, size: int = 20, batches: int = 4000) -> None:
        self.port = port
        self.size = size
        self.batches = batches
        self.run = uuid.uuid4().hex[:8]
        self.acks: list[float] = []  # monotonic time of each 200
        self.attempts: list[float] = []  # seconds of each HTTP request
        self.outcomes: dict[bool, list[tuple[str, list[bytes]]]] = {True: [], False: []}  # keyed -> (status, lines)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        clients = [(n, True) for n in range(keyed)] + [(keyed + n, False) for n in range(unkeyed)]
        self._threads = [threading.Thread(target=self._client, args=c, daemon=True) for c in clients]

    def start(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(REQUEST_BOUND + 130)
        assert not any(thread.is_alive() for thread in self._threads), "a client did not finish"

    def acked_since(self, moment: float) -> int:
        with self._lock:
            return sum(t > moment for t in self.acks)

    def wait_acks(self, count: int, since: float, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.acked_since(since) < count:
            assert time.monotonic() < deadline, f"{self.acked_since(since)} 200s since, not {count}: {self.statuses()}"
            time.sleep(0.1)

    def longest_without_ack(self, start: float, end: float) -> float:
        """The longest stretch between ``start`` and ``end`` without a 200."""
        with self._lock:
            times = sorted([start, *(t for t in self.acks if start < t < end), end])
        return max(b - a for a, b in zip(times, times[1:], strict=False))

    def statuses(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        with self._lock:
            for keyed, outcomes in self.outcomes.items():
                for status, _ in outcomes:
                    name = f"{'keyed' if keyed else 'unkeyed'} {status}"
                    counts[name] = counts.get(name, 0) + 1
        return counts

    def days(self) -> dict[str, tuple[list[list[bytes]], list[list[bytes]]]]:
        """Per day: the acknowledged batches' lines, and every batch's."""
        with self._lock:
            return {
                day: ([lines for status, lines in self.outcomes[keyed] if status == "200"],
                      [lines for _, lines in self.outcomes[keyed]])
                for day, keyed in ((KEYED_DAY, True), (UNKEYED_DAY, False))
            }  # fmt: skip

    def lines(self, client: int, number: int, day: str) -> list[bytes]:
        first = client * 10**7 + number * 10**3 + 1
        return [json.dumps(record(date=day, ip_id=first + i)).encode() for i in range(self.size)]

    def _client(self, client: int, keyed: bool) -> None:
        conn: http.client.HTTPConnection | None = None
        day = KEYED_DAY if keyed else UNKEYED_DAY
        for number in range(self.batches):
            if self._stop.is_set():
                break
            lines = self.lines(client, number, day)
            headers = {"Content-Type": "application/x-ndjson"}
            if keyed:
                headers["Idempotency-Key"] = f"hosts-{self.run}-{client}-{number}"
            give_up = time.monotonic() + 120
            while True:
                status, conn = self._post(conn, b"\n".join(lines), headers)
                if status == "200" or not keyed or time.monotonic() > give_up:
                    break
                time.sleep(0.25)
            with self._lock:
                self.outcomes[keyed].append((status, lines))
            if status != "200":
                time.sleep(0.25)
        if conn is not None:
            conn.close()

    def _post(
        self, conn: http.client.HTTPConnection | None, body: bytes, headers: dict[str, str]
    ) -> tuple[str, http.client.HTTPConnection | None]:
        began = time.monotonic()
        try:
            conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_BOUND + 10)
            conn.request("POST", "/ingest", body, headers)
            response = conn.getresponse()
            response.read()
            status = str(response.status)
        except (OSError, http.client.HTTPException):
            status = "no answer"
            if conn is not None:
                conn.close()
            conn = None
        ended = time.monotonic()
        with self._lock:
            self.attempts.append(ended - began)
            if status == "200":
                self.acks.append(ended)
        return status, conn


def _rows(batches: list[list[bytes]], day: str) -> list[list[bytes]]:
    """Each batch's rows as the day file holds them (the reference codec's CSV, header-less)."""
    from tiny.codec import encode_reference

    return [encode_reference(b"\n".join(lines)).days[day].splitlines(keepends=True) for lines in batches]


def check_day(content: bytes, acked: list[list[bytes]], sent: list[list[bytes]], day: str) -> dict[str, int]:
    """Every acknowledged batch in the day file once and whole; no row twice; nothing but sent rows."""
    from tiny.layout import HEADER

    assert content.startswith(HEADER), f"{day}: no header"
    on_disk = content[len(HEADER) :].splitlines(keepends=True)
    where = {row: number for number, row in enumerate(on_disk)}
    assert len(where) == len(on_disk), f"{day}: a row is on disk twice"
    known = {row for rows in _rows(sent, day) for row in rows}
    assert all(row in known for row in on_disk), f"{day}: a row no client sent"
    lost = 0
    for rows in _rows(acked, day):
        start = where.get(rows[0])
        whole = start is not None and on_disk[start : start + len(rows)] == rows
        lost += 0 if whole else sum(row not in where for row in rows) or len(rows)
    assert lost == 0, f"{day}: {lost} acknowledged rows missing or not whole"
    return {"rows": len(on_disk), "acknowledged_rows": sum(len(rows) for rows in _rows(acked, day))}


def check_hosts(hosts: Hosts, load: Load) -> dict[str, dict[str, int]]:
    """Every host's files byte-identical (the caller waited until all applied the head), then
    each of the load's days checked (:func:`check_day`) in host1's copy."""
    hashes = {host: hosts.files(host) for host in HOSTS}
    assert hashes["host1"] and hashes["host1"] == hashes["host2"] == hashes["host3"], hashes
    return {
        day: check_day(hosts.read("host1", f"/data/{day}.csv"), acked, sent, day)
        for day, (acked, sent) in load.days().items()
        if sent
    }

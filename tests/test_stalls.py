"""A process that stops or stalls: bounded waits for the flush lock, stalled workers replaced, a bounded stop.

A stopped process is the real thing here: a Python process that opens the data dir's journal,
takes its flush lock, and SIGSTOPs itself (as a debugger, a frozen container or a stuck
NFS call would stop it), or a server's own worker stopped by the crash-test hook while it
holds the lock.
"""

from __future__ import annotations

import contextlib
import http.client
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest

from tests.support import (
    ROOT,
    Server,
    assert_exactly_once,
    assert_stopped_in_a_flush,
    body_of,
    intent_is_live,
    keyed_clients,
    lock_is_held,
    record,
    stopped,
    wait_for,
)
from tiny.heartbeat import Heartbeats

pytestmark = pytest.mark.hardening("exactly once 2: a process holding the lock froze every writer of the data dir")

_HOLD = """
import os, signal, sys
from pathlib import Path
from tiny.commit.local import LocalCommit
journal = LocalCommit(Path(sys.argv[1]))
journal.open()
with journal.locked():
    print("holding", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
"""


@contextmanager
def stopped_lock_holder(data: Path) -> Iterator[int]:
    """A process that took the data dir's flush lock and stopped; killed on exit."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(data)], cwd=ROOT, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"holding\n"
        assert wait_for(lambda: stopped(proc.pid))
        assert lock_is_held(data)  # the precondition, proved from outside
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()


def line(ip_id: int = 1) -> bytes:
    return orjson.dumps(record(ip_id=ip_id)) + b"\n"


def test_a_stopped_lock_holder_gets_503_with_its_pid_and_healthz_says_so(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Server(data, "--lock-timeout", "1") as server:
        assert server.ingest(line()).status == 200
        with stopped_lock_holder(data) as holder:
            started = time.monotonic()
            refused = server.ingest(line(2))
            took = time.monotonic() - started
            waiting = threading.Thread(target=server.ingest, args=(line(3),))
            waiting.start()
            time.sleep(1.0 + 0.3)  # more than a second of waiting shows in /healthz
            health = server.request("GET", "/healthz")
            waiting.join(10)
        after = server.ingest(line(4))
        healthy = server.request("GET", "/healthz")
    assert refused.status == 503 and refused.headers["retry-after"]
    assert f"held by pid {holder} on " in refused.json()["error"]["message"]
    assert 0.9 < took < 3.0  # the bound, not until the holder goes on
    assert health.status == 503 and health.json()["status"] == "failing"
    assert f"held by pid {holder}" in health.json()["reason"]
    assert after.status == 200 and healthy.status == 200  # the holder killed: the lock is free again
    rows = (data / "2014-05-04.csv").read_bytes().count(b"\n")
    assert rows == 1 + 2  # ip_id 1 and 4; nothing of the refused requests


def test_sigterm_ends_a_server_within_its_drain_bound_whatever_the_lock_does(tmp_path: Path) -> None:
    """--lock-timeout longer than --drain-timeout: the stop still comes in time, the waiting
    request gets 503, and the exit status says some request could not be written. (The old
    tree's one-process server was still running 40 s after SIGTERM.)"""
    data = tmp_path / "data"
    server = Server(data, "--lock-timeout", "30", "--drain-timeout", "2").start()
    try:
        assert server.ingest(line()).status == 200
        with stopped_lock_holder(data):
            answers: list[int] = []
            waiting = threading.Thread(target=lambda: answers.append(server.ingest(line(2)).status))
            waiting.start()
            time.sleep(0.5)
            started = time.monotonic()
            code = server.stop(timeout=15)
            took = time.monotonic() - started
            waiting.join(10)
    finally:
        server.kill()
    assert took < 2 + 2 + 1.5, f"stopped after {took:.1f} s"
    assert code == 1 and answers == [503]
    assert "could not be written while it stopped" in server.log()
    assert (data / "2014-05-04.csv").read_bytes().count(b"\n") == 1 + 1


def test_a_worker_stopped_while_it_holds_the_lock_is_replaced_and_writing_resumes(
    tmp_path: Path, figures: dict[str, object]
) -> None:
    """One worker stops itself in the middle of a flush, the lock held and its rows written but
    not committed: the parent sees its heartbeat stall, kills it, a new worker takes its
    socket, recovery cuts the uncommitted rows, and the clients' retries write every batch once."""
    data = tmp_path / "data"
    env = {"TINY_CRASH_AT": "after-writes:1:stop-once"}
    enough = threading.Event()
    seen: list[tuple[bool, bool]] = []
    with Server(data, "--stall-timeout", "2", "--lock-timeout", "1", processes=2, env=env) as server:
        watcher = threading.Thread(target=_watch_for_a_stopped_worker, args=(server, data, seen, enough))
        watcher.start()
        threading.Timer(8.0, enough.set).start()
        attempts = keyed_clients(server.port, clients=4, enough=enough, timeout=60)
        watcher.join(5)
        log = server.log()
    assert seen == [(True, True)], "the worker never stopped with the lock held inside a flush"
    stopped = _logged_at(log, "crash test: stopping this process after-writes")
    replaced = _logged_at(log, "stalled: its event loop has not run for")
    ready = _logged_at(log, " ready (codec ", after=replaced)
    days = ("2014-05-04", "2014-05-05")
    assert_exactly_once(data, {batch: body_of(batch, days=days) for batch in attempts})
    figures.update(
        case="a worker SIGSTOPped inside a flush (lock held), --stall-timeout 2 --lock-timeout 1",
        replaced_after_seconds=round(replaced - stopped, 2),
        writing_again_after_seconds=round(ready - stopped, 2),
        batches=len(attempts),
        retries=sum(attempts.values()) - len(attempts),
    )
    assert ready - stopped < 30  # the bound; 2 + 1 s stall bound here
    assert len(attempts) > 20  # writing resumed after the replacement


def _watch_for_a_stopped_worker(
    server: Server, data: Path, seen: list[tuple[bool, bool]], enough: threading.Event
) -> None:
    """Note, for the first worker seen stopped (every thread), whether the lock was held and
    the intent live then: the precondition of the test, proved from outside."""
    while not enough.is_set():
        for pid in server.worker_pids():
            if stopped(pid):
                seen.append((lock_is_held(data), intent_is_live(data)))
                return
        time.sleep(0.01)


def _logged_at(log: str, text: str, after: float = 0.0) -> float:
    """The time (seconds of the day) of the first log line holding ``text`` at or after ``after``."""
    for entry in log.splitlines():
        if text in entry:
            hours, minutes, seconds = entry.split()[1].replace(",", ".").split(":")
            when = int(hours) * 3600 + int(minutes) * 60 + float(seconds)
            if when >= after:
                return when
    raise AssertionError(f"no log line with {text!r}")


def test_a_worker_that_dies_at_its_start_again_and_again_stops_the_server(tmp_path: Path) -> None:
    """5 deaths at its start in a row stop the server (exit 1) instead of a restart every second forever."""
    server = Server(tmp_path / "data", env={"TINY_CRASH_AT": "worker-start"})
    try:
        with pytest.raises(RuntimeError):
            server.start(timeout=10)
        assert wait_for(server.exited, 10)
        assert server.proc is not None and server.proc.returncode == 1
        assert "died at its start 5 times in a row" in server.log()
    finally:
        server.kill()


def test_heartbeats_tell_a_stalled_loop_from_a_stalled_disk_thread() -> None:
    beats = Heartbeats(2)
    beats.reset(0)
    beats.reset(1)
    assert beats.stalled(0, 1.0, 1.0) is None
    beats.beat(1, busy_since=time.monotonic() - 5)
    assert "disk thread has been in one flush for 5." in (beats.stalled(1, 1.0, 2.0) or "")
    time.sleep(0.3)
    assert "event loop has not run for 0." in (beats.stalled(0, 0.2, 1.0) or "")
    started = time.monotonic()
    assert not beats.beaten_since(0, started)
    beats.beat(0, 0.0)
    assert beats.beaten_since(0, started)


# -- the parent's own pause -------------------------------------------------------------------


def test_heartbeats_count_only_from_the_end_of_the_readers_own_pause() -> None:
    """Read 5 s after the last beat, a worker is stalled for a bound of 1 s, unless the reader
    itself was not running until 0.5 s before (``since``): then only that 0.5 s counts, for
    the loop and for the disk thread alike."""
    beats = Heartbeats(1)
    beats.beat(0, busy_since=time.monotonic())
    later = time.monotonic() + 5
    assert "event loop has not run for 5.0 s" in (beats.stalled(0, 1.0, 10.0, now=later) or "")
    assert "disk thread has been in one flush for 5.0 s" in (beats.stalled(0, 10.0, 1.0, now=later) or "")
    assert beats.stalled(0, 1.0, 1.0, now=later, since=later - 0.5) is None
    assert "has not run for 1.5 s" in (beats.stalled(0, 1.0, 10.0, now=later + 1, since=later - 0.5) or "")


@pytest.mark.hardening("third 10: /healthz answered 200 while another process held the lock, stopped")
def test_healthz_names_a_stopped_lock_holder_while_no_request_waits(tmp_path: Path) -> None:
    """No POST of this server waits: /healthz still sees the lock held elsewhere (a 200 there
    while every POST would get 503 after --lock-timeout would mislead a balancer)."""
    data = tmp_path / "data"
    with Server(data) as server:
        assert server.ingest(line()).status == 200
        with stopped_lock_holder(data) as holder:
            time.sleep(1.2)  # held for more than a second
            health = server.request("GET", "/healthz")
        healthy = server.request("GET", "/healthz")
    assert health.status == 503 and health.json()["status"] == "failing"
    assert f"held by pid {holder} on " in health.json()["reason"]
    assert healthy.status == 200


@pytest.mark.hardening("third 15: the crash tests' self-SIGSTOP was racy: the flush could finish before the stop")
def test_the_crash_hooks_stop_lands_inside_the_flush_every_time(tmp_path: Path) -> None:
    """The hook stops its own thread, not the process: a signal to the process is taken by the
    main thread while the flush goes on (3 of 12 runs stopped after the lock was released)."""
    for run in range(5):
        data = tmp_path / f"data{run}"
        with Server(data, "--stall-timeout", "600", env={"TINY_CRASH_AT": "after-commit:1:stop"}) as server:
            worker = server.worker_pid()
            posting = threading.Thread(target=_post_unanswered, args=(server,))
            posting.start()
            assert_stopped_in_a_flush(worker, data)
            server.kill()
            posting.join(10)


def _post_unanswered(server: Server) -> None:
    """A keyed POST whose worker is killed before it answers."""
    with contextlib.suppress(OSError, http.client.HTTPException):
        server.ingest(line(), {"Idempotency-Key": "k"})

"""The data dir's journal and lock against operators' mistakes, with real servers: refused starts,
``--new-journal``, writes stopped and resumed, and `tiny-admin backup` of a live data dir."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support import (
    ROOT,
    Server,
    assert_exactly_once,
    assert_stopped_in_a_flush,
    body_of,
    key,
    lock_is_held,
    needs_root,
    tmpfs,
    wait_for,
)
from tiny import layout
from tiny.layout import HEADER
from tiny.testing import server_env

DAYS = ("2014-05-04", "2014-05-05")


def start_fails(data: Path, *args: str) -> str:
    """Start a server on ``data`` that must refuse to start: its log."""
    server = Server(data, *args)
    try:
        try:
            server.start(timeout=10)
        except RuntimeError:
            pass
        else:  # (its log is what to read when this fails: the copied-mid-flush test did once)
            pytest.fail(f"a server started on {data}; its log:\n{server.log()}")
        assert wait_for(server.exited, 5)
        assert server.proc is not None and server.proc.returncode == 1
        return server.log()
    finally:
        server.kill()


def day_sizes(data: Path) -> dict[str, int]:
    """Each day file's size (-1: missing)."""
    return {day: (data / f"{day}.csv").stat().st_size if (data / f"{day}.csv").exists() else -1 for day in DAYS}


def post_all(server: Server, batches: range) -> None:
    for batch in batches:
        assert server.ingest(body_of(batch, days=DAYS), key(batch)).status == 200


@pytest.mark.hardening("exactly once 10: a deleted journal was silently replaced by an empty one")
def test_a_deleted_journal_stops_the_start_and_new_journal_replaces_it_knowingly(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Server(data) as server:
        post_all(server, range(3))
    layout.journal_path(data).unlink()
    log = start_fails(data)
    assert f"the journal {layout.journal_path(data)} of data dir" in log and "is missing" in log
    assert "--new-journal" in log
    with Server(data, "--new-journal") as server:
        again = server.ingest(body_of(0, days=DAYS), key(0))
    assert again.status == 200 and "idempotent-replayed" not in again.headers  # written again: knowingly
    assert list(data.glob(".tiny.replaced-*/journal.sqlite3-wal")) or list(data.glob(".tiny.replaced-*/intent"))


@pytest.mark.hardening("exactly once 5: a lock file deleted under a running server split the lock in two")
def test_a_deleted_lock_file_stops_every_writer_instead_of_splitting_the_lock(tmp_path: Path) -> None:
    """A restarted worker never locks a new inode while the other locks the old one: two locks
    would let two flushes overlap (50 of 14,653 acknowledged batches ended with 0 rows so)."""
    data = tmp_path / "data"
    with Server(data, processes=2) as server:
        post_all(server, range(10))
        layout.lock_path(data).unlink()
        victim = min(server.worker_pids())
        os.kill(victim, signal.SIGKILL)  # its replacement opens the journal afresh
        assert wait_for(lambda: len(server.worker_pids() - {victim}) == 2, 5)
        time.sleep(0.3)
        answers = [server.ingest(body_of(batch, days=DAYS), key(batch)) for batch in range(10, 30)]
    assert {answer.status for answer in answers} == {503}
    messages = {answer.json()["error"]["message"].split(":")[0] for answer in answers}
    assert any("lock" in message for message in messages), messages
    assert_exactly_once(data, {batch: body_of(batch, days=DAYS) for batch in range(10)})


def _restore_lock(data: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tiny.admin", "restore-lock", str(data)], cwd=ROOT, capture_output=True, text=True
    )


def test_a_lock_file_deleted_by_hand_is_written_again_by_restore_lock_keeping_every_key(tmp_path: Path) -> None:
    """Deleting .tiny/lock (the "stale lock" reflex) was only ever undone by --new-journal,
    which forgets every key: restore-lock writes it again, refused while a server runs."""
    data = tmp_path / "data"
    with Server(data) as server:
        post_all(server, range(3))
        layout.lock_path(data).unlink()
        refused = _restore_lock(data)
        assert refused.returncode == 1 and "stop every server first" in refused.stderr, refused.stderr
    log = start_fails(data)
    assert f"tiny-admin restore-lock {data}" in log
    done = _restore_lock(data)
    assert done.returncode == 0, done.stderr
    assert _restore_lock(data).returncode == 1  # nothing to restore now
    with Server(data) as server:
        assert server.ingest(body_of(0, days=DAYS), key(0)).headers["idempotent-replayed"] == "true"
    assert_exactly_once(data, {batch: body_of(batch, days=DAYS) for batch in range(3)})


@pytest.mark.hardening("exactly once 12: a journal mode other than the one in use was refused only at request time")
def test_a_journal_mode_other_than_the_one_in_use_is_refused_at_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Server(data) as server:
        post_all(server, range(1))
    log = start_fails(data, "--journal-mode", "delete")
    assert "is in 'wal' mode" in log and "tiny-admin set-journal-mode" in log
    done = subprocess.run(
        [sys.executable, "-m", "tiny.admin", "set-journal-mode", str(data), "delete"], cwd=ROOT, env=server_env()
    )
    assert done.returncode == 0
    with Server(data, "--journal-mode", "delete") as server:
        assert server.ingest(body_of(0, days=DAYS), key(0)).headers["idempotent-replayed"] == "true"


@pytest.mark.hardening("exactly once 4: a journal that failed to open leaked descriptors and said 200 on /healthz")
def test_a_journal_broken_under_a_running_server_gets_503_and_heals_without_a_restart(tmp_path: Path) -> None:
    """No descriptor leaks per request (2 a request would kill the worker at 20,000), the
    server heals once the cause is fixed, and /healthz says 503 meanwhile."""
    data = tmp_path / "data"
    with Server(data) as server:
        post_all(server, range(1))
        worker = server.worker_pid()
        journal = layout.journal_path(data)
        journal.rename(journal.with_name("elsewhere"))
        fds = len(os.listdir(f"/proc/{worker}/fd"))
        answers = [server.ingest(body_of(batch, days=DAYS), key(batch)) for batch in range(1, 201)]
        grown = len(os.listdir(f"/proc/{worker}/fd")) - fds
        health = server.request("GET", "/healthz")
        journal.with_name("elsewhere").rename(journal)
        time.sleep(1.2)  # a refused journal is tried again at most once a second
        healed = server.ingest(body_of(1, days=DAYS), key(1))
        healthy = server.request("GET", "/healthz")
        assert server.worker_pid() == worker  # no restart
    assert {answer.status for answer in answers} == {503}
    assert str(journal) in answers[0].json()["error"]["message"]
    assert grown <= 2, f"{grown} more descriptors after 200 refused requests"
    assert health.status == 503 and str(journal) in health.json()["reason"]
    assert healed.status == 200 and healthy.status == 200
    assert_exactly_once(data, {batch: body_of(batch, days=DAYS) for batch in range(2)})


@pytest.mark.hardening("exactly once 6: a data dir copied while live lost 24,900 acknowledged rows at its first flush")
def test_a_data_dir_copied_in_the_middle_of_a_flush_is_refused_not_cut(tmp_path: Path) -> None:
    """`cp -r` takes .tiny/ while a flush is under way, and the day files after more flushes."""
    data, copy = tmp_path / "data", tmp_path / "copy"
    # The copy needs the flush still stopped. The parent's stall watchdog (15 s for a young
    # worker) would kill it and have a new worker recover the flush in the original, before or
    # during the copy, on a machine slow enough (this test once took 70 s under an fsync load).
    env = {"TINY_CRASH_AT": "after-writes:1:stop-once"}
    with Server(data, "--stall-timeout", "600", env=env) as server:
        posting = threading.Thread(target=post_all, args=(server, range(3)))
        posting.start()  # the first batch's flush stops its worker, the lock held
        worker = server.worker_pid()
        assert_stopped_in_a_flush(worker, data)
        shutil.copytree(data, copy)  # the journal while the flush is under way
        os.kill(worker, signal.SIGCONT)
        posting.join(30)
        post_all(server, range(3, 20))
    for day in DAYS:
        shutil.copy(data / f"{day}.csv", copy / f"{day}.csv")  # the day files, later
    sizes = {day: (copy / f"{day}.csv").stat().st_size for day in DAYS}
    log = start_fails(copy)
    assert "copied while a server wrote to it" in log and "tiny-admin backup" in log
    assert {day: (copy / f"{day}.csv").stat().st_size for day in DAYS} == sizes  # nothing cut


@pytest.mark.hardening("exactly once 6: a data dir copied while live lost 24,900 acknowledged rows at its first flush")
def test_a_backup_of_a_live_data_dir_takes_every_retry_exactly_once(tmp_path: Path, figures: dict[str, object]) -> None:
    """`tiny-admin backup` while clients post: a server starts on the copy, and every batch,
    retried against it, is there exactly once (replayed if the copy has it, written if not)."""
    data, copy = tmp_path / "data", tmp_path / "copy"
    acked: list[int] = []
    stop = threading.Event()
    with Server(data, processes=2) as server:

        def client(first: int) -> None:
            batch = first
            while not stop.is_set():
                if server.ingest(body_of(batch, days=DAYS), key(batch)).status == 200:
                    acked.append(batch)
                batch += 4

        clients = [threading.Thread(target=client, args=(n,)) for n in range(4)]
        for thread in clients:
            thread.start()
        time.sleep(1.0)
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "tiny.admin", "backup", str(data), str(copy)],
            cwd=ROOT,
            env=server_env(),
            capture_output=True,
            text=True,
        )
        took = time.monotonic() - started
        time.sleep(0.5)
        stop.set()
        for thread in clients:
            thread.join(30)
    assert done.returncode == 0, done.stderr
    with Server(copy) as restored:
        replayed = 0
        for batch in sorted(acked):
            answer = restored.ingest(body_of(batch, days=DAYS), key(batch))
            assert answer.status == 200
            replayed += answer.headers.get("idempotent-replayed") == "true"
    assert_exactly_once(copy, {batch: body_of(batch, days=DAYS) for batch in acked})
    figures.update(
        case="tiny-admin backup under 4 keyed clients, then every batch retried against the copy",
        batches=len(acked),
        in_the_copy=replayed,
        written_again=len(acked) - replayed,
        backup_seconds=round(took, 2),
    )
    assert 0 < replayed < len(acked)


@pytest.mark.hardening("third 8: a writer paused mid-flush committed after its lock file was replaced and recovered")
def test_a_writer_paused_in_a_flush_never_commits_after_its_lock_file_was_replaced(tmp_path: Path) -> None:
    """A worker stopped inside a flush (as `docker pause` stops it), its lock file deleted and
    written again with the data dir's id, a second server started, the worker resumed: the old
    tree let the second server's recovery cut the flush and the worker then commit its key and
    answer 200 (0 of the rows on disk, the retry "replayed"). Now the second server waits for
    the flush to end, the worker's commit point refuses (503), and the retry is written once."""
    data = tmp_path / "data"
    env = {"TINY_CRASH_AT": "after-writes:1:stop-once"}
    answers: list[int] = []
    with Server(data, "--stall-timeout", "600", env=env) as first:
        posting = threading.Thread(target=lambda: answers.append(first.ingest(body_of(0, days=DAYS), key(0)).status))
        posting.start()
        worker = first.worker_pid()
        assert_stopped_in_a_flush(worker, data)
        lock = layout.lock_path(data)
        line = lock.read_bytes()[:64]
        lock.unlink()
        lock.write_bytes(line)
        sizes = day_sizes(data)
        second = Server(data, "--lock-timeout", "30")
        starting = threading.Thread(target=second.start, kwargs={"timeout": 60})

        def up_or_waiting() -> bool:  # up (the flush cut: the failure) or the new lock held, waiting
            holder = lock.read_bytes()[64:].split()[:1]
            opening = second.proc is not None and holder == [str(second.proc.pid).encode()]
            return not starting.is_alive() or (opening and lock_is_held(data))

        try:
            starting.start()
            assert wait_for(up_or_waiting, 30)
            time.sleep(0.5)
            assert day_sizes(data) == sizes, "the stopped flush was cut under its writer"
            os.kill(worker, signal.SIGCONT)
            posting.join(30)
            starting.join(60)
            retry = second.ingest(body_of(0, days=DAYS), key(0))
        finally:
            second.kill()
    assert answers == [503]
    assert retry.status == 200 and "idempotent-replayed" not in retry.headers
    assert_exactly_once(data, {0: body_of(0, days=DAYS)})


@pytest.mark.hardening("third 9: a live copy lacking an acknowledged batch started; its retry was answered replayed")
def test_a_live_copy_made_day_by_day_is_refused_naming_the_file_and_the_bytes_missing(tmp_path: Path) -> None:
    """Day 1 copied, then keyed batches to day 1 and to day 2, then day 2 and .tiny/ copied:
    the copy is refused though the last flush wrote day 2 only: started, it would answer the
    batches missing from its day 1 "replayed"."""
    data, copy = tmp_path / "data", tmp_path / "copy"
    day1, day2 = (f"{day}.csv" for day in DAYS)
    with Server(data) as server:
        post_all(server, range(2))
        copy.mkdir()
        shutil.copy(data / day1, copy / day1)
        for batch in range(2, 6):  # the last one to day 2 only
            days = (DAYS[batch % 2],)
            assert server.ingest(body_of(batch, days=days), key(batch)).status == 200
    shutil.copy(data / day2, copy / day2)
    shutil.copytree(data / "rejects", copy / "rejects")
    shutil.copytree(layout.state_dir(data), layout.state_dir(copy))
    shutil.copy(layout.identity_path(data), layout.identity_path(copy))
    missing = (data / day1).stat().st_size - (copy / day1).stat().st_size
    log = start_fails(copy)
    assert f"{copy / day1} is {(copy / day1).stat().st_size} bytes: {missing} bytes shorter than the" in log
    assert "--new-journal" in log


# -- tiny-admin forget: a data file deleted or cut on purpose, with a server running -----------


def admin(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tiny.admin", *args], cwd=ROOT, env=server_env(), capture_output=True, text=True
    )


def post_day(server: Server, batch: int, day: str) -> int:
    return server.ingest(body_of(batch, days=(day,)), key(batch)).status


def test_a_day_file_deleted_on_purpose_is_forgotten_knowingly_under_a_running_server(tmp_path: Path) -> None:
    """The refusal names the command; the command forgets the file under the server's lock;
    the server writes the day again without a restart, a retry of a batch that was in the
    deleted file is answered replayed (every key kept), and a restart starts."""
    data = tmp_path / "data"
    day1, day2 = (data / f"{day}.csv" for day in DAYS)
    with Server(data) as server:
        assert post_day(server, 0, DAYS[0]) == 200 and post_day(server, 1, DAYS[1]) == 200
        committed = day1.stat().st_size
        day1.unlink()  # a day no longer kept, removed by hand
        refused = server.ingest(body_of(2, days=(DAYS[0],)), key(2))
        assert refused.status == 503  # the precondition: the check refuses the day
        assert f"run `tiny-admin forget {data} {DAYS[0]}.csv`" in refused.json()["error"]["message"]
        assert post_day(server, 3, DAYS[1]) == 503  # the data dir as a whole, until it is settled
        done = admin("forget", str(data), str(day1))  # named as a path inside the data dir
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == (
            f"forgot {day1}: it is missing; the {committed} bytes committed to it are no longer expected"
        )
        time.sleep(1.1)  # a refused journal is tried again at most once a second
        assert post_day(server, 2, DAYS[0]) == 200 and post_day(server, 3, DAYS[1]) == 200
        again = server.ingest(body_of(0, days=(DAYS[0],)), key(0))
        assert again.status == 200 and again.headers.get("idempotent-replayed") == "true"
    assert day1.read_bytes().startswith(HEADER)  # a new file: its header once
    with Server(data) as restarted:
        assert post_day(restarted, 4, DAYS[0]) == 200
    written = {batch: body_of(batch, days=(DAYS[0],)) for batch in (2, 4)}
    assert_exactly_once(data, written | {batch: body_of(batch, days=(DAYS[1],)) for batch in (1, 3)})


def test_forget_accepts_a_cut_file_removes_one_only_when_asked_and_refuses_what_is_not_a_data_file(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    day1, day2 = (data / f"{day}.csv" for day in DAYS)
    with Server(data) as server:
        assert post_day(server, 0, DAYS[0]) == 200
        one_batch = day1.stat().st_size
        assert post_day(server, 1, DAYS[0]) == 200
        assert post_day(server, 10, DAYS[1]) == 200 and post_day(server, 11, DAYS[1]) == 200
        two_batches, day2_size = day1.stat().st_size, day2.stat().st_size
        with open(day1, "r+b") as cut:
            cut.truncate(one_batch)  # the second batch cut on purpose
        assert post_day(server, 2, DAYS[0]) == 503  # the precondition: refused until forgotten
        before = {path: path.read_bytes() for path in (day1, day2, layout.sizes_path(data), layout.intent_path(data))}
        for names, why in (
            ([DAYS[1] + ".csv"], "is whole"),
            ([DAYS[0] + ".csv", ".tiny/journal.sqlite3"], "is not a data file"),
            ([f"../{DAYS[0]}.csv"], "is not a data file"),
            ([str(tmp_path / "elsewhere" / f"{DAYS[0]}.csv")], "is not a data file"),
            (["2014-05-06.csv"], "does not exist and nothing was committed to it"),
        ):
            refused = admin("forget", str(data), *names)
            assert refused.returncode == 1 and why in refused.stderr, refused.stderr
            assert "nothing was changed" in refused.stderr.lower()
        assert {path: path.read_bytes() for path in before} == before
        accepted = admin("forget", str(data), f"{DAYS[0]}.csv")
        assert accepted.returncode == 0, accepted.stderr
        assert accepted.stdout.strip() == (
            f"accepted {day1} at {one_batch} bytes: the {two_batches - one_batch} bytes cut from its end are forgotten"
        )
        removed = admin("forget", "--remove", str(data), f"{DAYS[1]}.csv")
        assert removed.returncode == 0 and not day2.exists(), removed.stderr
        assert removed.stdout.startswith(f"removed {day2} ({day2_size} bytes)")
        time.sleep(1.1)
        assert post_day(server, 2, DAYS[0]) == 200 and post_day(server, 12, DAYS[1]) == 200
    kept = {batch: body_of(batch, days=(DAYS[0],)) for batch in (0, 2)}
    assert_exactly_once(data, kept | {12: body_of(12, days=(DAYS[1],))})


def test_forget_refuses_a_data_dir_that_follows_a_cluster(tmp_path: Path) -> None:
    """A cluster host's day files are the log's bytes: a file forgotten and removed there went on
    differing from every other host's (its follower appended only what came next, /healthz ok)."""
    from tiny import admin
    from tiny.cluster.binding import bind
    from tiny.commit import Refused
    from tiny.commit.local import LocalCommit

    data = tmp_path / "data"
    journal = LocalCommit(data)
    journal.open(keys=False)
    try:
        bind(journal, "cluster-1", b"k" * 32)  # what a first start in cluster mode does
    finally:
        journal.close()
    day = data / f"{DAYS[0]}.csv"
    day.write_bytes(HEADER)
    before = sorted((path.name, path.stat().st_size) for path in data.rglob("*"))
    with pytest.raises(Refused, match="follows the PostgreSQL cluster cluster-1"):
        admin.forget(data, [day.name], remove=True)
    assert day.exists() and sorted((path.name, path.stat().st_size) for path in data.rglob("*")) == before


@pytest.mark.parametrize(
    "command",
    [
        ["backup", "{missing}", "{dest}"],
        ["backup", "{plain}", "{dest}"],
        ["set-key-bounds", "{missing}", "3600", "1000"],
        ["set-key-bounds", "{plain}", "3600", "1000"],
        ["rebuild-aggregates", "{missing}"],
        ["rebuild-aggregates", "{plain}"],
        ["set-journal-mode", "{plain}", "delete"],
        ["restore-lock", "{plain}"],
        ["forget", "{plain}", "2014-05-04.csv"],
    ],
)
def test_tiny_admin_on_a_mistyped_data_dir_is_refused_and_makes_nothing(tmp_path: Path, command: list[str]) -> None:
    """A typo in a backup script must not report "copied 0 files", nor make a journal where no
    data dir was: a path that is no directory (or, to back up, that no server ran on) is refused."""
    (tmp_path / "plain").mkdir()
    paths = {"missing": tmp_path / "no" / "such", "plain": tmp_path / "plain", "dest": tmp_path / "dest"}
    argv = [part.format(**paths) for part in command]
    done = subprocess.run(
        [sys.executable, "-m", "tiny.admin", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and ("nothing was done" in done.stderr or "nothing to forget" in done.stderr), (
        done.stderr
    )
    assert not (tmp_path / "no").exists() and not (tmp_path / "dest").exists()
    assert list((tmp_path / "plain").iterdir()) == []


@pytest.mark.hardening("careless operator: tiny-admin on a damaged journal said no server had run on it")
@pytest.mark.parametrize(
    "command",
    [["restore-lock"], ["set-journal-mode", "delete"], ["forget", "2014-05-04.csv"], ["set-key-bounds", "60", "1000"]],
)
def test_tiny_admin_on_a_damaged_journal_says_it_cannot_be_read(tmp_path: Path, command: list[str]) -> None:
    data = tmp_path / "data"
    with Server(data) as server:
        assert server.ingest(body_of(1)).status == 200
    (data / ".tiny" / "journal.sqlite3").write_bytes(b"not a database" * 100)
    done = subprocess.run(
        [sys.executable, "-m", "tiny.admin", command[0], str(data), *command[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "cannot be read" in done.stderr and "no server has run" not in done.stderr, (
        done.stderr
    )


@pytest.mark.hardening("careless operator: set-journal-mode to wal went through with servers running")
def test_set_journal_mode_is_refused_while_a_server_runs_on_the_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    argv = [sys.executable, "-m", "tiny.admin", "set-journal-mode", str(data), "wal"]
    with Server(data, "--journal-mode", "delete") as server:
        assert server.ingest(body_of(1)).status == 200
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and "stop every server first" in done.stderr, done.stderr
        assert str(server.worker_pid()) in done.stderr
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)  # stopped: now it is done
    assert done.returncode == 0, done.stderr


@pytest.mark.hardening("careless operator: a backup into DATA/bk nested every later backup")
def test_a_backup_into_its_own_data_dir_is_refused_and_makes_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Server(data) as server:
        assert server.ingest(body_of(1)).status == 200
    before = sorted(path.name for path in data.iterdir())
    for dest in (data / "bk", data / "day" / ".." / "bk2"):
        done = subprocess.run(
            [sys.executable, "-m", "tiny.admin", "backup", str(data), str(dest)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1 and "is inside the data dir" in done.stderr, done.stderr
    assert sorted(path.name for path in data.iterdir()) == before


@needs_root
@pytest.mark.hardening("careless operator: a start on a full disk blamed the journal and advised --new-journal")
def test_a_start_on_a_full_disk_says_so_and_keeps_the_journal(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "1m") as small:
        data = small / "data"
        with Server(data) as server:
            assert server.ingest(body_of(1), {"Idempotency-Key": "full-1"}).status == 200
        (data / ".tiny" / "journal.sqlite3-shm").unlink(missing_ok=True)  # (made again at the next opening)
        filler = os.open(small / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(filler, b"\0" * 4096):
                pass
        except OSError:
            pass  # ENOSPC: full
        finally:
            os.close(filler)
        done = subprocess.run(
            [sys.executable, str(ROOT / "app.py"), "--port", "0", "--data-dir", str(data)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env=server_env(),
        )
        assert done.returncode != 0 and "bytes free" in done.stderr, done.stderr
        assert "--new-journal" not in done.stderr and "Traceback" not in done.stderr
        (small / "filler").unlink()
        with Server(data) as server:  # space back: the same journal, its keys kept
            answer = server.ingest(body_of(1), {"Idempotency-Key": "full-1"})
            assert answer.status == 200 and answer.headers.get("idempotent-replayed") == "true"


@needs_root
def test_a_backup_the_disk_refuses_leaves_no_destination_a_server_would_take(tmp_path: Path) -> None:
    """Onto a 256 KB file system a 1 MB data dir does not fit: exit 1 saying so, and neither
    DEST (its day file cut mid-row, which a server would start on) nor anything aside is left."""
    data = tmp_path / "data"
    with Server(data) as server:
        for batch in range(6):
            assert server.ingest(body_of(batch, size=1000)).status == 200
    with tmpfs(tmp_path / "small", "256k") as small:
        done = subprocess.run(
            [sys.executable, "-m", "tiny.admin", "backup", str(data), str(small / "copy")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1 and "nothing of it was left" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
        assert list(small.iterdir()) == []


def test_a_journal_made_over_day_files_already_there_is_said_loudly(tmp_path: Path) -> None:
    """Day files put in to be served start with no flag, but a journal deleted with .tiny-id
    looks the same: the start warns that no earlier key is known."""
    data = tmp_path / "data"
    with Server(data) as server:
        assert server.ingest(body_of(1)).status == 200
    shutil.rmtree(data / ".tiny")
    (data / ".tiny-id").unlink()
    with Server(data) as server:
        assert "WARNING" in server.log() and "created a journal for the 1 day files already in" in server.log()


@pytest.mark.hardening("careless operator: /healthz said ok on a worker with no POST while the data dir was moved")
def test_healthz_finds_the_data_dir_moved_away_without_a_post_and_says_when_it_is_back(tmp_path: Path) -> None:
    data, moved = tmp_path / "data", tmp_path / "moved"
    with Server(data) as server:
        assert server.ingest(body_of(1)).status == 200
        data.rename(moved)
        try:
            answers = [server.request("GET", "/healthz")]
            deadline = time.monotonic() + 10
            while answers[-1].status == 200 and time.monotonic() < deadline:
                time.sleep(0.3)  # the probe runs at most once a second, and only after a second without a flush
                answers.append(server.request("GET", "/healthz"))
            assert answers[-1].status == 503 and answers[-1].json()["status"] == "failing", answers[-1].body
            time.sleep(1.5)  # more probes: none makes the data dir again at its old path
            assert server.request("GET", "/healthz").status == 503
            assert not data.exists()
        finally:
            moved.rename(data)
        assert wait_for(lambda: server.request("GET", "/healthz").status == 200, timeout=10)
        assert server.ingest(body_of(2)).status == 200
    assert "the journal is usable again after a refusal" in server.log()


@pytest.mark.hardening("outside review: the idle probe logged an error every 5 s while another process held the lock")
def test_an_idle_server_whose_lock_another_holds_logs_no_error_from_its_probes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Server(data) as server:
        assert server.ingest(body_of(1)).status == 200
        with open(layout.lock_path(data), "ab") as holder:
            fcntl.flock(holder, fcntl.LOCK_EX)  # another process's flush, held 3 s
            answers = []
            for _ in range(10):
                answers.append(server.request("GET", "/healthz"))
                time.sleep(0.3)
            fcntl.flock(holder, fcntl.LOCK_UN)
        assert all(answer.status in (200, 503) for answer in answers)  # each at once: the probe waits 0.2 s at most
        assert server.ingest(body_of(2)).status == 200  # the sink's thread was never held by a probe
        assert wait_for(lambda: server.request("GET", "/healthz").status == 200, timeout=10)
    assert "ERROR" not in server.log(), server.log()[-2000:]

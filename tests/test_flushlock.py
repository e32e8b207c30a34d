"""The flush lock (tiny.flushlock): its bound, its holder's record, the fence of a flush under way."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

import pytest

from tests.journal_support import claims, opened, refusal
from tiny import layout
from tiny.commit import Refused
from tiny.commit.local import LocalCommit
from tiny.flushlock import LockTimeout, held_elsewhere
from tiny.intent import FileSpan


def test_a_busy_lock_times_out_naming_its_holder(tmp_path: Path) -> None:
    journal, other = opened(tmp_path, lock_timeout=0.3), opened(tmp_path)
    with other.locked():
        started = time.monotonic()
        with pytest.raises(LockTimeout) as raised, journal.locked():
            pass
    assert 0.3 <= time.monotonic() - started < 1.0
    assert f"held by pid {os.getpid()} on " in str(raised.value)
    with journal.locked():  # free again
        pass


@pytest.mark.hardening("exactly once 5: a lock file deleted under a running server split the lock in two")
def test_a_lock_file_deleted_while_open_stops_writes_and_is_refused_at_open(tmp_path: Path) -> None:
    """A restarted worker never locks a new inode while the others lock the old one."""
    journal = opened(tmp_path)
    layout.lock_path(tmp_path).unlink()
    with pytest.raises(Refused, match="lock was deleted or replaced while the server ran"), journal.locked():
        pass
    assert "was deleted or replaced" in refusal(tmp_path)
    assert "--new-journal" in refusal(tmp_path)
    opened(tmp_path, accept_new=True).close()  # knowingly: a fresh journal
    opened(tmp_path).close()


def test_a_lock_held_elsewhere_bounds_even_the_open(tmp_path: Path) -> None:
    layout.state_dir(tmp_path).mkdir()
    holder = os.open(layout.lock_path(tmp_path), os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        with pytest.raises(LockTimeout):
            opened(tmp_path, lock_timeout=0.2)
    finally:
        os.close(holder)


def test_a_lock_held_elsewhere_is_named_without_a_wait_once_held_past_the_bound(tmp_path: Path) -> None:
    opened(tmp_path).close()
    holder = os.open(layout.lock_path(tmp_path), os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        os.pwrite(holder, b"4242 otherhost %f" % (time.time() - 0.5), 64)
        young = held_elsewhere(tmp_path, 1.0)
        os.pwrite(holder, b"4242 otherhost %f" % (time.time() - 3), 64)
        old = held_elsewhere(tmp_path, 1.0)
    finally:
        os.close(holder)
    assert young is None and held_elsewhere(tmp_path, 1.0) is None
    assert old is not None and "is held by pid 4242 on otherhost since 3." in old


def replace_lock_file(data: Path) -> None:
    """Delete the lock file and write a new one with the data dir's id, as an operator might."""
    lock = layout.lock_path(data)
    line = lock.read_bytes()[:64]
    lock.unlink()
    lock.write_bytes(line)


@pytest.mark.hardening("third 8: a writer paused mid-flush committed after its lock file was replaced and recovered")
def test_a_flush_under_way_keeps_a_writer_of_a_replaced_lock_file_from_recovering_it(tmp_path: Path) -> None:
    """The lock file replaced while a writer is in a flush: another journal takes the new lock,
    but can neither open nor recover until that flush ends (a recovery would cut the flush,
    whose writer then commits its key: 0 of 100 rows on disk, the retry answered "replayed")."""
    (tmp_path / "d.csv").write_bytes(b"h\n")
    journal = opened(tmp_path)
    with journal.locked():
        journal.keys.decide(claims("k"))
        journal.intent.write([FileSpan("d.csv", 2, 4, False)])
        with open(tmp_path / "d.csv", "ab") as out:
            out.write(b"1\n")
        replace_lock_file(tmp_path)
        with pytest.raises(LockTimeout, match="is held by a writer that does not hold the lock file"):
            opened(tmp_path, lock_timeout=0.3)
        assert (tmp_path / "d.csv").read_bytes() == b"h\n1\n"  # not cut under the writer
        journal.keys.rollback()  # the writer's commit point refuses (tests/test_appender.py): it rolls back
    other = opened(tmp_path)  # the flush ended: the new lock's recovery cuts it
    assert (tmp_path / "d.csv").read_bytes() == b"h\n"
    assert not other.keys.is_stored("k")


@pytest.mark.hardening("third 11: a 503 named the wrong holder: opening the journal wrote no holder record")
def test_opening_the_journal_records_its_holder_as_soon_as_it_holds_the_lock(tmp_path: Path) -> None:
    """The data dir's id file is a FIFO here, so that the opening holds the lock while it reads
    it: a writer that times out meanwhile names the opening process, not the last flush's."""
    opened(tmp_path).close()
    lock = layout.lock_path(tmp_path)
    with open(lock, "r+b") as out:
        out.seek(64)
        out.write(b"1 elsewhere 1000.0".ljust(127) + b"\n")  # the record of an earlier holder
    identity = layout.identity_path(tmp_path)
    dir_id = identity.read_text()
    identity.unlink()
    os.mkfifo(identity)
    opening = LocalCommit(tmp_path)
    thread = threading.Thread(target=opening.open)
    thread.start()
    try:
        time.sleep(0.3)  # the opening holds the lock, blocked on the FIFO
        with pytest.raises(LockTimeout) as raised:
            opened(tmp_path, lock_timeout=0.2)
    finally:
        with open(identity, "w") as fifo:
            fifo.write(dir_id)
        thread.join(10)
    assert f"held by pid {os.getpid()} on " in str(raised.value) and "elsewhere" not in str(raised.value)
    assert opening.is_open
    opening.close()

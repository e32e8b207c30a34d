"""The journal on its own: the intent record, the key table, expiry, and the data dir's identity."""

from __future__ import annotations

import fcntl
import os
import shutil
import sqlite3
import threading
import time
import zlib
from pathlib import Path

import pytest

from tiny import layout
from tiny.journal import WAL_LIMIT, Claim, Intent, Journal, JournalError, LockTimeout


def opened(data: Path, accept_new: bool = False, **kwargs: object) -> Journal:
    journal = Journal(data, **kwargs)  # type: ignore[arg-type]
    journal.open(accept_new=accept_new)
    return journal


def claims(*keys: str, digest: bytes = b"d", answer: bytes = b"a") -> list[Claim]:
    return [Claim(key, digest, answer) for key in keys]


def commit(journal: Journal, keys: list[Claim]) -> None:
    """A flush of ``keys`` that writes no data (lock held)."""
    journal.claim(keys)
    journal.commit()


def flush(journal: Journal, data: Path, name: str, rows: bytes, *keys: str) -> None:
    """One whole flush as the sink does it: claim, intent, write, commit, mark."""
    path = data / name
    before = path.stat().st_size if path.exists() else 0
    with journal.locked():
        journal.recover()
        journal.claim(claims(*keys))
        journal.intend([Intent(name, before, before + len(rows), not path.exists())], keys[0] if keys else None)
        with open(path, "ab") as out:
            out.write(rows)
        journal.commit()
        journal.finish()


def refusal(data: Path, accept_new: bool = False, **kwargs: object) -> str:
    """The message of the JournalError that opening ``data``'s journal raises."""
    with pytest.raises(JournalError) as raised:
        opened(data, accept_new, **kwargs)
    return str(raised.value)


def test_a_finished_flush_leaves_nothing_to_recover(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_bytes(b"h\n1\n")
    journal = opened(tmp_path)
    with journal.locked():
        journal.intend([Intent("d.csv", 4, 6, False)])
        (tmp_path / "d.csv").write_bytes(b"h\n1\n2\n")
        journal.commit()
        journal.finish()
        assert journal.recover() == 0
    assert (tmp_path / "d.csv").read_bytes() == b"h\n1\n2\n"


def test_an_intent_torn_while_written_is_dropped_and_cuts_nothing(tmp_path: Path) -> None:
    """A flush killed inside the intent's pwrite wrote no data yet: its record fails the CRC."""
    (tmp_path / "d.csv").write_bytes(b"h\n1\n")
    journal = opened(tmp_path)
    with journal.locked():
        journal.intend([Intent("d.csv", 2, 4, False)])  # as if it claimed the file was shorter
    intent = layout.intent_path(tmp_path)
    record = intent.read_bytes()
    intent.write_bytes(record[:-3])  # the end of the record never reached the file
    with journal.locked():
        assert journal.recover() == 0
        assert journal.recover() == 0  # and it was marked
    assert (tmp_path / "d.csv").read_bytes() == b"h\n1\n"


def test_a_shorter_intent_over_a_longer_one_is_read_by_its_own_length(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_bytes(b"h\n1\n")
    journal = opened(tmp_path)
    with journal.locked():
        journal.intend([Intent(f"{n:040d}.csv", 0, 0, True) for n in range(20)])
        journal.finish()
        journal.intend([Intent("a.csv", 2, 4, False)])
    with journal.locked():
        assert journal.recover() == 1
    assert (tmp_path / "a.csv").read_bytes() == b"h\n"


def test_a_flush_whose_first_key_is_stored_committed_and_keeps_its_rows(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_bytes(b"h\n")
    journal = opened(tmp_path)
    with journal.locked():
        assert journal.claim(claims("k1", "k2")) == {}
        journal.intend([Intent("d.csv", 2, 4, False)], "k1")
        (tmp_path / "d.csv").write_bytes(b"h\n1\n")
        journal.commit()
        # killed here: the keys are stored, the intent still live
    with journal.locked():
        assert journal.recover() == 0
    assert (tmp_path / "d.csv").read_bytes() == b"h\n1\n"


def test_a_key_met_past_the_window_is_gone_before_the_flush_that_rewrites_it(tmp_path: Path) -> None:
    """The retry of an expired key writes again; if that flush dies before its commit, the old
    row of the key must not make recovery take the flush for committed."""
    (tmp_path / "d.csv").write_bytes(b"h\n")
    journal = opened(tmp_path, window=0.05)
    with journal.locked():
        commit(journal, claims("k"))
    time.sleep(0.1)
    with journal.locked():
        assert journal.claim(claims("k", digest=b"d2")) == {}  # past the window: new
        journal.intend([Intent("d.csv", 2, 4, False)], "k")
        (tmp_path / "d.csv").write_bytes(b"h\n1\n")
    journal.close()  # killed before the commit: SQLite drops the open transaction
    journal = opened(tmp_path, window=0.05)  # its recovery at open cuts the file back
    assert (tmp_path / "d.csv").read_bytes() == b"h\n"


def test_past_max_keys_the_oldest_go_but_never_those_of_the_flush_committing(tmp_path: Path) -> None:
    journal = opened(tmp_path, max_keys=3)
    with journal.locked():
        for n in range(4):
            commit(journal, claims(f"old{n}"))
        commit(journal, claims(*(f"new{n}" for n in range(5))))  # more than max_keys at once
    held = [key for (key,) in journal.db.execute("SELECT key FROM idempotency_keys")]
    assert sorted(held) == [f"new{n}" for n in range(5)]
    assert journal.held == 5


def test_the_count_of_keys_follows_commits_and_expiry(tmp_path: Path) -> None:
    journal = opened(tmp_path, window=0.05)
    with journal.locked():
        commit(journal, claims("a", "b"))
        commit(journal, claims("c"))
        assert journal.held == 3
        time.sleep(0.1)
        commit(journal, claims("d"))  # expires a, b and c on the way
        assert journal.held == 1


def test_the_count_of_keys_holds_when_another_process_emptied_the_table(tmp_path: Path) -> None:
    """Once every key is gone, SQLite numbers the next one 1 again, below the oldest seq the
    first process remembers."""
    first, second = opened(tmp_path, max_keys=3), opened(tmp_path)
    with first.locked():
        commit(first, claims(*(f"k{n}" for n in range(10))))
        commit(first, claims("k10"))  # past max_keys: it keeps seq 9-11
        assert first.held == 3
    with second.locked():
        second.db.execute("DELETE FROM idempotency_keys")  # all of them expired, say
    with first.locked():
        commit(first, claims("again"))
    assert first.held == 1


@pytest.mark.hardening("exactly once 11: expiring 198k keys stalled one flush 445 ms and grew the -wal to 44 MB")
def test_a_flush_expires_at_most_twice_its_keys_plus_eight_of_a_backlog(tmp_path: Path) -> None:
    """5,000 keys past the window (a data dir idle for a day): no flush pays for all of them
    (the old tree deleted 198k in one flush, 445 ms, and the -wal grew to 44 MB)."""
    journal = opened(tmp_path, window=3600)
    stale = time.time() - 7200
    with journal.locked():
        journal.db.executemany(
            "INSERT INTO idempotency_keys (key, digest, answer, stored) VALUES (?, 'd', 'a', ?)",
            [(f"stale{n}", stale) for n in range(5000)],
        )
    left = [5000]
    with journal.locked():
        for n in range(600):
            before = journal.expired
            commit(journal, claims(f"fresh{n}"))
            assert journal.expired - before <= 2 * 1 + 8
            left.append(
                journal.db.execute("SELECT count(*) FROM idempotency_keys WHERE stored < ?", (stale + 1,)).fetchone()[0]
            )
    assert left[-1] == 0 and left[1] == 5000 - 10  # it kept up, then caught up
    assert journal.held == 600


@pytest.mark.hardening("exactly once 11: expiring 198k keys stalled one flush 445 ms and grew the -wal to 44 MB")
def test_the_wal_is_cut_back_to_its_limit_after_a_checkpoint(tmp_path: Path) -> None:
    journal = opened(tmp_path)
    with journal.locked():
        for n in range(300):
            commit(journal, [Claim(f"k{n}-{i}", b"d" * 16, b"a" * 4000) for i in range(10)])
    journal.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    journal.db.execute("PRAGMA wal_checkpoint(PASSIVE)")
    wal = layout.journal_path(tmp_path).with_name("journal.sqlite3-wal")
    assert wal.stat().st_size <= WAL_LIMIT


def test_the_digest_is_128_bits_keyed_by_the_journal(tmp_path: Path) -> None:
    first, second = opened(tmp_path / "a"), opened(tmp_path / "b")
    assert len(first.digest(b"body")) == 16
    assert first.digest(b"body") == first.digest(b"body") != second.digest(b"body")


# -- the lock ----------------------------------------------------------------------------


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
    """The old tree let a restarted worker lock a new inode while the others locked the old one."""
    journal = opened(tmp_path)
    layout.lock_path(tmp_path).unlink()
    with pytest.raises(JournalError, match="lock was deleted or replaced while the server ran"), journal.locked():
        pass
    assert "was deleted or replaced" in refusal(tmp_path)
    assert "--new-journal" in refusal(tmp_path)
    opened(tmp_path, accept_new=True).close()  # knowingly: a fresh journal
    opened(tmp_path).close()


def test_the_identity_files_are_written_with_one_id(tmp_path: Path) -> None:
    journal = opened(tmp_path)
    dir_id = layout.identity_path(tmp_path).read_text().strip()
    assert layout.lock_path(tmp_path).read_bytes()[:32].decode() == dir_id == journal.dir_id
    (meta,) = journal.db.execute("SELECT value FROM meta WHERE name = 'data_dir_id'").fetchone()
    assert meta == dir_id.encode()


# -- what open() refuses ------------------------------------------------------------------


@pytest.mark.hardening("exactly once 10: a deleted journal was silently replaced by an empty one")
def test_a_deleted_journal_is_refused(tmp_path: Path) -> None:
    """The old tree made a new, empty one: 80 of 80 retried keyed batches were written again."""
    opened(tmp_path).close()
    layout.journal_path(tmp_path).unlink()
    assert "is missing" in refusal(tmp_path)


@pytest.mark.hardening("exactly once 10: a deleted journal was silently replaced by an empty one")
def test_a_journal_truncated_to_nothing_is_refused(tmp_path: Path) -> None:
    opened(tmp_path).close()
    layout.journal_path(tmp_path).write_bytes(b"")
    assert "holds no data dir id" in refusal(tmp_path)


@pytest.mark.hardening("exactly once 10: a deleted journal was silently replaced by an empty one")
def test_a_journal_overwritten_with_garbage_is_refused(tmp_path: Path) -> None:
    opened(tmp_path).close()
    layout.journal_path(tmp_path).write_bytes(b"not a database at all" * 300)
    assert "damaged" in refusal(tmp_path) or "cannot be read" in refusal(tmp_path)


@pytest.mark.hardening("exactly once 10: a deleted journal was silently replaced by an empty one")
def test_a_journal_from_another_data_dir_is_refused(tmp_path: Path) -> None:
    opened(tmp_path / "a").close()
    opened(tmp_path / "b").close()
    shutil.copy(layout.journal_path(tmp_path / "b"), layout.journal_path(tmp_path / "a"))
    assert "belongs to data dir" in refusal(tmp_path / "a")


@pytest.mark.hardening("exactly once 10: a deleted journal was silently replaced by an empty one")
def test_a_journal_that_lost_its_wal_is_refused(tmp_path: Path) -> None:
    """Its newest keys were only in the -wal: the intent still names the last one committed."""
    data = tmp_path / "data"
    journal = opened(data)
    flush(journal, data, "d.csv", b"1\n", "k1")
    snapshot = layout.journal_path(data).read_bytes()  # the database file without its -wal
    flush(journal, data, "d.csv", b"2\n", "k2")
    flush(journal, data, "d.csv", b"3\n")  # a flush without keys: its intent still names k2
    journal.db.close()  # a clean close would checkpoint: stand for a kill -9 instead
    journal._db = None
    journal.close()
    layout.journal_path(data).write_bytes(snapshot)
    for suffix in ("-wal", "-shm"):
        layout.journal_path(data).with_name("journal.sqlite3" + suffix).unlink(missing_ok=True)
    assert "lacks the key 'k2'" in refusal(data)


def test_files_shorter_than_the_last_committed_flush_left_them_are_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    journal = opened(data)
    flush(journal, data, "d.csv", b"h\n1\n", "k1")
    journal.close()
    (data / "d.csv").write_bytes(b"h\n")  # a restore of older files, or a cut by hand
    assert "shorter than the 4 the last committed flush left" in refusal(data)


@pytest.mark.hardening("exactly once 6: a data dir copied while live lost 24,900 acknowledged rows at its first flush")
def test_a_data_dir_copied_while_a_flush_ran_is_refused(tmp_path: Path) -> None:
    """`cp -r` took .tiny/ with a flush's intent live, then the day file after more flushes:
    the old tree cut 24,900 acknowledged rows back to the intent's size."""
    data = tmp_path / "data"
    journal = opened(data)
    flush(journal, data, "d.csv", b"h\n1\n", "k1")
    with journal.locked():
        journal.claim(claims("k2"))
        journal.intend([Intent("d.csv", 4, 6, False)], "k2")  # copied now, mid-flush
        copy = tmp_path / "copy"
        shutil.copytree(data, copy)
        with open(data / "d.csv", "ab") as out:
            out.write(b"2\n")
        journal.commit()
        journal.finish()
    flush(journal, data, "d.csv", b"3\n4\n", "k3")
    shutil.copy(data / "d.csv", copy / "d.csv")  # the day file, copied last
    message = refusal(copy)
    assert "past the 6 that the unfinished flush" in message and "tiny-admin backup" in message
    assert (copy / "d.csv").read_bytes() == b"h\n1\n2\n3\n4\n"  # nothing cut


def test_a_journal_of_the_earlier_format_is_refused_and_new_journal_replaces_it(tmp_path: Path) -> None:
    layout.state_dir(tmp_path).mkdir()
    db = sqlite3.connect(layout.journal_path(tmp_path))
    db.execute("CREATE TABLE idempotency_keys (seq INTEGER PRIMARY KEY, key TEXT UNIQUE, digest, answer, stored)")
    db.commit()
    db.close()
    layout.intent_path(tmp_path).write_bytes(b"")
    assert "earlier format" in refusal(tmp_path)
    opened(tmp_path, accept_new=True).close()
    assert list(tmp_path.glob(".tiny.replaced-*"))  # the old one is kept aside
    opened(tmp_path).close()


def test_another_journal_mode_is_refused_even_with_new_journal(tmp_path: Path) -> None:
    opened(tmp_path, mode="wal").close()
    for accept_new in (False, True):
        assert "tiny-admin set-journal-mode" in refusal(tmp_path, accept_new, mode="delete")


def test_an_interrupted_first_start_is_finished_by_the_next(tmp_path: Path) -> None:
    opened(tmp_path).close()
    identity = layout.identity_path(tmp_path)
    identity.rename(identity.with_name(".tiny-id.new"))  # killed before the last rename
    journal = opened(tmp_path)
    assert identity.exists() and journal.dir_id == identity.read_text().strip()


@pytest.mark.hardening("exactly once 4: a journal that failed to open leaked descriptors and said 200 on /healthz")
def test_a_failed_open_leaves_no_descriptor_open(tmp_path: Path) -> None:
    """The old tree leaked the lock's descriptor on each failed open: 20,000 of them."""
    opened(tmp_path).close()
    journal_path = layout.journal_path(tmp_path)
    journal_path.unlink()
    journal_path.mkdir()  # cannot be opened as a database
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        journal = Journal(tmp_path)
        with pytest.raises(JournalError, match=str(journal_path)):
            journal.open()
    assert len(os.listdir("/proc/self/fd")) == fds


def test_a_lock_held_elsewhere_bounds_even_the_open(tmp_path: Path) -> None:
    layout.state_dir(tmp_path).mkdir()
    holder = os.open(layout.lock_path(tmp_path), os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        with pytest.raises(LockTimeout):
            opened(tmp_path, lock_timeout=0.2)
    finally:
        os.close(holder)


def test_an_intent_record_reads_back_and_a_torn_one_reads_as_none() -> None:
    from tiny.journal import _parse_intent

    payload = b'["k1",[["d.csv",4,9,0],["new.csv",0,5,1]],["k0",7,1.5]]'
    record = b"I" + len(payload).to_bytes(4, "big") + zlib.crc32(payload).to_bytes(4, "big") + payload
    first_key, intents, last = _parse_intent(record + b"older bytes")  # type: ignore[misc]
    assert first_key == "k1" and last == ("k0", 7, 1.5)
    assert intents == [Intent("d.csv", 4, 9, False), Intent("new.csv", 0, 5, True)]
    assert _parse_intent(record[:-1]) is None  # torn
    assert _parse_intent(record[:5] + b"\0\0\0\0" + payload) is None  # its CRC does not match
    earlier = b'[null,[["d.csv",4,0]]]'  # the landed format: no size after, no last key
    old = b"-" + len(earlier).to_bytes(4, "big") + zlib.crc32(earlier).to_bytes(4, "big") + earlier
    assert _parse_intent(old) == (None, [Intent("d.csv", 4, None, False)], None)  # type: ignore[arg-type]


def test_committed_sizes_are_read_without_the_lock_from_the_intent(tmp_path: Path) -> None:
    path, other_file = tmp_path / "d.csv", tmp_path / "e.csv"
    path.write_bytes(b"h\n1\n")
    other_file.write_bytes(b"h\n")
    journal = opened(tmp_path)
    other = opened(tmp_path)  # another process's view of the same data dir
    d, e = "d.csv", "e.csv"  # the files' names in the data dir, as intents name them
    assert other.committed_sizes_unlocked([d, "none.csv"]) == {d: 4}
    with journal.locked():
        journal.intend([Intent("d.csv", 4, 6, False)])
        path.write_bytes(b"h\n1\n2\n")  # a flush under way: its bytes are not committed yet
        assert other.committed_sizes_unlocked([d, e]) == {d: 4, e: 2}
        journal.commit()
        journal.finish()
    assert other.committed_sizes_unlocked([d]) == {d: 6}
    with journal.locked():
        journal.intend([Intent("d.csv", 6, 8, False)])
        path.write_bytes(b"h\n1\n2\n3\n")
    assert other.committed_sizes_unlocked([d]) == {d: 6}  # a crashed flush: below it only
    with other.locked():
        assert other.recover() == 1
    assert other.committed_sizes_unlocked([d]) == {d: 6}
    layout.intent_path(tmp_path).write_bytes(b"I\x00\x00")  # torn: only the lock and recovery know
    assert other.committed_sizes_unlocked([d]) is None


# -- a writer whose lock file was replaced while it was in a flush ----------------------------


def replace_lock_file(data: Path) -> None:
    """Delete the lock file and write a new one with the data dir's id, as an operator might."""
    lock = layout.lock_path(data)
    line = lock.read_bytes()[:64]
    lock.unlink()
    lock.write_bytes(line)


@pytest.mark.hardening("third 8: a writer paused mid-flush committed after its lock file was replaced and recovered")
def test_a_flush_under_way_keeps_a_writer_of_a_replaced_lock_file_from_recovering_it(tmp_path: Path) -> None:
    """The lock file replaced while a writer is in a flush: another journal takes the new lock,
    but can neither open nor recover until that flush ends (the old tree cut the flush, whose
    writer then committed its key: 0 of 100 rows on disk, the retry answered "replayed")."""
    (tmp_path / "d.csv").write_bytes(b"h\n")
    journal = opened(tmp_path)
    with journal.locked():
        journal.claim(claims("k"))
        journal.intend([Intent("d.csv", 2, 4, False)], "k")
        with open(tmp_path / "d.csv", "ab") as out:
            out.write(b"1\n")
        replace_lock_file(tmp_path)
        with pytest.raises(JournalError, match="is held by a writer that does not hold the lock file"):
            opened(tmp_path, lock_timeout=0.3)
        assert (tmp_path / "d.csv").read_bytes() == b"h\n1\n"  # not cut under the writer
        journal.rollback()  # the writer's commit point refuses (the next test): it rolls back
    other = opened(tmp_path)  # the flush ended: the new lock's recovery cuts it
    assert (tmp_path / "d.csv").read_bytes() == b"h\n"
    assert not other._stored("k")


@pytest.mark.hardening("third 8: a writer paused mid-flush committed after its lock file was replaced and recovered")
@pytest.mark.parametrize("change", ["lock file replaced", "intent overwritten", "file cut", "file appended"])
def test_a_flush_does_not_reach_its_commit_point_once_its_lock_or_files_changed(tmp_path: Path, change: str) -> None:
    from tiny.journal import LockLost

    path = tmp_path / "d.csv"
    path.write_bytes(b"h\n")
    journal = opened(tmp_path)
    fd = os.open(path, os.O_RDWR | os.O_APPEND)
    intent = Intent("d.csv", 2, 4, False)
    try:
        with journal.locked():
            journal.claim(claims("k"))
            journal.intend([intent], "k")
            os.write(fd, b"1\n")
            journal.confirm([(fd, intent)])  # nothing changed: it may commit
            if change == "lock file replaced":
                replace_lock_file(tmp_path)
            elif change == "intent overwritten":  # as a recovery marks it undone
                os.pwrite(os.open(layout.intent_path(tmp_path), os.O_WRONLY), b"x", 0)
            elif change == "file cut":
                os.ftruncate(fd, 2)
            else:
                os.write(fd, b"2\n")
            with pytest.raises(LockLost, match="a flush was not committed"):
                journal.confirm([(fd, intent)])
            journal.rollback()
    finally:
        os.close(fd)


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
    opening = Journal(tmp_path)
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


# -- the files' committed sizes ------------------------------------------------------------


@pytest.mark.hardening("third 9: a live copy lacking an acknowledged batch started; its retry was answered replayed")
def test_a_file_shorter_than_the_journal_knows_was_committed_is_refused_at_open(tmp_path: Path) -> None:
    """The last flush wrote b.csv only: the old tree checked that flush's files, not a.csv."""
    data = tmp_path / "data"
    journal = opened(data)
    flush(journal, data, "a.csv", b"h\n1\n", "k1")
    flush(journal, data, "b.csv", b"h\n2\n", "k2")
    journal.close()
    (data / "a.csv").write_bytes(b"h\n")  # an older copy of a.csv
    message = refusal(data)
    assert f"{data / 'a.csv'} is 2 bytes: 2 bytes shorter than the 4 that the journal knows" in message
    assert "--new-journal" in message
    (data / "a.csv").unlink()
    assert f"{data / 'a.csv'} is missing: 4 bytes shorter" in refusal(data)


def test_committed_sizes_follow_every_flush_and_a_fresh_journal_starts_without_them(tmp_path: Path) -> None:
    data = tmp_path / "data"
    journal = opened(data)
    for n in range(3):
        flush(journal, data, "a.csv", b"%d\n" % n)  # without keys too
    flush(journal, data, "b.csv", b"x\n")
    journal.close()
    (data / "a.csv").write_bytes(b"0\n1\n")
    assert "is 4 bytes: 2 bytes shorter than the 6" in refusal(data)
    opened(data, accept_new=True).close()  # knowingly
    opened(data).close()


def test_a_journal_without_committed_sizes_gets_them_and_a_deleted_table_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    journal = opened(data)
    flush(journal, data, "a.csv", b"1\n", "k1")
    journal.db.execute("DELETE FROM meta WHERE name = 'sizes'")  # a journal of the earlier format
    journal.close()
    layout.sizes_path(data).unlink()
    opened(data).close()  # gets an empty table
    assert layout.sizes_path(data).exists()
    layout.sizes_path(data).unlink()
    assert "committed sizes" in refusal(data) and "is missing" in refusal(data)

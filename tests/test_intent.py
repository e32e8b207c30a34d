"""The intent (tiny.intent): its record, recovery, sizes read without the lock, a position committed with the bytes."""

from __future__ import annotations

import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from tests.journal_support import opened
from tiny import layout
from tiny.commit.local import LocalCommit
from tiny.intent import FINISHED, UNDONE, FileSpan, parse
from tiny.refusals import Found
from tiny.testing import ROOT, server_env


def recover(journal: LocalCommit) -> int:
    """The files the recovery of ``journal``'s intent cuts back (lock held)."""
    return journal.intent.recover(journal.keys.is_stored)


def test_a_finished_flush_leaves_nothing_to_recover(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_bytes(b"h\n1\n")
    journal = opened(tmp_path)
    with journal.locked():
        journal.intent.write([FileSpan("d.csv", 4, 6, False)])
        (tmp_path / "d.csv").write_bytes(b"h\n1\n2\n")
        journal.intent.mark_committed()
        assert recover(journal) == 0
    assert (tmp_path / "d.csv").read_bytes() == b"h\n1\n2\n"


def test_an_intent_torn_while_written_is_dropped_and_cuts_nothing(tmp_path: Path) -> None:
    """A flush killed inside the intent's pwrite wrote no data yet: its record fails the CRC."""
    (tmp_path / "d.csv").write_bytes(b"h\n1\n")
    journal = opened(tmp_path)
    with journal.locked():
        journal.intent.write([FileSpan("d.csv", 2, 4, False)])  # as if it claimed the file was shorter
    intent = layout.intent_path(tmp_path)
    record = intent.read_bytes()
    intent.write_bytes(record[:-3])  # the end of the record never reached the file
    with journal.locked():
        assert recover(journal) == 0
        assert recover(journal) == 0  # and it was marked
    assert (tmp_path / "d.csv").read_bytes() == b"h\n1\n"


def test_a_shorter_intent_over_a_longer_one_is_read_by_its_own_length(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_bytes(b"h\n1\n")
    journal = opened(tmp_path)
    with journal.locked():
        journal.intent.write([FileSpan(f"{n:040d}.csv", 0, 0, True) for n in range(20)])
        journal.intent.mark_committed()
        journal.intent.write([FileSpan("a.csv", 2, 4, False)])
    with journal.locked():
        assert recover(journal) == 1
    assert (tmp_path / "a.csv").read_bytes() == b"h\n"


def test_an_intent_of_the_previous_format_whose_first_key_is_stored_committed_and_keeps_its_rows(
    tmp_path: Path,
) -> None:
    """The previous format committed a flush's keys in SQLite before its mark: a live intent
    whose first key is stored was committed (a flush of this format names no first key: its
    keys are in the key log, cut back with its rows)."""
    (tmp_path / "d.csv").write_bytes(b"h\n")
    journal = opened(tmp_path)
    with journal.locked():
        journal.intent.write([FileSpan("d.csv", 2, 4, False)], "k1")
        (tmp_path / "d.csv").write_bytes(b"h\n1\n")
        # killed here: the keys are stored, the intent still live
    with journal.locked():
        assert journal.intent.recover(lambda key: key == "k1") == 0
    assert (tmp_path / "d.csv").read_bytes() == b"h\n1\n"


def test_an_intent_record_reads_back_and_a_torn_one_reads_as_none() -> None:
    payload = b'["k1",[["d.csv",4,9,0],["new.csv",0,5,1]],["k0",7,1.5],"t-1",[3,4]]'
    record = b"I" + len(payload).to_bytes(4, "big") + zlib.crc32(payload).to_bytes(4, "big") + payload
    parsed = parse(record + b"older bytes")
    assert parsed is not None and parsed.first_key == "k1" and parsed.last == ("k0", 7, 1.5)
    assert parsed.spans == [FileSpan("d.csv", 4, 9, False), FileSpan("new.csv", 0, 5, True)]
    assert parsed.position == (3, 4)
    assert parse(record[:-1]) is None  # torn
    assert parse(record[:5] + b"\0\0\0\0" + payload) is None  # its CRC does not match
    earlier = b'[null,[["d.csv",4,0]]]'  # the first format: no size after, no last key
    old = b"-" + len(earlier).to_bytes(4, "big") + zlib.crc32(earlier).to_bytes(4, "big") + earlier
    old_record = parse(old)
    assert old_record is not None and old_record.first_key is None and old_record.last is None
    assert old_record.spans == [FileSpan("d.csv", 4, None, False)] and old_record.position is None


def test_committed_sizes_are_read_without_the_lock_from_the_intent(tmp_path: Path) -> None:
    path, other_file = tmp_path / "d.csv", tmp_path / "e.csv"
    path.write_bytes(b"h\n1\n")
    other_file.write_bytes(b"h\n")
    journal = opened(tmp_path)
    other = opened(tmp_path)  # another process's view of the same data dir
    d, e = "d.csv", "e.csv"  # the files' names in the data dir, as intents name them
    assert other.peek_committed_sizes([d, "none.csv"]) == {d: 4}
    with journal.locked():
        journal.intent.write([FileSpan("d.csv", 4, 6, False)])
        path.write_bytes(b"h\n1\n2\n")  # a flush under way: its bytes are not committed yet
        assert other.peek_committed_sizes([d, e]) == {d: 4, e: 2}
        journal.intent.mark_committed()
    assert other.peek_committed_sizes([d]) == {d: 6}
    with journal.locked():
        journal.intent.write([FileSpan("d.csv", 6, 8, False)])
        path.write_bytes(b"h\n1\n2\n3\n")
    assert other.peek_committed_sizes([d]) == {d: 6}  # a crashed flush: below it only
    with other.locked():
        assert recover(other) == 1
    assert other.peek_committed_sizes([d]) == {d: 6}
    layout.intent_path(tmp_path).write_bytes(b"I\x00\x00")  # torn: only the lock and recovery know
    assert other.peek_committed_sizes([d]) is None


# -- a position committed with the bytes (cluster mode's follower) ---------------------------

_FOLLOWER_FLUSH = """
import sys
from pathlib import Path
from tiny.commit.local import LocalCommit
from tiny.crashpoints import CrashPoints

data, point = Path(sys.argv[1]), sys.argv[2]
journal = LocalCommit(data, headers={".csv": b"h\\n"})
journal.open()
crash = CrashPoints(f"{point}:1" if point != "none" else "", data)
with journal.locked():
    journal.intent.recover(lambda key: False)  # no keys: the mark is the commit point
    before = journal.intent.committed_position() or 0
    flush = journal.appender.flush()
    files = {"d.csv": [b"%d\\n" % (before + 1)], "e.csv": [b"x\\n"]}
    flush.write(files, position=(before, before + 1), crash=crash.reach)
    crash.reach("after-writes")
    flush.confirm()
    flush.finish()
    crash.reach("after-finish")
    flush.close()
"""


def follower_flush(data: Path, point: str) -> int:
    """One batch applied as cluster mode's follower applies one, in a process of its own that
    kills itself at ``point`` ("none": it does not); its exit status."""
    child = [sys.executable, "-c", _FOLLOWER_FLUSH, str(data), point]
    return subprocess.run(child, cwd=ROOT, env=server_env(), capture_output=True, timeout=30).returncode


def position_after_recovery(data: Path) -> int | None:
    journal = opened(data)  # its opening recovers
    try:
        with journal.locked():
            return journal.intent.committed_position()
    finally:
        journal.close()


@pytest.mark.parametrize("point", ["before-writes", "between-writes", "after-writes", "after-finish"])
def test_a_position_comes_back_after_a_kill_exactly_when_its_bytes_were_kept(tmp_path: Path, point: str) -> None:
    data = tmp_path / "data"
    opened(data).close()
    assert follower_flush(data, "none") == 0 and follower_flush(data, "none") == 0
    assert position_after_recovery(data) == 2 and (data / "d.csv").read_bytes() == b"h\n1\n2\n"
    assert follower_flush(data, point) == -9  # the precondition: it died there
    kept = point == "after-finish"
    assert position_after_recovery(data) == (3 if kept else 2)
    assert (data / "d.csv").read_bytes() == (b"h\n1\n2\n3\n" if kept else b"h\n1\n2\n")
    assert (data / "e.csv").read_bytes() == b"h\n" + b"x\n" * (3 if kept else 2)


def test_a_position_is_none_until_one_is_written_and_a_torn_record_refuses_to_guess_it(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_bytes(b"h\n")
    journal = opened(tmp_path)
    with journal.locked():
        assert journal.intent.committed_position() is None  # a new data dir's intent is empty
        journal.intent.write([FileSpan("d.csv", 2, 2, False)])
        journal.intent.mark_committed()
        assert journal.intent.committed_position() is None  # a flush of the sink's: no position
        journal.intent.write([FileSpan("d.csv", 2, 2, False)], position=(0, 7))
        journal.intent.mark_committed()
        assert journal.intent.committed_position() == 7
    intent = layout.intent_path(tmp_path)
    intent.write_bytes(intent.read_bytes()[:-2])  # a power loss tore it
    with journal.locked(), pytest.raises(Found, match="the position committed with the files is not known"):
        journal.intent.committed_position()


def test_a_settled_record_rewritten_without_forgotten_files_keeps_its_state_and_the_rest(tmp_path: Path) -> None:
    for name in ("a.csv", "b.csv"):
        (tmp_path / name).write_bytes(b"h\n1\n")
    journal = opened(tmp_path)
    with journal.locked():
        journal.intent.write([FileSpan("a.csv", 2, 4, False), FileSpan("b.csv", 2, 4, False)], position=(1, 2))
        journal.intent.mark_committed()
        journal.intent.rewrite_without({"a.csv"})
        record = journal.intent.read()
        journal.intent.write([FileSpan("a.csv", 4, 6, False)])
        journal.intent.mark_undone()
        journal.intent.rewrite_without({"a.csv"})
        undone = journal.intent.read()
    assert record is not None and record.state == FINISHED and record.position == (1, 2)
    assert record.spans == [FileSpan("b.csv", 2, 4, False)]
    assert undone is not None and undone.state == UNDONE and undone.spans == []

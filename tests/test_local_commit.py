"""The local commit point (tiny.commit.local): a flush through the journal's pieces, as the sink asks for one."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.journal_support import Append, flush, opened
from tiny import layout
from tiny.commit import Claim, Refused, Stored, WriteFailed
from tiny.commit.local import LocalCommit
from tiny.flushlock import LockTimeout
from tiny.intent import FileSpan


def test_the_digest_is_128_bits_keyed_by_the_journal(tmp_path: Path) -> None:
    first, second = opened(tmp_path / "a"), opened(tmp_path / "b")
    assert len(first.digest(b"body")) == 16
    assert first.digest(b"body") == first.digest(b"body") != second.digest(b"body")


def test_a_flush_decides_per_append_and_returns_a_receipt_without_a_position(tmp_path: Path) -> None:
    journal = opened(tmp_path, headers={".csv": b"h\n"})
    first = Claim("k", b"d1", b"a1")
    appends = [Append({"d.csv": b"1\n"}, first), Append({"d.csv": b"2\n"}, Claim("k", b"d2", b"a2")), Append({})]
    receipt = journal.commit(appends, time.monotonic() + 1)
    again = journal.commit([Append({"d.csv": b"1\n"}, first)], time.monotonic() + 1)
    assert receipt.decisions == [None, Stored(b"d1", b"a1"), None] and receipt.position is None
    assert again.decisions == [Stored(b"d1", b"a1")]
    assert (tmp_path / "d.csv").read_bytes() == b"h\n1\n"


def test_a_lock_not_free_by_the_deadline_is_unavailable_and_a_file_refused_is_a_write_failure(tmp_path: Path) -> None:
    journal, other = opened(tmp_path), opened(tmp_path)
    with other.locked(), pytest.raises(LockTimeout):
        journal.commit([Append({"d.csv": b"1\n"})], time.monotonic() + 0.1)
    (tmp_path / "x.csv").mkdir()  # the disk (here: a folder) refuses that file
    with pytest.raises(WriteFailed, match="the disk refused the write"):
        journal.commit([Append({"x.csv": b"1\n"})], time.monotonic() + 1)
    assert not journal.unfinished


def test_a_file_cut_below_its_committed_size_refuses_the_flush_as_a_whole(tmp_path: Path) -> None:
    journal = opened(tmp_path)
    flush(journal, "d.csv", b"1\n2\n")
    (tmp_path / "d.csv").write_bytes(b"1\n")
    with pytest.raises(Refused, match="bytes shorter than the 4"):
        journal.commit([Append({"d.csv": b"3\n"})], time.monotonic() + 1)
    assert (tmp_path / "d.csv").read_bytes() == b"1\n"


def test_recover_takes_the_lock_itself_or_works_under_the_one_held(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_bytes(b"h\n")
    journal = opened(tmp_path)
    for under_the_lock in (False, True):
        with journal.locked():
            journal.intent.write([FileSpan("d.csv", 2, 4, False)])
        (tmp_path / "d.csv").write_bytes(b"h\n1\n")  # a crashed flush's rows
        if under_the_lock:
            with journal.locked():
                journal.recover()
        else:
            journal.recover()
        assert (tmp_path / "d.csv").read_bytes() == b"h\n"
        assert layout.intent_path(tmp_path).read_bytes()[:1] == b"x"


def test_a_closed_commit_point_is_not_open_and_opens_again(tmp_path: Path) -> None:
    journal = LocalCommit(tmp_path)
    assert not journal.is_open
    journal.open()
    journal.close()
    assert not journal.is_open
    journal.open()
    assert journal.is_open and journal.wait_bound == journal.lock.lock_timeout

"""One flush's files (tiny.appender): intent first, header and LF, the check before the commit point, roll-back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.journal_support import claims, opened
from tiny import layout
from tiny.appender import LockLost
from tiny.intent import LIVE, UNDONE, FileSpan


def replace_lock_file(data: Path) -> None:
    lock = layout.lock_path(data)
    line = lock.read_bytes()[:64]
    lock.unlink()
    lock.write_bytes(line)


def test_a_new_file_gets_its_header_and_a_row_without_its_lf_gets_one_all_recorded_first(tmp_path: Path) -> None:
    (tmp_path / "old.csv").write_bytes(b"h\n1")  # edited by hand: no final LF
    journal = opened(tmp_path, headers={".csv": b"h\n"})
    with journal.locked():
        flush = journal.appender.flush()
        flush.write({"new.csv": [b"a\n"], "old.csv": [b"2\n"], "rejects/r.ndjson": [b"{}\n"]})
        record = journal.intent.read()
        flush.confirm()
        flush.finish()
        flush.close()
    assert record is not None and record.state == LIVE  # read between the writes and the mark
    assert record.spans == [
        FileSpan("new.csv", 0, 4, True),
        FileSpan("old.csv", 3, 6, False),
        FileSpan("rejects/r.ndjson", 0, 3, True),
    ]
    assert (tmp_path / "new.csv").read_bytes() == b"h\na\n" and (tmp_path / "old.csv").read_bytes() == b"h\n1\n2\n"
    assert (tmp_path / "rejects" / "r.ndjson").read_bytes() == b"{}\n"  # no header for that suffix


def test_a_rolled_back_flush_cuts_its_files_removes_those_it_made_and_marks_its_intent(tmp_path: Path) -> None:
    (tmp_path / "old.csv").write_bytes(b"h\n1\n")
    journal = opened(tmp_path, headers={".csv": b"h\n"})
    with journal.locked():
        flush = journal.appender.flush()
        flush.write({"new.csv": [b"a\n"], "old.csv": [b"2\n"]})
        flush.roll_back()
        flush.close()
        state = layout.intent_path(tmp_path).read_bytes()[:1]
    assert (tmp_path / "old.csv").read_bytes() == b"h\n1\n" and not (tmp_path / "new.csv").exists()
    assert state == UNDONE


@pytest.mark.hardening("third 8: a writer paused mid-flush committed after its lock file was replaced and recovered")
@pytest.mark.parametrize("change", ["lock file replaced", "intent overwritten", "file cut", "file appended"])
def test_a_flush_does_not_reach_its_commit_point_once_its_lock_or_files_changed(tmp_path: Path, change: str) -> None:
    path = tmp_path / "d.csv"
    path.write_bytes(b"h\n")
    journal = opened(tmp_path)
    with journal.locked():
        journal.keys.decide(claims("k"))
        flush = journal.appender.flush()
        try:
            flush.write({"d.csv": [b"1\n"]}, first_key="k")
            flush.confirm()  # nothing changed: it may commit
            fd = flush.opened[0][0]
            if change == "lock file replaced":
                replace_lock_file(tmp_path)
            elif change == "intent overwritten":  # as a recovery marks it undone
                os.pwrite(journal.intent.fd, b"x", 0)
            elif change == "file cut":
                os.ftruncate(fd, 2)
            else:
                os.write(fd, b"2\n")
            with pytest.raises(LockLost, match="a flush was not committed"):
                flush.confirm()
            journal.keys.rollback()
        finally:
            flush.close()

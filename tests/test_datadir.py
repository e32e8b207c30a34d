"""Opening the journal (tiny.datadir): the data dir's identity, its first start, what is refused, ``--new-journal``.

(tests/test_data_dir.py holds the same refusals met by real servers.)
"""

from __future__ import annotations

import gc
import os
import shutil
from pathlib import Path

import pytest

from tests.journal_support import flush, opened, previous_format_keys, refusal
from tiny import layout
from tiny.commit import Refused
from tiny.commit.local import LocalCommit
from tiny.intent import FileSpan
from tiny.keylog import segment_name


def test_the_identity_files_are_written_with_one_id(tmp_path: Path) -> None:
    journal = opened(tmp_path)
    dir_id = layout.identity_path(tmp_path).read_text().strip()
    assert layout.lock_path(tmp_path).read_bytes()[:32].decode() == dir_id == journal.dir_id
    (meta,) = journal.keys.db.execute("SELECT value FROM meta WHERE name = 'data_dir_id'").fetchone()
    assert meta == dir_id.encode()


@pytest.mark.hardening("exactly once 10: a deleted journal was silently replaced by an empty one")
def test_a_deleted_journal_is_refused(tmp_path: Path) -> None:
    """Never made again, empty: every retried keyed batch (80 of 80) would be written again."""
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
def test_a_key_log_that_lost_commits_is_refused(tmp_path: Path) -> None:
    """Its newest keys were lost (an older copy of it restored): its committed size names them."""
    data = tmp_path / "data"
    journal = opened(data)
    flush(journal, "d.csv", b"1\n", "k1")
    segment = data / segment_name(1)
    snapshot = segment.read_bytes()
    flush(journal, "d.csv", b"2\n", "k2")
    flush(journal, "d.csv", b"3\n")  # a flush without keys
    journal.close()
    segment.write_bytes(snapshot)
    message = refusal(data)
    assert f"{segment} is {len(snapshot)} bytes" in message and "shorter than the" in message
    # tiny-admin forget refuses journal files: the way named is a restore (or --new-journal)
    assert "tiny-admin forget" not in message and "Restore the key log's segment" in message


@pytest.mark.hardening("exactly once 10: a deleted journal was silently replaced by an empty one")
def test_a_key_log_deleted_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    journal = opened(data)
    flush(journal, "d.csv", b"1\n", "k1")
    journal.close()
    (data / segment_name(1)).unlink()
    message = refusal(data)
    assert f"{data / segment_name(1)} is 0 bytes, shorter than the" in message
    assert "tiny-admin forget" not in message and "Restore the key log's segment" in message


def test_files_shorter_than_the_last_committed_flush_left_them_are_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    journal = opened(data)
    flush(journal, "d.csv", b"h\n1\n", "k1")
    journal.close()
    (data / "d.csv").write_bytes(b"h\n")  # a restore of older files, or a cut by hand
    assert "shorter than the 4 the last committed flush left" in refusal(data)


@pytest.mark.hardening("exactly once 6: a data dir copied while live lost 24,900 acknowledged rows at its first flush")
def test_a_data_dir_copied_while_a_flush_ran_is_refused(tmp_path: Path) -> None:
    """`cp -r` took .tiny/ with a flush's intent live, then the day file after more flushes:
    recovering that intent would cut acknowledged rows (24,900) back to the intent's size."""
    data = tmp_path / "data"
    journal = opened(data)
    flush(journal, "d.csv", b"h\n1\n", "k1")
    with journal.locked():
        journal.intent.write([FileSpan("d.csv", 4, 6, False)])  # copied now, mid-flush
        copy = tmp_path / "copy"
        shutil.copytree(data, copy)
        with open(data / "d.csv", "ab") as out:
            out.write(b"2\n")
        journal.intent.mark_committed()
    flush(journal, "d.csv", b"3\n4\n", "k3")
    shutil.copy(data / "d.csv", copy / "d.csv")  # the day file, copied last
    message = refusal(copy)
    assert "past the 6 that the unfinished flush" in message and "tiny-admin backup" in message
    assert (copy / "d.csv").read_bytes() == b"h\n1\n2\n3\n4\n"  # nothing cut


def test_a_journal_of_the_earlier_format_is_refused_and_new_journal_replaces_it(tmp_path: Path) -> None:
    layout.state_dir(tmp_path).mkdir()
    previous_format_keys(tmp_path)  # and no meta
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


def test_new_journal_undoes_an_unfinished_flush_without_keys_and_keeps_one_with_keys_written_whole(
    tmp_path: Path,
) -> None:
    for name in ("a.csv", "b.csv"):
        (tmp_path / name).write_bytes(b"h\n")
    journal = opened(tmp_path)
    with journal.locked():
        journal.intent.write([FileSpan("a.csv", 2, 4, False)])  # no key: never acknowledged
        (tmp_path / "a.csv").write_bytes(b"h\n1\n")
    journal.close()
    layout.journal_path(tmp_path).unlink()  # found wrong: only --new-journal goes on
    opened(tmp_path, accept_new=True).close()
    assert (tmp_path / "a.csv").read_bytes() == b"h\n"
    journal = opened(tmp_path)
    with journal.locked():
        journal.intent.write([FileSpan("b.csv", 2, 4, False)], "k")  # a key, written whole: maybe acknowledged
        (tmp_path / "b.csv").write_bytes(b"h\n1\n")
    journal.close()
    layout.journal_path(tmp_path).unlink()
    opened(tmp_path, accept_new=True).close()
    assert (tmp_path / "b.csv").read_bytes() == b"h\n1\n"


@pytest.mark.hardening("exactly once 4: a journal that failed to open leaked descriptors and said 200 on /healthz")
def test_a_failed_open_leaves_no_descriptor_open(tmp_path: Path) -> None:
    """Each failed open closes the lock's descriptor (20,000 failed opens leave none)."""
    opened(tmp_path).close()
    journal_path = layout.journal_path(tmp_path)
    journal_path.unlink()
    journal_path.mkdir()  # cannot be opened as a database
    gc.collect()  # the earlier tests' journals, closed now if they are garbage, not during the count
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        journal = LocalCommit(tmp_path)
        with pytest.raises(Refused, match=str(journal_path)):
            journal.open()
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == fds


def test_a_journal_without_committed_sizes_gets_them_and_a_deleted_table_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    journal = opened(data)
    flush(journal, "a.csv", b"1\n", "k1")
    journal.keys.db.execute("DELETE FROM meta WHERE name = 'sizes'")  # a journal of the earlier format
    journal.close()
    layout.sizes_path(data).unlink()
    opened(data).close()  # gets an empty table
    assert layout.sizes_path(data).exists()
    layout.sizes_path(data).unlink()
    assert "committed sizes" in refusal(data) and "is missing" in refusal(data)

"""The journal on its own: the intent record, the key table, and taking over the first version's."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from tiny import layout
from tiny.journal import Intent, Journal


def opened(data: Path, **kwargs: object) -> Journal:
    journal = Journal(data, **kwargs)  # type: ignore[arg-type]
    journal.open()
    return journal


def commit(journal: Journal, keys: list[tuple[str, bytes, bytes]]) -> None:
    """A flush of ``keys`` that writes no data (lock held)."""
    journal.claim(keys)
    journal.commit()


def test_a_finished_flush_leaves_nothing_to_recover(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_bytes(b"h\n1\n")
    journal = opened(tmp_path)
    with journal.locked():
        journal.intend([Intent("d.csv", 4, False)])
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
        journal.intend([Intent("d.csv", 2, False)])  # as if it claimed the file was shorter
    intent = layout.intent_path(tmp_path)
    record = intent.read_bytes()
    intent.write_bytes(record[:-3])  # the end of the record never reached the file
    with journal.locked():
        assert journal.recover() == 0
        assert journal.recover() == 0  # and it was marked finished
    assert (tmp_path / "d.csv").read_bytes() == b"h\n1\n"


def test_a_shorter_intent_over_a_longer_one_is_read_by_its_own_length(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_bytes(b"h\n1\n")
    journal = opened(tmp_path)
    with journal.locked():
        journal.intend([Intent(f"{n:040d}.csv", 0, True) for n in range(20)])
        journal.finish()
        journal.intend([Intent("a.csv", 2, False)])
    with journal.locked():
        assert journal.recover() == 1
    assert (tmp_path / "a.csv").read_bytes() == b"h\n"


def test_a_flush_whose_first_key_is_stored_committed_and_keeps_its_rows(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_bytes(b"h\n")
    journal = opened(tmp_path)
    with journal.locked():
        assert journal.claim([("k1", b"digest", b"answer"), ("k2", b"digest", b"answer")]) == {}
        journal.intend([Intent("d.csv", 2, False)], "k1")
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
        commit(journal, [("k", b"digest", b"answer")])
    time.sleep(0.1)
    with journal.locked():
        assert journal.claim([("k", b"digest2", b"answer2")]) == {}  # past the window: new
        journal.intend([Intent("d.csv", 2, False)], "k")
        (tmp_path / "d.csv").write_bytes(b"h\n1\n")
    journal.close()  # killed before the commit: SQLite drops the open transaction
    journal = opened(tmp_path, window=0.05)
    with journal.locked():
        assert journal.recover() == 1
    assert (tmp_path / "d.csv").read_bytes() == b"h\n"


def test_past_max_keys_the_oldest_go_but_never_those_of_the_flush_committing(tmp_path: Path) -> None:
    journal = opened(tmp_path, max_keys=3)
    with journal.locked():
        for n in range(4):
            commit(journal, [(f"old{n}", b"d", b"a")])
        commit(journal, [(f"new{n}", b"d", b"a") for n in range(5)])  # more than max_keys at once
    held = [key for (key,) in journal.db.execute("SELECT key FROM idempotency_keys")]
    assert sorted(held) == [f"new{n}" for n in range(5)]
    assert journal.held == 5


def test_the_count_of_keys_follows_commits_and_expiry(tmp_path: Path) -> None:
    journal = opened(tmp_path, window=0.05)
    with journal.locked():
        commit(journal, [("a", b"d", b"x"), ("b", b"d", b"x")])
        commit(journal, [("c", b"d", b"x")])
        assert journal.held == 3
        time.sleep(0.1)
        for _ in range(1000):  # the next expiry runs at the 1001st commit
            journal.commit()
        assert journal.held == 0


def test_the_first_versions_journal_is_taken_over(tmp_path: Path) -> None:
    """Its keys stay (a retry is still answered from them) and its unfinished flush, kept
    in a table then, is undone."""
    layout.state_dir(tmp_path).mkdir()
    (tmp_path / "d.csv").write_bytes(b"h\n1\n2\n")
    db = sqlite3.connect(layout.journal_path(tmp_path))
    db.executescript(
        """
        CREATE TABLE intent (name TEXT PRIMARY KEY, size_before INTEGER NOT NULL, created INTEGER NOT NULL);
        CREATE TABLE keys (
            key TEXT PRIMARY KEY, digest BLOB NOT NULL, answer BLOB NOT NULL, stored REAL NOT NULL
        ) WITHOUT ROWID;
        CREATE INDEX keys_by_age ON keys (stored);
        CREATE TABLE counts (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
        INSERT INTO counts VALUES ('keys', 2);
        INSERT INTO intent VALUES ('d.csv', 4, 0);
        """
    )
    db.executemany(
        "INSERT INTO keys VALUES (?, ?, ?, ?)", [("k1", b"d1", b"a1", time.time()), ("k2", b"d2", b"a2", 1.0)]
    )
    db.commit()
    db.close()
    journal = opened(tmp_path, window=3600)
    with journal.locked():
        found = journal.claim([("k1", b"x", b"x"), ("k2", b"d3", b"a3")])
        journal.rollback()
    assert {key: (s.digest, s.answer) for key, s in found.items()} == {"k1": (b"d1", b"a1")}  # k2: past the window
    assert (tmp_path / "d.csv").read_bytes() == b"h\n1\n"
    tables = {name for (name,) in journal.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"idempotency_keys"}
    journal.close()
    assert os.path.getsize(layout.intent_path(tmp_path)) == 0


def test_the_count_of_keys_holds_when_another_process_emptied_the_table(tmp_path: Path) -> None:
    """Once every key is gone, SQLite numbers the next one 1 again, below the oldest seq the
    first process remembers."""
    first, second = opened(tmp_path, max_keys=3), opened(tmp_path, window=0.05)
    with first.locked():
        commit(first, [(f"k{n}", b"d", b"x") for n in range(10)])
        commit(first, [("k10", b"d", b"x")])  # past max_keys: it keeps seq 9-11
        assert first.held == 3
    time.sleep(0.1)
    with second.locked():
        for _ in range(1001):
            second.commit()
    with first.locked():
        commit(first, [("again", b"d", b"x")])
    assert first.held == 1

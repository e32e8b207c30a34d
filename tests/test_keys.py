"""The idempotency keys (tiny.keys): claims, the window, the count kept, bounded expiry."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.journal_support import claims, commit_keys, opened
from tiny import layout
from tiny.commit import Claim
from tiny.intent import FileSpan
from tiny.keys import WAL_LIMIT


def test_a_key_met_past_the_window_is_gone_before_the_flush_that_rewrites_it(tmp_path: Path) -> None:
    """The retry of an expired key writes again; if that flush dies before its commit, the old
    row of the key must not make recovery take the flush for committed."""
    (tmp_path / "d.csv").write_bytes(b"h\n")
    journal = opened(tmp_path, window=0.05)
    with journal.locked():
        commit_keys(journal, claims("k"))
    time.sleep(0.1)
    with journal.locked():
        assert journal.keys.claim(claims("k", digest=b"d2")) == {}  # past the window: new
        journal.intent.write([FileSpan("d.csv", 2, 4, False)], "k")
        (tmp_path / "d.csv").write_bytes(b"h\n1\n")
    journal.close()  # killed before the commit: SQLite drops the open transaction
    journal = opened(tmp_path, window=0.05)  # its recovery at open cuts the file back
    assert (tmp_path / "d.csv").read_bytes() == b"h\n"


def test_past_max_keys_the_oldest_go_but_never_those_of_the_flush_committing(tmp_path: Path) -> None:
    journal = opened(tmp_path, max_keys=3)
    with journal.locked():
        for n in range(4):
            commit_keys(journal, claims(f"old{n}"))
        commit_keys(journal, claims(*(f"new{n}" for n in range(5))))  # more than max_keys at once
    kept = [key for (key,) in journal.keys.db.execute("SELECT key FROM idempotency_keys")]
    assert sorted(kept) == [f"new{n}" for n in range(5)]
    assert journal.key_count == 5


def test_the_count_of_keys_follows_commits_and_expiry(tmp_path: Path) -> None:
    journal = opened(tmp_path, window=0.05)
    with journal.locked():
        commit_keys(journal, claims("a", "b"))
        commit_keys(journal, claims("c"))
        assert journal.key_count == 3
        time.sleep(0.1)
        commit_keys(journal, claims("d"))  # expires a, b and c on the way
        assert journal.key_count == 1


def test_the_count_of_keys_holds_when_another_process_emptied_the_table(tmp_path: Path) -> None:
    """Once every key is gone, SQLite numbers the next one 1 again, below the oldest seq the
    first process remembers."""
    first, second = opened(tmp_path, max_keys=3), opened(tmp_path)
    with first.locked():
        commit_keys(first, claims(*(f"k{n}" for n in range(10))))
        commit_keys(first, claims("k10"))  # past max_keys: it keeps seq 9-11
        assert first.key_count == 3
    with second.locked():
        second.keys.db.execute("DELETE FROM idempotency_keys")  # all of them expired, say
    with first.locked():
        commit_keys(first, claims("again"))
    assert first.key_count == 1


def test_a_key_stored_within_the_window_is_answered_from_what_it_stored(tmp_path: Path) -> None:
    journal = opened(tmp_path)
    with journal.locked():
        commit_keys(journal, claims("k", digest=b"first", answer=b"its answer"))
        decisions, first_key = journal.keys.decide([Claim("k", b"second", b"x"), None, Claim("n", b"d", b"a")])
        journal.keys.rollback()
    assert [d.answer if d else None for d in decisions] == [b"its answer", None, None] and first_key == "n"


@pytest.mark.hardening("exactly once 11: expiring 198k keys stalled one flush 445 ms and grew the -wal to 44 MB")
def test_a_flush_expires_at_most_twice_its_keys_plus_eight_of_a_backlog(tmp_path: Path) -> None:
    """5,000 keys past the window (a data dir idle for a day): no flush pays for all of them
    (198k deleted in one flush took 445 ms, and grew the -wal to 44 MB)."""
    journal = opened(tmp_path, window=3600)
    stale = time.time() - 7200
    with journal.locked():
        journal.keys.db.executemany(
            "INSERT INTO idempotency_keys (key, digest, answer, stored) VALUES (?, 'd', 'a', ?)",
            [(f"stale{n}", stale) for n in range(5000)],
        )
    left = [5000]
    with journal.locked():
        for n in range(600):
            before = journal.keys.expired
            commit_keys(journal, claims(f"fresh{n}"))
            assert journal.keys.expired - before <= 2 * 1 + 8
            left.append(
                journal.keys.db.execute(
                    "SELECT count(*) FROM idempotency_keys WHERE stored < ?", (stale + 1,)
                ).fetchone()[0]
            )
    assert left[-1] == 0 and left[1] == 5000 - 10  # it kept up, then caught up
    assert journal.key_count == 600


@pytest.mark.hardening("exactly once 11: expiring 198k keys stalled one flush 445 ms and grew the -wal to 44 MB")
def test_the_wal_is_cut_back_to_its_limit_after_a_checkpoint(tmp_path: Path) -> None:
    journal = opened(tmp_path)
    with journal.locked():
        for n in range(300):
            commit_keys(journal, [Claim(f"k{n}-{i}", b"d" * 16, b"a" * 4000) for i in range(10)])
    journal.keys.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    journal.keys.db.execute("PRAGMA wal_checkpoint(PASSIVE)")
    wal = layout.journal_path(tmp_path).with_name("journal.sqlite3-wal")
    assert wal.stat().st_size <= WAL_LIMIT

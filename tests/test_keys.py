"""The idempotency keys (tiny.keys, tiny.keylog): the key log, its keys in memory, the window, the bound, expiry."""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import tiny.keyload
from tests.journal_support import Append, claims, commit_keys, flush, opened, previous_format_keys
from tests.support import needs_strace, traced, unlinked_once_sizes_synced
from tiny import layout
from tiny.commit import Claim, Refused, Stored, Unavailable
from tiny.commit.local import LocalCommit
from tiny.files import size_of
from tiny.intent import FileSpan
from tiny.keylog import FIRST, KeyTable, encode, records, segment_name, segment_number


def _replayed(journal: object, *keys: str) -> list[bool]:
    """Whether each key would be answered from the journal now (a flush that writes nothing)."""
    receipt = commit_keys(journal, claims(*keys, digest=b"probe"))  # type: ignore[arg-type]
    return [decision is not None for decision in receipt.decisions]


def _die_after_writes(journal: object, appends: list[Append]) -> None:
    """A flush killed after writing its intent, rows and key records, before its mark."""
    j = journal  # LocalCommit
    with j.locked():  # type: ignore[attr-defined]
        j.intent.recover(j.keys.is_stored)  # type: ignore[attr-defined]
        _, records_ = j.keys.decide([a.claim for a in appends])  # type: ignore[attr-defined]
        files = {name: [data] for a in appends for name, data in a.chunks.items()}
        if records_ is not None:
            files[records_[0]] = [records_[1]]
        flush_ = j.appender.flush()  # type: ignore[attr-defined]
        flush_.write(files)
        flush_.close()
    j.close()  # type: ignore[attr-defined]


def test_a_flush_that_dies_before_its_mark_leaves_no_key_behind(tmp_path: Path) -> None:
    """Its key records are cut back with its rows: the retry is written, not replayed."""
    (tmp_path / "d.csv").write_bytes(b"h\n")
    journal = opened(tmp_path)
    commit_keys(journal, claims("before"))
    logged = size_of(tmp_path / segment_name(1))
    _die_after_writes(journal, [Append({"d.csv": b"1\n"}, Claim("k", b"d", b"a"))])
    assert size_of(tmp_path / segment_name(1)) > logged
    journal = opened(tmp_path)  # its recovery at open cuts the rows and the records back
    assert (tmp_path / "d.csv").read_bytes() == b"h\n" and size_of(tmp_path / segment_name(1)) == logged
    assert _replayed(journal, "k", "before") == [False, True]


def test_a_key_met_past_the_window_is_new_and_its_rewrite_dying_keeps_nothing(tmp_path: Path) -> None:
    """The retry of an expired key writes again; if that flush dies before its mark, the key's
    old record must not make the retry after it look stored."""
    (tmp_path / "d.csv").write_bytes(b"h\n")
    journal = opened(tmp_path, window=0.05)
    flush(journal, "d.csv", b"1\n", "k")
    time.sleep(0.1)
    _die_after_writes(journal, [Append({"d.csv": b"1\n"}, Claim("k", b"d2", b"a2"))])
    journal = opened(tmp_path, window=0.05)
    assert (tmp_path / "d.csv").read_bytes() == b"h\n1\n"
    assert flush(journal, "d.csv", b"1\n", "k").decisions == [None]  # written again, as documented


def test_past_max_keys_the_oldest_go_but_never_those_of_the_flush_committing(tmp_path: Path) -> None:
    journal = opened(tmp_path, max_keys=3)
    for n in range(4):
        commit_keys(journal, claims(f"old{n}"))
    commit_keys(journal, claims(*(f"new{n}" for n in range(5))))  # more than max_keys at once
    assert journal.key_count == 5
    assert _replayed(journal, "new0", "new4") == [True, True]
    assert _replayed(journal, "old3") == [False]


def test_the_count_of_keys_follows_commits_and_expiry(tmp_path: Path) -> None:
    journal = opened(tmp_path, window=0.05)
    commit_keys(journal, claims("a", "b"))
    commit_keys(journal, claims("c"))
    assert journal.key_count == 3
    time.sleep(0.1)
    commit_keys(journal, claims("d"))  # expires a, b and c on the way
    assert journal.key_count == 1 and journal.keys.expired == 3


def test_a_key_stored_within_the_window_is_answered_from_what_it_stored(tmp_path: Path) -> None:
    journal = opened(tmp_path)
    commit_keys(journal, claims("k", digest=b"first", answer=b"its answer"))
    with journal.locked():
        decisions, written = journal.keys.decide([Claim("k", b"second", b"x"), None, Claim("n", b"d", b"a")])
        journal.keys.rollback()
    assert decisions == [Stored(b"first", b"its answer"), None, None]
    assert written is not None and written[0] == segment_name(1)
    assert [record.key for _, record in records(written[1])] == [b"n"]


def test_each_process_reads_the_keys_the_others_appended_before_it_decides(tmp_path: Path) -> None:
    """Two journals of one data dir (two processes, or servers): what one commits, the other's
    next flush finds, from the log's tail, under the flush lock; and the other way round."""
    first, second = opened(tmp_path), opened(tmp_path)
    commit_keys(first, claims("a", digest=b"da", answer=b"aa"))
    assert commit_keys(second, claims("a")).decisions == [Stored(b"da", b"aa")]
    commit_keys(second, claims("b", digest=b"db", answer=b"ab"))
    assert commit_keys(first, claims("b", "c")).decisions == [Stored(b"db", b"ab"), None]
    assert first.key_count == second.key_count + 1 == 3


def test_a_restart_reads_every_key_back_from_the_log(tmp_path: Path) -> None:
    journal = opened(tmp_path)
    keys = [f"key-{n}" for n in range(3000)]
    for start in range(0, len(keys), 250):
        commit_keys(journal, claims(*keys[start : start + 250], answer=b"answer"))
    journal.close()
    again = opened(tmp_path)
    assert again.keys_read(10) and again.keys.table.size == 3000
    assert all(_replayed(again, *keys[::97]))
    assert again.keys.last is not None and again.keys.last[:2] == ("key-2999", 3000)


def test_a_torn_record_at_the_end_of_the_log_is_never_read_and_is_cut_before_the_next_append(
    tmp_path: Path,
) -> None:
    """A power loss inside an append leaves part of a record: reading stops before it (its
    length runs past the end, or its CRC fails), and the next flush cuts it off first."""
    journal = opened(tmp_path)
    commit_keys(journal, claims("whole"))
    journal.close()
    segment = tmp_path / segment_name(1)
    for number, how in enumerate(("cut short", "its bytes lost")):
        whole, key = segment.read_bytes(), f"torn{number}"
        torn = encode(number + 2, time.time(), FIRST, key.encode(), b"d", b"a")
        segment.write_bytes(whole + (torn[:-3] if how == "cut short" else torn[:8] + b"\0" * (len(torn) - 8)))
        again = opened(tmp_path)
        assert again.keys_read(10) and again.keys.table.size == number + 1 and again.keys.newest == number + 1
        assert _replayed(again, key, "whole") == [False, True]
        data = segment.read_bytes()
        parsed = list(records(data))
        assert data.startswith(whole) and parsed[-1][1].key == key.encode()
        assert len(data) == parsed[-1][0] + len(encode(*parsed[-1][1]))  # nothing torn left: read to the end
        again.close()


def test_expiry_deletes_the_segments_it_walks_past_and_their_committed_sizes(tmp_path: Path) -> None:
    """Small segments: keys past the window go, oldest first, a segment at a time; the
    data dir then opens (its committed sizes no longer expect the deleted segments)."""
    journal = opened(tmp_path, window=0.2, segment_bytes=1000)
    for n in range(40):
        commit_keys(journal, claims(f"k{n}", answer=b"x" * 100))
    made = sorted(layout.state_dir(tmp_path).joinpath("keys").iterdir())
    assert len(made) >= 4
    time.sleep(0.3)
    for n in range(40):
        commit_keys(journal, claims(f"fresh{n}", answer=b"x" * 100))
    left = sorted(layout.state_dir(tmp_path).joinpath("keys").iterdir())
    assert made[0] not in left and left[-1] not in made
    assert journal.key_count == 40
    journal.close()
    again = opened(tmp_path, window=0.2, segment_bytes=1000)
    assert _replayed(again, "fresh0", "k39") == [True, False]


def test_a_flush_expires_at_most_twice_its_keys_plus_eight_of_a_backlog(tmp_path: Path) -> None:
    """5,000 keys past the window (a data dir idle for a day): no flush pays for all of them
    (198k deleted in one flush took 445 ms)."""
    journal = opened(tmp_path, window=3600)
    journal.close()
    stale = time.time() - 7200
    segment = tmp_path / segment_name(1)
    segment.parent.mkdir(parents=True, exist_ok=True)
    segment.write_bytes(b"".join(encode(n, stale, FIRST, f"stale{n}".encode(), b"d", b"a") for n in range(1, 5001)))
    journal = opened(tmp_path, window=3600)
    expired = [0]
    for n in range(600):
        commit_keys(journal, claims(f"fresh{n}"))
        assert journal.keys.expired - expired[-1] <= 2 * 1 + 8
        expired.append(journal.keys.expired)
    assert expired[1] == 10 and expired[-1] == 5000  # it kept up, then caught up
    assert journal.key_count == 600


def test_the_keys_of_a_journal_of_the_previous_format_are_copied_into_the_log(tmp_path: Path) -> None:
    journal = opened(tmp_path)
    journal.close()
    previous_format_keys(tmp_path, (1, "old", b"dd", b"aa"))
    again = opened(tmp_path)
    assert commit_keys(again, claims("old", "new")).decisions == [Stored(b"dd", b"aa"), None]
    db = sqlite3.connect(layout.journal_path(tmp_path))
    assert db.execute("SELECT count(*) FROM idempotency_keys").fetchone() == (0,)
    db.close()


def test_the_key_table_finds_updates_and_removes_like_a_dict_under_collisions() -> None:
    """Hashes crowded into few homes (the low bits equal), random puts and removes; the table
    grows past its load. Backward-shift removal keeps every other key findable."""
    rng = random.Random(7)
    table, model = KeyTable(16), {}
    always = lambda where: True  # noqa: E731 - each hash is one key here
    for step in range(20000):
        h = (rng.randrange(1, 400) << 20) | rng.choice((1, 2, 3))
        if rng.random() < 0.6:
            table.put(h, step, always)
            model[h] = step
        elif h in model:
            assert table.remove(h, model.pop(h))
        if step % 997 == 0:
            assert all(table.find(k, always) == v for k, v in model.items())
            assert table.size == len(model)
    assert all(table.find(k, always) == v for k, v in model.items())
    assert table.find(5 << 40, always) == -1


def test_a_reopened_journal_keeps_the_keys_it_read_when_the_log_is_the_same(tmp_path: Path) -> None:
    """A journal closed and opened again (after a refusal, at most once a second) reads only
    what is new, not the whole log again."""
    journal = opened(tmp_path)
    commit_keys(journal, claims("a"))
    table = journal.keys.table
    journal.close()
    other = opened(tmp_path)
    commit_keys(other, claims("b"))
    journal.open()
    assert journal.keys_read(10) and journal.keys.table is table and _replayed(journal, "a", "b") == [True, True]


def test_a_keyed_flush_waits_for_the_keys_at_most_its_deadline_and_one_without_keys_does_not(tmp_path: Path) -> None:
    """The keys are read on a thread of their own after the opening (a start on 10 million
    takes seconds): a keyed flush waits for them until its deadline (then Unavailable, a 503
    with Retry-After), a flush without keys never waits."""
    journal = opened(tmp_path)
    commit_keys(journal, claims("k"))
    journal.close()
    reading = opened(tmp_path)
    assert reading.keys_read(10)
    loader = threading.Thread(target=time.sleep, args=(0.5,))  # stands for a long reading
    loader.start()
    reading._loader = loader
    reading._loader_started = True
    with pytest.raises(Unavailable, match="still being read"):
        reading.commit([Append({}, Claim("k", b"d", b"a"))], time.monotonic() + 0.05)
    assert reading.commit([Append({"d.csv": b"1\n"})], time.monotonic() + 0.05).decisions == [None]
    loader.join()
    assert reading.commit([Append({}, Claim("k", b"d", b"a"))], time.monotonic() + 1).decisions != [None]


def test_closing_stops_a_reading_of_the_keys_under_way(tmp_path: Path) -> None:
    journal = opened(tmp_path)
    for start in range(0, 2000, 250):
        commit_keys(journal, claims(*(f"k{n}" for n in range(start, start + 250))))
    journal.close()
    again = LocalCommit(tmp_path)
    again.keys.stop_loading = True  # as close() sets it: the reading stops at its next chunk
    again.open()
    again.close()
    assert again.keys.table.size == 0 and not again.keys.stop_loading


def test_a_reopened_journal_whose_key_log_was_replaced_reads_the_new_one_from_its_start(tmp_path: Path) -> None:
    """Its segment is another file now (another inode): the keys read before are dropped and
    the log read again, the journal's meta database staying open."""
    journal = opened(tmp_path)
    commit_keys(journal, claims("old"))
    journal.close()
    segment = tmp_path / segment_name(1)
    replaced = encode(1, time.time(), FIRST, b"new", b"d", b"a" * 200)
    segment.unlink()
    segment.write_bytes(replaced)
    journal.open()
    assert journal.keys_read(10) and journal.keys.table.size == 1
    assert journal.keys.meta("data_dir_id") is not None  # the meta database still open
    assert _replayed(journal, "new", "old") == [True, False]


def test_two_processes_crashing_flushes_and_reopening_over_rotating_segments_agree_with_a_model(
    tmp_path: Path,
) -> None:
    """Random flushes of new keys from two journals of one data dir (two processes), some
    killed after their writes (before the mark), journals closed and reopened, in segments of
    600 bytes with at most 40 keys counted: after every step both decide like the model, the
    newest 40 keys committed count (those of the newest flush always), no key of a killed flush
    does, and the segments expiry walked past are gone."""
    rng = random.Random(45)
    journals = [opened(tmp_path, max_keys=40, segment_bytes=600) for _ in range(2)]
    committed: list[list[str]] = []  # flushes, in commit order
    killed: list[str] = []
    for step in range(160):
        which = rng.randrange(2)
        keys = [f"s{step}-k{n}" for n in range(rng.randint(1, 4))]
        action = rng.random()
        if action < 0.15:
            _die_after_writes(journals[which], [Append({}, claim) for claim in claims(*keys)])
            killed += keys
            journals[which] = opened(tmp_path, max_keys=40, segment_bytes=600)
        elif action < 0.22:
            journals[which].close()
            journals[which].open()
            assert journals[which].keys_read(30)
        else:
            assert commit_keys(journals[which], claims(*keys)).decisions == [None] * len(keys)
            committed.append(keys)
        if step % 10 == 9:
            order = [key for flush_ in committed for key in flush_]
            counting = set(order[-40:]) | set(committed[-1])
            probe = rng.sample(order, min(12, len(order))) + rng.sample(killed, min(4, len(killed)))
            for journal in journals:
                with journal.locked():
                    decisions, _ = journal.keys.decide(claims(*probe))
                    journal.keys.rollback()
                assert [d is not None for d in decisions] == [key in counting for key in probe], step
    segments = sorted(layout.state_dir(tmp_path).joinpath("keys").iterdir())
    assert segments[0].name != "00000001.log" and len(segments) < 12


def test_a_key_log_cut_under_a_running_server_refuses_its_next_keyed_flush(tmp_path: Path) -> None:
    """Its committed keys are gone: a retry of theirs would be written again. The flush is
    refused (the sink answers 503 and reopens the journal, whose committed sizes refuse it too)."""
    journal = opened(tmp_path)
    commit_keys(journal, claims("a", "b"))
    segment = tmp_path / segment_name(1)
    os.truncate(segment, size_of(segment) // 2)
    with pytest.raises(Refused, match="shorter than the .* this server read from it"):
        commit_keys(journal, claims("c"))
    journal.close()
    assert "shorter than the" in str(pytest.raises(Refused, opened, tmp_path).value)


def test_an_upgrade_over_a_flush_of_the_previous_format_killed_after_its_keys_committed_keeps_its_rows(
    tmp_path: Path,
) -> None:
    """The previous format's crash point after-commit: its keys in SQLite, its intent still
    live. The first opening of this version keeps the rows (the first key is found in the old
    table), then copies the keys into the log: the retry is answered from it."""
    (tmp_path / "d.csv").write_bytes(b"h\n")
    journal = opened(tmp_path)
    with journal.locked():
        journal.intent.write([FileSpan("d.csv", 2, 4, False)], "k1")
        (tmp_path / "d.csv").write_bytes(b"h\n1\n")
    journal.close()
    previous_format_keys(tmp_path, (7, "k1", b"d", b"a"))
    again = opened(tmp_path)
    assert (tmp_path / "d.csv").read_bytes() == b"h\n1\n"
    assert commit_keys(again, claims("k1")).decisions == [Stored(b"d", b"a")]


def test_a_start_with_a_lower_bound_holds_the_bound_plus_one_segment_of_keys_not_the_whole_log(tmp_path: Path) -> None:
    """--idempotency-max-keys lowered over a log written under a higher one: the start leaves
    out the keys that cannot count (older than the bound before the newest segment's first)."""
    journal = opened(tmp_path, segment_bytes=4000)
    keys = [f"key-{n}" for n in range(3000)]
    for start in range(0, len(keys), 250):
        commit_keys(journal, claims(*keys[start : start + 250], answer=b"answer"))
    journal.close()
    segments = sorted(layout.state_dir(tmp_path).joinpath("keys").iterdir())
    per_segment = max(len(list(records(segment.read_bytes()))) for segment in segments)
    assert len(segments) >= 10 and per_segment == 250
    again = opened(tmp_path, max_keys=256, segment_bytes=4000)
    assert again.keys.table.size <= 256 + per_segment
    assert _replayed(again, keys[-1], keys[-256], keys[0]) == [True, True, False]


def test_a_damaged_record_inside_the_log_costs_its_own_key_only_and_cuts_no_committed_one(tmp_path: Path) -> None:
    """A record whose CRC fails with whole records after it (a bad sector, not a torn append):
    the records after it are committed keys; reading goes on past it, and nothing is cut."""
    journal = opened(tmp_path)
    for key in ("before", "damaged", "after"):
        commit_keys(journal, claims(key))
    journal.close()
    segment = tmp_path / segment_name(1)
    data = bytearray(segment.read_bytes())
    (_, _), (middle, record), (last, _) = records(bytes(data))
    data[middle + len(encode(*record)) - 1] ^= 0xFF  # the damaged record's last byte: its CRC fails
    segment.write_bytes(bytes(data))
    assert [r.key for _, r in records(bytes(data))] == [b"before"]  # precondition: reading stops at it
    again = opened(tmp_path)
    assert _replayed(again, "after", "before") == [True, True]
    assert segment.read_bytes()[: len(data)] == bytes(data)  # nothing cut
    again.close()
    third = opened(tmp_path)
    assert _replayed(third, "after", "before") == [True, True]


def test_a_journal_idle_while_another_filled_and_expired_segments_reads_on_from_the_oldest_left(tmp_path: Path) -> None:
    """Two journals of one data dir: while one is idle, the other fills segments past it and
    its expiry deletes the next one the idle one would read. The idle one's next flush finds
    the keys of the segments left, and appends to the newest (no segment made again)."""
    busy, idle = opened(tmp_path, window=0.3, segment_bytes=1000), opened(tmp_path, window=0.3, segment_bytes=1000)
    commit_keys(idle, claims("idle-first", answer=b"x" * 100))
    for n in range(30):
        commit_keys(busy, claims(f"old{n}", answer=b"x" * 100))
    time.sleep(0.4)
    for n in range(30):
        commit_keys(busy, claims(f"new{n}", digest=b"dn", answer=b"x" * 100))
    left = [segment_number(p.name) for p in layout.state_dir(tmp_path).joinpath("keys").iterdir()]
    assert 2 not in left and max(left) > 3  # precondition: the idle one's next segment is gone
    assert commit_keys(idle, claims("new29", "new0")).decisions == [Stored(b"dn", b"x" * 100)] * 2
    assert 2 not in [segment_number(p.name) for p in layout.state_dir(tmp_path).joinpath("keys").iterdir()]


_EXPIRE_A_SEGMENT = """
import sys, time
from pathlib import Path
from tests.journal_support import claims, commit_keys, opened
journal = opened(Path(sys.argv[1]), window=0.2, segment_bytes=1000, fsync=True)
for n in range(15):
    commit_keys(journal, claims(f"old{n}", answer=b"x" * 100))
time.sleep(0.3)
for n in range(15):
    commit_keys(journal, claims(f"new{n}", answer=b"x" * 100))
"""


@needs_strace
def test_with_fsync_a_segment_expiry_deletes_is_forgotten_durably_before_it_goes(tmp_path: Path) -> None:
    """Committed sizes are never synced (a slot lost is a weaker check), but the forgetting of
    a segment must be on disk before its deletion: otherwise a power loss that kept the
    deletion and lost the forgetting refuses the next start (a committed segment missing)."""
    lines = traced(tmp_path / "trace", _EXPIRE_A_SEGMENT, str(tmp_path / "data"))
    deleted = unlinked_once_sizes_synced(lines, r"/\.tiny/keys/\d{8}\.log")
    assert deleted >= 1  # precondition: expiry deleted a segment


def test_an_older_segment_cut_under_a_running_server_refuses_a_retry_of_its_keys(tmp_path: Path) -> None:
    """Not the newest segment: no fstat of it sees the cut, but a key whose record can no longer
    be read back is refused, never taken for new (its batch would be written again)."""
    journal = opened(tmp_path, segment_bytes=1000)
    for n in range(20):
        commit_keys(journal, claims(f"k{n}", answer=b"x" * 100))
    first = tmp_path / segment_name(1)
    assert (tmp_path / segment_name(2)).exists()  # precondition: the first segment is not the newest
    os.truncate(first, 10)
    with pytest.raises(Refused, match="cannot be read back"):
        commit_keys(journal, claims("k0"))
    assert _replayed(journal, "k19") == [True]  # keys of the segments left still answer


def test_a_segment_deleted_by_hand_before_an_idle_journal_read_it_refuses_its_next_keyed_flush(tmp_path: Path) -> None:
    """Unlike a segment expiry deleted (its committed size forgotten first), one deleted by
    hand still has its committed size: its keys count, so the idle journal refuses."""
    busy, idle = opened(tmp_path, segment_bytes=1000), opened(tmp_path, segment_bytes=1000)
    commit_keys(idle, claims("idle-first", answer=b"x" * 100))
    for n in range(30):
        commit_keys(busy, claims(f"k{n}", answer=b"x" * 100))
    os.unlink(tmp_path / segment_name(2))
    assert (tmp_path / segment_name(3)).exists()  # precondition: segments after it are left
    with pytest.raises(Refused, match="deleted"):
        commit_keys(idle, claims("k29"))


# Keys of the pace tests' records (keys like "busy59-19", 40-byte answers) in a 1,000-byte segment, at most.
_KEYS_PER_SEGMENT = 1000 // len(encode(1, 0.0, FIRST, b"busy59-19", b"d", b"x" * 40)) + 1


def _deleted_segments_held(journal: LocalCommit) -> list[str]:
    """The key log segments ``journal`` holds open that are deleted (another's expiry: disk held)."""
    held = [os.readlink(f"/proc/self/fd/{fd}") for fd in journal.keys._fds.values()]
    return [target for target in held if target.endswith(" (deleted)")]


def test_a_journal_that_flushes_keys_seldom_expires_as_fast_as_the_log_grows(tmp_path: Path) -> None:
    """Two journals of one data dir, one storing 20 keys for each the other stores: the seldom
    one reads the others' records at its flushes, and expires as many as it reads, so its
    table and its open segments stay within the bound (a budget of its own keys alone let
    both grow with the log: deleted segments held open, their keys in memory)."""
    busy = opened(tmp_path, max_keys=50, segment_bytes=1000)
    seldom = opened(tmp_path, max_keys=50, segment_bytes=1000)
    for n in range(60):
        for m in range(20):
            commit_keys(busy, claims(f"busy{n}-{m}", answer=b"x" * 40))
        commit_keys(seldom, claims(f"seldom{n}", answer=b"x" * 40))
    assert busy.keys.table.size <= 50 + _KEYS_PER_SEGMENT  # precondition: the busy one holds the bound
    assert seldom.keys.table.size <= 50 + 2 * _KEYS_PER_SEGMENT
    assert seldom.keys.segment_count <= busy.keys.segment_count + 1
    assert _deleted_segments_held(seldom) == []


def test_a_journal_opened_before_the_log_began_finds_it_after_its_first_segment_expired(tmp_path: Path) -> None:
    """A journal opened while the log had no segment yet, whose first look comes after another
    journal's expiry deleted segment 1: it reads on from the oldest segment left, so it replays
    the keys the other stored (and never starts segment 1 again, at seq 1)."""
    late = opened(tmp_path, max_keys=50, segment_bytes=1000)  # the log has no segment yet
    busy = opened(tmp_path, max_keys=50, segment_bytes=1000)
    for n in range(100):
        commit_keys(busy, claims(f"k{n}", digest=b"dk", answer=b"x" * 40))
    left = sorted(segment_number(p.name) for p in layout.state_dir(tmp_path).joinpath("keys").iterdir())
    assert left[0] > 1  # precondition: segment 1 was expired before the late journal read it
    assert commit_keys(late, claims("k99")).decisions == [Stored(b"dk", b"x" * 40)]
    assert commit_keys(late, claims("late-new")).decisions == [None]
    assert commit_keys(busy, claims("late-new")).decisions == [Stored(b"d", b"a")]
    assert not (layout.state_dir(tmp_path) / "keys" / "00000001.log").exists()


def test_a_journal_idle_while_others_wrote_expires_what_it_read_in_its_next_flush(tmp_path: Path) -> None:
    """10,000 keys written by another journal while this one was idle, all past the window by
    its next flush: that flush reads them, and expires them (twice what it read is its budget:
    linear in the reading it must do anyway), so the idle journal holds its own key only."""
    idle = opened(tmp_path, window=0.3)
    busy = opened(tmp_path, window=0.3)
    for n in range(100):
        commit_keys(busy, claims(*(f"k{n}-{m}" for m in range(100))))
    time.sleep(0.4)
    before = idle.keys.expired
    commit_keys(idle, claims("fresh"))
    assert idle.keys.expired - before == 10_000 and idle.keys.table.size == 1


def test_a_journal_whose_keyed_flushes_are_all_replays_keeps_pace_with_the_log(tmp_path: Path) -> None:
    """Its flushes store no key of their own (each one a retry of a key the other stored), yet
    they read the others' records: it expires as many, within the bound, and lets go of the
    segments the other deleted."""
    busy = opened(tmp_path, max_keys=50, segment_bytes=1000)
    replayer = opened(tmp_path, max_keys=50, segment_bytes=1000)
    for n in range(60):
        for m in range(20):
            commit_keys(busy, claims(f"busy{n}-{m}", answer=b"x" * 40))
        assert commit_keys(replayer, claims(f"busy{n}-19", answer=b"x" * 40)).decisions[0] is not None
    assert replayer.keys.table.size <= 50 + 2 * _KEYS_PER_SEGMENT
    assert _deleted_segments_held(replayer) == []


def test_a_flush_without_keys_over_a_key_log_cut_by_hand_still_commits(tmp_path: Path) -> None:
    """A flush without keys neither reads nor expires the key log: a cut of the log is no
    business of its rows, and is refused at the next flush with keys."""
    (tmp_path / "d.csv").write_bytes(b"h\n")
    busy = opened(tmp_path)
    commit_keys(busy, claims("a", "b", "c"))
    keyless = opened(tmp_path)
    segment = tmp_path / segment_name(1)
    os.truncate(segment, size_of(segment) - 5)
    assert flush(keyless, "d.csv", b"1\n").decisions == [None]
    assert (tmp_path / "d.csv").read_bytes() == b"h\n1\n"
    with pytest.raises(Refused, match="shorter than the .* this server read from it"):
        commit_keys(keyless, claims("d"))


def test_a_journal_whose_keys_could_not_be_read_expires_nothing_at_a_flush_without_keys(tmp_path: Path) -> None:
    """The start's reading of the log failed (an I/O error on its first segment): memory does
    not hold the log, and a flush without keys reads on or expires nothing from it (expiry would
    walk past, and delete, a segment of keys that still count)."""
    (tmp_path / "d.csv").write_bytes(b"h\n")
    busy = opened(tmp_path, segment_bytes=1000)
    for n in range(30):
        commit_keys(busy, claims(f"k{n}", answer=b"x" * 100))
    segments = sorted(p.name for p in layout.state_dir(tmp_path).joinpath("keys").iterdir())
    journal = LocalCommit(tmp_path, segment_bytes=1000)
    read = journal.keys._read

    def failing_first_read(*args: object, **kwargs: object) -> int:
        journal.keys._read = read  # type: ignore[method-assign]
        raise OSError(5, "Input/output error")

    journal.keys._read = failing_first_read  # type: ignore[method-assign]
    journal.open()
    assert not journal.keys_read(30)  # precondition: the reading failed
    flush(journal, "d.csv", b"1\n")
    assert sorted(p.name for p in layout.state_dir(tmp_path).joinpath("keys").iterdir()) == segments
    assert commit_keys(opened(tmp_path, segment_bytes=1000), claims("k0")).decisions[0] is not None


def test_a_journal_opened_before_the_log_began_refuses_a_first_segment_deleted_by_hand(tmp_path: Path) -> None:
    """Segment 1, full and committed, deleted by hand (not by expiry, which forgets its
    committed size first): the journal opened before the log began finds its keys gone at its
    first flush with keys and refuses it, instead of reading on from segment 2 and taking them
    for new."""
    late = opened(tmp_path, segment_bytes=1000)  # the log has no segment yet
    busy = opened(tmp_path, segment_bytes=1000)
    for n in range(12):
        commit_keys(busy, claims(f"k{n}", digest=b"dk", answer=b"x" * 100))
    assert (tmp_path / segment_name(2)).exists()  # precondition: segment 1 is full, 2 follows
    os.unlink(tmp_path / segment_name(1))
    with pytest.raises(Refused, match=r"00000001\.log was deleted under the running server"):
        commit_keys(late, claims("k0", digest=b"dk", answer=b"x" * 100))


def test_a_journal_that_skipped_segments_others_expired_expires_twice_what_it_read_not_the_gap(
    tmp_path: Path,
) -> None:
    """5,000 keys of its own past the window, then segments another journal wrote and expired
    while this one was idle (it skips them: their keys no longer count): its next flush expires
    twice the records it read plus 8, not twice the jump in seq over the skipped segments, so
    its backlog goes a step per flush."""
    idle = opened(tmp_path, window=0.5, segment_bytes=4000)
    busy = opened(tmp_path, window=0.5, segment_bytes=4000)
    for n in range(50):
        commit_keys(idle, claims(*(f"idle{n}-{m}" for m in range(100))))
    time.sleep(0.6)
    for n in range(3000):
        commit_keys(busy, claims(f"b{n}"))
    time.sleep(0.6)
    for n in range(400):
        commit_keys(busy, claims(f"d{n}"))
    newest, expired = idle.keys.newest, idle.keys.expired
    took = []
    take = idle.keys._take

    def counted(buf: bytes, base: int) -> tuple[int, int]:
        found = take(buf, base)
        took.append(sum(1 for _ in records(bytes(buf[: found[0]]))))
        return found

    idle.keys._take = counted  # type: ignore[method-assign]
    commit_keys(idle, claims("fresh"))
    read = sum(took)
    assert idle.keys.newest - newest > read + 1000  # precondition: it skipped segments of many keys
    assert idle.keys.expired - expired <= 2 * (read + 1) + 8 < 5000


# -- the start's loop, compiled and in Python ------------------------------------------------------


def _log_of_every_kind(data: Path) -> None:
    """A journal whose key log holds, among 3,000 keys: the same keys stored again (a slot of
    the same hash), keys past the window, a record damaged inside the log and a torn tail."""
    opened(data).close()
    now, out = time.time(), bytearray()
    for seq in range(1, 3001):
        key = f"k{seq % 2500}".encode()  # the last 500 store the first 500 again
        stored = now - 10 * 86400 if seq % 7 == 0 else now - seq  # every 7th past the window
        out += encode(seq, stored, FIRST if seq % 3 == 1 else 0, key, b"d" * 16, b"answer %d" % seq)
        if seq == 1500:
            out[-3] ^= 0xFF  # damaged inside: its length still leads to the next record
    out += encode(3001, now, FIRST, b"torn", b"d", b"a")[:-4]
    (data / segment_name(1)).parent.mkdir(parents=True, exist_ok=True)
    (data / segment_name(1)).write_bytes(bytes(out))


@pytest.mark.skipif(tiny.keyload.CODEC != "rust", reason="the compiled codec is not in use (TINY_CODEC=python)")
def test_the_compiled_start_loop_fills_the_table_as_the_python_one_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tiny._codec.take_keys against the Python loop, on one log and one hash: the same slots
    in the same order, the same newest seq, flush, last key and count, through the table's
    growth (no room reserved), keys stored again, keys past the window, damage and a torn tail."""
    _log_of_every_kind(tmp_path / "data")
    shutil.copytree(tmp_path / "data", tmp_path / "copy")
    monkeypatch.setattr(KeyTable, "reserve", lambda table, keys: None)
    compiled = opened(tmp_path / "data")
    monkeypatch.setattr(tiny.keyload, "CODEC", "python")
    python = opened(tmp_path / "copy")
    try:
        ours, theirs = compiled.keys, python.keys
        assert ours.table.size == theirs.table.size > 2000  # precondition: most keys taken, the table grown
        assert ours.table.capacity == theirs.table.capacity > 1024
        assert ours.table.slots()[:2] == theirs.table.slots()[:2]
        assert (ours.newest, ours._flush_first, ours.last) == (theirs.newest, theirs._flush_first, theirs.last)
        assert ours.last is not None and ours.last[1] == 3000
        for n in (1, 499, 2000):  # stored again: the newer record's answer
            assert ours.decide(claims(f"k{n}"))[0][0] == theirs.decide(claims(f"k{n}"))[0][0]
    finally:
        compiled.close()
        python.close()


@pytest.mark.skipif(tiny.keyload.CODEC != "rust", reason="the compiled codec is not in use (TINY_CODEC=python)")
@settings(max_examples=int(os.environ.get("TINY_FUZZ_EXAMPLES", "200")), deadline=None)
@given(
    records=st.lists(
        st.tuples(st.integers(1, 80), st.integers(0, 40), st.sampled_from([1.0, 10 * 86400.0, float("nan")])),
        min_size=1,
        max_size=60,
    ),
    damage=st.lists(st.tuples(st.integers(0, 1 << 14), st.integers(0, 255)), max_size=4),
    cut=st.integers(0, 64),
    start=st.integers(0, 3),
)
@example(records=[(seq, seq, 1.0) for seq in range(1, 13)], damage=[], cut=0, start=0)  # grown at the last record
def test_the_compiled_start_loop_agrees_with_the_python_one_on_any_damage(
    keyed_pair: tuple[LocalCommit, LocalCommit],
    records: list[tuple[int, int, float]],
    damage: list[tuple[int, int]],
    cut: int,
    start: int,
) -> None:
    """Any bytes (records in any seq order, keys stored again, out of the window, NaN times,
    bytes flipped, a tail cut), any newest seq read before: the same table, seqs and offsets."""
    now, buf = time.time(), bytearray()
    for seq, n, age in records:
        buf += encode(seq, now - age, FIRST if n % 3 == 0 else 0, b"key-%d" % n, b"d", b"answer")
    for at, byte in damage:
        if at < len(buf):
            buf[at] = byte
    data = bytes(buf[: max(0, len(buf) - cut)])
    taken = []
    for journal, loop in zip(keyed_pair, ("_take_compiled", "_take_python"), strict=True):
        store = journal.keys
        store.table, store.newest, store._flush_first, store._taken = KeyTable(16), start, 0, 0
        at, last = getattr(store, loop)(data, 7 << 40, now - 86400)
        taken.append((at, last, store.newest, store._flush_first, store._taken, store.table.slots()[:2]))
    assert taken[0] == taken[1]


@pytest.fixture(scope="module")
def keyed_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCommit, LocalCommit]]:
    """Two journals whose key stores the start loops run on (their tables replaced each time)."""
    pair = (opened(tmp_path_factory.mktemp("compiled")), opened(tmp_path_factory.mktemp("python")))
    yield pair
    for journal in pair:
        journal.close()

"""The sink (tiny.sink) over the local commit point: header once, group commit, all-or-nothing flushes, answers."""

from __future__ import annotations

import asyncio
import fcntl
import os
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from tiny import layout
from tiny.commit import Append, Claim, OutcomeUnknown, Receipt, Refused, Stored, Unavailable, WriteFailed
from tiny.commit.local import LocalCommit
from tiny.files import size_of
from tiny.keylog import segment_name
from tiny.sink import BacklogFull, DailyFileSink, Outcome, SinkError

HEADER = b"h\n"


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def make(
    tmp_path: Path, fsync: bool = False, lock_timeout: float = 5.0, **kwargs: object
) -> tuple[DailyFileSink, list[tuple[int, bool]]]:
    """A sink on the local commit point of ``tmp_path`` (``kwargs``: the sink's own bounds),
    and the (bytes, ok) of each flush it reports."""
    flushes: list[tuple[int, bool]] = []
    journal = LocalCommit(tmp_path, fsync=fsync, lock_timeout=lock_timeout, headers={".csv": HEADER})
    sink = DailyFileSink(journal, on_flush=lambda s, n, ok: flushes.append((n, ok)), **kwargs)  # type: ignore[arg-type]
    return sink, flushes


WRITTEN = Outcome(None)


def append_then_close(tmp_path: Path, *appends: dict[str, bytes]) -> None:
    """Each of ``appends`` through a fresh sink on ``tmp_path``, one after the other, then close."""

    async def go() -> None:
        sink, _ = make(tmp_path)
        for chunks in appends:
            await sink.append(chunks)
        await sink.close()

    run(go())


def test_a_new_csv_file_starts_with_the_header_once(tmp_path: Path) -> None:
    append_then_close(tmp_path, {"d.csv": b"1\n"}, {"d.csv": b"2\n"})
    assert (tmp_path / "d.csv").read_bytes() == b"h\n1\n2\n"


def test_appends_queued_together_go_out_in_one_flush_in_order(tmp_path: Path) -> None:
    async def go() -> list[tuple[int, bool]]:
        sink, flushes = make(tmp_path)
        # all 50 are queued before the flush task first runs: one group, one flush
        waiters = [sink.append({"d.csv": b"%d\n" % i, "rejects/r.ndjson": b"r%d\n" % i}) for i in range(50)]
        await asyncio.gather(*waiters)
        await sink.close()
        return flushes

    flushes = run(go())
    assert len(flushes) == 1
    assert (tmp_path / "d.csv").read_bytes() == HEADER + b"".join(b"%d\n" % i for i in range(50))
    assert (tmp_path / "rejects" / "r.ndjson").read_bytes() == b"".join(b"r%d\n" % i for i in range(50))


def test_a_failed_flush_rolls_back_every_file_it_wrote(tmp_path: Path) -> None:
    (tmp_path / "b.csv").mkdir()  # sorted after a.csv: a.csv is written, then b.csv fails

    async def go() -> None:
        sink, flushes = make(tmp_path)
        await sink.append({"a.csv": b"kept\n"})
        with pytest.raises(WriteFailed):
            await sink.append({"a.csv": b"lost\n", "b.csv": b"x\n"})
        await sink.close()
        assert flushes[-1][1] is False

    run(go())
    assert (tmp_path / "a.csv").read_bytes() == b"h\nkept\n"


def test_appends_that_arrive_while_a_flush_is_in_flight_go_out_together_in_the_next(tmp_path: Path) -> None:
    """The first flush waits for the data dir's lock (held here); 49 appends arrive meanwhile
    and go out together in the second: 2 flushes for 50 appends."""

    async def go() -> list[tuple[int, bool]]:
        sink, flushes = make(tmp_path)
        await sink.append({"d.csv": b"0\n"})  # the journal is open, the file there
        flushes.clear()
        holder = os.open(layout.lock_path(tmp_path), os.O_RDWR)
        fcntl.flock(holder, fcntl.LOCK_EX)
        first = sink.append({"d.csv": b"1\n"})
        await asyncio.sleep(0.1)  # its flush is on the sink thread, waiting for the lock
        later = [sink.append({"d.csv": b"%d\n" % i}) for i in range(2, 51)]
        os.close(holder)
        await asyncio.gather(first, *later)
        await sink.close()
        return flushes

    assert len(run(go())) == 2  # type: ignore[arg-type]
    assert (tmp_path / "d.csv").read_bytes() == HEADER + b"".join(b"%d\n" % i for i in range(51))


def test_backlog_over_the_limit_refuses_at_once(tmp_path: Path) -> None:
    async def go() -> None:
        sink, _ = make(tmp_path, max_backlog=10)
        first = sink.append({"a.csv": b"123456\n"})
        with pytest.raises(BacklogFull):
            sink.append({"a.csv": b"789012\n"})
        await first
        assert sink.backlog == 0
        await sink.close()

    run(go())
    assert (tmp_path / "a.csv").read_bytes() == b"h\n123456\n"


def test_a_single_append_larger_than_the_backlog_limit_is_taken_when_idle(tmp_path: Path) -> None:
    async def go() -> None:
        sink, _ = make(tmp_path, max_backlog=2)
        await sink.append({"a.csv": b"big row\n"})
        await sink.close()

    run(go())
    assert (tmp_path / "a.csv").read_bytes() == b"h\nbig row\n"


def test_fsync_mode_writes_the_same_bytes(tmp_path: Path) -> None:
    async def go() -> None:
        sink, _ = make(tmp_path, fsync=True)
        await sink.append({"new/a.csv": b"1\n"})
        await sink.close()

    run(go())
    assert (tmp_path / "new" / "a.csv").read_bytes() == b"h\n1\n"


@pytest.mark.hardening("ingest 4: one batch could open unboundedly many day files")
def test_one_appends_failure_never_fails_another_appends_write(tmp_path: Path) -> None:
    (tmp_path / "b.csv").mkdir()  # any write to b.csv fails (EISDIR)

    async def go() -> list[object]:
        sink, _ = make(tmp_path)
        blocker = sink.append({"a.csv": b"0\n"})  # queued with the next three: one group, failing for b.csv
        group = [sink.append({"a.csv": b"1\n"}), sink.append({"b.csv": b"x\n"}), sink.append({"a.csv": b"2\n"})]
        await blocker
        results = await asyncio.gather(*group, return_exceptions=True)
        await sink.close()
        return results

    first, failed, last = run(go())  # type: ignore[misc]
    assert first == last == WRITTEN and isinstance(failed, WriteFailed)
    assert (tmp_path / "a.csv").read_bytes() == b"h\n0\n1\n2\n"


@pytest.mark.hardening("ingest 4: one batch could open unboundedly many day files")
def test_a_failed_flush_removes_the_files_it_created(tmp_path: Path) -> None:
    (tmp_path / "z.csv").mkdir()  # sorted last: new.csv and rejects/r.ndjson are created first

    async def go() -> None:
        sink, _ = make(tmp_path)
        with pytest.raises(WriteFailed):
            await sink.append({"new.csv": b"1\n", "rejects/r.ndjson": b"r\n", "z.csv": b"x\n"})
        await sink.close()

    run(go())
    assert not (tmp_path / "new.csv").exists() and not (tmp_path / "rejects" / "r.ndjson").exists()


@pytest.mark.hardening("ingest 4: one batch could open unboundedly many day files")
def test_a_flush_opens_at_most_max_files_files(tmp_path: Path) -> None:
    async def go() -> list[tuple[int, bool]]:
        sink, flushes = make(tmp_path, max_files=4)
        blocker = sink.append({"0.csv": b"0\n"})
        waiters = [sink.append({f"{n}.csv": b"%d\n" % n, "r.ndjson": b"r\n"}) for n in range(1, 10)]
        await blocker
        await asyncio.gather(*waiters)
        await sink.close()
        return flushes

    flushes = run(go())
    assert len(flushes) == 4  # 10 appends queued at once, at most 4 files a flush: 3 + 3 + 3 + 1 appends
    assert (tmp_path / "r.ndjson").read_bytes() == b"r\n" * 9


@pytest.mark.hardening("ingest 4: one batch could open unboundedly many day files")
def test_a_writer_opens_its_files_only_under_the_data_dirs_lock(tmp_path: Path) -> None:
    """A roll-back may remove a file it created: no other writer may hold it open meanwhile."""
    import fcntl
    import os
    import threading

    from tiny import layout

    async def go() -> None:
        sink, _ = make(tmp_path)
        await sink.append({"d.csv": b"1\n"})
        await sink.close()

    layout.state_dir(tmp_path).mkdir()
    holder = os.open(layout.lock_path(tmp_path), os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another writer's flush is under way
    done = threading.Thread(target=run, args=(go(),))
    done.start()
    time.sleep(0.3)
    assert not (tmp_path / "d.csv").exists()  # the sink waits for the lock before it opens anything
    (tmp_path / "d.csv").write_bytes(b"")
    (tmp_path / "d.csv").unlink()  # that flush created the file, failed and removed it
    os.close(holder)
    done.join(10)
    assert (tmp_path / "d.csv").read_bytes() == b"h\n1\n"


@pytest.mark.hardening("exactly once: a day file without a final LF lost its last row")
def test_a_last_row_the_sink_did_not_write_is_kept_even_without_its_lf(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_bytes(b"h\n1\n2")  # copied in, or edited by hand
    append_then_close(tmp_path, {"d.csv": b"3\n"})
    assert (tmp_path / "d.csv").read_bytes() == b"h\n1\n2\n3\n"


@pytest.mark.hardening("exactly once: a torn write was cut back to a guess, not to its size")
def test_a_flush_killed_mid_write_is_cut_back_to_its_exact_size_by_the_next(tmp_path: Path) -> None:
    """The journal's intent gives each file's size before the flush: the next flush cuts the
    torn bytes, however many lines they hold, and nothing before them."""
    from tiny.intent import FileSpan

    (tmp_path / "d.csv").write_bytes(b"h\n1\n2")
    journal = LocalCommit(tmp_path)
    journal.open()
    with journal.locked():
        journal.intent.write([FileSpan("d.csv", 5, 13, False), FileSpan("new.csv", 0, 5, True)])
    with open(tmp_path / "d.csv", "ab") as torn:
        torn.write(b"\n9\n9\n9")  # the killed flush got this far
    (tmp_path / "new.csv").write_bytes(b"h\n9")
    journal.close()
    append_then_close(tmp_path, {"d.csv": b"3\n"})
    assert (tmp_path / "d.csv").read_bytes() == b"h\n1\n2\n3\n"
    assert not (tmp_path / "new.csv").exists()


# -- exactly once under failures (issue "Exactly-once under hangs, damage and operators' mistakes")


def keyed(sink: DailyFileSink, key: str, rows: bytes) -> asyncio.Future[Outcome]:
    return sink.append({"d.csv": rows}, Claim(key, b"digest of " + rows, b"answer to " + rows))


@pytest.mark.hardening("exactly once 1: one key with two bodies in one flush wrote one and claimed the other")
def test_one_key_with_two_bodies_in_one_flush_the_first_append_decides(tmp_path: Path) -> None:
    """The rows, the digest and the answer stored are all the first body's: storing the last
    one's would answer the written body's retry 422, the other's 200 (replayed, never written)."""

    async def go() -> list[Outcome]:
        sink, _ = make(tmp_path)
        blocker = sink.append({"d.csv": b"0\n"})  # queued with the next two: one group, one flush
        pair = [keyed(sink, "k", b"first\n"), keyed(sink, "k", b"second\n")]
        await blocker
        results = list(await asyncio.gather(*pair))
        results += [await keyed(sink, "k", b"second\n"), await keyed(sink, "k", b"first\n")]  # retries
        await sink.close()
        return results

    first, second, retry_second, retry_first = run(go())  # type: ignore[misc]
    decided = Outcome(Stored(b"digest of first\n", b"answer to first\n"))
    assert first == WRITTEN and second == retry_second == retry_first == decided
    assert (tmp_path / "d.csv").read_bytes() == b"h\n0\nfirst\n"


def test_later_appends_of_one_key_in_one_flush_write_nothing(tmp_path: Path) -> None:
    async def go() -> list[Outcome]:
        sink, _ = make(tmp_path)
        blocker = sink.append({"d.csv": b"0\n"})
        same = [keyed(sink, "k", b"1\n") for _ in range(5)]
        await blocker
        results = list(await asyncio.gather(*same))
        await sink.close()
        return results

    results = run(go())
    replayed = Outcome(Stored(b"digest of 1\n", b"answer to 1\n"))
    assert results[0] == WRITTEN and results[1:] == [replayed] * 4  # type: ignore[index]
    assert (tmp_path / "d.csv").read_bytes() == b"h\n0\n1\n"


@pytest.mark.hardening("exactly once 9: a failed key commit left the rows on disk after its 503")
def test_a_failed_commit_point_of_a_flush_with_keys_cuts_its_rows_and_keys_back_before_the_answer(
    tmp_path: Path,
) -> None:
    """The keys are in the key log, written with the rows; until the intent's mark nothing of
    them counts, and a failed mark cuts both back before the answer (not at the next flush's
    recovery, nor after a clean stop): the retry is processed afresh, not replayed."""

    async def go() -> None:
        sink, _ = make(tmp_path)
        await sink.append({"d.csv": b"0\n"})
        intent = sink.commit_point.intent  # type: ignore[attr-defined]
        mark = intent._mark

        def failing(state: bytes) -> None:
            if state == b"-":
                raise OSError(28, "No space left on device")
            mark(state)

        intent._mark = failing
        with pytest.raises(WriteFailed, match="No space left"):
            await keyed(sink, "k", b"1\n")
        assert (tmp_path / "d.csv").read_bytes() == b"h\n0\n"  # at the answer, not later
        assert size_of(tmp_path / segment_name(1)) <= 0  # no key either
        intent._mark = mark
        assert await keyed(sink, "k", b"1\n") == WRITTEN  # the retry is processed afresh
        await sink.close()

    run(go())
    assert (tmp_path / "d.csv").read_bytes() == b"h\n0\n1\n"


@pytest.mark.hardening("exactly once 7: a failed mark after the key commit wrote rows twice and said 503")
def test_a_failed_mark_after_the_keys_committed_is_still_a_success(tmp_path: Path) -> None:
    """The flush committed with its keys: a 503 'nothing kept' would be false, and a retry of
    the same flush's unkeyed rows one by one would write them a second time."""

    async def go() -> list[object]:
        sink, _ = make(tmp_path)
        blocker = sink.append({"d.csv": b"0\n"})
        intent = sink.commit_point.intent  # type: ignore[attr-defined]
        mark = intent._mark
        failures = [OSError(5, "Input/output error")]

        def failing(state: bytes) -> None:
            if state == b"-" and failures:
                raise failures.pop()
            mark(state)

        intent._mark = failing
        group = [keyed(sink, "k", b"1\n"), sink.append({"d.csv": b"2\n"})]
        await blocker
        results = await asyncio.gather(*group, return_exceptions=True)
        await sink.append({"d.csv": b"3\n"})  # its recovery finds k stored and keeps the rows
        await sink.close()
        return results

    assert run(go()) == [WRITTEN, WRITTEN]
    assert (tmp_path / "d.csv").read_bytes() == b"h\n0\n1\n2\n3\n"


def test_a_failed_mark_of_a_flush_without_keys_cuts_it_back(tmp_path: Path) -> None:
    """Without keys the mark is the commit point: failing, nothing of the flush stays."""

    async def go() -> None:
        sink, _ = make(tmp_path)
        await sink.append({"d.csv": b"0\n"})
        intent = sink.commit_point.intent  # type: ignore[attr-defined]
        mark = intent._mark

        def failing(state: bytes) -> None:
            if state == b"-":
                raise OSError(5, "Input/output error")
            mark(state)

        intent._mark = failing
        with pytest.raises(WriteFailed):
            await sink.append({"d.csv": b"1\n"})
        assert (tmp_path / "d.csv").read_bytes() == b"h\n0\n"
        intent._mark = mark
        await sink.close()

    run(go())
    assert (tmp_path / "d.csv").read_bytes() == b"h\n0\n"


@pytest.mark.hardening("exactly once 2: a process holding the lock froze every writer of the data dir")
def test_a_lock_held_elsewhere_fails_the_group_once_within_the_bound(tmp_path: Path) -> None:
    """Five appends, one group: one wait of the lock timeout, not one per append, and the
    answer names who holds the lock."""

    async def go() -> tuple[list[object], float, str | None]:
        sink, _ = make(tmp_path, lock_timeout=0.3)
        await sink.append({"d.csv": b"0\n"})
        holder = os.open(layout.lock_path(tmp_path), os.O_RDWR)
        fcntl.flock(holder, fcntl.LOCK_EX)
        os.pwrite(holder, b"%d otherhost %f" % (os.getpid(), time.time() - 7), 64)
        started = time.monotonic()
        waiting = [sink.append({"d.csv": b"%d\n" % n}) for n in range(5)]
        await asyncio.sleep(0.2)
        trouble = sink.trouble()
        results = await asyncio.gather(*waiting, return_exceptions=True)
        took = time.monotonic() - started
        os.close(holder)
        await sink.append({"d.csv": b"9\n"})  # free again
        await sink.close()
        return results, took, trouble

    results, took, trouble = run(go())  # type: ignore[misc]
    assert all(isinstance(result, Unavailable) for result in results)
    assert f"held by pid {os.getpid()} on otherhost since 7." in str(results[0])
    assert took < 1.0
    # under a second of waiting is not reported, but the lock held elsewhere for 7 s is
    assert trouble is not None and f"is held by pid {os.getpid()} on otherhost since 7." in trouble
    assert (tmp_path / "d.csv").read_bytes() == b"h\n0\n9\n"


def test_a_wait_of_more_than_a_second_for_the_lock_is_reported(tmp_path: Path) -> None:
    async def go() -> str | None:
        sink, _ = make(tmp_path, lock_timeout=3)
        await sink.append({"d.csv": b"0\n"})
        holder = os.open(layout.lock_path(tmp_path), os.O_RDWR)
        fcntl.flock(holder, fcntl.LOCK_EX)
        waiting = sink.append({"d.csv": b"1\n"})
        await asyncio.sleep(1.5)
        trouble = sink.trouble()
        os.close(holder)
        await waiting
        await sink.close()
        return trouble

    trouble = run(go())
    assert trouble is not None and trouble.startswith("waiting 1.") and "flush lock, held by pid" in trouble


def test_close_is_bounded_when_the_lock_is_held_and_says_what_failed(tmp_path: Path) -> None:
    async def go() -> tuple[bool, float, object]:
        sink, _ = make(tmp_path)
        await sink.append({"d.csv": b"0\n"})
        holder = os.open(layout.lock_path(tmp_path), os.O_RDWR)
        fcntl.flock(holder, fcntl.LOCK_EX)
        pending = sink.append({"d.csv": b"1\n"})
        started = time.monotonic()
        written = await sink.close(timeout=0.5)
        took = time.monotonic() - started
        os.close(holder)
        outcome = await asyncio.gather(pending, return_exceptions=True)
        return written, took, outcome[0]

    written, took, outcome = run(go())  # type: ignore[misc]
    assert written is False and took < 1.5 and isinstance(outcome, Unavailable)
    assert (tmp_path / "d.csv").read_bytes() == b"h\n0\n"


def test_a_second_close_returns_what_the_first_did(tmp_path: Path) -> None:
    async def go() -> tuple[bool, bool]:
        sink, _ = make(tmp_path)
        await sink.append({"d.csv": b"0\n"})
        holder = os.open(layout.lock_path(tmp_path), os.O_RDWR)
        fcntl.flock(holder, fcntl.LOCK_EX)
        pending = sink.append({"d.csv": b"1\n"})
        first = await sink.close(timeout=0.5)
        os.close(holder)
        await asyncio.gather(pending, return_exceptions=True)
        return first, await sink.close()

    assert run(go()) == (False, False)


def test_an_append_after_close_is_refused_at_once_and_writes_nothing(tmp_path: Path) -> None:
    async def go() -> None:
        sink, _ = make(tmp_path)
        await sink.append({"d.csv": b"0\n"})
        assert await sink.close()
        with pytest.raises(SinkError, match="stopping"):
            sink.append({"d.csv": b"1\n"})
        with pytest.raises(SinkError, match="stopping"):
            await sink.ready()
        assert await sink.close()  # a second close is harmless

    run(go())
    assert (tmp_path / "d.csv").read_bytes() == b"h\n0\n"


def test_a_refused_journal_answers_its_reason_and_is_picked_up_again_when_fixed(tmp_path: Path) -> None:
    """The journal renamed away while the server runs: writes stop with the reason; renamed
    back, they go on, with no restart (and no descriptor left behind by the failures)."""

    async def go() -> tuple[list[BaseException | None], int, int]:
        sink, _ = make(tmp_path)
        await sink.append({"d.csv": b"0\n"})
        journal = layout.journal_path(tmp_path)
        journal.rename(journal.with_name("moved"))
        fds = len(os.listdir("/proc/self/fd"))
        failed = [(await asyncio.gather(sink.append({"d.csv": b"x\n"}), return_exceptions=True))[0] for _ in range(30)]
        after = len(os.listdir("/proc/self/fd"))
        journal.with_name("moved").rename(journal)
        await asyncio.sleep(1.1)  # a refused journal is tried again at most once a second
        await sink.append({"d.csv": b"1\n"})
        await sink.close()
        return failed, fds, after

    failed, fds, after = run(go())  # type: ignore[misc]
    reasons = [str(result) for result in failed]
    assert all(isinstance(result, Refused) for result in failed)
    assert "journal.sqlite3 was deleted while the server ran" in reasons[0]
    assert after <= fds
    assert (tmp_path / "d.csv").read_bytes() == b"h\n0\n1\n"


def test_groups_keep_the_order_and_bound_files_and_appends_but_never_split_an_append() -> None:
    from tiny.sink import _Append, _groups

    def append(*names: str) -> _Append:
        return _Append(dict.fromkeys(names, b""), None, 0, None, 0.0)  # type: ignore[arg-type]

    appends = [append("a"), append("b"), append("a", "c"), append("d", "e", "f", "g"), append("h")]
    groups = _groups(appends, max_files=3, max_appends=2)
    assert [[appends.index(a) for a in group] for group in groups] == [[0, 1], [2], [3], [4]]
    same = [append("a") for _ in range(5)]
    assert [len(group) for group in _groups(same, max_files=3, max_appends=2)] == [2, 2, 1]


@pytest.mark.hardening("third 9: a live copy lacking an acknowledged batch started; its retry was answered replayed")
def test_a_flush_to_a_file_cut_below_its_committed_size_is_refused_naming_the_bytes_missing(tmp_path: Path) -> None:
    async def go() -> str:
        sink, _ = make(tmp_path)
        await sink.append({"a.csv": b"1\n2\n"})
        await sink.append({"b.csv": b"3\n"})
        (tmp_path / "a.csv").write_bytes(b"h\n1\n")  # cut by hand while the server runs
        with pytest.raises(Refused) as raised:
            await sink.append({"a.csv": b"4\n"})
        await sink.close()
        return str(raised.value)

    message = run(go())
    assert f"{tmp_path / 'a.csv'} is 4 bytes: 2 bytes shorter than the 6 that the journal knows" in message
    assert (tmp_path / "a.csv").read_bytes() == b"h\n1\n"  # nothing written after the gap


@pytest.mark.hardening("third 10: /healthz answered 200 while another process held the lock, stopped")
def test_trouble_names_a_lock_held_elsewhere_for_over_a_second_while_nothing_waits(tmp_path: Path) -> None:
    async def go() -> tuple[str | None, str | None, str | None]:
        sink, _ = make(tmp_path)
        await sink.append({"d.csv": b"0\n"})
        holder = os.open(layout.lock_path(tmp_path), os.O_RDWR)
        fcntl.flock(holder, fcntl.LOCK_EX)
        os.pwrite(holder, b"4242 otherhost %f" % (time.time() - 0.5), 64)
        young = sink.trouble()  # held for half a second: a flush may take that long
        os.pwrite(holder, b"4242 otherhost %f" % (time.time() - 3), 64)
        old = sink.trouble()
        os.close(holder)
        free = sink.trouble()
        await sink.close()
        return young, old, free

    young, old, free = run(go())  # type: ignore[misc]
    assert young is None and free is None
    assert old is not None and "is held by pid 4242 on otherhost since 3." in old


@pytest.mark.hardening("third 10: /healthz answered 200 while another process held the lock, stopped")
def test_trouble_names_a_writer_that_holds_the_intent_without_the_lock(tmp_path: Path) -> None:
    """A writer still in a flush after its lock file was replaced holds the intent's flock:
    every POST would wait for it, and /healthz says so while none waits."""

    async def go() -> tuple[str | None, str | None]:
        sink, _ = make(tmp_path)
        await sink.append({"d.csv": b"0\n"})
        fenced = os.open(layout.intent_path(tmp_path), os.O_RDWR)
        fcntl.flock(fenced, fcntl.LOCK_EX)
        held = sink.trouble()
        os.close(fenced)
        free = sink.trouble()
        await sink.close()
        return held, free

    held, free = run(go())  # type: ignore[misc]
    assert held is not None and "is held by a writer that does not hold the lock file" in held
    assert free is None


@pytest.mark.hardening("third 13: a request waited twice --lock-timeout for the lock behind a /healthz probe flush")
def test_a_request_waits_for_the_lock_at_most_the_timeout_whatever_waited_before_it(tmp_path: Path) -> None:
    async def go() -> float:
        sink, _ = make(tmp_path, lock_timeout=1.0)
        await sink.append({"d.csv": b"0\n"})
        holder = os.open(layout.lock_path(tmp_path), os.O_RDWR)
        fcntl.flock(holder, fcntl.LOCK_EX)
        sink.fault = "the last flush failed"  # as after any failure: /healthz then probes
        sink.probe()  # a flush of nothing, now waiting for the lock
        await asyncio.sleep(0.5)
        started = time.monotonic()
        with pytest.raises(Unavailable):
            await sink.append({"d.csv": b"1\n"})
        waited = time.monotonic() - started
        os.close(holder)
        await sink.append({"d.csv": b"2\n"})
        await sink.close()
        return waited

    waited = run(go())
    assert 0.9 < waited < 1.0 + 0.25, waited  # its own bound, not the probe's 1 s wait and then its own
    assert (tmp_path / "d.csv").read_bytes() == b"h\n0\n2\n"


def test_appends_queued_behind_a_lock_timeout_wait_until_their_own_deadline(tmp_path: Path) -> None:
    """The first group times out; an append queued half-way through it is not refused with it,
    and is written once the lock is free within its own bound."""

    async def go() -> tuple[object, object]:
        sink, _ = make(tmp_path, lock_timeout=1.0)
        await sink.append({"d.csv": b"0\n"})
        holder = os.open(layout.lock_path(tmp_path), os.O_RDWR)
        fcntl.flock(holder, fcntl.LOCK_EX)
        first = sink.append({"d.csv": b"1\n"})
        await asyncio.sleep(0.6)
        second = sink.append({"d.csv": b"2\n"})
        await asyncio.sleep(0.6)  # the first timed out, the second waits on
        os.close(holder)
        answers = await asyncio.gather(first, second, return_exceptions=True)
        await sink.close()
        return answers[0], answers[1]

    first, second = run(go())  # type: ignore[misc]
    assert isinstance(first, Unavailable) and second == WRITTEN
    assert (tmp_path / "d.csv").read_bytes() == b"h\n0\n2\n"


def test_an_outcome_unknown_fails_the_whole_group_with_it_and_retries_no_append_alone(tmp_path: Path) -> None:
    """Cluster mode's commit point may not know whether a flush committed (its COMMIT's answer
    lost): here the flush did commit. Retrying its appends one by one would write them twice,
    and no answer may say "written" or "nothing kept"."""

    class AnswerLost(LocalCommit):
        def commit(self, appends: Sequence[Append], deadline: float) -> Receipt:
            super().commit(appends, deadline)
            raise OutcomeUnknown("the commit's answer was lost", 7)

    async def go() -> list[object]:
        sink = DailyFileSink(AnswerLost(tmp_path, headers={".csv": HEADER}))
        group = [sink.append({"d.csv": b"1\n"}), sink.append({"d.csv": b"2\n"})]
        results = await asyncio.gather(*group, return_exceptions=True)
        await sink.close()
        return results

    results = run(go())
    assert all(isinstance(result, OutcomeUnknown) and result.retry_after == 7 for result in results)  # type: ignore[union-attr, attr-defined]
    assert (tmp_path / "d.csv").read_bytes() == b"h\n1\n2\n"  # once: not retried append by append

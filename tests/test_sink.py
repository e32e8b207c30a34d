"""The daily-file sink: header once, group commit, all-or-nothing flushes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tiny.sink import BacklogFull, DailyFileSink, SinkError

HEADER = b"h\n"


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def make(tmp_path: Path, **kwargs: object) -> tuple[DailyFileSink, list[tuple[int, bool]]]:
    flushes: list[tuple[int, bool]] = []
    sink = DailyFileSink(
        tmp_path, headers={".csv": HEADER}, on_flush=lambda s, n, ok: flushes.append((n, ok)), **kwargs
    )  # type: ignore[arg-type]
    return sink, flushes


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


def test_appends_waiting_for_a_flush_go_out_together_in_order(tmp_path: Path) -> None:
    async def go() -> list[tuple[int, bool]]:
        sink, flushes = make(tmp_path)
        waiters = [sink.append({"d.csv": b"%d\n" % i, "rejects/r.ndjson": b"r%d\n" % i}) for i in range(50)]
        await asyncio.gather(*waiters)
        await sink.close()
        return flushes

    flushes = run(go())
    assert len(flushes) < 50  # the first flush is alone, the 49 others wait and join one flush
    assert (tmp_path / "d.csv").read_bytes() == HEADER + b"".join(b"%d\n" % i for i in range(50))
    assert (tmp_path / "rejects" / "r.ndjson").read_bytes() == b"".join(b"r%d\n" % i for i in range(50))


def test_a_failed_flush_rolls_back_every_file_it_wrote(tmp_path: Path) -> None:
    (tmp_path / "b.csv").mkdir()  # sorted after a.csv: a.csv is written, then b.csv fails

    async def go() -> None:
        sink, flushes = make(tmp_path)
        await sink.append({"a.csv": b"kept\n"})
        with pytest.raises(SinkError):
            await sink.append({"a.csv": b"lost\n", "b.csv": b"x\n"})
        await sink.close()
        assert flushes[-1][1] is False

    run(go())
    assert (tmp_path / "a.csv").read_bytes() == b"h\nkept\n"


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
        blocker = sink.append({"a.csv": b"0\n"})  # the next three wait for this flush: one group
        group = [sink.append({"a.csv": b"1\n"}), sink.append({"b.csv": b"x\n"}), sink.append({"a.csv": b"2\n"})]
        await blocker
        results = await asyncio.gather(*group, return_exceptions=True)
        await sink.close()
        return results

    first, failed, last = run(go())  # type: ignore[misc]
    assert first is None and last is None and isinstance(failed, SinkError)
    assert (tmp_path / "a.csv").read_bytes() == b"h\n0\n1\n2\n"


@pytest.mark.hardening("ingest 4: one batch could open unboundedly many day files")
def test_a_failed_flush_removes_the_files_it_created(tmp_path: Path) -> None:
    (tmp_path / "z.csv").mkdir()  # sorted last: new.csv and rejects/r.ndjson are created first

    async def go() -> None:
        sink, _ = make(tmp_path)
        with pytest.raises(SinkError):
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
    assert len(flushes) == 1 + 3  # 9 appends of 2 files (one shared): 3 + 3 + 3 appends per flush
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
    from tiny.journal import Intent, Journal

    (tmp_path / "d.csv").write_bytes(b"h\n1\n2")
    journal = Journal(tmp_path)
    journal.open()
    with journal.locked():
        journal.intend([Intent("d.csv", 5, False), Intent("new.csv", 0, True)])
    with open(tmp_path / "d.csv", "ab") as torn:
        torn.write(b"\n9\n9\n9")  # the killed flush got this far
    (tmp_path / "new.csv").write_bytes(b"h\n9")
    journal.close()
    append_then_close(tmp_path, {"d.csv": b"3\n"})
    assert (tmp_path / "d.csv").read_bytes() == b"h\n1\n2\n3\n"
    assert not (tmp_path / "new.csv").exists()

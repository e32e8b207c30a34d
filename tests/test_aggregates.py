"""The aggregate store (tiny.aggregates): which file it counted, how far, and what it says when it cannot count.

The counts themselves (against an independent count of the sample day, folds killed at any
moment, two processes at once) are checked in tests/test_downloads.py; here: a day file cut
back, replaced, or rewritten in place under the same inode is counted again; a fold keeps to
its deadline and says truly what is left; a day file that is not a regular file is refused
at once; a full disk is reported as one.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tiny.aggregate_errors import Behind, Unavailable
from tiny.aggregate_generation import read_generation
from tiny.aggregates import Aggregates
from tiny.layout import HEADER
from tiny.testing import sample_csv

DAY = "2014-05-04"
pytestmark = pytest.mark.timeout(120)


def csv_row(package: str, ip_id: int) -> bytes:
    return f'"{DAY}","10:00:00",1000,"3.1.0","x86_64","linux-gnu","{package}","1.0","DE",{ip_id}\n'.encode()


def rows(package: str, first: int, count: int) -> list[bytes]:
    """``count`` rows of ``package`` with ip_ids from ``first``: lines of different lengths."""
    return [csv_row(package, ip_id) for ip_id in range(first, first + count)]


def sizes_of(data: Path) -> dict[str, int]:
    return {p.stem: p.stat().st_size for p in data.glob("*.csv")}


def counted(store: Aggregates) -> Counter[str]:
    """The store's downloads per package of DAY, and (as "*rows" and "*skipped") its rows and skipped lines."""
    found = Counter(dict(store.db.execute("SELECT package, downloads FROM packages WHERE day = ?", (DAY,))))
    row = store.db.execute("SELECT rows, skipped FROM files WHERE day = ?", (DAY,)).fetchone()
    if row is not None:
        found["*rows"], found["*skipped"] = row
    return +found


def held(path: Path) -> Counter[str]:
    """What the day file holds, counted here: downloads per package, rows, and no skipped line."""
    packages = Counter(line.split(b",")[6].strip(b'"').decode() for line in path.read_bytes().splitlines()[1:])
    return packages + Counter({"*rows": sum(packages.values())})


# -- which file was counted, and how far ---------------------------------------------------------


@pytest.mark.hardening("third 7: a day file cut back by hand kept the counts of its old length")
def test_a_day_file_cut_back_is_counted_again(tmp_path: Path) -> None:
    path = tmp_path / f"{DAY}.csv"
    kept = rows("cut", 1, 500)
    path.write_bytes(HEADER + b"".join(kept + rows("cut", 501, 500)))
    store = Aggregates(tmp_path)
    store.fold(sizes_of(tmp_path))
    assert counted(store) == Counter({"cut": 1000, "*rows": 1000})
    inode = path.stat().st_ino
    os.truncate(path, len(HEADER) + len(b"".join(kept)))
    assert path.stat().st_ino == inode  # the same file, shorter
    store.fold(sizes_of(tmp_path))
    assert counted(store) == held(path) == Counter({"cut": 500, "*rows": 500})


@pytest.mark.hardening("third 7: a day file cut back by hand kept the counts of its old length")
def test_a_day_file_cut_back_then_grown_past_the_counted_bytes_is_counted_again(tmp_path: Path) -> None:
    """Cut to 500 of 1,000 rows, then 1,000 rows appended before the next fold: the counted
    offset now falls inside another line of the file."""
    path = tmp_path / f"{DAY}.csv"
    kept = rows("cut", 1, 500)
    path.write_bytes(HEADER + b"".join(kept + rows("cut", 501, 500)))
    store = Aggregates(tmp_path)
    store.fold(sizes_of(tmp_path))
    consumed = path.stat().st_size
    os.truncate(path, len(HEADER) + len(b"".join(kept)))
    with open(path, "ab") as out:
        out.write(b"".join(rows("grown", 100_000, 1000)))
    assert path.stat().st_size > consumed
    assert path.read_bytes()[consumed - 1 : consumed] != b"\n"  # the old offset is mid-line now
    store.fold(sizes_of(tmp_path))
    assert counted(store) == held(path) == Counter({"cut": 500, "grown": 1000, "*rows": 1500})


@pytest.mark.hardening("third 7: a day file replaced under the same inode kept the old file's counts")
def test_a_day_file_rewritten_in_place_is_counted_again(tmp_path: Path) -> None:
    """Truncated to nothing and written again, longer, with the first rows the same: the same
    inode, the same header and first rows, other bytes at the counted offset."""
    path = tmp_path / f"{DAY}.csv"
    first = rows("same", 1, 10)
    path.write_bytes(HEADER + b"".join(first + rows("old", 11, 990)))
    store = Aggregates(tmp_path)
    store.fold(sizes_of(tmp_path))
    inode, size = path.stat().st_ino, path.stat().st_size
    with open(path, "r+b") as rewrite:
        rewrite.truncate(0)
        rewrite.write(HEADER + b"".join(first + rows("new", 5000, 1500)))
    assert path.stat().st_ino == inode and path.stat().st_size > size
    store.fold(sizes_of(tmp_path))
    assert counted(store) == held(path) == Counter({"same": 10, "new": 1500, "*rows": 1510})


@pytest.mark.hardening("third 7: a day file deleted and ingested again took the old file's counts (inode reused)")
def test_a_day_file_deleted_and_written_again_in_a_reused_inode_is_counted_again_after_a_restart(
    tmp_path: Path,
) -> None:
    path = tmp_path / f"{DAY}.csv"
    path.write_bytes(HEADER + b"".join(rows("old", 1, 1000)))
    store = Aggregates(tmp_path)
    store.fold(sizes_of(tmp_path))
    store.close()  # the process that counted it is gone: what it knew is only in the store
    inode, size = path.stat().st_ino, path.stat().st_size
    path.unlink()
    written_again(path, HEADER + b"".join(rows("new", 7, 1400)), inode)
    assert path.stat().st_ino == inode and path.stat().st_size > size
    restarted = Aggregates(tmp_path)
    restarted.fold(sizes_of(tmp_path))
    assert counted(restarted) == held(path) == Counter({"new": 1400, "*rows": 1400})


@pytest.mark.hardening("third 7: a day file replaced under the same inode kept the old file's counts")
def test_a_day_file_known_unchanged_by_its_stat_is_counted_again_once_rewritten_with_its_old_times(
    tmp_path: Path,
) -> None:
    """A file unchanged for a second is then known by its stat alone (no read). Rewritten in
    place to the very same size, its modification time then set back as it was (as `touch -r`
    or a copy keeping times do): its change time tells."""
    path = tmp_path / f"{DAY}.csv"
    path.write_bytes(HEADER + b"".join(rows("old", 1000, 1000)))
    store = Aggregates(tmp_path)
    store.fold(sizes_of(tmp_path))
    time.sleep(1.1)
    store.fold(sizes_of(tmp_path))
    assert DAY in store._seen  # known by its stat from now on
    before = path.stat()
    with open(path, "r+b") as rewrite:
        rewrite.write(HEADER + b"".join(rows("new", 1000, 1000)))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    store.fold(sizes_of(tmp_path))
    assert counted(store) == held(path) == Counter({"new": 1000, "*rows": 1000})


def written_again(path: Path, body: bytes, inode: int) -> None:
    """``body`` written as a new file at ``path`` in the inode ``inode``, just freed: new files
    are made beside it until the file system gives one that inode (ext4 soon does), which is
    then renamed to ``path``."""
    others = []
    for n in range(1000):
        made = path.with_name(f"new-{n}.tmp")
        made.write_bytes(body)
        if made.stat().st_ino == inode:
            made.rename(path)
            break
        others.append(made)
    else:
        for made in others:
            made.unlink()
        # Not every file system hands a freed inode out again soon (ext4 does, others need not):
        # the same inode with new bytes is then proved by the rewrite-in-place test above.
        pytest.skip(f"this file system did not give inode {inode} again in 1,000 new files")
    for made in others:
        made.unlink()


def test_an_unchanged_day_file_is_not_counted_again(tmp_path: Path) -> None:
    path = tmp_path / f"{DAY}.csv"
    path.write_bytes(HEADER + b"".join(rows("kept", 1, 3000)))
    store = Aggregates(tmp_path)
    assert store.fold(sizes_of(tmp_path)) == 3000
    assert Aggregates(tmp_path).fold(sizes_of(tmp_path)) == 0  # another process: the same file, counted
    with open(path, "ab") as out:
        out.write(b"".join(rows("more", 1, 2)))
    assert store.fold(sizes_of(tmp_path)) == 2


# -- the deadline ----------------------------------------------------------------------------------


def big_day(data: Path, copies: int) -> int:
    """DAY as ``copies`` copies of the sample day's rows; its size."""
    body = sample_csv().split(b"\n", 1)[1]
    (data / f"{DAY}.csv").write_bytes(HEADER + body * copies)
    return (data / f"{DAY}.csv").stat().st_size


def consumed_of(store: Aggregates) -> int:
    row = store.db.execute("SELECT consumed FROM files WHERE day = ?", (DAY,)).fetchone()
    return 0 if row is None else int(row[0])


@pytest.mark.hardening("third 13: the 'catching up' 503 said 0.0 MB left")
def test_a_fold_past_its_deadline_says_exactly_what_it_left(tmp_path: Path) -> None:
    """A deadline already past: the fold either answers (nothing left) or says what is left,
    which is exactly what it did not count."""
    size = big_day(tmp_path, 1)
    store = Aggregates(tmp_path)
    try:
        store.fold({DAY: size}, deadline=time.monotonic())
    except Behind as behind:
        assert behind.left == size - consumed_of(store) > 0, str(behind)
        assert " 0.0 MB" not in str(behind)
    else:
        assert consumed_of(store) == size


def test_a_fold_keeps_to_its_deadline_and_the_next_goes_on(tmp_path: Path) -> None:
    size = big_day(tmp_path, 4)  # 26 MB
    store = Aggregates(tmp_path)
    started = time.monotonic()
    with pytest.raises(Behind) as behind:
        store.fold({DAY: size}, deadline=started + 0.3)
    assert time.monotonic() - started < 1.3
    assert behind.value.day == DAY and behind.value.left == size - consumed_of(store) > 0
    assert "are catching up" in str(behind.value)
    first = counted(store)["*rows"]
    assert 0 < first < 4 * 77_107
    assert store.fold({DAY: size}) == 4 * 77_107 - first  # the rest, not everything again
    assert counted(store)["*rows"] == 4 * 77_107


def test_what_is_left_is_told_in_bytes_and_rows(tmp_path: Path) -> None:
    """The rows left are counted (with the compiled codec, up to 64 MiB left) or estimated
    from the rows per byte counted so far, and then said to be about that many."""
    size = big_day(tmp_path, 4)
    store = Aggregates(tmp_path)
    with pytest.raises(Behind) as behind:
        store.fold({DAY: size}, deadline=time.monotonic() + 0.2)
    left_rows = 4 * 77_107 - counted(store)["*rows"]
    assert behind.value.left == size - consumed_of(store) and f"{behind.value.left / 1e6:.1f} MB" in str(behind.value)
    assert behind.value.rows is not None
    if behind.value.exact:
        assert behind.value.rows == left_rows and f": {left_rows:,} rows left to count" in str(behind.value)
    else:
        assert abs(behind.value.rows - left_rows) < 0.05 * left_rows and ": about " in str(behind.value)


# -- what is not a day file, and a full disk -------------------------------------------------------


def test_a_day_file_that_is_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / f"{DAY}.csv")
    store = Aggregates(tmp_path)
    started = time.monotonic()
    with pytest.raises(Unavailable, match=f"{DAY}.csv is not a regular file"):
        store.fold({DAY: 0})
    assert time.monotonic() - started < 1


def test_a_rebuild_refuses_a_day_file_that_is_a_fifo_and_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / f"{DAY}.csv").write_bytes(HEADER + b"".join(rows("kept", 1, 10)))
    store = Aggregates(tmp_path)
    store.fold(sizes_of(tmp_path))
    generation = store.generation()
    os.mkfifo(tmp_path / "2014-05-05.csv")
    with pytest.raises(Unavailable, match="2014-05-05.csv is not a regular file but a FIFO"):
        store.rebuild({**sizes_of(tmp_path), "2014-05-05": 0})
    assert counted(store) == Counter({"kept": 10, "*rows": 10})
    assert store.generation() == read_generation(tmp_path) == generation


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A data dir on a tmpfs of 1 MB."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    data = tmp_path / "data"
    data.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tinyfull", str(data)], check=True)
    try:
        yield data
    finally:
        subprocess.run(["umount", "-l", str(data)], check=False)


def fill(data: Path) -> None:
    """Fill the file system of ``data`` (ENOSPC proved)."""
    with open(data / "filler", "wb", buffering=0) as filler, contextlib.suppress(OSError):
        while True:
            filler.write(b"\0" * 4096)
    with pytest.raises(OSError, match="No space left"):
        (data / "proof").write_bytes(b"\0" * 4096)


@pytest.mark.hardening("third 16: a full disk under the aggregate store was reported as a busy store")
def test_a_full_disk_under_the_store_is_reported_as_one(small_disk: Path) -> None:
    (small_disk / f"{DAY}.csv").write_bytes(HEADER + b"".join(rows("full", 1, 3000)))
    store = Aggregates(small_disk)
    assert store.generation()  # the store opened (and marked) while there is room
    fill(small_disk)
    with pytest.raises(Unavailable, match="disk under the aggregate store is full"):
        store.fold(sizes_of(small_disk))
    (small_disk / "filler").unlink()
    store.fold(sizes_of(small_disk))
    assert counted(store)["full"] == 3000
    store.close()


def test_the_store_generation_changes_with_a_rebuild(tmp_path: Path) -> None:
    (tmp_path / f"{DAY}.csv").write_bytes(HEADER + b"".join(rows("gen", 1, 10)))
    store = Aggregates(tmp_path)
    store.fold(sizes_of(tmp_path))
    before = read_generation(tmp_path)
    assert before == store.generation() != 0
    store.rebuild(sizes_of(tmp_path))
    assert read_generation(tmp_path) == store.generation() != before

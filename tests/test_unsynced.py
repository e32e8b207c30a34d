"""The aggregate store kept without fsync (tiny.unsynced): trusted by the boot that wrote it,
or after a sync; otherwise deleted before use and counted again from the day files.

A machine that stops mid-write cannot be made here; what it leaves can: a store whose marker
names another boot, with counts that disagree with the files (writes of one transaction on
disk, not those of another) or pages of garbage. Every count is checked against the rows
the test wrote.
"""

from __future__ import annotations

import re
import signal
import sqlite3
import uuid
from collections import Counter
from pathlib import Path

import orjson
import pytest

from tests.support import Server, needs_strace, once_counted, record, traced
from tiny import unsynced
from tiny.aggregate_errors import Unavailable
from tiny.aggregates import Aggregates, aggregates_path
from tiny.layout import HEADER

DAY = "2014-05-04"
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(unsynced.BOOT is None, reason="no boot id on this machine: the store is written with fsync"),
]


def csv_row(package: str) -> bytes:
    return f'"{DAY}","10:00:00",1000,"3.1.0","x86_64","linux-gnu","{package}","1.0","DE",1\n'.encode()


def write_day(data: Path, counts: Counter[str]) -> None:
    data.mkdir(parents=True, exist_ok=True)
    rows = b"".join(csv_row(package) * n for package, n in counts.items())
    (data / f"{DAY}.csv").write_bytes(HEADER + rows)


def sizes_of(data: Path) -> dict[str, int]:
    return {p.stem: p.stat().st_size for p in data.glob("*.csv")}


def stored(store: Aggregates) -> Counter[str]:
    return Counter(dict(store.db.execute("SELECT package, downloads FROM packages WHERE day = ?", (DAY,))))


def marker_of(data: Path) -> str:
    return unsynced.Marker(aggregates_path(data)).path.read_text().strip()


def mark_as_another_boot(data: Path) -> None:
    unsynced.Marker(aggregates_path(data)).path.write_text(f"{uuid.uuid4()}\n")


def folded(data: Path, counts: Counter[str]) -> Aggregates:
    write_day(data, counts)
    store = Aggregates(data)
    assert store.fold(sizes_of(data)) == sum(counts.values())
    return store


COUNTS = Counter(ggplot2=30, Rcpp=12, dplyr=5)


def test_a_store_written_under_this_boot_is_kept(tmp_path: Path) -> None:
    folded(tmp_path, COUNTS).close()
    assert marker_of(tmp_path) == unsynced.BOOT
    again = Aggregates(tmp_path)
    assert again.fold(sizes_of(tmp_path)) == 0  # nothing counted twice, nothing again
    assert stored(again) == COUNTS


def test_a_store_written_under_another_boot_is_counted_again_from_the_files(tmp_path: Path) -> None:
    store = folded(tmp_path, COUNTS)
    store.db.execute("UPDATE packages SET downloads = downloads + 7")  # what a torn write leaves
    store.close()
    mark_as_another_boot(tmp_path)
    again = Aggregates(tmp_path)
    assert again.fold(sizes_of(tmp_path)) == sum(COUNTS.values())
    assert stored(again) == COUNTS
    assert marker_of(tmp_path) == unsynced.BOOT


def test_a_store_of_garbage_from_another_boot_is_counted_again(tmp_path: Path) -> None:
    folded(tmp_path, COUNTS).close()
    path = aggregates_path(tmp_path)
    with open(path, "r+b") as torn:
        torn.seek(4096)
        torn.write(b"\xa5" * 8192)
    mark_as_another_boot(tmp_path)
    again = Aggregates(tmp_path)
    assert again.fold(sizes_of(tmp_path)) == sum(COUNTS.values())
    assert stored(again) == COUNTS


def test_a_store_without_its_marker_is_counted_again(tmp_path: Path) -> None:
    store = folded(tmp_path, COUNTS)
    store.db.execute("UPDATE packages SET downloads = 0")
    store.close()
    unsynced.Marker(aggregates_path(tmp_path)).path.unlink()
    again = Aggregates(tmp_path)
    assert again.fold(sizes_of(tmp_path)) == sum(COUNTS.values())
    assert stored(again) == COUNTS


def test_a_synced_store_is_kept_by_any_boot(tmp_path: Path) -> None:
    store = folded(tmp_path, COUNTS)
    assert store.sync()
    store.close()
    assert marker_of(tmp_path) == unsynced.SYNCED  # says nothing of the boot: the next one keeps it
    again = Aggregates(tmp_path)
    assert again.fold(sizes_of(tmp_path)) == 0
    assert stored(again) == COUNTS


def test_a_write_after_a_sync_marks_the_store_unsynced_first(tmp_path: Path) -> None:
    writer = folded(tmp_path, COUNTS)
    syncer = Aggregates(tmp_path)
    assert syncer.sync()
    assert marker_of(tmp_path) == unsynced.SYNCED
    with open(tmp_path / f"{DAY}.csv", "ab") as day:
        day.write(csv_row("late"))
    assert writer.fold(sizes_of(tmp_path)) == 1
    assert marker_of(tmp_path) == unsynced.BOOT


def test_a_read_leaves_a_synced_store_synced(tmp_path: Path) -> None:
    store = folded(tmp_path, COUNTS)
    assert store.sync()
    assert store.fold(sizes_of(tmp_path)) == 0  # up to date: no write transaction
    assert marker_of(tmp_path) == unsynced.SYNCED


def test_a_synced_store_opened_and_read_by_another_process_stays_synced(tmp_path: Path) -> None:
    store = folded(tmp_path, COUNTS)
    assert store.sync()
    store.close()
    reader = Aggregates(tmp_path)
    assert reader.fold(sizes_of(tmp_path)) == 0
    assert stored(reader) == COUNTS
    reader.close()
    assert marker_of(tmp_path) == unsynced.SYNCED


def test_a_store_deleted_under_a_process_is_opened_again_and_counted(tmp_path: Path) -> None:
    store = folded(tmp_path, COUNTS)
    for side in ("", "-wal", "-shm"):
        Path(f"{aggregates_path(tmp_path)}{side}").unlink(missing_ok=True)
    assert store.fold(sizes_of(tmp_path)) == sum(COUNTS.values())
    assert stored(store) == COUNTS
    assert aggregates_path(tmp_path).exists()


def test_a_store_another_process_deleted_as_untrusted_is_opened_again(tmp_path: Path) -> None:
    first = folded(tmp_path, COUNTS)
    mark_as_another_boot(tmp_path)  # an operator's edit: the next opener deletes the store
    second = Aggregates(tmp_path)
    assert second.fold(sizes_of(tmp_path)) == sum(COUNTS.values())
    with open(tmp_path / f"{DAY}.csv", "ab") as day:
        day.write(csv_row("late"))
    first.fold(sizes_of(tmp_path))  # on the store now at the path, not its deleted one
    assert stored(second) == stored(first) == COUNTS + Counter(late=1)


def test_sync_without_a_store_creates_none(tmp_path: Path) -> None:
    assert not Aggregates(tmp_path).sync()
    assert not aggregates_path(tmp_path).exists()


# -- the close after a sync: traced, since a missing fsync shows only after a power loss --------

CLOSE_AFTER_SYNC = """
import sys
from pathlib import Path
from tiny.aggregates import Aggregates

data, last = Path(sys.argv[1]), sys.argv[2]
writer = Aggregates(data)
writer.fold({p.stem: p.stat().st_size for p in data.glob("*.csv")})
reader, syncer = Aggregates(data), Aggregates(data)
reader.db.execute("SELECT count(*) FROM packages").fetchone()
assert syncer.sync()
writer.close()
if last == "syncer":
    reader.close()
    syncer.close()
elif last == "reader":
    syncer.close()
    reader.close()
else:  # the reader is left to the interpreter's exit
    syncer.close()
"""


@needs_strace
@pytest.mark.parametrize("last", ["syncer", "reader", "exit"])
def test_the_checkpoint_of_the_last_close_after_a_sync_reaches_the_disk_before_the_log_goes(
    tmp_path: Path, last: str
) -> None:
    # SQLite's last connection to close copies the write-ahead log into the store, then
    # deletes the log: a store marked synced must have those copies fsynced in between.
    write_day(tmp_path, COUNTS)
    calls = "pwrite64,fsync,fdatasync,unlink,unlinkat,rename,renameat,renameat2"
    lines = traced(tmp_path / "trace", CLOSE_AFTER_SYNC, str(tmp_path), last, calls=calls)
    assert marker_of(tmp_path) == unsynced.SYNCED
    marked = max(i for i, line in enumerate(lines) if re.search(r"rename.*aggregates\.boot\"", line))
    unwritten = copied = False
    for line in lines[marked + 1 :]:
        if re.search(r"pwrite64\(\d+<[^>]*aggregates\.sqlite3>", line):
            unwritten = copied = True
        elif re.search(r"f(data)?sync\(\d+<[^>]*aggregates\.sqlite3>", line):
            unwritten = False
        elif re.search(r"unlink(at)?\(.*aggregates\.sqlite3-wal\"", line):
            assert not unwritten, "the log was deleted before the pages copied from it were fsynced"
            break
    else:
        pytest.fail("the last close did not checkpoint and delete the log: nothing was tried")
    assert copied
    assert stored(Aggregates(tmp_path)) == COUNTS


# -- a real server --------------------------------------------------------------------------------


def post(server: Server, package: str, count: int) -> None:
    body = b"".join(orjson.dumps(record(package=package, date=DAY, ip_id=n)) + b"\n" for n in range(1, count + 1))
    response = server.ingest(body)
    assert response.status == 200, response.body


def total(server: Server, package: str) -> int:
    response = once_counted(server, f"/downloads/total/{DAY}/{package}")
    assert response.status == 200, response.body
    return int(response.json()[0]["downloads"])


def test_a_graceful_stop_leaves_the_store_synced(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Server(data, "--public-downloads", processes=2) as server:
        post(server, "tiny", 25)
        assert total(server, "tiny") == 25
        assert marker_of(data) == unsynced.BOOT
        assert server.stop() == 0
    assert marker_of(data) == unsynced.SYNCED
    store = Aggregates(data)
    assert stored(store) == Counter(tiny=25)
    assert store.db.execute("PRAGMA quick_check").fetchone() == ("ok",)


def test_a_server_killed_then_restarted_after_a_reboot_counts_exactly(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Server(data, "--public-downloads") as server:
        post(server, "tiny", 25)
        assert total(server, "tiny") == 25
        post(server, "tiny", 5)  # in the day file, not yet in the store
        server.stop(signal.SIGKILL)
    assert marker_of(data) == unsynced.BOOT  # written without fsync, never synced
    with sqlite3.connect(aggregates_path(data)) as db:
        db.execute("UPDATE packages SET downloads = 1000")  # what the machine's stop left on disk
    db.close()
    mark_as_another_boot(data)  # ...under a boot that is over
    with Server(data, "--public-downloads") as server:
        assert total(server, "tiny") == 30
        assert "deleted, the day files are counted again" in server.log()


def test_a_store_whose_marker_cannot_be_written_is_unavailable(tmp_path: Path) -> None:
    write_day(tmp_path, COUNTS)
    unsynced.Marker(aggregates_path(tmp_path)).path.mkdir(parents=True)  # a wrong file in its place
    with pytest.raises(Unavailable, match="aggregate store is unavailable"):
        Aggregates(tmp_path).fold(sizes_of(tmp_path))


def test_a_query_the_store_cannot_answer_gets_a_json_503(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Server(data, "--public-downloads") as server:
        post(server, "tiny", 3)
        unsynced.Marker(aggregates_path(data)).path.mkdir(parents=True)
        response = server.request("GET", f"/downloads/total/{DAY}/tiny")
        assert response.status == 503, response.body
        assert "aggregate store is unavailable" in response.json()["error"]["message"]
        assert response.headers["retry-after"]
        unsynced.Marker(aggregates_path(data)).path.rmdir()
        assert total(server, "tiny") == 3

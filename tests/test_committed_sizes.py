"""The files' committed sizes (tiny.committed_sizes): recorded at each commit, checked at open, forgotten knowingly."""

from __future__ import annotations

import os
import re
import resource
import signal
import time
import zlib
from pathlib import Path

import pytest

from tests.journal_support import Append, flush, opened, refusal
from tests.support import needs_strace, traced, unlinked_once_sizes_synced
from tiny import layout
from tiny.admin import forget
from tiny.commit import CommitError
from tiny.committed_sizes import SizeTable
from tiny.keylog import segment_name


@pytest.mark.hardening("third 9: a live copy lacking an acknowledged batch started; its retry was answered replayed")
def test_a_file_shorter_than_the_journal_knows_was_committed_is_refused_at_open(tmp_path: Path) -> None:
    """The last flush wrote b.csv only: every file a flush ever wrote is checked, a.csv too, not
    the last flush's files alone."""
    data = tmp_path / "data"
    journal = opened(data)
    flush(journal, "a.csv", b"h\n1\n", "k1")
    flush(journal, "b.csv", b"h\n2\n", "k2")
    journal.close()
    (data / "a.csv").write_bytes(b"h\n")  # an older copy of a.csv
    message = refusal(data)
    assert f"{data / 'a.csv'} is 2 bytes: 2 bytes shorter than the 4 that the journal knows" in message
    assert f"`tiny-admin forget {data} a.csv`" in message and "--new-journal" in message
    (data / "a.csv").unlink()
    assert f"{data / 'a.csv'} is missing: 4 bytes shorter" in refusal(data)


def test_committed_sizes_follow_every_flush_and_a_fresh_journal_starts_without_them(tmp_path: Path) -> None:
    data = tmp_path / "data"
    journal = opened(data)
    for n in range(3):
        flush(journal, "a.csv", b"%d\n" % n)  # without keys too
    flush(journal, "b.csv", b"x\n")
    journal.close()
    (data / "a.csv").write_bytes(b"0\n1\n")
    assert "is 4 bytes: 2 bytes shorter than the 6" in refusal(data)
    opened(data, accept_new=True).close()  # knowingly
    opened(data).close()


def table(tmp_path: Path) -> SizeTable:
    return SizeTable.create(str(tmp_path / "sizes"), "id1")


def test_a_forgotten_name_is_known_nowhere_even_to_a_process_that_read_its_slot_before(tmp_path: Path) -> None:
    writer = table(tmp_path)
    writer.record("a.csv", 10)
    writer.record("b.csv", 20)
    other = SizeTable.open(str(tmp_path / "sizes"), "id1")
    assert other.known("a.csv") == 10  # its slot is now this process's too
    SizeTable.open(str(tmp_path / "sizes"), "id1").forget("a.csv")
    assert other.known("a.csv") == 0 and writer.known("a.csv") == 0
    assert other.items() == {"b.csv": 20}
    writer.record("a.csv", 4)  # a later flush to the file: recorded again
    assert SizeTable.open(str(tmp_path / "sizes"), "id1").items() == {"a.csv": 4, "b.csv": 20}


def test_an_accepted_size_replaces_every_slot_of_its_name(tmp_path: Path) -> None:
    sizes = table(tmp_path)
    sizes.record("a.csv", 10)
    sizes.record("b.csv", 20)
    sizes.close()
    again = SizeTable.open(str(tmp_path / "sizes"), "id1")
    whole = (tmp_path / "sizes").read_bytes()
    (tmp_path / "sizes").write_bytes(whole + whole[64:128])  # a.csv in two slots (an older version's table)
    assert [size for _, size in again.slots_of("a.csv")] == [10, 10]
    again.accept("a.csv", 3)
    assert again.slots_of("a.csv") == [(64, 3)] and again.known("a.csv") == 3
    assert SizeTable.open(str(tmp_path / "sizes"), "id1").items() == {"a.csv": 3, "b.csv": 20}


def test_the_refusal_names_the_file_and_both_ways_past_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    journal = opened(data)
    flush(journal, "2014-05-04.csv", b"h\n1\n")
    flush(journal, "2014-05-05.csv", b"h\n1\n")  # the last flush: the check of the sizes finds the first day
    journal.close()
    (data / "2014-05-04.csv").unlink()
    message = refusal(data)
    assert message.startswith(f"{data / '2014-05-04.csv'} is missing: 4 bytes shorter than the 4")
    assert f"({layout.sizes_path(data)})" in message
    assert f"run `tiny-admin forget {data} 2014-05-04.csv`, which forgets them and keeps every key" in message
    assert message.endswith(
        "(its keys are then forgotten: a batch retried with an earlier Idempotency-Key is written again)."
    )


def test_a_file_the_last_flush_wrote_found_cut_names_both_ways_past_it_too(tmp_path: Path) -> None:
    data = tmp_path / "data"
    journal = opened(data)
    flush(journal, "2014-05-04.csv", b"h\n1\n")
    journal.close()
    (data / "2014-05-04.csv").write_bytes(b"h\n")
    message = refusal(data)
    assert "shorter than the 4 the last committed flush left" in message
    assert f"`tiny-admin forget {data} 2014-05-04.csv`" in message and "--new-journal" in message


def test_a_forgotten_file_keeps_its_slot_and_every_process_writes_that_one(tmp_path: Path) -> None:
    """A forget leaves the name's slot at 0: a process that knew it and one started since
    write the same slot, so both check the file against the same size."""
    knew = table(tmp_path)
    knew.record("a.csv", 10)
    SizeTable.open(str(tmp_path / "sizes"), "id1").forget("a.csv")
    assert knew.known("a.csv") == 0 and knew.items() == {}  # forgotten: not checked at open
    started_since = SizeTable.open(str(tmp_path / "sizes"), "id1")
    started_since.record("a.csv", 5)
    assert knew.known("a.csv") == 5
    knew.record("a.csv", 7)
    assert knew.slots_of("a.csv") == [(64, 7)] and started_since.known("a.csv") == 7


def test_a_forgotten_files_slot_fails_an_older_versions_check_and_stays_the_names(tmp_path: Path) -> None:
    """An older version checked a slot by its CRC-32 alone and refused a missing file whose slot
    said 0: the forgotten slot fails that check (it ignores it, as it did a zeroed one), and this
    version reads it as the name's, at 0."""
    sizes = table(tmp_path)
    sizes.record("a.csv", 10)
    sizes.forget("a.csv")
    raw = (tmp_path / "sizes").read_bytes()[64:128]
    assert raw[:5] == b"a.csv" and zlib.crc32(raw[:56]).to_bytes(4, "big") != raw[56:60]
    again = SizeTable.open(str(tmp_path / "sizes"), "id1")
    assert again.known("a.csv") == 0 and again.slots_of("a.csv") == [(64, 0)] and again.items() == {}


def _raw_slot(path: Path, offset: int, name: str, size: int) -> None:
    """Write a slot as the module documents it (name, size, CRC-32 of both), as an older
    version's process could have left it."""
    body = name.encode().ljust(48, b"\0") + size.to_bytes(8, "big")
    with open(path, "r+b") as raw:
        raw.seek(offset)
        raw.write(body + zlib.crc32(body).to_bytes(4, "big") + bytes(4))


def test_with_duplicate_slots_every_process_goes_on_with_the_first(tmp_path: Path) -> None:
    """Two live slots of a.csv (an older version's table): a process that knew the first keeps it
    when it reads the second; one opening the table merges them into the first, at the larger
    size; one holding a slot an accept zeroed moves to the first."""
    sizes = table(tmp_path)
    sizes.record("a.csv", 10)
    reader = SizeTable.open(str(tmp_path / "sizes"), "id1")
    assert reader.known("a.csv") == 10
    _raw_slot(tmp_path / "sizes", 2 * 64, "a.csv", 50)  # the duplicate, after the first
    assert reader.known("new.csv") == 0  # no slot for new.csv: the table's new slots are read
    assert reader.known("a.csv") == 10
    opening = SizeTable.open(str(tmp_path / "sizes"), "id1")
    assert opening.slots_of("a.csv") == [(64, 50)] and reader.known("a.csv") == 50
    _raw_slot(tmp_path / "sizes", 64, "b.csv", 1)  # a.csv's first slot another name's now
    _raw_slot(tmp_path / "sizes", 2 * 64, "a.csv", 50)
    second = SizeTable.open(str(tmp_path / "sizes"), "id1")
    assert second.known("a.csv") == 50  # its slot: the one at 128
    _raw_slot(tmp_path / "sizes", 64, "a.csv", 10)
    reader.accept("a.csv", 8)  # the first says 8, the other zeroed
    assert second.known("a.csv") == 8 and reader.known("a.csv") == 8


def _older_versions_duplicate(tmp_path: Path) -> tuple[Path, int]:
    """A data dir whose table an older version left with a.csv in two live slots: a forget
    zeroed its slot, a server that knew the slot wrote it again (4), and one started since gave
    a.csv another slot and committed the file up to its end."""
    data = tmp_path / "data"
    journal = opened(data)
    flush(journal, "a.csv", b"h\n1\n")
    flush(journal, "b.csv", b"h\n2\n")
    flush(journal, "a.csv", b"x" * 55 + b"\n")
    flush(journal, "b.csv", b"3\n")  # the last flush: b.csv's (the intent's own check is not the one tested)
    journal.close()
    committed = (data / "a.csv").stat().st_size
    _raw_slot(layout.sizes_path(data), 64, "a.csv", 4)
    _raw_slot(layout.sizes_path(data), 3 * 64, "a.csv", committed)
    return data, committed


def test_an_older_versions_duplicate_slots_are_merged_at_open_into_the_first_at_the_largest(tmp_path: Path) -> None:
    data, committed = _older_versions_duplicate(tmp_path)
    journal = opened(data)
    assert journal.intent.sizes is not None
    assert journal.intent.sizes.slots_of("a.csv") == [(64, committed)]
    with open(data / "a.csv", "r+b") as cut:
        cut.truncate(10)
    with pytest.raises(CommitError, match=f"shorter than the {committed} that the journal knows"):
        journal.commit([Append({"a.csv": b"5\n"})], time.monotonic() + 5)
    journal.close()
    assert f"shorter than the {committed}" in refusal(data)


def test_forget_accepts_a_cut_file_the_last_committed_flush_wrote(tmp_path: Path) -> None:
    """The refusal at open names tiny-admin forget; for the last flush's file too, it does what
    the refusal says."""
    data = tmp_path / "data"
    journal = opened(data)
    flush(journal, "2014-05-01.csv", b"h\n1\n")
    journal.close()
    (data / "2014-05-01.csv").write_bytes(b"h\n")
    assert "tiny-admin forget" in refusal(data)
    assert forget(data, ["2014-05-01.csv"]) == [
        f"accepted {data / '2014-05-01.csv'} at 2 bytes: the 2 bytes cut from its end are forgotten"
    ]
    opened(data).close()


def test_a_forgotten_name_is_looked_up_with_one_read_of_its_slot(tmp_path: Path) -> None:
    """Expiry forgot key log segments whose slots another process had read: each lookup of one
    (tiny.keyload asks for every segment deleted before it read it) reads its slot alone, not
    the whole table."""
    path = str(tmp_path / "sizes")
    expiring = SizeTable.create(path, "id1")
    for n in range(1, 1001):
        expiring.record(segment_name(n), 64 << 20)
    other = SizeTable.open(path, "id1")
    for n in range(1, 101):
        expiring.forget(segment_name(n))
    before = _bytes_read()
    for n in range(1, 101):
        assert other.known(segment_name(n)) == 0
    assert _bytes_read() - before < 100 * 64 + 4096  # (reading /proc/self/io counts too)


def _bytes_read() -> int:
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar:"))


def test_a_new_slot_the_disk_refused_is_not_taken_for_the_names_slot(tmp_path: Path) -> None:
    """The disk refuses a new slot (a full disk; here the file size limit): the next name
    another process gives a slot lands there, and is not read as this name's size."""
    path = str(tmp_path / "sizes")
    refused = SizeTable.create(path, "id1")
    refused.record("2014-05-01.csv", 10)
    other = SizeTable.open(path, "id1")
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (os.stat(path).st_size, limit[1]))
    try:
        with pytest.raises(OSError):
            refused.record("2014-05-02.csv", 5)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, handler)
    other.record("2014-05-03.csv", 1000)
    assert refused.known("2014-05-02.csv") == 0
    refused.record("2014-05-02.csv", 5)
    assert other.items() == {"2014-05-01.csv": 10, "2014-05-03.csv": 1000, "2014-05-02.csv": 5}


def test_a_file_forgotten_then_written_by_two_servers_is_refused_by_both_once_cut(tmp_path: Path) -> None:
    """A server running throughout and one started after the forget both flush to the file
    again, one after the other, then it is cut below what they committed: both refuse it."""
    data = tmp_path / "data"
    day, other = "2014-05-01.csv", "2014-05-02.csv"
    throughout = opened(data)
    flush(throughout, day, b"h\n" + b"0" * 59 + b"\n")
    forget(data, [day], remove=True)
    since = opened(data)
    flush(throughout, day, b"h\n1\n")
    flush(since, day, b"2" * 10 + b"\n")
    flush(throughout, day, b"3" * 20 + b"\n")
    flush(throughout, other, b"h\n")
    flush(since, day, b"4" * 30 + b"\n")
    committed = (data / day).stat().st_size
    with open(data / day, "r+b") as cut:
        cut.truncate(committed - 5)
    for journal in (throughout, since):
        with pytest.raises(CommitError, match=f"shorter than the {committed} that the journal knows"):
            journal.commit([Append({day: b"5\n"})], time.monotonic() + 5)


def test_a_file_cut_below_committed_is_refused_by_a_flush_that_also_creates_a_new_file(tmp_path: Path) -> None:
    """The file forgotten, made again by a server started since, then written by one that ran
    throughout: cut by hand below what the latter committed, it is refused by every flush to it,
    one that creates another file too, and the other server's."""
    data = tmp_path / "data"
    throughout = opened(data)
    flush(throughout, "2014-05-01.csv", b"h\n" + b"0" * 59 + b"\n")
    forget(data, ["2014-05-01.csv"], remove=True)
    since = opened(data)
    flush(since, "2014-05-01.csv", b"1" * 27 + b"\n")
    flush(throughout, "2014-05-01.csv", b"2" * 29 + b"\n")
    committed = (data / "2014-05-01.csv").stat().st_size
    with open(data / "2014-05-01.csv", "r+b") as cut:
        cut.truncate(committed - 10)
    for journal, appends in (
        (throughout, [Append({"2014-05-01.csv": b"3\n"}), Append({"2014-05-02.csv": b"h\n4\n"})]),
        (throughout, [Append({"2014-05-01.csv": b"3\n"})]),
        (since, [Append({"2014-05-01.csv": b"3\n"})]),
    ):
        with pytest.raises(CommitError, match=f"shorter than the {committed} that the journal knows"):
            journal.commit(appends, time.monotonic() + 5)


FORGET_REMOVE = """
import sys
from pathlib import Path
from tests.journal_support import flush, opened
from tiny.admin import forget

data = Path(sys.argv[1])
journal = opened(data)
flush(journal, "2014-05-01.csv", b"h\\n1\\n")
journal.close()
forget(data, ["2014-05-01.csv"], remove=True)
"""


@needs_strace
def test_forget_remove_makes_the_forgetting_durable_before_the_file_goes(tmp_path: Path) -> None:
    """A power loss inside ``tiny-admin forget --remove`` never leaves a committed file missing
    (every start would refuse the data dir): the slot's forgetting is fsynced before the unlink."""
    lines = traced(tmp_path / "trace", FORGET_REMOVE, str(tmp_path / "data"))
    assert not (tmp_path / "data" / "2014-05-01.csv").exists()
    assert unlinked_once_sizes_synced(lines, r"/2014-05-01\.csv") == 1
    forgotten = [i for i, line in enumerate(lines) if re.search(r"pwrite64\(\d+<[^>]*/\.tiny/sizes>", line)]
    assert len(forgotten) >= 2, "the flush's record and the forgetting, both written"
    journal = opened(tmp_path / "data")
    assert journal.intent.sizes is not None and journal.intent.sizes.items() == {}
    journal.close()

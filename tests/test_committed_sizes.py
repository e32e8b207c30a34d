"""The files' committed sizes (tiny.committed_sizes): recorded at each commit, checked at open, forgotten knowingly."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.journal_support import Append, flush, opened, refusal
from tiny import layout
from tiny.admin import forget
from tiny.commit import CommitError
from tiny.committed_sizes import SizeTable


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
    whole = (tmp_path / "sizes").read_bytes()
    (tmp_path / "sizes").write_bytes(whole + whole[64:128])  # a.csv in two slots: the larger counts
    again = SizeTable.open(str(tmp_path / "sizes"), "id1")
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


def test_a_process_whose_slot_was_forgotten_writes_the_slot_another_gave_the_name_since(tmp_path: Path) -> None:
    """After a forget, a process that knew the zeroed slot and one that gave the name a new slot
    keep one live slot between them: every process checks against the same size."""
    knew = table(tmp_path)
    knew.record("a.csv", 10)
    SizeTable.open(str(tmp_path / "sizes"), "id1").forget("a.csv")
    started_since = SizeTable.open(str(tmp_path / "sizes"), "id1")
    started_since.record("a.csv", 5)  # a new slot at the end
    assert knew.known("a.csv") == 5
    knew.record("a.csv", 7)
    assert knew.slots_of("a.csv") == [(2 * 64, 7)] and started_since.known("a.csv") == 7


def test_a_lower_duplicate_slot_read_later_does_not_replace_the_slot_a_process_knows(tmp_path: Path) -> None:
    """Two live slots of one name (a process that recorded the zeroed slot again on its own,
    as recovery does): a process reading the table's new slots keeps the larger."""
    knew = table(tmp_path)
    knew.record("a.csv", 10)
    reader = SizeTable.open(str(tmp_path / "sizes"), "id1")
    assert reader.known("a.csv") == 10
    SizeTable.open(str(tmp_path / "sizes"), "id1").forget("a.csv")
    SizeTable.open(str(tmp_path / "sizes"), "id1").record("a.csv", 5)  # a new slot, 5
    knew.record("a.csv", 50)  # the zeroed slot live again, 50
    assert reader.known("new.csv") == 0  # no slot known for new.csv: the table's new slots are read
    assert reader.known("a.csv") == 50


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

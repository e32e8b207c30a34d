"""The files' committed sizes (tiny.committed_sizes): recorded at each commit, checked at open."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.journal_support import flush, opened, refusal


@pytest.mark.hardening("third 9: a live copy lacking an acknowledged batch started; its retry was answered replayed")
def test_a_file_shorter_than_the_journal_knows_was_committed_is_refused_at_open(tmp_path: Path) -> None:
    """The last flush wrote b.csv only: the old tree checked that flush's files, not a.csv."""
    data = tmp_path / "data"
    journal = opened(data)
    flush(journal, "a.csv", b"h\n1\n", "k1")
    flush(journal, "b.csv", b"h\n2\n", "k2")
    journal.close()
    (data / "a.csv").write_bytes(b"h\n")  # an older copy of a.csv
    message = refusal(data)
    assert f"{data / 'a.csv'} is 2 bytes: 2 bytes shorter than the 4 that the journal knows" in message
    assert "--new-journal" in message
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

"""Helpers for the tests of the journal's pieces (tiny.datadir, flushlock, intent, keys, appender, commit.local)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tiny import layout
from tiny.commit import Claim, CommitError, Receipt
from tiny.commit.local import LocalCommit


@dataclass
class Append:
    """One append of a flush, as the sink queues it (tiny.commit.Append)."""

    chunks: Mapping[str, bytes] = field(default_factory=dict)
    claim: Claim | None = None


def opened(data: Path, accept_new: bool = False, **kwargs: object) -> LocalCommit:
    """A journal of ``data``, opened, its keys read (a flush waits for them itself; a test
    that calls the key store directly must not race their reading)."""
    journal = LocalCommit(data, **kwargs)  # type: ignore[arg-type]
    journal.open(accept_new=accept_new)
    assert journal.keys_read(30)
    return journal


def claims(*keys: str, digest: bytes = b"d", answer: bytes = b"a") -> list[Claim]:
    return [Claim(key, digest, answer) for key in keys]


def commit_keys(journal: LocalCommit, keys: list[Claim]) -> Receipt:
    """A flush of ``keys`` that writes no data: only their records to the key log."""
    return journal.commit([Append({}, claim) for claim in keys], time.monotonic() + 5)


def flush(journal: LocalCommit, name: str, rows: bytes, *keys: str) -> Receipt:
    """One whole flush as the sink makes it: ``rows`` to ``name`` with the first key, the other
    keys on appends of their own that write nothing."""
    first = [Append({name: rows}, Claim(keys[0], b"d", b"a") if keys else None)]
    return journal.commit([*first, *(Append({}, claim) for claim in claims(*keys[1:]))], time.monotonic() + 5)


def previous_format_keys(data: Path, *keys: tuple[int, str, bytes, bytes]) -> None:
    """Give the journal of ``data`` the previous format's keys table, holding ``keys`` (seq, key,
    digest, answer), each stored now."""
    db = sqlite3.connect(layout.journal_path(data))
    db.execute("CREATE TABLE idempotency_keys (seq INTEGER PRIMARY KEY, key TEXT UNIQUE, digest, answer, stored)")
    db.executemany("INSERT INTO idempotency_keys VALUES (?, ?, ?, ?, ?)", [(*key, time.time()) for key in keys])
    db.commit()
    db.close()


def refusal(data: Path, accept_new: bool = False, **kwargs: object) -> str:
    """The message of the refusal that opening ``data``'s journal raises."""
    with pytest.raises(CommitError) as raised:
        opened(data, accept_new, **kwargs)
    return str(raised.value)

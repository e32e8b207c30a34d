"""The data dir's journal: the flush lock, the intent of the flush under way, and the idempotency keys.

Every writer of a data dir (every worker of every server and container sharing it) takes
one exclusive ``flock`` on ``.tiny/lock`` (tiny.layout) for the whole of a flush, and keeps,
in one SQLite database (``.tiny/journal.sqlite3``; WAL mode, or SQLite's rollback journal
with ``mode="delete"``, for writers on several hosts, whose WAL would need shared memory):

- ``intent``: the files the flush under way appends to, each with its size before the flush
  and whether the flush created it. Written and committed *before* the first byte of data;
  deleted in the same transaction that records the flush's keys. So a crash at any point of a
  flush (kill -9, a power loss with ``--durability fsync``) leaves an intent behind, and the
  next writer to take the lock (:meth:`Journal.recover`) cuts every file back to exactly its
  size before, removes the files the flush created, and deletes the intent: the flush's rows
  and keys are then both absent, and a retry writes them once. Bytes the flush did not write
  are never touched, so a day file whose last row lacks its LF (edited by hand) keeps it.
- ``keys``: per Idempotency-Key, a digest of the body it came with and the answer that was
  sent, recorded atomically with the rows (the commit above). A key is decided under the same
  lock as the write: a retry, in any process, sees the key or writes the rows, never both.
  A key counts for ``window`` seconds; a retry after that is processed as new. At most
  ``max_keys`` keys are kept: past that, the oldest go first (checked at every commit). Keys
  past the window are deleted every 1,000 flushes, and when a retry meets one.

With ``fsync``, the intent's commit reaches the disk before the data is written, and the
data and new directory entries before the keys' commit (synchronous=FULL), so the same
holds across a power loss; without, each commit is written (WAL, synchronous=NORMAL), which
a killed process cannot lose.

Not thread-safe: a :class:`Journal` belongs to one sink thread of one process.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tiny import layout

log = logging.getLogger("tiny.journal")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS intent (name TEXT PRIMARY KEY, size_before INTEGER NOT NULL, created INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS keys (
    key TEXT PRIMARY KEY, digest BLOB NOT NULL, answer BLOB NOT NULL, stored REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS keys_by_age ON keys (stored);
CREATE TABLE IF NOT EXISTS counts (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO counts VALUES ('keys', 0);
"""
_EXPIRE_EVERY = 1000  # commits between two deletions of the keys past the window (and at start)


@dataclass(frozen=True)
class Stored:
    """What the journal holds for a key: the digest of its body and the answer it got."""

    digest: bytes
    answer: bytes


@dataclass(frozen=True)
class Intent:
    """One file a flush is about to append to, as the journal records it first."""

    name: str  # relative to the data dir
    size_before: int
    created: bool  # the flush created the file: a roll-back removes it


class Journal:
    """The journal of ``data_dir``; see the module docstring. Open it with :meth:`open`."""

    def __init__(
        self,
        data_dir: Path,
        *,
        fsync: bool = False,
        window: float = 86_400.0,
        max_keys: int = 10_000_000,
        mode: str = "wal",
    ) -> None:
        self.data_dir = Path(data_dir)
        self.fsync = fsync
        self.mode = mode
        self.window = window
        self.max_keys = max_keys
        self._db: sqlite3.Connection | None = None
        self._lock_fd = -1
        self._commits = 0
        self.held = 0  # keys in the journal at the last commit

    def open(self) -> None:
        """Create the journal's directory, lock file and database if needed, and open them."""
        state = layout.state_dir(self.data_dir)
        state.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(layout.lock_path(self.data_dir), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        # isolation_level=None: transactions are explicit (BEGIN ... COMMIT), nothing implicit.
        self._db = sqlite3.connect(layout.journal_path(self.data_dir), isolation_level=None, check_same_thread=False)
        with self.locked():
            self._db.execute(f"PRAGMA journal_mode={'WAL' if self.mode == 'wal' else 'DELETE'}")
            self._db.executescript(_SCHEMA)
        self._db.execute(f"PRAGMA synchronous={'FULL' if self.fsync else 'NORMAL'}")

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the data dir's flush lock (every writer of every process takes it)."""
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    @property
    def db(self) -> sqlite3.Connection:
        assert self._db is not None, "Journal.open() first"
        return self._db

    def recover(self) -> int:
        """Undo the flush a crash left unfinished, if any; returns the files it repaired.

        Lock held by caller. Each file goes back to exactly its size before that flush (a
        file the flush created is removed), with fsync when fsync is on, before the intent
        is deleted: a crash during recovery leaves the intent for the next one.
        """
        intents = [Intent(name, size, bool(created)) for name, size, created in self.db.execute("SELECT * FROM intent")]
        if not intents:
            return 0
        for intent in intents:
            path = self.data_dir / intent.name
            try:
                if intent.created and intent.size_before == 0:
                    path.unlink(missing_ok=True)
                    continue
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                if os.fstat(fd).st_size > intent.size_before:
                    os.ftruncate(fd, intent.size_before)
                    if self.fsync:
                        os.fsync(fd)
            finally:
                os.close(fd)
        self.db.execute("DELETE FROM intent")
        log.warning("recovered from an unfinished flush: %s", ", ".join(i.name for i in intents))
        return len(intents)

    def lookup(self, keys: Iterable[str]) -> dict[str, Stored]:
        """The keys (of ``keys``) the journal holds within the window, with their digest and
        answer; one past the window is deleted here (its retry is new). Lock held."""
        wanted = list(dict.fromkeys(keys))
        found: dict[str, Stored] = {}
        expired: list[str] = []
        oldest = time.time() - self.window
        for start in range(0, len(wanted), 500):  # SQLite's limit on bound parameters
            chunk = wanted[start : start + 500]
            marks = ",".join("?" * len(chunk))
            rows = self.db.execute(f"SELECT key, digest, answer, stored FROM keys WHERE key IN ({marks})", chunk)
            for key, digest, answer, stored in rows:
                if stored < oldest:
                    expired.append(key)
                else:
                    found[key] = Stored(digest, answer)
        if expired:
            with self._transaction():
                self.db.executemany("DELETE FROM keys WHERE key = ?", [(key,) for key in expired])
                self.db.execute("UPDATE counts SET value = value - ? WHERE name = 'keys'", (len(expired),))
        return found

    def intend(self, intents: list[Intent]) -> None:
        """Record the files a flush is about to append to, before it writes. Lock held."""
        with self._transaction():
            self.db.executemany(
                "INSERT INTO intent VALUES (?, ?, ?)", [(i.name, i.size_before, int(i.created)) for i in intents]
            )

    def commit(self, keys: list[tuple[str, bytes, bytes]]) -> None:
        """The flush is whole: record its keys ``(key, digest, answer)`` and drop its intent, in
        one transaction (the flush's commit point). Lock held."""
        now = time.time()
        with self._transaction():
            if keys:
                self.db.executemany("INSERT INTO keys VALUES (?, ?, ?, ?)", [(*key, now) for key in keys])
                self.db.execute("UPDATE counts SET value = value + ? WHERE name = 'keys'", (len(keys),))
            self.db.execute("DELETE FROM intent")
            self._commits += 1
            self.held = self.db.execute("SELECT value FROM counts WHERE name = 'keys'").fetchone()[0]
            if self._commits % _EXPIRE_EVERY == 1 or self.held > self.max_keys:
                self.held -= self._expire(now, self.held)

    def abandon(self) -> None:
        """Drop the intent of a flush whose files the caller has rolled back already. Lock held."""
        with self._transaction():
            self.db.execute("DELETE FROM intent")

    def _expire(self, now: float, held: int) -> int:
        """Forget the keys past the window, then the oldest past max_keys; returns how many
        (in the caller's transaction)."""
        gone = self.db.execute("DELETE FROM keys WHERE stored < ?", (now - self.window,)).rowcount
        if held - gone > self.max_keys:
            gone += self.db.execute(
                "DELETE FROM keys WHERE key IN (SELECT key FROM keys ORDER BY stored LIMIT ?)",
                (held - gone - self.max_keys,),
            ).rowcount
        if gone:
            self.db.execute("UPDATE counts SET value = value - ? WHERE name = 'keys'", (gone,))
        return gone

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

"""The data dir's journal: the flush lock, the intent of the flush under way, and the idempotency keys.

Every writer of a data dir (every worker of every server and container sharing it) takes
one exclusive ``flock`` on ``.tiny/lock`` (tiny.layout) for the whole of a flush, and keeps:

- ``.tiny/intent``: the flush under way, written *before* the first byte of data: the files
  it appends to, each with its size before and whether the flush created it, and the first
  of the keys it records (if any), as one record ``b"I"``, length, CRC-32, payload (one
  ``pwrite`` at offset 0; with fsync, synced before the data). The flush is finished when
  the record's first byte is overwritten with ``b"-"`` (a 1-byte ``pwrite``; emptying the
  file with ``ftruncate`` instead cost about 15 µs more per flush, its block freed and
  allocated again each time). A crash at any point of a flush (kill -9, a power loss with
  ``--durability fsync``) leaves the intent live, and the next writer to take the lock
  (:meth:`Journal.recover`) cuts every file back to exactly its size before, removes the
  files the flush created, and marks the intent finished: the flush's rows and keys are
  then both absent, and a retry writes them once. Bytes the flush did not write are never
  touched, so a day file whose last row lacks its LF (edited by hand) keeps it. An intent
  whose CRC does not match was torn while being written, before any data: it is dropped.
- ``.tiny/journal.sqlite3`` (SQLite, WAL mode, or its rollback journal with
  ``mode="delete"`` for writers on several hosts, whose WAL would need shared memory), table
  ``idempotency_keys``: per Idempotency-Key, in the order they were stored, a digest of the
  body it came with and the answer that was sent. A flush with keys claims them in one
  transaction (:meth:`Journal.claim`: one ``INSERT ... ON CONFLICT DO NOTHING`` per key, a
  conflict meaning "held") before its intent and data, and commits it after the data (its
  commit point), before it finishes the intent; recovery, finding the intent's first key
  stored, keeps the files (that key had no row when the flush began, under the same lock,
  and only that flush's commit stores it). A key is decided
  under the same lock as the write: a retry, in any process, sees the key or writes the rows,
  never both. A key counts for ``window`` seconds; a retry after that is processed as new.
  At most ``max_keys`` keys are kept: past that, the oldest go first (checked at every commit
  with keys). Keys past the window are deleted every 1,000 flushes, and when a retry meets
  one. A flush without keys does not touch SQLite at all.

With ``fsync``, the intent reaches the disk before the data is written, the data and new
directory entries before the keys' commit (synchronous=FULL), and that before the finished
intent; so the same holds across a power loss. Without, every step is written (WAL,
synchronous=NORMAL), which a killed process cannot lose.

Not thread-safe: a :class:`Journal` belongs to one sink thread of one process.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from tiny import layout

log = logging.getLogger("tiny.journal")

# One row per key, in the order stored (seq): the key's own index finds it, and seq gives the
# oldest first and the count (last seq - first seq + 1) without a second index or a counter row
# to update (each would add a page to every commit: 30 µs of 90 in a flush with one key).
_SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotency_keys (
    seq INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, digest BLOB NOT NULL, answer BLOB NOT NULL, stored REAL NOT NULL
);
"""
_TABLE = "idempotency_keys"
_INSERT = f"INSERT INTO {_TABLE} (key, digest, answer, stored) VALUES (?, ?, ?, ?) ON CONFLICT (key) DO NOTHING"
_SELECT = f"SELECT digest, answer, stored FROM {_TABLE} WHERE key = ?"
# Two subqueries: SQLite reads min() or max() off the index end only when it is a query's one aggregate
# (one query with both scanned the table: 140 µs a commit at 20k keys).
_BOUNDS = f"SELECT (SELECT min(seq) FROM {_TABLE}), (SELECT max(seq) FROM {_TABLE})"
_LIVE, _FINISHED = b"I", b"-"  # the intent's first byte: a flush under way, or none
_EXPIRE_EVERY = 1000  # commits between two deletions of the keys past the window (and at start)
_RECOUNT_EVERY = 64  # commits between two readings of the oldest key's seq (``held``)


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
        self._intent_fd = -1
        self._commits = 0
        self._inserted = 0  # keys claim() inserted in it
        self._last_seq = 0  # the seq of the last of them
        self._first_seq = 0  # the oldest key's seq when this process last looked (others may expire)
        # Keys in the journal at this process's last commit: newest seq - oldest seq + 1, the
        # oldest read every _RECOUNT_EVERY commits (an upper bound while other processes expire).
        self.held = 0

    def open(self) -> None:
        """Create the journal's directory, lock file and database if needed, and open them."""
        state = layout.state_dir(self.data_dir)
        state.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(layout.lock_path(self.data_dir), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        # isolation_level=None: transactions are explicit (BEGIN ... COMMIT), nothing implicit.
        self._db = sqlite3.connect(layout.journal_path(self.data_dir), isolation_level=None, check_same_thread=False)
        self._intent_fd = os.open(layout.intent_path(self.data_dir), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        with self.locked():
            self._db.execute(f"PRAGMA journal_mode={'WAL' if self.mode == 'wal' else 'DELETE'}")
            with self._transaction():
                self._db.execute(_SCHEMA)
                self._upgrade()
        self._db.execute(f"PRAGMA synchronous={'FULL' if self.fsync else 'NORMAL'}")
        if self.fsync:
            os.fsync(self._intent_fd)
            fsync_dir(state)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
        if self._intent_fd >= 0:
            os.close(self._intent_fd)
            self._intent_fd = -1

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
        is marked finished: a crash during recovery leaves the intent for the next one. An
        intent whose flush committed (its first key is stored) only needs marking.
        """
        if os.pread(self._intent_fd, 1, 0) != _LIVE:  # the usual case: finished, or never written
            return 0
        first_key, intents = _parse_intent(os.pread(self._intent_fd, 1 << 24, 0))
        repaired = 0
        if intents is None:
            log.warning("dropped a torn intent (a flush stopped before writing any data)")
        elif first_key is None or not self._stored(first_key):
            self._cut_back(intents)
            repaired = len(intents)
            log.warning("recovered from an unfinished flush: %s", ", ".join(i.name for i in intents))
        self._clear_intent()
        return repaired

    def _stored(self, key: str) -> bool:
        return self.db.execute(_SELECT, (key,)).fetchone() is not None

    def _upgrade(self) -> None:
        """Take over the tables of the first version (lock held, in the caller's transaction):
        its unfinished flush (the intent was a table then) is undone, its keys move over."""
        tables = {name for (name,) in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "intent" in tables:
            rows = self.db.execute("SELECT name, size_before, created FROM intent").fetchall()
            if rows:
                self._cut_back([Intent(name, size, bool(created)) for name, size, created in rows])
                log.warning("recovered from an unfinished flush: %s", ", ".join(name for name, _, _ in rows))
            self.db.execute("DROP TABLE intent")
        if "keys" in tables:
            self.db.execute(
                f"INSERT OR IGNORE INTO {_TABLE} (key, digest, answer, stored) "
                "SELECT key, digest, answer, stored FROM keys ORDER BY stored"
            )
            self.db.execute("DROP TABLE keys")
        if "counts" in tables:
            self.db.execute("DROP TABLE counts")

    def _cut_back(self, intents: list[Intent]) -> None:
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

    def claim(self, keys: list[tuple[str, bytes, bytes]]) -> dict[str, Stored]:
        """Open the flush's transaction and insert each of ``keys`` ``(key, digest, answer)``
        (distinct) that the journal does not hold; returns those it holds within the window,
        with their digest and answer: their appends write nothing. The inserts become durable
        with :meth:`commit`, after the data; :meth:`rollback` drops them. No keys: nothing.

        One statement per key, found or not (the usual flush has one new key). A key held past
        the window is deleted first, in a transaction of its own, and the claim starts again:
        so the first key inserted had no row before, and recovery, finding it, knows the flush
        committed. Lock held."""
        if not keys:
            return {}
        while True:
            self.db.execute("BEGIN IMMEDIATE")
            held: dict[str, Stored] = {}
            expired: list[tuple[str]] = []
            oldest = (now := time.time()) - self.window
            try:
                for key, digest, answer in keys:
                    cursor = self.db.execute(_INSERT, (key, digest, answer, now))
                    if cursor.rowcount == 1:
                        self._last_seq = cursor.lastrowid or 0
                        continue
                    held_digest, held_answer, stored = self.db.execute(_SELECT, (key,)).fetchone()
                    if stored < oldest:
                        expired.append((key,))
                    else:
                        held[key] = Stored(held_digest, held_answer)
            except BaseException:
                self.rollback()
                raise
            if not expired:
                self._inserted = len(keys) - len(held)
                return held
            self.rollback()
            with self._transaction():
                self.db.executemany(f"DELETE FROM {_TABLE} WHERE key = ?", expired)

    def rollback(self) -> None:
        """Drop the keys :meth:`claim` inserted (a flush that failed). Lock held."""
        if self.db.in_transaction:  # not when SQLite rolled back by itself (a failed COMMIT)
            self.db.execute("ROLLBACK")

    def intend(self, intents: list[Intent], first_key: str | None = None) -> None:
        """Record the files a flush is about to append to, and the first key it will record
        (one :meth:`lookup` did not find), before it writes. Lock held."""
        payload = orjson.dumps([first_key, [[i.name, i.size_before, int(i.created)] for i in intents]])
        record = _LIVE + len(payload).to_bytes(4, "big") + zlib.crc32(payload).to_bytes(4, "big") + payload
        written = os.pwrite(self._intent_fd, record, 0)
        if written != len(record):  # a short write (disk full): the flush fails, its caller rolls back
            raise OSError(f"the intent was written short ({written} of {len(record)} bytes)")
        if self.fsync:
            os.fsync(self._intent_fd)

    def commit(self) -> None:
        """The flush's data is written: commit the keys :meth:`claim` inserted (the commit
        point of a flush with keys). :meth:`finish` comes next. Lock held."""
        self._commits += 1
        expire = self._commits % _EXPIRE_EVERY == 1
        if not (self.db.in_transaction or expire):
            return
        try:
            if not self.db.in_transaction:
                self.db.execute("BEGIN IMMEDIATE")
            inserted, self._inserted = self._inserted, 0
            last = self._last_seq if inserted else self._bounds()[1]
            if not self._first_seq or last < self._first_seq or self._commits % _RECOUNT_EVERY == 0:
                # unknown, or stale: other processes expire keys too, and seq starts at 1
                # again once the table is empty
                self._first_seq = self._bounds()[0]
            self.held = last - self._first_seq + 1 if last else 0
            if expire or self.held > self.max_keys:
                self._expire(time.time(), before=last - inserted + 1)
                self._first_seq, last = self._bounds()
                self.held = last - self._first_seq + 1 if last else 0
            self.db.execute("COMMIT")
        except BaseException:
            self.rollback()
            raise

    def _bounds(self) -> tuple[int, int]:
        """The seqs of the oldest and the newest key (0, 0 when there is none)."""
        oldest, newest = self.db.execute(_BOUNDS).fetchone()
        return oldest or 0, newest or 0

    def finish(self) -> None:
        """Mark the intent finished: the commit point of a flush without keys (one with keys is
        committed already: recovery keeps its files). Lock held."""
        self._clear_intent()

    def abandon(self) -> None:
        """Drop the intent of a flush whose files the caller has rolled back already. Lock held."""
        self._clear_intent()

    def _clear_intent(self) -> None:
        os.pwrite(self._intent_fd, _FINISHED, 0)  # one byte: it cannot be written in part
        if self.fsync:
            os.fsync(self._intent_fd)

    def _expire(self, now: float, before: int) -> None:
        """Forget the keys past the window, then the oldest past max_keys, all older than seq
        ``before`` (the keys of the flush being committed stay). In the caller's transaction.

        Oldest first by seq: the scan stops at the first key within the window, so its cost is
        the number of keys it deletes; a key stored out of time order (another host's clock)
        is kept longer, never shorter, than the window."""
        first_kept = self.db.execute(
            f"SELECT seq FROM {_TABLE} WHERE stored >= ? ORDER BY seq LIMIT 1", (now - self.window,)
        ).fetchone()
        limit = min(before, first_kept[0] if first_kept else before)
        self.db.execute(f"DELETE FROM {_TABLE} WHERE seq < ?", (limit,))
        oldest, newest = self._bounds()
        excess = newest - oldest + 1 - self.max_keys if newest else 0
        if excess > 0:
            self.db.execute(
                f"DELETE FROM {_TABLE} WHERE seq IN (SELECT seq FROM {_TABLE} WHERE seq < ? ORDER BY seq LIMIT ?)",
                (before, excess),
            )

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")


def _parse_intent(record: bytes) -> tuple[str | None, list[Intent] | None]:
    """(first key, intents) of a live intent record (``b"I"``, length, CRC-32, payload; the
    bytes after it are an older, longer record's); intents None when it is torn."""
    size, crc = int.from_bytes(record[1:5], "big"), record[5:9]
    payload = record[9 : 9 + size]
    if len(payload) != size or zlib.crc32(payload).to_bytes(4, "big") != crc:
        return None, None
    first_key, files = orjson.loads(payload)
    return first_key, [Intent(name, size, bool(created)) for name, size, created in files]


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` (a file created in it) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

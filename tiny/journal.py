"""The data dir's journal: the flush lock, the intent of the flush under way, and the idempotency keys.

Every writer of a data dir (every worker of every server and container sharing it) takes
one exclusive ``flock`` on ``.tiny/lock`` (tiny.layout) for the whole of a flush, and keeps:

- ``.tiny/intent``: the flush under way, written *before* the first byte of data: a random
  flush id and the files it appends to, each with its size before and whether the flush
  created it, behind a CRC-32 (one ``pwrite``; with fsync, synced before the data). The flush
  is finished when the file is emptied again. A crash at any point of a flush (kill -9, a
  power loss with ``--durability fsync``) leaves the intent behind, and the next writer to take
  the lock (:meth:`Journal.recover`) cuts every file back to exactly its size before, removes
  the files the flush created, and empties the intent: the flush's rows and keys are then
  both absent, and a retry writes them once. Bytes the flush did not write are never touched,
  so a day file whose last row lacks its LF (edited by hand) keeps it. An intent whose CRC
  does not match was torn while being written, before any data: it is dropped.
- ``.tiny/journal.sqlite3`` (SQLite, WAL mode, or its rollback journal with
  ``mode="delete"`` for writers on several hosts, whose WAL would need shared memory), table
  ``keys``: per Idempotency-Key, a digest of the body it came with and the answer that was
  sent. A flush with keys records them, and its flush id as the last committed one, in one
  transaction (its commit point) before it empties the intent; so recovery, finding an intent
  whose id is the committed one, keeps the files. A key is decided under the same lock as the
  write: a retry, in any process, sees the key or writes the rows, never both. A key counts
  for ``window`` seconds; a retry after that is processed as new. At most ``max_keys`` keys
  are kept: past that, the oldest go first (checked at every commit with keys). Keys past the
  window are deleted every 1,000 flushes, and when a retry meets one. A flush without keys
  does not touch SQLite at all (speed: two SQLite transactions per flush cost about 100 µs).

With ``fsync``, the intent reaches the disk before the data is written, the data and new
directory entries before the keys' commit (synchronous=FULL), and that before the emptied
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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

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
INSERT OR IGNORE INTO counts VALUES ('flush', 0);
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
        self._intent_fd = -1
        self._flush_id = 0
        self._commits = 0
        self.held = 0  # keys in the journal at the last commit

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
            self._db.executescript(_SCHEMA)
            self._recover_table()
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
        is emptied: a crash during recovery leaves the intent for the next one. An intent
        whose flush committed (its keys are recorded) only needs emptying.
        """
        if os.fstat(self._intent_fd).st_size == 0:  # the usual case: one fstat
            return 0
        record = os.pread(self._intent_fd, 1 << 24, 0)
        flush_id, intents = _parse_intent(record)
        committed = self.db.execute("SELECT value FROM counts WHERE name = 'flush'").fetchone()[0]
        repaired = 0
        if intents is None:
            log.warning("dropped a torn intent (a flush stopped before writing any data)")
        elif flush_id != committed:
            self._cut_back(intents)
            repaired = len(intents)
            log.warning("recovered from an unfinished flush: %s", ", ".join(i.name for i in intents))
        self._clear_intent()
        return repaired

    def _recover_table(self) -> None:
        """The intent of a flush by an older version, which kept it in SQLite. Lock held."""
        rows = self.db.execute("SELECT * FROM intent").fetchall()
        if rows:
            self._cut_back([Intent(name, size, bool(created)) for name, size, created in rows])
            self.db.execute("DELETE FROM intent")
            log.warning("recovered from an unfinished flush: %s", ", ".join(name for name, _, _ in rows))

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
        self._flush_id = int.from_bytes(os.urandom(8)) >> 1  # > 0 (the committed id starts at 0)
        payload = orjson.dumps([self._flush_id, [[i.name, i.size_before, int(i.created)] for i in intents]])
        record = zlib.crc32(payload).to_bytes(4, "big") + payload
        written = os.pwrite(self._intent_fd, record, 0)
        if written != len(record):  # a short write (disk full): the flush fails, its caller rolls back
            raise OSError(f"the intent was written short ({written} of {len(record)} bytes)")
        if self.fsync:
            os.fsync(self._intent_fd)

    def commit(self, keys: list[tuple[str, bytes, bytes]]) -> None:
        """The flush's data is written: record its keys ``(key, digest, answer)`` with its flush
        id, in one transaction (the commit point of a flush with keys). :meth:`finish` comes
        next. Lock held."""
        self._commits += 1
        expire = self._commits % _EXPIRE_EVERY == 1
        if keys or expire:
            now = time.time()
            with self._transaction():
                if keys:
                    self.db.executemany("INSERT INTO keys VALUES (?, ?, ?, ?)", [(*key, now) for key in keys])
                    self.db.execute(
                        "UPDATE counts SET value = CASE name WHEN 'keys' THEN value + ? ELSE ? END "
                        "WHERE name IN ('keys', 'flush')",
                        (len(keys), self._flush_id),
                    )
                self.held = self.db.execute("SELECT value FROM counts WHERE name = 'keys'").fetchone()[0]
                if expire or self.held > self.max_keys:
                    self.held -= self._expire(now, self.held)

    def finish(self) -> None:
        """Empty the intent: the commit point of a flush without keys (one with keys is
        committed already: recovery keeps its files). Lock held."""
        self._clear_intent()

    def abandon(self) -> None:
        """Drop the intent of a flush whose files the caller has rolled back already. Lock held."""
        self._clear_intent()

    def _clear_intent(self) -> None:
        os.ftruncate(self._intent_fd, 0)
        if self.fsync:
            os.fsync(self._intent_fd)

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


def _parse_intent(record: bytes) -> tuple[int, list[Intent] | None]:
    """(flush id, intents) of an intent record; intents None when it is torn."""
    crc, payload = record[:4], record[4:]
    if len(record) < 4 or zlib.crc32(payload).to_bytes(4, "big") != crc:
        return 0, None
    flush_id, files = orjson.loads(payload)
    return flush_id, [Intent(name, size, bool(created)) for name, size, created in files]


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` (a file created in it) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

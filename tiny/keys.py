"""The idempotency keys, in SQLite (``.tiny/journal.sqlite3``), and their expiry.

Layout: table ``idempotency_keys (seq INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, digest,
answer, stored)``, one row per key in the order stored: the key's unique index finds it, and
``seq`` gives the oldest first and the number kept (newest seq - oldest seq + 1) without a
second index or a counter row (each would add a page to every commit: 30 µs of 90 in a flush
with one key). Table ``meta (name, value)``: ``data_dir_id``, ``journal_mode``, ``digest_key``
(the secret of :func:`tiny.commit.keyed_digest`), ``created``, ``sizes`` (the data dir tracks
committed sizes); in cluster mode ``cluster_id`` and ``cluster_digest_key``, the cluster the
data dir follows and that cluster's digest secret (tiny.cluster.binding). The database
runs in WAL mode, or in its rollback journal (``mode="delete"``) for writers on several
hosts, whose WAL would need shared memory; ``journal_size_limit`` brings the ``-wal`` back
to 4 MiB after each checkpoint.

Rules (every method but :meth:`KeyStore.close` expects the data dir's flush lock held by the
caller, tiny.flushlock, and one thread):

- A flush with keys decides them (:meth:`KeyStore.decide`: per key, the flush's first append
  decides), which opens one transaction and inserts each new key (``INSERT ... ON CONFLICT
  DO NOTHING``; a conflict means the key was stored before: its appends write nothing and are
  answered from its digest and answer); :meth:`KeyStore.commit` commits it after the flush's
  data (the commit point of a flush with keys), :meth:`KeyStore.rollback` drops it. A key
  stored past the window is deleted first, in a transaction of its own, and the claim starts
  again: so the first key a flush inserts had no row before, and recovery, finding it stored,
  knows the flush committed (tiny.intent). A flush without keys does not touch SQLite.
- A key counts for ``window`` seconds; at most ``max_keys`` are kept, the oldest going first.
  Expiry runs inside commits with keys and deletes at most twice the flush's own new keys plus
  :data:`EXPIRE_SLACK`, so no flush pays for a backlog.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

from tiny import layout, limits
from tiny.commit import Claim, Stored
from tiny.refusals import Found
from tiny.transaction import immediate

MODES = ("wal", "delete")
EXPIRE_SLACK = 8  # a commit with k new keys expires at most 2k + EXPIRE_SLACK old ones
WAL_LIMIT = 4 * 1024**2  # bytes the -wal is cut back to after a checkpoint (journal_size_limit)
_RECOUNT_EVERY = 64  # commits between two readings of the oldest key (other processes expire too)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotency_keys (
    seq INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, digest BLOB NOT NULL, answer BLOB NOT NULL, stored REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
"""
_TABLE = "idempotency_keys"
_INSERT = f"INSERT INTO {_TABLE} (key, digest, answer, stored) VALUES (?, ?, ?, ?) ON CONFLICT (key) DO NOTHING"
_SELECT = f"SELECT digest, answer, stored FROM {_TABLE} WHERE key = ?"
_OLDEST = f"SELECT seq, stored FROM {_TABLE} ORDER BY seq LIMIT 1"
_NEWEST = f"SELECT key, seq, stored FROM {_TABLE} ORDER BY seq DESC LIMIT 1"


class KeyStore:
    """The keys of the data dir whose journal database is at ``path``; see the module docstring."""

    def __init__(
        self,
        path: Path,
        *,
        fsync: bool = False,
        window: float = limits.IDEMPOTENCY_WINDOW,
        max_keys: int = limits.IDEMPOTENCY_MAX_KEYS,
        mode: str = "wal",
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"journal mode must be one of {MODES}")
        self.path = path
        self.fsync, self.window, self.max_keys, self.mode = fsync, window, max_keys, mode
        self.last: tuple[str, int, float] | None = None  # the newest key committed: (key, seq, stored)
        self.count = 0  # keys in the table at this process's last commit with keys (newest seq - oldest + 1)
        self.expired = 0  # keys this process's commits expired (for tests and bounds)
        self._db: sqlite3.Connection | None = None
        self._path = str(path)  # a str: joining Paths on the hot path cost more than the stat
        self._inode = 0  # the database file's, once opened: one replaced under a server stops its writes
        self._inserted = 0  # keys the open transaction inserted
        self._claimed: tuple[str, int] | None = None  # the last of them: (key, seq)
        self._commits = 0
        self._oldest: tuple[int, float] | None = None  # (seq, stored) of the oldest key, when last read

    @property
    def db(self) -> sqlite3.Connection:
        assert self._db is not None, "KeyStore: connect first"
        return self._db

    def connect_existing(self) -> dict[str, bytes]:
        """Open the existing database (never creating it); its meta rows ({}: none, not this
        format). Found when it cannot be read as a database."""
        try:
            self._db = _connect(self.path, create=False)
            self._configure()
            rows = self.db.execute("SELECT name, value FROM meta").fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return {}
            raise Found(f"the journal {self.path} cannot be read: {exc}") from None
        except sqlite3.DatabaseError as exc:
            raise Found(f"the journal {self.path} is damaged: {exc}") from None
        return {name: value if isinstance(value, bytes) else str(value).encode() for name, value in rows}

    def read_newest(self) -> None:
        """Note the newest key committed (:attr:`last`), as the database holds it."""
        newest = self.db.execute(_NEWEST).fetchone()
        self.last = (newest[0], newest[1], newest[2]) if newest else None

    def create(self, dir_id: str) -> bytes:
        """A new database for data dir ``dir_id``: its tables, its meta (a fresh digest
        secret, returned), checkpointed into the database file itself (the id then survives a
        ``-wal`` lost later, which the history check reports instead)."""
        self._db = _connect(self.path, create=True)
        self.db.execute(f"PRAGMA journal_mode={'WAL' if self.mode == 'wal' else 'DELETE'}")
        self._configure()
        secret = os.urandom(32)
        with immediate(self.db):
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self.db.execute(statement)
            self.db.execute("DELETE FROM meta")
            self.db.executemany(
                "INSERT INTO meta (name, value) VALUES (?, ?)",
                [
                    ("data_dir_id", dir_id.encode()),
                    ("journal_mode", self.mode.encode()),
                    ("digest_key", secret),
                    ("created", datetime.now(UTC).isoformat().encode()),
                    ("sizes", b"1"),
                ],
            )
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.last = None
        return secret

    def meta(self, name: str) -> bytes | None:
        """The value of the meta row ``name``, or None."""
        row = self.db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return None if row is None else bytes(row[0])

    def set_meta(self, name: str, value: bytes) -> None:
        with immediate(self.db):
            self.db.execute("INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", (name, value))

    def _configure(self) -> None:
        self.db.execute(f"PRAGMA synchronous={'FULL' if self.fsync else 'NORMAL'}")
        self.db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT}")

    def close(self) -> None:
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            self._db = None
        self._inode = 0

    def note_file(self) -> None:
        """Remember the database file's inode (:meth:`check_file` compares)."""
        self._inode = os.stat(self.path).st_ino

    def check_file(self) -> None:
        """Found unless the database's path still has the inode noted (one stat)."""
        if not self._inode:  # opening: not known yet
            return
        try:
            found = os.stat(self._path).st_ino
        except FileNotFoundError:
            raise Found(f"{self._path} was deleted while the server ran; its writes stop until it is back") from None
        if found != self._inode:
            raise Found(f"{self._path} was replaced while the server ran; its writes stop until the original is back")

    def is_stored(self, key: str) -> bool:
        return self.db.execute(_SELECT, (key,)).fetchone() is not None

    def decide(self, claims: Sequence[Claim | None]) -> tuple[list[Stored | None], str | None]:
        """What each append of a flush does, by its claim (None: no key), and the first key the
        flush stores (None: none). ``decisions[i]`` None: append i writes; a Stored: it is
        answered from that digest and answer and writes nothing (its key was stored before, or
        an earlier append of this flush has it). Claims the new keys (:meth:`claim`)."""
        deciding: dict[str, Stored] = {}
        distinct: list[Claim] = []
        for claim in claims:
            if claim is not None and claim.key not in deciding:
                deciding[claim.key] = Stored(claim.digest, claim.answer)
                distinct.append(claim)
        stored_before = self.claim(distinct)
        decisions: list[Stored | None] = []
        writing: set[str] = set()
        first_key = None
        for claim in claims:
            if claim is None:
                decisions.append(None)
            elif claim.key in stored_before:
                decisions.append(stored_before[claim.key])
            elif claim.key in writing:  # an earlier append of this flush decided it
                decisions.append(deciding[claim.key])
            else:
                writing.add(claim.key)
                first_key = first_key or claim.key
                decisions.append(None)
        return decisions, first_key

    def claim(self, claims: list[Claim]) -> dict[str, Stored]:
        """Open the flush's transaction and insert each of ``claims`` (distinct keys) that is
        not stored; returns those stored within the window, with their digest and answer. No
        claims: nothing. One statement per key, found or not (the usual flush has one new key)."""
        if not claims:
            return {}
        while True:
            self.db.execute("BEGIN IMMEDIATE")
            stored_before: dict[str, Stored] = {}
            expired: list[tuple[str]] = []
            inserted = 0
            oldest = (now := time.time()) - self.window
            try:
                for claim in claims:
                    cursor = self.db.execute(_INSERT, (claim.key, claim.digest, claim.answer, now))
                    if cursor.rowcount == 1:
                        inserted += 1
                        self._claimed = (claim.key, cursor.lastrowid or 0)
                        continue
                    digest, answer, stored = self.db.execute(_SELECT, (claim.key,)).fetchone()
                    if stored < oldest:
                        expired.append((claim.key,))
                    else:
                        stored_before[claim.key] = Stored(digest, answer)
            except BaseException:
                self.rollback()
                raise
            if not expired:
                self._inserted = inserted
                return stored_before
            self.rollback()
            with immediate(self.db):
                self.db.executemany(f"DELETE FROM {_TABLE} WHERE key = ?", expired)

    def rollback(self) -> None:
        """Drop the keys the open transaction inserted (a flush that failed)."""
        self._inserted = 0
        if self._db is not None and self._db.in_transaction:  # not when SQLite rolled back by itself
            self._db.execute("ROLLBACK")

    def commit(self) -> None:
        """Commit the keys :meth:`claim` inserted (the commit point of a flush with keys),
        expiring at most twice as many old keys plus EXPIRE_SLACK first. No transaction: nothing."""
        if self._db is None or not self._db.in_transaction:
            return
        inserted, self._inserted = self._inserted, 0
        try:
            if inserted and self._claimed is not None:
                self._commits += 1
                newest = self._claimed[1]
                self._expire(newest, before=newest - inserted + 1, limit=2 * inserted + EXPIRE_SLACK)
            self.db.execute("COMMIT")
        except BaseException:
            self.rollback()
            raise
        if inserted and self._claimed is not None:
            self.last = (self._claimed[0], self._claimed[1], time.time())

    def _expire(self, newest: int, before: int, limit: int) -> None:
        """Update ``count`` and expire old keys if any are due, at most ``limit`` of them, all
        older than seq ``before`` (the keys of the flush being committed stay). In the
        caller's transaction."""
        if self._oldest is None or self._commits % _RECOUNT_EVERY == 0 or newest < self._oldest[0]:
            # unknown, or stale: other processes expire keys too, and seq starts at 1 again
            # once the table is empty
            row = self.db.execute(_OLDEST).fetchone()
            self._oldest = (row[0], row[1]) if row else (before, time.time())
        self.count = newest - self._oldest[0] + 1
        now = time.time()
        if self.count <= self.max_keys and self._oldest[1] >= now - self.window:
            return  # nothing is due: no query
        rows = self.db.execute(
            f"SELECT seq, stored FROM {_TABLE} WHERE seq < ? ORDER BY seq LIMIT ?", (before, limit + 1)
        ).fetchall()
        cutoff, excess = now - self.window, self.count - self.max_keys
        due = 0
        for _, stored in rows[:limit]:
            if stored >= cutoff and due >= excess:
                break
            due += 1
        if due:
            self.db.execute(f"DELETE FROM {_TABLE} WHERE seq <= ?", (rows[due - 1][0],))
            self.expired += due
        self._oldest = (rows[due][0], rows[due][1]) if due < len(rows) else (before, now)
        self.count = newest - self._oldest[0] + 1


def stored_mode(data_dir: Path) -> str | None:
    """The journal mode recorded in ``data_dir``'s journal, or None (no journal of this version)."""
    path = layout.journal_path(data_dir)
    if not path.exists():
        return None
    try:
        db = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
        try:
            row = db.execute("SELECT value FROM meta WHERE name = 'journal_mode'").fetchone()
        finally:
            db.close()
    except sqlite3.Error:
        return None
    return bytes(row[0]).decode() if row else None


def _connect(path: Path, create: bool) -> sqlite3.Connection:
    # isolation_level=None: transactions are explicit (BEGIN ... COMMIT), nothing implicit.
    # mode=rw never creates the file: a journal that should exist and does not is noticed.
    uri = f"file:{quote(str(path))}?mode={'rwc' if create else 'rw'}"
    return sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)

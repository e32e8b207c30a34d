"""The journal's meta (``.tiny/journal.sqlite3``): the data dir's id, mode and digest secret in SQLite.

Layout: one SQLite database, table ``meta (name TEXT PRIMARY KEY, value BLOB)`` WITHOUT ROWID,
rows ``data_dir_id``, ``journal_mode``, ``digest_key`` (the secret of
:func:`tiny.commit.keyed_digest`), ``created``, ``sizes`` (the data dir tracks committed sizes);
``key_bounds`` (the keys' window and bound every server on the data dir keeps, once a server
has opened it: :func:`bounds_text`); in cluster mode ``cluster_id`` and ``cluster_digest_key``
(tiny.cluster.binding). It runs in WAL
mode (its ``-wal`` cut back to :data:`WAL_LIMIT` after a checkpoint), or in its rollback journal
(``mode="delete"``) for writers on several hosts. A database of the previous format also holds
a table ``idempotency_keys``, which tiny.keyload copies into the key log once.

Locking: every write is one ``BEGIN IMMEDIATE`` transaction (tiny.transaction), taken with the
data dir's flush lock held by the caller (tiny.flushlock), so SQLite's own lock never waits;
one thread at a time. :func:`stored_mode` reads without any lock (read-only, for tiny-admin).
The database file's inode is noted at opening: :meth:`JournalMeta.check_file` (one ``stat``
per flush) stops writes to a database replaced or deleted under a running server.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

from tiny import layout
from tiny.commit.errors import Refused
from tiny.refusals import Found
from tiny.transaction import immediate

MODES = ("wal", "delete")
WAL_LIMIT = 4 * 1024**2  # bytes the -wal is cut back to after a checkpoint (journal_size_limit)
_SCHEMA = "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID"


def bounds_text(window: float, max_keys: int) -> bytes:
    """The ``key_bounds`` row of a window of ``window`` seconds and a bound of ``max_keys`` keys."""
    return f"{float(window)!r} {int(max_keys)}".encode()


def bounds_of(text: bytes) -> tuple[float, int]:
    """The window and bound of a ``key_bounds`` row (ValueError: not one)."""
    window, max_keys = text.decode().split()
    return float(window), int(max_keys)


def described(text: bytes) -> str:
    """A ``key_bounds`` row in words: "86400 s and at most 10,000,000" (ValueError: not one)."""
    window, max_keys = bounds_of(text)
    return f"{seconds_text(window)} s and at most {max_keys:,}"


def seconds_text(window: float) -> str:
    """``window`` as a flag takes it back exactly: ``86400``, ``0.5``, ``1234567`` (never ``1.23457e+06``)."""
    short = f"{window:g}"
    return short if float(short) == window else repr(float(window))


class JournalMeta:
    """The meta database at ``path``; see the module docstring."""

    def __init__(self, path: Path, *, fsync: bool = False, mode: str = "wal") -> None:
        if mode not in MODES:
            raise ValueError(f"journal mode must be one of {MODES}")
        self.path = path
        self.fsync, self.mode = fsync, mode
        self._db: sqlite3.Connection | None = None
        self._path = str(path)  # a str: joining Paths on the hot path cost more than the stat
        self._inode = 0  # the database file's, once opened: one replaced under a server stops its writes

    @property
    def db(self) -> sqlite3.Connection:
        assert self._db is not None, "JournalMeta: connect first"
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
            if getattr(exc, "sqlite_errorname", "").startswith(_NOT_THE_FILES):
                # The disk, a permission, another process: nothing a fresh journal would mend
                # (--new-journal moved .tiny aside and failed the same way, its keys forgotten).
                raise Refused(f"the journal {self.path} cannot be opened: {exc}{_room(self.path)}") from None
            raise Found(f"the journal {self.path} cannot be read: {exc}") from None
        except sqlite3.DatabaseError as exc:
            raise Found(f"the journal {self.path} is damaged: {exc}") from None
        return {name: value if isinstance(value, bytes) else str(value).encode() for name, value in rows}

    def read_newest(self) -> None:
        """(The previous format's history check reads the newest key from the log itself: :meth:`is_stored`.)"""

    def create(self, dir_id: str) -> bytes:
        """A new database for data dir ``dir_id``: its meta (a fresh digest secret, returned),
        checkpointed into the database file itself (the id then survives a ``-wal`` lost
        later). The key log starts empty."""
        self._db = _connect(self.path, create=True)
        self.db.execute(f"PRAGMA journal_mode={'WAL' if self.mode == 'wal' else 'DELETE'}")
        self._configure()
        secret = os.urandom(32)
        with immediate(self.db):
            self.db.execute(_SCHEMA)
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
        """Close the database (its inode is forgotten)."""
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


# SQLite's errors that say the journal could not be opened or written now, not that it is damaged.
_NOT_THE_FILES = (
    "SQLITE_IOERR",
    "SQLITE_FULL",
    "SQLITE_CANTOPEN",
    "SQLITE_READONLY",
    "SQLITE_BUSY",
    "SQLITE_NOMEM",
    "SQLITE_PERM",
)
_LOW_ROOM = 1024**2  # bytes free below which a failed opening is said to be the disk's


def _room(path: Path) -> str:
    """What to add to a failed opening's message when the file system holding ``path`` is full."""
    try:
        room = os.statvfs(path.parent)
    except OSError:
        return ""
    free = room.f_bavail * room.f_frsize
    if free >= _LOW_ROOM:
        return ""
    return (
        f"; the file system holding it has {free:,} bytes free: free some space, then start again (the journal is kept)"
    )


def missing_journal(data_dir: Path) -> str | None:
    """Why ``data_dir`` has no journal an operator's command can use (none at all, or one that
    cannot be read), or None when :func:`stored_mode` reads one."""
    if stored_mode(data_dir) is not None:
        return None
    path = layout.journal_path(data_dir)
    if path.exists():
        return (
            f"the journal {path} cannot be read (damaged, or of an earlier version: a server of this version "
            "says which when it starts)"
        )
    return f"{data_dir} has no journal of this version: no server has run on it"


def _connect(path: Path, create: bool) -> sqlite3.Connection:
    # isolation_level=None: transactions are explicit (BEGIN ... COMMIT), nothing implicit.
    # mode=rw never creates the file: a journal that should exist and does not is noticed.
    uri = f"file:{quote(str(path))}?mode={'rwc' if create else 'rw'}"
    return sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)

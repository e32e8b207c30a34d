"""The data dir's journal: its identity, the flush lock, the intent of the flush under way, and the idempotency keys.

Every writer of a data dir (every worker of every server and container sharing it) takes
the flush lock for the whole of a flush, waiting at most ``lock_timeout`` seconds for it
(:class:`LockTimeout` names the holder then): an exclusive ``flock`` on ``.tiny/lock``
(tiny.layout), whose holder writes its record there (pid, host, time) as soon as it holds it,
whatever it does under it; then one on ``.tiny/intent``, the fence of the flush under way: a
writer that still holds its intent after the lock file was replaced under it (a process or
container paused mid-flush) keeps every other writer from opening, recovering or overwriting
that flush until it ends. Right before its commit point a flush checks (:meth:`Journal.confirm`)
that both files are still linked, that the intent still holds its own record (a token no other
flush writes), and that its files are exactly as long as it left them; otherwise it is not
committed (:class:`LockLost`). Each writer keeps:

- ``.tiny/intent``: the flush under way, written *before* the first byte of data: the files
  it appends to, each with its size before and after the flush's own write and whether the
  flush created it; the first of the keys it records (if any); and the newest key committed
  before it (``last``); as one record ``b"I"``, length, CRC-32, payload (one ``pwrite`` at
  offset 0; with fsync, synced before the data). The record's first byte then says how the
  flush ended: ``b"-"`` committed, ``b"x"`` undone (a 1-byte ``pwrite``, which cannot tear).
  A crash at any point of a flush (kill -9, a power loss with ``--durability fsync``) leaves
  the intent live, and the next writer to take the lock (:meth:`Journal.recover`) cuts every
  file back to exactly its size before, removes the files the flush created, and marks the
  intent undone: the flush's rows and keys are then both absent, and a retry writes them
  once. Recovery cuts only what it knows the flush wrote: a file found longer than the
  flush's own end, or shorter than its start, was changed by someone else (a data dir copied
  while a server wrote to it, a file cut by hand), and recovery refuses (:class:`JournalError`)
  instead of guessing. An intent whose CRC does not match was torn while being written,
  before any data: it is dropped.
- ``.tiny/journal.sqlite3`` (SQLite, WAL mode, or its rollback journal with
  ``mode="delete"`` for writers on several hosts, whose WAL would need shared memory): table
  ``idempotency_keys``, per Idempotency-Key in the order stored (``seq``), the digest of the
  body it came with (:meth:`Journal.digest`: 128 bits of BLAKE3 keyed with a secret of this
  journal) and the answer that was sent; table ``meta``, the data dir's id, the journal
  mode and the digest secret. A flush with keys claims them in one transaction
  (:meth:`Journal.claim`: one ``INSERT ... ON CONFLICT DO NOTHING`` per key, a conflict
  meaning "held") before its intent and data, and commits it after the data (its commit
  point), before it marks the intent; recovery, finding the intent's first key stored,
  keeps the files (that key had no row when the flush began, under the same lock, and only
  that flush's commit stores it). A flush without keys does not touch SQLite; its commit
  point is the ``b"-"`` mark. A key counts for ``window`` seconds; at most ``max_keys`` are
  kept, the oldest going first. Expiry runs at commits with keys and deletes at most twice
  the flush's own keys plus 8 (:data:`EXPIRE_SLACK`) at a time, so no flush pays for a
  backlog; SQLite's ``journal_size_limit`` brings the ``-wal`` back to 4 MiB after each
  checkpoint.
- ``.tiny/sizes`` (tiny.committed_sizes): per file any flush appended to, the size it was
  committed up to, recorded after each commit point. A file shorter than that has lost
  acknowledged rows: :meth:`Journal.open` checks every file, and each flush its own files
  before it writes (:meth:`Journal.intend`: one pread per file, against the size it fstat'ed);
  both refuse (JournalError naming the file and the bytes missing).
- ``.tiny-id`` (beside ``.tiny/``), the first line of ``.tiny/lock`` and the journal's
  ``meta`` hold the same random id. :meth:`Journal.open` refuses a journal, lock or intent
  file that is missing, empty, damaged or holds another id, a journal in another mode than
  asked, a journal that lacks the newest key an intent says was committed (its ``-wal``
  deleted, or restored from an older copy), and files shorter than the last committed flush
  left them or than their committed sizes: with a :class:`JournalError` that says what was
  found and that
  ``--new-journal`` (``accept_new``) starts a fresh journal knowingly. Every flush checks
  that the lock and intent files are still linked (an fstat each) and that the journal's path
  still has the inode it opened (a stat): one replaced or deleted while the server runs stops
  its writes (JournalError) until it is put back.

With ``fsync``, the intent reaches the disk before the data is written, the data and new
directory entries before the keys' commit (synchronous=FULL), and that before the intent's
mark; so the same holds across a power loss. Without, every step is written (WAL,
synchronous=NORMAL), which a killed process cannot lose.

Not thread-safe: a :class:`Journal` belongs to one sink thread of one process, except
:attr:`Journal.waiting_since` and :meth:`Journal.digest`, which any thread may read or call.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import sqlite3
import time
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

import orjson
from blake3 import blake3

from tiny import layout, limits
from tiny.committed_sizes import SizeTable, SizeTableError
from tiny.transaction import immediate

log = logging.getLogger("tiny.journal")

MODES = ("wal", "delete")
DIGEST_BYTES = 16  # 128 bits of keyed BLAKE3: no collision can be forged without the journal's secret
EXPIRE_SLACK = 8  # a commit with k new keys expires at most 2k + EXPIRE_SLACK old ones
NEW_JOURNAL_FLAG = "--new-journal"
WAL_LIMIT = 4 * 1024**2  # bytes the -wal is cut back to after a checkpoint (journal_size_limit)
_ACCEPT = (
    f"If that is known and wanted, stop every server on this data dir and start one with {NEW_JOURNAL_FLAG}: "
    "it moves .tiny aside and starts a fresh journal (its keys are then forgotten: a batch retried with "
    "an earlier Idempotency-Key is written again)"
)

# One row per key, in the order stored (seq): the key's own index finds it, and seq gives the
# oldest first and the count (last seq - first seq + 1) without a second index or a counter row
# to update (each would add a page to every commit: 30 µs of 90 in a flush with one key).
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
_LIVE, _FINISHED, _UNDONE = b"I", b"-", b"x"  # the intent's first byte: under way, committed, undone
_RECOUNT_EVERY = 64  # commits between two readings of the oldest key (``held``; others expire too)
_HOLDER_AT = 64  # the lock file: the data dir's id on its first line, the holder's record from here
_HOLDER_BYTES = 128  # the holder's record: "pid host time", padded, one pwrite
_POLL_FIRST, _POLL_MAX = 0.0002, 0.002  # seconds between two tries of a busy lock, doubling
_UNLOCKED_INTENT_BYTES = 1 << 16  # an intent longer than this is read under the lock
_CLOCK_SLACK = 3600.0  # seconds of clock difference between hosts the history check tolerates


class JournalError(Exception):
    """The journal, its lock or its files cannot be used as found. The message says what was
    found, where, and what to do; it is meant for the operator and for the client's 503."""


class LockTimeout(JournalError):
    """Another writer held the data dir's flush lock longer than ``lock_timeout``."""


class LockLost(JournalError):
    """At its commit point a flush found that what it locked and wrote is no longer what the
    data dir has (the lock or intent file replaced, its intent overwritten, a file of it cut or
    written by someone else): it was not committed, and its files and intent are left as they
    are for the next recovery, which holds the data dir's real lock."""


@dataclass(frozen=True, slots=True)
class Claim:
    """What a request with an Idempotency-Key asks the journal to record with its rows."""

    key: str
    digest: bytes  # Journal.digest of the decompressed body
    answer: bytes  # the 200 answer to replay


@dataclass(frozen=True, slots=True)
class Stored:
    """What the journal holds for a key: the digest of its body and the answer it got."""

    digest: bytes
    answer: bytes


@dataclass(frozen=True, slots=True)
class Intent:
    """One file a flush is about to append to, as the journal records it first."""

    name: str  # relative to the data dir
    size_before: int
    size_after: int  # size_before + the bytes this flush writes (None: an intent of an older format)
    created: bool  # the flush created the file: a roll-back removes it


class Flush:
    """One flush's exactly-once decisions, from :meth:`Journal.begin` (the lock held).

    ``decisions[i]`` says what append i of the flush does: None, write its rows; or the
    :class:`Stored` digest and answer it is answered from, writing nothing (its key was stored
    before, or an earlier append of this flush has it: per key, the first append decides).
    ``first_key`` is the first key the flush stores: the key that makes it committed (None: the
    intent's mark does). The flush then goes :meth:`intend` (before the data), :meth:`commit`
    (after it) and :meth:`finish`; :meth:`abort` undoes the keys of one that failed before
    its commit.
    """

    __slots__ = ("_journal", "decisions", "first_key", "intended")

    def __init__(self, journal: Journal, decisions: list[Stored | None], first_key: str | None) -> None:
        self._journal = journal
        self.decisions = decisions
        self.first_key = first_key
        self.intended = False  # the intent is written: the flush's mark is its to set

    def intend(self, intents: list[Intent]) -> None:
        """Record the files the flush appends to (sizes before and after), before the data."""
        self._journal.intend(intents, self.first_key)
        self.intended = True

    def confirm(self, files: Sequence[tuple[int, Intent]]) -> None:
        """Right before the commit point: :class:`LockLost` unless the lock, the intent and the
        files (descriptor, intent) are still as this flush left them (:meth:`Journal.confirm`)."""
        if self.intended:
            self._journal.confirm(files)

    def commit(self) -> None:
        """The data is written: store the flush's keys (the commit point of a flush with keys)."""
        self._journal.commit()

    def finish(self) -> bool:
        """Mark the intent committed (the commit point of a flush without keys). True when
        marked; False when the mark failed after the keys' commit (the flush is committed all
        the same: the next recovery finds its first key and keeps its rows). Raises OSError when
        the mark failed and was the commit point: the caller cuts the files back."""
        if not self.intended:
            return True
        try:
            self._journal.finish()
        except OSError as exc:
            if self.first_key is None:
                raise
            log.error("could not mark a committed flush (the next flush will): %s", exc)
            return False
        return True

    def abort(self) -> None:
        """The flush failed before its commit point: drop the keys it claimed."""
        self._journal.rollback()

    def abandon(self) -> None:
        """The caller cut the flush's files back: mark its intent undone."""
        if self.intended:
            self._journal.abandon()


class _Held:
    """The flush lock, held: released on leaving the ``with`` block (see :meth:`Journal.locked`):
    the intent file's flock first, then the lock file's (so that whoever gets the lock file's
    next finds the intent's free). The journal's current descriptors are released: opening may
    replace them (a fresh journal) while the lock is held."""

    __slots__ = ("_journal",)

    def __init__(self, journal: Journal) -> None:
        self._journal = journal

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self._journal._release()


class _Found(JournalError):
    """Something found wrong that a fresh journal (``accept_new``) would replace; the message
    ends with how to accept that."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what}. {_ACCEPT}.")
        self.what = what


class Journal:
    """The journal of ``data_dir``; see the module docstring. Open it with :meth:`open`."""

    def __init__(
        self,
        data_dir: Path,
        *,
        fsync: bool = False,
        window: float = limits.IDEMPOTENCY_WINDOW,
        max_keys: int = limits.IDEMPOTENCY_MAX_KEYS,
        mode: str = "wal",
        lock_timeout: float = limits.LOCK_TIMEOUT,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"journal mode must be one of {MODES}")
        self.data_dir = Path(data_dir)
        self.fsync = fsync
        self.mode = mode
        self.window = window
        self.max_keys = max_keys
        self.lock_timeout = lock_timeout
        self.dir_id: str | None = None  # the data dir's id, once open; a reopening must find the same
        self.digest_key: bytes | None = None  # the journal's secret for digest(); None until open
        self.last: tuple[str, int, float] | None = None  # the newest key committed: (key, seq, stored)
        self.held = 0  # keys in the journal at this process's last commit (newest seq - oldest seq + 1)
        self.expired = 0  # keys this process's commits expired (for tests and bounds)
        self.waiting_since = 0.0  # time.monotonic() since this process waits for the lock; 0 when not
        self.waiting_for = ""  # while it waits: who holds the lock (refreshed twice a second)
        self.give_up_at = float("inf")  # time.monotonic() past which no wait for the lock goes on (a stop)
        self._db: sqlite3.Connection | None = None
        self._lock_fd = -1
        self._intent_fd = -1
        self._journal_inode = 0
        self._journal_file = str(layout.journal_path(self.data_dir))
        self._lock_file = str(layout.lock_path(self.data_dir))
        self._intent_file = str(layout.intent_path(self.data_dir))
        self._record = b""  # the intent record of this process's flush under way (confirm() compares)
        self._intents: list[Intent] = []  # its files (finish() records their sizes after it)
        self._token = ""  # this journal's opening, in every intent it writes: no two flushes write the same record
        self._intents_written = 0
        self._sizes: SizeTable | None = None  # the files' committed sizes (tiny.committed_sizes)
        self._opening_deadline = 0.0  # time.monotonic() past which open() waits for no lock
        self._host = socket.gethostname()
        self._inserted = 0  # keys claim() inserted in the open transaction
        self._claimed: tuple[str, int] | None = None  # the last of them: (key, seq)
        self._commits = 0
        self._oldest: tuple[int, float] | None = None  # (seq, stored) of the oldest key, when last read

    # -- opening ---------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self._db is not None

    def open(self, accept_new: bool = False) -> None:
        """Attach to the data dir's journal, creating it in a data dir that has none.

        Raises :class:`JournalError` (naming the path and what was found) when the journal,
        lock or intent file is missing, damaged, replaced or from another data dir, when the
        journal lacks commits that its intent vouches for, when a file is shorter than the
        last committed flush left it, or when an unfinished flush cannot be undone safely.
        ``accept_new`` moves such a ``.tiny`` aside and starts a fresh journal instead. A
        journal in another mode is refused either way. On any failure nothing stays open.
        """
        if self._db is not None:
            return
        try:
            state = layout.state_dir(self.data_dir)
            try:
                state.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise JournalError(f"cannot create the journal's folder {state}: {exc.strerror or exc}") from None
            self._lock_fd = _open_fd(layout.lock_path(self.data_dir), os.O_RDWR | os.O_CREAT)
            self._opening_deadline = time.monotonic() + self.lock_timeout
            with self._locked_unchecked(self.lock_timeout):
                try:
                    self._attach()
                    self.recover()
                except _Found as found:
                    self._close_files()
                    if not accept_new:
                        raise
                    self._start_fresh(found.what)
                self._journal_inode = os.stat(layout.journal_path(self.data_dir)).st_ino
                self._token = f"{os.getpid()}-{os.urandom(6).hex()}"
        except sqlite3.Error as exc:
            self.close()
            raise JournalError(f"the journal {layout.journal_path(self.data_dir)} cannot be used: {exc}") from None
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close every file and the database (also after a failed :meth:`open`)."""
        self._close_files()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
        self._journal_inode = 0

    def _close_files(self) -> None:
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            self._db = None
        if self._intent_fd >= 0:
            os.close(self._intent_fd)
            self._intent_fd = -1
        if self._sizes is not None:
            self._sizes.close()
            self._sizes = None

    def _attach(self) -> None:
        """Open the existing journal after checking its identity, or create the first one (lock held)."""
        identity_path = layout.identity_path(self.data_dir)
        journal_path = layout.journal_path(self.data_dir)
        intent_path = layout.intent_path(self.data_dir)
        identity = _read_identity(identity_path)
        pending = _read_identity(_pending(identity_path))
        if identity is None and self.dir_id is not None:
            raise _Found(f"{identity_path} is gone while this server used the data dir (its id was {self.dir_id})")
        if identity is None:
            if not journal_path.exists():
                if pending is None and intent_path.exists():
                    raise _Found(f"the journal {journal_path} is missing, but {intent_path} is there")
                self._init(pending or uuid.uuid4().hex)  # a new data dir, or an interrupted first start
                return
            meta = self._connect_meta(journal_path)
            if pending is not None and meta.get("data_dir_id") == pending.encode():
                self._close_files()
                self._init(pending)  # the first start was interrupted after the journal was made
                return
            if "data_dir_id" not in meta:
                raise _Found(
                    f"the journal {journal_path} is of an earlier format (it has no data dir id) or empty, "
                    f"and {identity_path} is missing"
                )
            raise _Found(
                f"{identity_path} is missing, but the journal {journal_path} belongs to data dir "
                f"{meta['data_dir_id'].decode()}"
            )
        if self.dir_id is not None and identity != self.dir_id:
            raise _Found(f"{identity_path} now holds {identity}, but this server used the data dir as {self.dir_id}")
        if not journal_path.exists():
            raise _Found(f"the journal {journal_path} of data dir {identity} is missing")
        meta = self._connect_meta(journal_path)
        if "data_dir_id" not in meta:
            raise _Found(f"the journal {journal_path} holds no data dir id: it is empty, truncated or replaced")
        if meta["data_dir_id"].decode() != identity:
            raise _Found(
                f"the journal {journal_path} belongs to data dir {meta['data_dir_id'].decode()}, "
                f"but this data dir is {identity}"
            )
        lock_id = _lock_id(self._lock_fd)
        if lock_id != identity:
            raise _Found(
                f"the lock file {layout.lock_path(self.data_dir)} was deleted or replaced "
                f"(it holds {lock_id or 'no id'}, the data dir is {identity}): a server still running "
                "may hold the old one"
            )
        try:
            self._intent_fd = _open_fd(intent_path, os.O_RDWR)
        except JournalError:
            raise _Found(f"the intent file {intent_path} is missing: an unfinished flush may not be undone") from None
        self._acquire(self._intent_fd, self._opening_deadline, fence=True)
        mode = meta.get("journal_mode", b"").decode()
        if mode != self.mode:
            self._close_files()
            raise JournalError(
                f"the journal {journal_path} is in {mode!r} mode, and this server was started with "
                f"--journal-mode {self.mode}: every server on a data dir must use the same mode. To change "
                f"it, stop every server on {self.data_dir}, then run: tiny-admin set-journal-mode "
                f"{self.data_dir} {self.mode}"
            )
        self.dir_id = identity
        self.digest_key = bytes(meta["digest_key"])
        newest = self.db.execute(_NEWEST).fetchone()
        self.last = (newest[0], newest[1], newest[2]) if newest else None
        committed = self._check_history(intent_path)
        self._open_sizes(identity, tracked="sizes" in meta)
        self._check_sizes(committed)

    def _connect_meta(self, journal_path: Path) -> dict[str, bytes]:
        """Open the existing database (never creating it); its meta rows (none: not our format)."""
        try:
            self._db = _connect(journal_path, create=False)
            self._configure()
            rows = self.db.execute("SELECT name, value FROM meta").fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return {}
            raise _Found(f"the journal {journal_path} cannot be read: {exc}") from None
        except sqlite3.DatabaseError as exc:
            raise _Found(f"the journal {journal_path} is damaged: {exc}") from None
        return {name: value if isinstance(value, bytes) else str(value).encode() for name, value in rows}

    def _configure(self) -> None:
        self.db.execute(f"PRAGMA synchronous={'FULL' if self.fsync else 'NORMAL'}")
        self.db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT}")

    def _init(self, dir_id: str) -> None:
        """Create the journal, intent and lock id of data dir ``dir_id`` (lock held). The id
        file is written first as ``.tiny-id.new`` and renamed last: an interrupted first start
        is finished by the next one."""
        identity_path = layout.identity_path(self.data_dir)
        write_durably(_pending(identity_path), dir_id.encode() + b"\n")
        journal_path = layout.journal_path(self.data_dir)
        self._db = _connect(journal_path, create=True)
        self.db.execute(f"PRAGMA journal_mode={'WAL' if self.mode == 'wal' else 'DELETE'}")
        self._configure()
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
                    ("digest_key", os.urandom(32)),
                    ("created", datetime.now(UTC).isoformat().encode()),
                    ("sizes", b"1"),
                ],
            )
        # Into the database file itself: the id then survives a -wal lost later, which the
        # history check (the newest key an intent vouches for) reports instead.
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self._intent_fd = _open_fd(layout.intent_path(self.data_dir), os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        fcntl.flock(self._intent_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new: nobody else holds it
        self._sizes = SizeTable.create(str(layout.sizes_path(self.data_dir)), dir_id)
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, dir_id.encode().ljust(_HOLDER_AT - 1) + b"\n", 0)
        self._write_holder()
        if self.fsync:
            os.fsync(self._intent_fd)
            os.fsync(self._lock_fd)
        fsync_dir(layout.state_dir(self.data_dir))
        os.replace(_pending(identity_path), identity_path)
        fsync_dir(self.data_dir)
        self.dir_id = dir_id
        self.digest_key = bytes(self.db.execute("SELECT value FROM meta WHERE name = 'digest_key'").fetchone()[0])
        self.last = None
        log.info("created the journal of data dir %s in %s", dir_id, layout.state_dir(self.data_dir))

    def _start_fresh(self, reason: str) -> None:
        """accept_new: move ``.tiny`` aside and create a fresh journal (lock held, on the old
        lock file, which moves with it). An unfinished flush it records is undone where that
        is safe: a flush without keys, or a write that did not complete; rows that may have
        been acknowledged are kept."""
        state = layout.state_dir(self.data_dir)
        log.warning("%s: starting a fresh journal, as %s asks (%s)", reason, NEW_JOURNAL_FLAG, state)
        self._undo_orphan_intent(layout.intent_path(self.data_dir))
        aside = state.with_name(f"{state.name}.replaced-{datetime.now(UTC):%Y%m%dT%H%M%S.%fZ}")
        os.rename(state, aside)
        log.warning("the old journal's folder is kept as %s", aside)
        state.mkdir()
        old_lock = self._lock_fd
        self._lock_fd = _open_fd(layout.lock_path(self.data_dir), os.O_RDWR | os.O_CREAT)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)  # new and ours: nobody else can know it yet
        os.close(old_lock)  # releases the old one
        self._write_holder()
        identity = _read_identity(layout.identity_path(self.data_dir))
        self.dir_id = None
        self._init(identity or uuid.uuid4().hex)

    def _undo_orphan_intent(self, intent_path: Path) -> None:
        try:
            record = intent_path.read_bytes()
        except OSError:
            return
        if record[:1] != _LIVE or (parsed := _parse_intent(record)) is None:
            return
        first_key, intents, _ = parsed
        complete = all(i.size_after is not None and _size(self.data_dir / i.name) >= i.size_after for i in intents)
        if first_key is not None and complete:
            log.warning("kept the rows of an unfinished flush with keys: it may have been acknowledged")
            return
        self._cut_back(intents)
        log.warning("undid an unfinished flush: %s", ", ".join(i.name for i in intents))

    def _check_history(self, intent_path: Path) -> list[Intent]:
        """The journal holds what the intent vouches for, and the files hold what the last
        committed flush wrote; _Found otherwise (see :meth:`open`). Returns the files of that
        flush when it is known committed (their sizes after it are committed sizes)."""
        record = os.pread(self._intent_fd, 1 << 24, 0)
        parsed = _parse_intent(record) if record else None
        if parsed is None:
            return []
        first_key, intents, last = parsed
        if last is not None:
            key, seq, stored = last
            newest = self.last[1] if self.last else 0
            if not self._stored(key) and newest < seq and stored > time.time() - self.window + _CLOCK_SLACK:
                raise _Found(
                    f"the journal {layout.journal_path(self.data_dir)} lacks the key {key!r} (seq {seq}) that "
                    f"{intent_path} says was committed at {datetime.fromtimestamp(stored, UTC):%Y-%m-%d %H:%M:%S} "
                    "UTC: it lost commits (its -wal deleted, or the journal restored from an older copy)"
                )
        if record[:1] != _FINISHED or (first_key is not None and not self._stored(first_key)):
            return []
        for intent in intents:
            size = _size(self.data_dir / intent.name)
            if intent.size_after is not None and size < intent.size_after:
                raise _Found(
                    f"{self.data_dir / intent.name} is {max(size, 0)} bytes, shorter than the "
                    f"{intent.size_after} the last committed flush left (per {intent_path}): the files are "
                    "older than the journal (restored, or copied while a server wrote), or were cut by hand"
                )
        return [intent for intent in intents if intent.size_after is not None]

    # -- the files' committed sizes -----------------------------------------------------------

    def _open_sizes(self, dir_id: str, tracked: bool) -> None:
        """Open the files' committed sizes (tiny.committed_sizes); a journal that never had
        them (an earlier format) gets an empty table now. _Found when a journal that has them
        finds the table missing, damaged or another data dir's. Lock held."""
        path = str(layout.sizes_path(self.data_dir))
        try:
            if not tracked:
                self._sizes = SizeTable.create(path, dir_id)
                with immediate(self.db):
                    self.db.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('sizes', ?)", (b"1",))
                return
            self._sizes = SizeTable.open(path, dir_id)
        except SizeTableError as exc:
            raise _Found(
                f"the files' committed sizes {exc}: the journal cannot tell whether acknowledged rows are gone"
            ) from None
        except OSError as exc:
            raise JournalError(f"cannot use the files' committed sizes {path}: {exc.strerror or exc}") from None

    def _check_sizes(self, committed: list[Intent]) -> None:
        """Every file is at least as long as the journal knows was committed to it (_Found
        naming the file and the bytes missing otherwise); then the sizes of the last committed
        flush are recorded (its writer may have died before it recorded them). Lock held."""
        assert self._sizes is not None
        try:
            recorded = self._sizes.items()
        except OSError as exc:
            raise JournalError(f"cannot read the files' committed sizes {self._sizes.path}: {exc}") from None
        for name, size in recorded.items():
            found = _size(self.data_dir / name)
            if found < size:
                raise _Found(self._shorter(name, found, size))
        self._record_sizes(committed)

    def _shorter(self, name: str, found: int, committed: int) -> str:
        what = "is missing" if found < 0 else f"is {found} bytes"
        return (
            f"{self.data_dir / name} {what}: {committed - max(found, 0)} bytes shorter than the {committed} "
            f"that the journal knows were committed to it ({layout.sizes_path(self.data_dir)}): acknowledged "
            "rows are gone (the file cut, replaced or deleted by hand, an older copy restored, or the data dir "
            "copied file by file while a server wrote to it: `tiny-admin backup` copies a live one). Restore the "
            "file"
        )

    # -- the lock --------------------------------------------------------------------------

    def locked(self, timeout: float | None = None) -> _Held:
        """Take the data dir's flush lock (every writer of every process takes it); use as
        ``with journal.locked(): ...``, which releases it.

        Waits at most ``timeout`` (default ``lock_timeout``) seconds in all, then raises
        :class:`LockTimeout` naming the holder. The lock is two flocks, taken in this order:
        the lock file's, whose holder writes its record into it at once (pid, host, time:
        :meth:`holder`); then the intent file's, the fence of a flush under way: a writer that
        still holds an intent after its lock file was replaced (paused, then resumed) keeps
        every other writer from recovering or overwriting that flush until it ends. Once both
        are held, checks that the lock, intent and journal files are the ones this journal
        opened (JournalError otherwise)."""
        deadline = time.monotonic() + (self.lock_timeout if timeout is None else timeout)
        self._acquire(self._lock_fd, deadline)
        try:
            self._write_holder()
            self._acquire(self._intent_fd, deadline, fence=True)
            self._check_files()
            self._check_journal()
        except BaseException:
            self._release()
            raise
        return _Held(self)

    def _locked_unchecked(self, timeout: float) -> _Held:
        """The lock file's flock, before the files it would check are known (opening); the
        intent's is taken as soon as its file is open (:meth:`_attach`)."""
        self._acquire(self._lock_fd, time.monotonic() + timeout)
        try:
            self._write_holder()
        except BaseException:
            self._release()
            raise
        return _Held(self)

    def _release(self) -> None:
        for fd in (self._intent_fd, self._lock_fd):
            if fd >= 0:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _write_holder(self) -> None:
        """Record this process as the holder, in the lock file it now holds (one pwrite)."""
        record = b"%d %s %.3f" % (os.getpid(), self._host.encode()[:100], time.time())
        os.pwrite(self._lock_fd, record.ljust(_HOLDER_BYTES - 1) + b"\n", _HOLDER_AT)

    def _acquire(self, fd: int, deadline: float, fence: bool = False) -> None:
        # A blocking flock cannot be given a timeout (nor interrupted on a thread that is not
        # the main one), so a busy lock is polled: every 0.2 ms at first, then every 2 ms.
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        started = time.monotonic()
        deadline = min(deadline, self.give_up_at)
        pause = _POLL_FIRST
        self.waiting_for = self._waiting_for(fence)
        self.waiting_since = started
        noted = started
        try:
            while True:
                time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return
                except BlockingIOError:
                    pass
                if time.monotonic() - noted > 0.5:
                    self.waiting_for, noted = self._waiting_for(fence), time.monotonic()
                if time.monotonic() >= min(deadline, self.give_up_at):
                    raise LockTimeout(
                        f"the data dir's flush lock {layout.lock_path(self.data_dir)} was not free within "
                        f"{time.monotonic() - started:.1f} s: {self._waiting_for(fence)}"
                    )
                pause = min(2 * pause, _POLL_MAX)
        finally:
            self.waiting_since = 0.0

    def _waiting_for(self, fence: bool) -> str:
        if not fence:
            return self.holder()
        return (
            f"its intent file {layout.intent_path(self.data_dir)} is held by a writer that does not hold "
            f"the lock file: the lock file was deleted or replaced while that writer was in a flush "
            f"(a paused process or container); nothing can be written until it ends ({_flock_holders(self._intent_fd)})"
        )

    def holder(self) -> str:
        """Who holds (or last held) the flush lock, and since when, as its holder recorded it."""
        try:
            return _describe_holder(os.pread(self._lock_fd, _HOLDER_BYTES, _HOLDER_AT))
        except OSError:
            return "its holder is unknown"

    def _check_files(self) -> None:
        """The lock and intent files are still linked where this journal opened them: one
        deleted, or replaced by a rename, has no link left (one fstat each, no path lookup)."""
        for fd, path in ((self._lock_fd, layout.lock_path), (self._intent_fd, layout.intent_path)):
            if fd >= 0 and os.fstat(fd).st_nlink == 0:
                raise _Found(f"{path(self.data_dir)} was deleted or replaced while the server ran; its writes stop")

    def _check_journal(self) -> None:
        """The journal's file is still the one this journal opened (by its path's inode)."""
        if not self._journal_inode:  # opening: not known yet
            return
        path = self._journal_file  # a str: joining Paths here cost more than the stat
        try:
            found = os.stat(path).st_ino
        except FileNotFoundError:
            raise _Found(f"{path} was deleted while the server ran; its writes stop until it is back") from None
        if found != self._journal_inode:
            raise _Found(f"{path} was replaced while the server ran; its writes stop until the original is back")

    @property
    def db(self) -> sqlite3.Connection:
        assert self._db is not None, "Journal.open() first"
        return self._db

    # -- a flush ---------------------------------------------------------------------------

    def recover(self) -> int:
        """Undo the flush a crash left unfinished, if any; returns the files it cut back.

        Lock held by caller. Each file goes back to exactly its size before that flush (a
        file the flush created is removed), with fsync when fsync is on, before the intent
        is marked undone: a crash during recovery leaves the intent for the next one. An
        intent whose flush committed (its first key is stored) is only marked. A file that is
        not where the flush could have left it raises JournalError, the intent left live.
        """
        if os.pread(self._intent_fd, 1, 0) != _LIVE:  # the usual case: finished, or never written
            return 0
        parsed = _parse_intent(os.pread(self._intent_fd, 1 << 24, 0))
        if parsed is None:
            log.warning("dropped a torn intent (a flush stopped before writing any data)")
            self._mark(_UNDONE)
            return 0
        first_key, intents, _ = parsed
        committed = first_key is not None and self._stored(first_key)
        for intent in intents:
            size = _size(self.data_dir / intent.name)  # -1: missing
            if intent.size_after is not None and size > intent.size_after:
                raise _Found(
                    f"{self.data_dir / intent.name} is {size} bytes, past the {intent.size_after} that the "
                    f"unfinished flush in {layout.intent_path(self.data_dir)} could have left: the data dir was "
                    "copied while a server wrote to it (the journal is older than the files; copy a live data "
                    "dir with `tiny-admin backup`), or the file was written by something else"
                )
            if committed and intent.size_after is not None:
                low = intent.size_after  # acknowledged rows
            else:
                low = -1 if intent.created else intent.size_before  # a recovery cut it back already
            if size < low:
                raise _Found(
                    f"{self.data_dir / intent.name} is {max(size, 0)} bytes{'' if size >= 0 else ' (missing)'}, "
                    f"shorter than the {low} that the unfinished flush in {layout.intent_path(self.data_dir)} "
                    "records: the files are older than the journal, or were cut by hand"
                )
        if committed:
            self._mark(_FINISHED)
            self._record_sizes(intents)
            return 0
        self._cut_back(intents)
        log.warning("recovered from an unfinished flush: %s", ", ".join(i.name for i in intents))
        self._mark(_UNDONE)
        return len(intents)

    def _stored(self, key: str) -> bool:
        return self.db.execute(_SELECT, (key,)).fetchone() is not None

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

    def begin(self, claims: Sequence[Claim | None]) -> Flush:
        """Decide a flush of appends whose claims are ``claims`` (None: an append without a key)
        and claim their new keys (see :meth:`claim`); the :class:`Flush` says which append
        writes and which is answered from a stored answer. Lock held."""
        deciding: dict[str, Stored] = {}
        distinct: list[Claim] = []
        for claim in claims:
            if claim is not None and claim.key not in deciding:
                deciding[claim.key] = Stored(claim.digest, claim.answer)
                distinct.append(claim)
        held = self.claim(distinct)
        decisions: list[Stored | None] = []
        writing: set[str] = set()
        first_key = None
        for claim in claims:
            if claim is None:
                decisions.append(None)
            elif claim.key in held:  # stored before this flush
                decisions.append(held[claim.key])
            elif claim.key in writing:  # an earlier append of this flush decided it
                decisions.append(deciding[claim.key])
            else:
                writing.add(claim.key)
                first_key = first_key or claim.key
                decisions.append(None)
        return Flush(self, decisions, first_key)

    def claim(self, claims: list[Claim]) -> dict[str, Stored]:
        """Open the flush's transaction and insert each of ``claims`` (distinct keys) that the
        journal does not hold; returns those it holds within the window, with their digest
        and answer: their appends write nothing. The inserts become durable with
        :meth:`commit`, after the data; :meth:`rollback` drops them. No claims: nothing.

        One statement per key, found or not (the usual flush has one new key). A key held past
        the window is deleted first, in a transaction of its own, and the claim starts again:
        so the first key inserted had no row before, and recovery, finding it, knows the flush
        committed. Lock held."""
        if not claims:
            return {}
        while True:
            self.db.execute("BEGIN IMMEDIATE")
            held: dict[str, Stored] = {}
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
                    held_digest, held_answer, stored = self.db.execute(_SELECT, (claim.key,)).fetchone()
                    if stored < oldest:
                        expired.append((claim.key,))
                    else:
                        held[claim.key] = Stored(held_digest, held_answer)
            except BaseException:
                self.rollback()
                raise
            if not expired:
                self._inserted = inserted
                return held
            self.rollback()
            with immediate(self.db):
                self.db.executemany(f"DELETE FROM {_TABLE} WHERE key = ?", expired)

    def rollback(self) -> None:
        """Drop the keys :meth:`claim` inserted (a flush that failed). Lock held."""
        self._inserted = 0
        if self._db is not None and self._db.in_transaction:  # not when SQLite rolled back by itself
            self._db.execute("ROLLBACK")

    def intend(self, intents: list[Intent], first_key: str | None = None) -> None:
        """Record the files a flush is about to append to, the first key it will commit (one
        :meth:`claim` inserted), the newest key committed before it, and a token no other
        flush writes. First, each file must be at least as long as the journal knows was
        committed to it (_Found, naming the file and the bytes missing, otherwise: the flush
        writes nothing). Lock held."""
        self._check_committed(intents)
        self._intents_written += 1
        files = [[i.name, i.size_before, i.size_after, int(i.created)] for i in intents]
        token = f"{self._token}-{self._intents_written}"
        payload = orjson.dumps([first_key, files, list(self.last) if self.last else None, token])
        record = _LIVE + len(payload).to_bytes(4, "big") + zlib.crc32(payload).to_bytes(4, "big") + payload
        self._record, self._intents = record, intents
        written = os.pwrite(self._intent_fd, record, 0)
        if written != len(record):  # a short write (disk full): the flush fails, its caller rolls back
            raise OSError(f"the intent was written short ({written} of {len(record)} bytes)")
        if self.fsync:
            os.fsync(self._intent_fd)

    def _check_committed(self, intents: list[Intent]) -> None:
        if self._sizes is None:
            return
        for intent in intents:
            committed = self._sizes.known(intent.name)
            if intent.size_before < committed:
                raise _Found(self._shorter(intent.name, -1 if intent.created else intent.size_before, committed))

    def _record_sizes(self, intents: list[Intent]) -> None:
        """The files of a committed flush are committed up to their sizes after it. A failure
        (a disk refusing a new slot) leaves the table lower: a weaker check, never a false one;
        the flush stays committed."""
        if self._sizes is None:
            return
        try:
            for intent in intents:
                if intent.size_after is not None:
                    self._sizes.record(intent.name, intent.size_after)
        except OSError as exc:
            log.error("could not record the committed sizes of a flush (%s): %s", self._sizes.path, exc)

    def confirm(self, files: Sequence[tuple[int, Intent]]) -> None:
        """Right before a flush's commit point: raise :class:`LockLost` unless the lock file
        this journal holds is still linked (deleted, or replaced by a rename, it has no link
        left), the intent still holds this flush's record (its token makes it unique), and
        each file of the flush (``files``: its descriptor and intent) is still linked and
        exactly as long as the flush left it. A writer paused in a flush and resumed after its
        lock file was replaced must not commit: another writer may have taken the new lock
        meanwhile. (An intent file replaced meanwhile is harmless to this flush: no other
        writer can know its intent, so none can cut it; the next flush's lock refuses that
        file.) One fstat per file, one pread. Lock held."""
        changed = None
        if os.fstat(self._lock_fd).st_nlink == 0:
            changed = f"the lock file {self._lock_file} was deleted or replaced"
        elif os.pread(self._intent_fd, len(self._record), 0) != self._record:
            changed = f"the intent file {self._intent_file} holds another flush's record"
        else:
            for fd, intent in files:
                stat = os.fstat(fd)
                if stat.st_nlink == 0 or stat.st_size != intent.size_after:
                    changed = (
                        f"{self.data_dir / intent.name} is {stat.st_size} bytes"
                        f"{'' if stat.st_nlink else ' and deleted'}, not the {intent.size_after} this flush left"
                    )
                    break
        if changed is not None:
            raise LockLost(
                f"a flush was not committed: {changed} while it ran (another writer may have taken the lock "
                "and recovered it); nothing of it is kept"
            )

    def commit(self) -> None:
        """The flush's data is written: commit the keys :meth:`claim` inserted (the commit
        point of a flush with keys), expiring at most twice as many old keys plus
        EXPIRE_SLACK first. :meth:`finish` comes next. Lock held."""
        if self._db is None or not self._db.in_transaction:
            return
        inserted, self._inserted = self._inserted, 0
        try:
            if inserted and self._claimed is not None:
                self._commits += 1
                newest = self._claimed[1]
                self._account(newest, before=newest - inserted + 1, limit=2 * inserted + EXPIRE_SLACK)
            self.db.execute("COMMIT")
        except BaseException:
            self.rollback()
            raise
        if inserted and self._claimed is not None:
            self.last = (self._claimed[0], self._claimed[1], time.time())

    def _account(self, newest: int, before: int, limit: int) -> None:
        """Update ``held`` and expire old keys if any are due, at most ``limit`` of them, all
        older than seq ``before`` (the keys of the flush being committed stay). In the
        caller's transaction."""
        if self._oldest is None or self._commits % _RECOUNT_EVERY == 0 or newest < self._oldest[0]:
            # unknown, or stale: other processes expire keys too, and seq starts at 1 again
            # once the table is empty
            row = self.db.execute(_OLDEST).fetchone()
            self._oldest = (row[0], row[1]) if row else (before, time.time())
        self.held = newest - self._oldest[0] + 1
        now = time.time()
        if self.held <= self.max_keys and self._oldest[1] >= now - self.window:
            return  # nothing is due: no query
        rows = self.db.execute(
            f"SELECT seq, stored FROM {_TABLE} WHERE seq < ? ORDER BY seq LIMIT ?", (before, limit + 1)
        ).fetchall()
        cutoff, excess = now - self.window, self.held - self.max_keys
        count = 0
        for _, stored in rows[:limit]:
            if stored >= cutoff and count >= excess:
                break
            count += 1
        if count:
            self.db.execute(f"DELETE FROM {_TABLE} WHERE seq <= ?", (rows[count - 1][0],))
            self.expired += count
        self._oldest = (rows[count][0], rows[count][1]) if count < len(rows) else (before, now)
        self.held = newest - self._oldest[0] + 1

    def finish(self) -> None:
        """Mark the intent committed: the commit point of a flush without keys (one with keys
        is committed already: recovery keeps its files); then record the sizes its files have
        after it as committed (tiny.committed_sizes). Lock held."""
        self._mark(_FINISHED)
        intents, self._intents = self._intents, []
        self._record_sizes(intents)

    def abandon(self) -> None:
        """Mark the intent undone: the caller has cut the flush's files back. Lock held."""
        self._intents = []
        self._mark(_UNDONE)

    def _mark(self, state: bytes) -> None:
        os.pwrite(self._intent_fd, state, 0)  # one byte: it cannot be written in part
        if self.fsync:
            os.fsync(self._intent_fd)

    def committed_sizes_unlocked(self, names: list[str]) -> dict[str, int] | None:
        """The sizes of the files ``names`` (relative to the data dir, as intents name them;
        those that exist) below which every byte is committed, read without the flush lock,
        or None when that cannot be known that way now.

        A seqlock on the intent file: every flush writes its intent (mark, length, CRC, the
        files with their sizes before) before its first byte reaches a file, and marks it
        after its last, and no two flushes write the same intent. So when the intent's first
        9 bytes are the same before and after the stats, no flush began or ended meanwhile:
        with no flush under way every byte stat'ed is committed; with one under way (or a
        crashed one's intent waiting for recovery), the files it names are committed up to
        their sizes before it, the others up to their sizes. (A flush committed whose mark
        failed counts as under way until the next flush marks it: its rows are seen then.)
        A few system calls, never a wait: callable on the event loop. None when the intent
        changed three times in a row, or is torn or too long to read in one go."""
        if self._intent_fd < 0:
            return None
        root = str(self.data_dir)  # joined as strs: Path joins cost more than the stats
        for _ in range(3):
            record = os.pread(self._intent_fd, _UNLOCKED_INTENT_BYTES, 0)
            before: dict[str, int] = {}
            if record[:1] == _LIVE:
                parsed = _parse_intent(record)
                if parsed is None:
                    continue  # being written, torn, or longer than read
                before = {intent.name: intent.size_before for intent in parsed[1]}
            sizes = {}
            for name in names:
                try:
                    size = os.stat(os.path.join(root, name)).st_size
                except FileNotFoundError:
                    continue
                sizes[name] = min(size, before[name]) if name in before else size
            if os.pread(self._intent_fd, 9, 0) == record[:9]:
                return sizes
        return None

    def digest(self, body: bytes) -> bytes:
        """The identity of a (decompressed) body that a key is stored with: 128 bits of BLAKE3
        keyed with this journal's secret, so that no client can forge a second body that
        passes for the first. Any thread; the journal must be open."""
        assert self.digest_key is not None, "Journal.open() first"
        return blake3(body, key=self.digest_key).digest(DIGEST_BYTES)


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


def _parse_intent(record: bytes) -> tuple[str | None, list[Intent], tuple[str, int, float] | None] | None:
    """(first key, intents, last committed key) of an intent record (``b"I"`` or a mark,
    length, CRC-32, payload; the bytes after it are an older, longer record's); None when it
    is torn. Intents of the previous format carry no size after (None)."""
    size, crc = int.from_bytes(record[1:5], "big"), record[5:9]
    payload = record[9 : 9 + size]
    if len(record) < 9 or len(payload) != size or zlib.crc32(payload).to_bytes(4, "big") != crc:
        return None
    fields = orjson.loads(payload)
    first_key, files = fields[0], fields[1]
    last = tuple(fields[2]) if len(fields) > 2 and fields[2] else None
    intents = [
        Intent(f[0], f[1], f[2], bool(f[3])) if len(f) == 4 else Intent(f[0], f[1], None, bool(f[2]))  # type: ignore[arg-type]
        for f in files
    ]
    return first_key, intents, last  # type: ignore[return-value]


def _connect(path: Path, create: bool) -> sqlite3.Connection:
    # isolation_level=None: transactions are explicit (BEGIN ... COMMIT), nothing implicit.
    # mode=rw never creates the file: a journal that should exist and does not is noticed.
    uri = f"file:{quote(str(path))}?mode={'rwc' if create else 'rw'}"
    return sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)


def _open_fd(path: Path, flags: int) -> int:
    try:
        return os.open(path, flags | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise JournalError(f"cannot open {path}: {exc.strerror or exc}") from None


def _read_identity(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise JournalError(f"cannot read the data dir's id {path}: {exc}") from None
    if not text or not all(char in "0123456789abcdef" for char in text):
        raise JournalError(f"the data dir's id file {path} is damaged (it holds {text[:40]!r})")
    return text


def _pending(identity_path: Path) -> Path:
    return identity_path.with_name(identity_path.name + ".new")


def _describe_holder(record: bytes) -> str:
    try:
        fields = record.split()
        pid, host, since = int(fields[0]), fields[1].decode(errors="replace"), float(fields[2])
    except (ValueError, IndexError):
        return "its holder is unknown"
    return f"held by pid {pid} on {host} since {time.time() - since:.1f} s"


def lock_held_past(data_dir: Path, seconds: float) -> str | None:
    """Whether another process holds the data dir's flush lock now, by its holder's record for
    longer than ``seconds``, or holds the intent's flock without the lock (the fence of a
    writer whose lock file was replaced): then who and since when; else None. Never waits
    (non-blocking tries on descriptors of its own, released at once; a few system calls): for
    /healthz on the event loop, which must see a lock held elsewhere while no request of its
    own waits. A record of this process (its own sink in a flush) is not reported here."""
    try:
        fd = os.open(layout.lock_path(data_dir), os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None  # no lock file: the journal's own checks say so
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fields = os.pread(fd, _HOLDER_BYTES, _HOLDER_AT).split()
            try:
                since = float(fields[2])
            except (ValueError, IndexError):
                since = 0.0  # no record: held, by whom is not known
            mine = fields[:1] == [str(os.getpid()).encode()] and fields[1:2] == [socket.gethostname().encode()[:100]]
            if time.time() - since > seconds and not mine:
                return (
                    f"the data dir's flush lock {layout.lock_path(data_dir)} is {_describe_holder(b' '.join(fields))}"
                )
            return None
        try:
            return _fenced(data_dir)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _fenced(data_dir: Path) -> str | None:
    """With the lock file's flock held: whether someone holds the intent's (a writer whose lock
    file was replaced, still in its flush), and who; a non-blocking try, released at once."""
    try:
        fd = os.open(layout.intent_path(data_dir), os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return (
            f"the intent file {layout.intent_path(data_dir)} is held by a writer that does not hold the lock file "
            f"(it was replaced while that writer was in a flush; {_flock_holders(fd)})"
        )
    finally:
        os.close(fd)  # (closing releases a flock taken on it)
    return None


def _flock_holders(fd: int) -> str:
    """The pids /proc/locks names as holding a flock on the file of ``fd`` (for a refusal's message)."""
    try:
        stat = os.fstat(fd)
        device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            pids = sorted({f.split()[4] for f in locks if f.split()[1:2] == ["FLOCK"] and device in f.split()})
    except (OSError, IndexError):
        return "its pid is unknown"
    others = [pid for pid in pids if pid != str(os.getpid())]
    return f"held by pid {', '.join(others)}" if others else "its pid is unknown"


def _lock_id(fd: int) -> str:
    return os.pread(fd, _HOLDER_AT, 0).strip(b"\0 \n").decode(errors="replace")


def _size(path: Path) -> int:
    """A file's size, -1 when it does not exist."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return -1


def write_durably(path: Path, data: bytes) -> None:
    """Write ``data`` as the whole of the file at ``path`` and fsync it (not its directory)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` (a file created in it) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

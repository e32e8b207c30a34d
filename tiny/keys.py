"""The idempotency keys: the key log (tiny.keylog) read into memory, and the journal's meta in SQLite.

The keys live in the key log, ``.tiny/keys/NNNNNNNN.log`` (tiny.keylog gives its layout), which
a flush with keys appends to like a data file: its records go into the flush's intent with
the day files (tiny.intent, tiny.appender), are written (fsync mode: synced) with them, and
count once the intent's mark, the commit point of every flush, is set; a flush that fails or
dies before it is cut back with its rows by the same recovery. So a flush's keys and its rows
are kept together or not at all, and nothing but the log is written for a key: no B-tree page,
no second file, no second fsync.

Each process keeps the window's keys in memory (tiny.keylog ``KeyTable``): read from the log
at its start (:meth:`KeyStore.attach_log` notes the segments under the flush lock,
:meth:`KeyStore.load` reads them without it: bytes below a size noted after recovery are
committed and no one cuts them), then, at each flush with keys, under the flush lock and after
recovery, the records other processes appended since (:meth:`KeyStore.refresh`: an ``fstat``
and, when the log grew, one ``pread``). A key lookup is a probe of the table and, on a hit, one
``pread`` of its record. Every process decides on the whole log, so all processes and servers
sharing the data dir decide alike, as they did on one SQLite table.

The journal's meta stays in SQLite (``.tiny/journal.sqlite3``, table ``meta (name, value)``):
``data_dir_id``, ``journal_mode``, ``digest_key`` (the secret of
:func:`tiny.commit.keyed_digest`), ``created``, ``sizes`` (the data dir tracks committed
sizes); in cluster mode ``cluster_id`` and ``cluster_digest_key`` (tiny.cluster.binding). It
runs in WAL mode, or in its rollback journal (``mode="delete"``) for writers on several hosts.
A journal of the previous format keeps its keys in a table ``idempotency_keys``: the first
opening copies them into the key log (:meth:`KeyStore.attach_log`).

Rules (every method but :meth:`KeyStore.close` and :meth:`KeyStore.load` expects the data
dir's flush lock held by the caller, tiny.flushlock, and one thread):

- A key counts for ``window`` seconds, and only while it is among the newest ``max_keys``
  (those of the newest flush always count). :meth:`KeyStore.decide` answers a key that
  counts from its record and appends one for each new key (per key, the flush's first append
  decides). Expiry (:meth:`KeyStore.commit`, after each flush with keys) walks the log from
  its oldest key and drops at most twice the flush's new keys plus :data:`EXPIRE_SLACK` from
  memory, so no flush pays for a backlog; a segment walked past whole is deleted (its
  committed size forgotten first).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
import zlib
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

from tiny import layout, limits
from tiny.commit import Claim, Stored
from tiny.files import fsync_dir
from tiny.keylog import (
    FIELDS,
    FIRST,
    FIXED,
    HEAD,
    KEY_LENGTH_AT,
    KEYS_DIR,
    SEGMENT_BYTES,
    KeyTable,
    Record,
    decode,
    encode,
    key_hash,
    place,
    records,
    segment_name,
    segment_number,
    split,
)
from tiny.refusals import Found
from tiny.transaction import immediate

log = logging.getLogger("tiny.keys")

MODES = ("wal", "delete")
EXPIRE_SLACK = 8  # a commit with k new keys expires at most 2k + EXPIRE_SLACK old ones
WAL_LIMIT = 4 * 1024**2  # bytes the -wal is cut back to after a checkpoint (journal_size_limit)
_WALK_READ = 1 << 16  # bytes expiry reads of the oldest segment at a time
_RECORD_READ = 512  # bytes a lookup reads first of a record (most records are shorter)
_LOAD_READ = 1 << 24  # bytes the start reads of a segment at a time
_SAMPLE_READ = 1 << 16  # bytes of the first segment a start reads to size the key table

_SEGMENT_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC  # read (pread), appended to by flushes, cut when torn
_SCHEMA = "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID"
_LEGACY = "idempotency_keys"  # the previous format's keys table


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
        segment_bytes: int = SEGMENT_BYTES,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"journal mode must be one of {MODES}")
        self.path = path
        self.fsync, self.window, self.max_keys, self.mode = fsync, window, max_keys, mode
        self.segment_bytes = segment_bytes
        self.data_dir = path.parent.parent
        self.on_drop: Callable[[str], None] = lambda name: None  # a segment deleted: forget its committed size
        self.last: tuple[str, int, float] | None = None  # the newest key read: (key, seq, stored)
        self.count = 0  # keys counted at this process's last commit with keys (newest seq - oldest + 1)
        self.expired = 0  # keys this process's commits expired (for tests and bounds)
        self._db: sqlite3.Connection | None = None
        self._path = str(path)  # a str: joining Paths on the hot path cost more than the stat
        self._inode = 0  # the database file's, once opened: one replaced under a server stops its writes
        self._dir = str(self.data_dir / KEYS_DIR)
        self.stop_loading = False  # set (another thread) to stop a load() under way: the journal closes
        self._reset()

    def _reset(self) -> None:
        """Forget every key read (the log is read again from its start)."""
        self.table = KeyTable()
        self.newest = 0  # seq of the newest record read
        self.last = None
        self._flush_first = 0  # seq of the first record of the newest flush read
        self._fds: dict[int, int] = {}  # segment -> descriptor (kept until expiry walks past it)
        self._inodes: dict[int, tuple[int, int]] = {}  # segment -> (st_dev, st_ino), kept across close()
        self._ends: dict[int, int] = {}  # segment -> the end of its whole records read
        self._segment = 1  # the newest segment known
        self._noted: dict[int, int] = {}  # segment -> its size noted at open, for load()
        self._walk = (1, 0)  # expiry's cursor: the oldest record not yet expired
        self._walk_buf = b""
        self._walk_base = -1  # offset of _walk_buf in the cursor's segment
        self._want = b""  # the key a table probe confirms (_same)
        self._seen: Record | None = None  # the record the last confirmed probe read
        self._new: list[tuple[int, int, int]] = []  # the flush under way's new keys: (hash, offset in its bytes, seq)
        self._new_at = (0, b"")  # the segment they go to, and their bytes
        self._loading = False  # load() is (or is to be) under way, on another thread
        self._oldest: tuple[int, float] | None = None  # (seq, stored) of the record at expiry's cursor

    @property
    def segment_count(self) -> int:
        return len(self._ends)

    @property
    def db(self) -> sqlite3.Connection:
        assert self._db is not None, "KeyStore: connect first"
        return self._db

    # -- the meta database -------------------------------------------------------------------

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
        """Close the database and the log's descriptors. The keys read stay in memory: the
        next :meth:`attach_log` keeps them when the log's segments are still the same files."""
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            self._db = None
        self._inode = 0
        self._close_log()

    def _close_log(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

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

    # -- the key log: opening and reading ------------------------------------------------------

    def segments(self) -> list[int]:
        """The numbers of the log's segments on disk, oldest first."""
        try:
            names = os.listdir(self._dir)
        except FileNotFoundError:
            return []
        return sorted(number for name in names if (number := segment_number(name)) is not None)

    def holds_keys(self) -> bool:
        """Whether the key log holds any record (read or not: a segment with bytes)."""
        for number in self.segments():
            with contextlib.suppress(FileNotFoundError):
                if os.stat(os.path.join(self._dir, f"{number:08d}.log")).st_size > 0:
                    return True
        return False

    def attach_log(self) -> None:
        """Open the log's segments and note their sizes for :meth:`load` (under the lock, after
        recovery: every byte below them is committed). Keys read by an earlier opening are
        kept when their segments are still the same files; otherwise the log is read again
        from its start. A journal of the previous format has its keys copied in first."""
        self._import_legacy()
        found = self.segments()
        unread = [number for number in self._inodes if number >= self._walk[0]]
        for number in found:
            if number < self._walk[0] and self._inodes:
                continue  # walked past by this process's expiry: its keys are gone from memory
            fd = os.open(os.path.join(self._dir, f"{number:08d}.log"), _SEGMENT_FLAGS)
            stat = os.fstat(fd)
            known = self._inodes.get(number)
            if known is not None and known != (stat.st_dev, stat.st_ino):
                os.close(fd)
                self._close_log()  # (the meta database stays open)
                self._reset()
                self.attach_log()
                return
            self._fds[number] = fd
            self._inodes[number] = (stat.st_dev, stat.st_ino)
            self._noted[number] = stat.st_size
        if any(number not in self._fds for number in unread):  # a segment this process still needed is gone
            self._close_log()
            self._reset()
            self.attach_log()
            return
        if found:
            self._segment = max(self._segment, found[-1])
            if not self._ends:
                self._walk = (found[0], 0)
        self._loading = bool(self._noted)  # until load() ends: is_stored() reads the disk, not the table

    def load(self) -> None:
        """Read the segments up to the sizes :meth:`attach_log` noted (without the lock)."""
        noted, self._noted = self._noted, {}
        if not self._ends and noted:  # a first reading: room for about as many keys as the log holds
            first = min(noted)
            sample = os.pread(self._fds[first], _SAMPLE_READ, 0)
            offsets = [offset for offset, _ in records(sample)]
            if len(offsets) > 1:
                self.table.reserve(int(sum(noted.values()) / (offsets[-1] / (len(offsets) - 1))))
        for number in sorted(noted):
            start = self._ends.get(number, 0)
            if noted[number] > start:
                self._read(number, start, noted[number], cut=False)
        if not self.stop_loading:
            self._loading = False

    def refresh(self) -> None:
        """Read what was appended since this process last read (under the lock, after
        recovery): the newest segment's new records, and the next segment's once it is full.
        A torn record at the end of the newest segment (a power loss) is cut off."""
        while True:
            number = self._segment
            fd = self._fds.get(number)
            if fd is None:
                fd = self._open_segment(number)
                if fd is None:
                    return
            size = os.fstat(fd).st_size
            end = self._ends.get(number, 0)
            if size > end:
                end = self._read(number, end, size, cut=True)
            elif size < end:
                raise Found(
                    f"the key log {self._dir}/{number:08d}.log is {size} bytes, shorter than the {end} this server "
                    "read from it: committed keys are gone (cut by hand, or an older copy restored)"
                )
            if end < self.segment_bytes:
                return
            if self._open_segment(number + 1) is None:
                return
            self._segment = number + 1

    def _open_segment(self, number: int) -> int | None:
        try:
            fd = os.open(os.path.join(self._dir, f"{number:08d}.log"), _SEGMENT_FLAGS)
        except FileNotFoundError:
            return None
        stat = os.fstat(fd)
        self._fds[number] = fd
        self._inodes[number] = (stat.st_dev, stat.st_ino)
        return fd

    def _read(self, number: int, start: int, stop: int, cut: bool) -> int:
        """Take the whole records of segment ``number`` between ``start`` and ``stop``; returns
        where they end. A torn one stops the reading; ``cut`` (the lock held): it is cut off."""
        fd = self._fds[number]
        while start < stop and not self.stop_loading:
            buf = os.pread(fd, min(stop - start, _LOAD_READ), start)
            at, end = self._take(buf, place(number, start))
            reached = start + end >= stop
            start += at
            self._ends[number] = start
            if end == 0 or (at < end and (reached or at == 0)):
                break  # a torn record: the bytes left do not make one
        if start < stop and not self.stop_loading:
            if cut and number == self._segment:
                log.warning("cut a torn record off the key log %s at %d of %d", segment_name(number), start, stop)
                os.ftruncate(fd, start)
            elif number != self._segment:
                log.warning("skipped a torn record in the key log %s at %d", segment_name(number), start)
                self._ends[number] = stop
        return start

    def _take(self, buf: bytes, base: int) -> tuple[int, int]:
        """Take the whole records of ``buf`` (at place ``base``) into memory: (the end of the
        last whole one, len(buf)). The loop a start runs 10 million times: decode() and
        KeyTable.put() inlined (the same probe: a slot of the same hash is the same key only
        when its record says so)."""
        view = memoryview(buf)
        unpack_head, unpack_fields, crc32 = HEAD.unpack_from, FIELDS.unpack_from, zlib.crc32
        table, same = self.table, self._same
        hashes, places, mask, limit = table.slots()
        cutoff = time.time() - self.window
        newest, flush_first, last = self.newest, self._flush_first, -1
        at, end = 0, len(buf)
        while at + FIXED <= end:
            length, crc = unpack_head(view, at)
            stop = at + length
            if length < FIXED or stop > end or crc32(view[at + 8 : stop]) != crc:
                break
            seq, stored, flags, key_length, digest_length = unpack_fields(view, at + 8)
            if FIXED + key_length + digest_length > length:
                break  # cannot be: its CRC held
            if seq > newest:
                newest, last = seq, at
                if flags & FIRST:
                    flush_first = seq
                if stored >= cutoff:
                    key = buf[at + FIXED : at + FIXED + key_length]
                    h = hash(key) or 1
                    i = h & mask
                    while True:
                        found = hashes[i]
                        if found == 0:
                            hashes[i], places[i] = h, base + at
                            table.size += 1
                            if table.size > limit:
                                table.grow()
                                hashes, places, mask, limit = table.slots()
                            break
                        if found == h:
                            self._want = key
                            if same(places[i]):
                                places[i] = base + at
                                break
                        i = (i + 1) & mask
            at = stop
        self.newest, self._flush_first = newest, flush_first
        if last >= 0:
            found_last = decode(view, last, end)
            if found_last is not None:
                self.last = (found_last[0].key.decode(), found_last[0].seq, found_last[0].stored)
        return at, end

    def _same(self, where: int) -> bool:
        """Whether the record at ``where`` is of the key a probe looks for (it is kept, read)."""
        record = self._record_at(where)
        self._seen = record
        return record is not None and record.key == self._want

    def _record_at(self, where: int) -> Record | None:
        number, offset = split(where)
        fd = self._fds.get(number)
        if fd is None:
            return None
        head = os.pread(fd, _RECORD_READ, offset)
        if len(head) >= 4 and (length := int.from_bytes(head[:4], "big")) > len(head):
            head = os.pread(fd, length, offset)
        found = decode(head, 0, len(head))
        return None if found is None else found[0]

    def is_stored(self, key: str) -> bool:
        """Whether the log holds ``key``, however old (an intent of the previous format names its
        first key: stored means that flush committed). Until :meth:`load` has ended (it runs on
        another thread), a scan of the log on disk, which never touches the table it fills."""
        wanted = key.encode()
        if self._ends and not self._loading:
            self._want = wanted
            return self.table.find(key_hash(wanted), self._same) >= 0
        if self._db is not None:
            with contextlib.suppress(sqlite3.OperationalError):  # no such table: a journal of this format
                if self.db.execute(f"SELECT 1 FROM {_LEGACY} WHERE key = ?", (key,)).fetchone() is not None:
                    return True
        for number in self.segments():
            with open(os.path.join(self._dir, f"{number:08d}.log"), "rb") as segment:
                if any(record.key == wanted for _, record in records(segment.read())):
                    return True
        return False

    # -- a flush with keys ---------------------------------------------------------------------

    def decide(
        self, claims: Sequence[Claim | None]
    ) -> tuple[list[Stored | None], tuple[str, bytes, tuple[int, int] | None] | None]:
        """What each append of a flush does, by its claim (None: no key), and the records the
        flush appends to the log: (segment file, bytes, (descriptor, size) when this process
        holds the segment open), or None. ``decisions[i]`` None: append i writes; a Stored: it
        is answered from that digest and answer and writes nothing (its key counts already, or
        an earlier append of this flush has it). Reads the log's new records first (:meth:`refresh`)."""
        self.refresh()
        now = time.time()
        decided: dict[str, Stored] = {}
        decisions: list[Stored | None] = []
        new: list[bytes] = []
        self._new = []
        seq, offset = self.newest, 0
        for claim in claims:
            if claim is None:
                decisions.append(None)
                continue
            known = decided.get(claim.key)
            if known is not None:
                decisions.append(known)
                continue
            key = claim.key.encode()
            h = key_hash(key)
            stored = self._counting(key, h, now)
            if stored is not None:
                decided[claim.key] = stored
                decisions.append(stored)
                continue
            decided[claim.key] = Stored(claim.digest, claim.answer)
            decisions.append(None)
            seq += 1
            record = encode(seq, now, 0 if new else FIRST, key, claim.digest, claim.answer)
            self._new.append((h, offset, seq))
            offset += len(record)
            new.append(record)
        if not new:
            return decisions, None
        number = self._segment
        end = self._ends.get(number, 0)
        if end >= self.segment_bytes:
            number, end = number + 1, 0
        data = b"".join(new)
        self._new_at = (number, data)
        fd = self._fds.get(number)
        return decisions, (segment_name(number), data, None if fd is None else (fd, end))

    def _counting(self, key: bytes, h: int, now: float) -> Stored | None:
        """The digest and answer of ``key`` (hash ``h``) if it counts (see the module docstring), or None."""
        self._want = key
        if self.table.find(h, self._same) < 0 or self._seen is None:
            return None
        record = self._seen
        if record.stored < now - self.window:
            return None
        if record.seq <= self.newest - self.max_keys and record.seq < self._flush_first:
            return None
        return Stored(record.digest, record.answer)

    def rollback(self) -> None:
        """The flush under way failed: its records were cut back with its rows (none is read)."""
        self._new = []

    def commit(self, size_before: int | None = None) -> None:
        """After a flush's commit point: its new keys into memory (``size_before``: the size of
        their segment before the flush wrote them, from its intent; or they are read back from
        the log), then expire at most twice as many plus EXPIRE_SLACK of the oldest."""
        new, self._new = self._new, []
        if not new:
            return
        number, data = self._new_at
        if size_before is not None and size_before == self._ends.get(number, 0) and self._take_own(number, size_before):
            base = place(number, size_before)
            for h, offset, _ in new:
                self._want = data[offset + FIXED : offset + FIXED + data[offset + KEY_LENGTH_AT]]
                self.table.put(h, base + offset, self._same)
            self._ends[number] = size_before + len(data)
            seq = new[-1][2]
            self._flush_first, self.newest = new[0][2], seq
            self.last = (self._want.decode(), seq, time.time())
        else:
            self.refresh()
        self._expire(2 * len(new) + EXPIRE_SLACK)

    def _take_own(self, number: int, size_before: int) -> bool:
        """Whether this process reads segment ``number`` on from ``size_before`` (it made it: opened now)."""
        if number == self._segment and number in self._fds:
            return True
        if number != self._segment + 1 or size_before != 0 or self._open_segment(number) is None:
            return False
        self._ends[number] = 0
        self._segment = number
        return True

    # -- expiry ----------------------------------------------------------------------------------

    def _expire(self, limit: int) -> None:
        """Drop from memory the oldest keys that no longer count, at most ``limit``; delete each
        segment walked past whole (never the newest). Updates ``count``."""
        cutoff = time.time() - self.window
        done = 0
        while True:
            if self._oldest is not None:  # known: most commits expire nothing, and read nothing
                seq, stored = self._oldest
                if not (stored < cutoff or (self.newest - seq + 1 > self.max_keys and seq < self._flush_first)):
                    self.count = self.newest - seq + 1
                    return
            found = self._walk_record()
            if found is None:
                self.count = 0
                return
            record, where, after = found
            self._oldest = (record.seq, record.stored)
            due = record.stored < cutoff or (
                self.newest - record.seq + 1 > self.max_keys and record.seq < self._flush_first
            )
            if not due or done >= limit:
                self.count = self.newest - record.seq + 1
                return
            self.table.remove(key_hash(record.key), where)
            self.expired += 1
            done += 1
            self._walk, self._oldest = (self._walk[0], after), None

    def _walk_record(self) -> tuple[Record, int, int] | None:
        """The record at expiry's cursor (its place and the offset after it), moving to the next
        segment (and deleting the one left) at the end of one; None at the end of the log read."""
        while True:
            number, offset = self._walk
            end = self._ends.get(number)
            if end is None or offset >= end:
                later = [n for n in self._ends if n > number]
                if not later:
                    return None
                self._drop(number)
                self._walk, self._walk_base, self._walk_buf = (min(later), 0), -1, b""
                continue
            at = offset - self._walk_base
            found = decode(self._walk_buf, at, len(self._walk_buf)) if self._walk_base >= 0 and at >= 0 else None
            if found is None:
                fd = self._fds[number]
                head = os.pread(fd, FIXED, offset)
                length = int.from_bytes(head[:4], "big") if len(head) >= 4 else 0
                self._walk_buf = os.pread(fd, min(max(_WALK_READ, length), end - offset), offset)
                self._walk_base = offset
                found = decode(self._walk_buf, 0, len(self._walk_buf))
                if found is None:  # cannot be: it was read whole once
                    self._walk = (number, end)
                    continue
                return found[0], place(number, offset), offset + (found[1])
            return found[0], place(number, offset), self._walk_base + found[1]

    def _drop(self, number: int) -> None:
        """Segment ``number`` was walked past whole: delete it (never the newest), its
        committed size forgotten first (the check at open would miss it otherwise)."""
        if number >= self._segment:
            return
        name = segment_name(number)
        self.on_drop(name)
        with contextlib.suppress(FileNotFoundError):  # another process dropped it first
            os.unlink(os.path.join(self._dir, f"{number:08d}.log"))
        fd = self._fds.pop(number, None)
        if fd is not None:
            os.close(fd)
        self._ends.pop(number, None)
        self._inodes.pop(number, None)

    # -- the previous format ---------------------------------------------------------------------

    def _import_legacy(self) -> None:
        """Copy the keys of a journal of the previous format (its ``idempotency_keys`` table)
        into the log's first segment, written aside, synced and renamed into place; then empty
        the table. A log already there was copied before (the table's emptying was lost)."""
        if self._db is None:
            return
        exists = self.db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (_LEGACY,)).fetchone()
        if exists is None or self.db.execute(f"SELECT 1 FROM {_LEGACY} LIMIT 1").fetchone() is None:
            return
        if not self.segments():
            os.makedirs(self._dir, exist_ok=True)
            rows = self.db.execute(f"SELECT key, digest, answer, stored FROM {_LEGACY} ORDER BY seq")
            aside = os.path.join(self._dir, "import.tmp")
            with open(aside, "wb") as out:
                for seq, (key, digest, answer, stored) in enumerate(rows, 1):
                    out.write(encode(seq, stored, FIRST, key.encode(), bytes(digest), bytes(answer)))
                out.flush()
                os.fsync(out.fileno())
            os.replace(aside, os.path.join(self._dir, f"{1:08d}.log"))
            fsync_dir(Path(self._dir))
            log.warning("copied the keys of %s into the key log %s", self.path, self._dir)
        with immediate(self.db):
            self.db.execute(f"DELETE FROM {_LEGACY}")


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

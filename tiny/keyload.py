"""The key log read into memory: its segments at a process's start, then what others appended.

Layout: ``.tiny/keys/NNNNNNNN.log``, numbered segments of records (tiny.keylog gives the record
format); read into a tiny.keylog ``KeyTable``, whose slots hold each key's hash and the place
(segment, offset) of its newest record. A hit is confirmed by one ``pread`` of the record.

Reading, in three steps (:class:`KeyReader`):

- :meth:`KeyReader.attach_log`, under the data dir's flush lock and after recovery: opens every
  segment (one descriptor each, kept until expiry deletes the segment) and notes its size.
  Every byte below a noted size is committed and no one cuts it. A journal of the previous
  format has its keys copied into the first segment first (written aside, synced, renamed).
- :meth:`KeyReader.load`, without the lock, on a thread of its own (tiny.commit.local): reads
  the noted bytes; :attr:`KeyReader.stop_loading`, set from another thread, stops it between
  reads. Until it ends, :meth:`KeyReader.is_stored` scans the files instead of the table. Keys
  more than ``max_keys`` older than the newest segment's first can never count again: they are
  left out, so memory holds at most ``max_keys`` plus one segment's keys, whatever the log.
- :meth:`KeyReader.refresh`, under the lock, after recovery, at each flush with keys: an
  ``fstat`` of the newest segment and, when it grew, a ``pread`` of the new records (other
  processes' and servers'); past a full segment, the next one, or the oldest left when another
  process's expiry deleted it first (one whose committed size is still known was deleted by
  hand: Found). A newest segment shorter than what was read from it stops writes (Found).

Damage: a record that does not read whole at the end of the newest segment is torn (a power
loss inside an append) and cut off (``ftruncate``: only under the lock); one at the end of an
older segment is skipped with a warning. One whose length leads to a whole record is damaged
inside the log (a bad sector): it is stepped over with a warning, the records after it read,
nothing cut. A record read whole once that no longer reads back (a lookup's ``pread``) sets
``unreadable``, and tiny.keys refuses the flush (its segment was cut under the server).

Locking: every method but :meth:`KeyReader.load` and :meth:`KeyReader.close` expects the flush
lock held by the caller, and one thread; ``load`` only reads below the noted sizes, which no
flush changes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from tiny.codec import CODEC
from tiny.files import fsync_dir
from tiny.journal_meta import JournalMeta
from tiny.keylog import (
    FIELDS,
    FIRST,
    FIXED,
    HEAD,
    KEY_LENGTH_AT,
    KEYS_DIR,
    KeyTable,
    Record,
    decode,
    encode,
    key_hash,
    place,
    records,
    segment_name,
    segment_numbers,
    split,
)
from tiny.refusals import Found
from tiny.transaction import immediate

log = logging.getLogger("tiny.keys")

_RECORD_READ = 512  # bytes a lookup reads first of a record (most records are shorter)
_LOAD_READ = 1 << 24  # bytes the start reads of a segment at a time
_SAMPLE_READ = 1 << 16  # bytes of the first segment a start reads to size the key table
_SEGMENT_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC  # read (pread), appended to by flushes, cut when torn
_LEGACY = "idempotency_keys"  # the previous format's keys table
_GROW, _SAME = 1, 2  # where tiny._codec.take_keys stops but at the end: past the limit, at a slot of the same hash


class KeyReader(JournalMeta):
    """The key log of the data dir whose journal database is at ``path``, read into memory; see
    the module docstring. ``window``: keys older than this many seconds are not taken."""

    def __init__(self, path: Path, *, fsync: bool, window: float, max_keys: int, mode: str, segment_bytes: int) -> None:
        super().__init__(path, fsync=fsync, mode=mode)
        self.window, self.max_keys, self.segment_bytes = window, max_keys, segment_bytes
        self.data_dir = path.parent.parent
        self.last: tuple[str, int, float] | None = None  # the newest key read: (key, seq, stored)
        self._dir = str(self.data_dir / KEYS_DIR)
        self.stop_loading = False  # set (another thread) to stop a load() under way: the journal closes
        self.committed_size: Callable[[str], int] = lambda name: 0  # a file's committed size (0: none known)
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
        self._walk = (1, 0)  # expiry's cursor (tiny.keyexpiry): the oldest record not yet expired
        self._want = b""  # the key a table probe confirms (_same)
        self._seen: Record | None = None  # the record the last confirmed probe read
        self._loading = False  # load() is (or is to be) under way, on another thread
        self.unreadable = -1  # the place of a record read whole once that no longer is (_record_at)
        self._floor = 0  # records up to this seq can never count again: load() leaves them out
        self._taken = 0  # records taken (read, or this process's own) since the last expiry or load: its budget

    @property
    def segment_count(self) -> int:
        return len(self._ends)

    def close(self) -> None:
        """Close the database and the log's descriptors. The keys read stay in memory: the
        next :meth:`attach_log` keeps them when the log's segments are still the same files."""
        super().close()
        self._close_log()

    def _close_log(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

    def segments(self) -> list[int]:
        """The numbers of the log's segments on disk, oldest first."""
        return segment_numbers(self._dir)

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
        self._floor = max(self._floor, self._bound_floor(noted))
        if not self._ends and noted:  # a first reading: room for about as many keys as it takes
            first = min(noted)
            sample = os.pread(self._fds[first], _SAMPLE_READ, 0)
            offsets = [offset for offset, _ in records(sample)]
            if len(offsets) > 1:
                size = offsets[-1] / (len(offsets) - 1)
                self.table.reserve(int(min(sum(noted.values()), self.max_keys * size + noted[max(noted)]) / size))
        for number in sorted(noted):
            start = self._ends.get(number, 0)
            if noted[number] > start:
                self._read(number, start, noted[number], cut=False)
        if not self.stop_loading:
            self._taken = 0  # expiry's budget counts the records taken from here
            self._loading = False

    def _bound_floor(self, noted: dict[int, int]) -> int:
        """The seq up to which no record can count, whatever comes later: the newest segment
        with a whole first record starts at seq s, the newest flush (one segment's) starts at
        or after s, so a seq at most s - max_keys is past the bound and not of the newest flush.
        0 when no segment's first record reads whole. So a start holds at most ``max_keys``
        plus a segment of keys, even over a log written under a higher bound."""
        for number in sorted(noted, reverse=True):
            found = self._record_in(self._fds[number], 0, noted[number]) if noted[number] else None
            if found is not None:
                return max(0, found.seq - self.max_keys)
        return 0

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
                    # Never read here (this process attached before the log had it): another
                    # process's expiry may have deleted it since, with segments after it (one
                    # deleted by hand, its committed size known, is refused there).
                    following = self._next_segment(number - 1)
                    if following is None:
                        return  # no log yet
                    self._segment = following
                    continue
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
            following = self._next_segment(number)
            if following is None:
                return
            self._segment = following

    def _next_segment(self, number: int) -> int | None:
        """Open the segment after ``number``, full: the next number, or, when another process's
        expiry deleted that one before this process read it (its keys no longer count), the
        oldest left after it. None when the log has none after it yet."""
        if self._open_segment(number + 1) is not None:
            return number + 1
        for later in self.segments():
            if later <= number + 1:
                continue
            for gone in range(number + 1, later):
                if self.committed_size(segment_name(gone)):  # expiry forgets it before it deletes
                    raise Found(
                        f"the key log {segment_name(gone)} was deleted under the running server before it read "
                        "its committed keys (expiry forgets a segment's committed size first; this one's is known)"
                    )
            if self._open_segment(later) is not None:
                log.info("the key log's segments %d to %d were expired by another process first", number + 1, later - 1)
                return later
        return None

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
        where they end. A damaged record with whole ones after it is skipped (its key is lost,
        theirs are read); a torn one at the end stops the reading; ``cut`` (the lock held): it
        is cut off."""
        fd = self._fds[number]
        while True:
            start = self._read_whole(number, fd, start, stop)
            if start >= stop or self.stop_loading:
                return start
            past = self._past_damage(fd, start, stop)
            if past < 0:
                break
            log.warning(
                "skipped a damaged record in the key log %s at %d (its key is lost)", segment_name(number), start
            )
            start = self._ends[number] = past
        if cut and number == self._segment:
            log.warning("cut a torn record off the key log %s at %d of %d", segment_name(number), start, stop)
            os.ftruncate(fd, start)
        elif number != self._segment:
            log.warning("skipped a torn record in the key log %s at %d", segment_name(number), start)
            self._ends[number] = stop
        return start

    def _read_whole(self, number: int, fd: int, start: int, stop: int) -> int:
        """Take the records of segment ``number`` from ``start`` up to ``stop`` or the first that
        does not read whole; returns where they end."""
        while start < stop and not self.stop_loading:
            buf = os.pread(fd, min(stop - start, _LOAD_READ), start)
            at, end = self._take(buf, place(number, start))
            reached = start + end >= stop
            start += at
            self._ends[number] = start
            if end == 0 or (at < end and (reached or at == 0)):
                break  # a torn record: the bytes left do not make one
        return start

    def _past_damage(self, fd: int, at: int, stop: int) -> int:
        """The offset after the record at ``at``, which does not read whole, when its length
        leads to a whole record before ``stop``: damage inside a committed record (a bad
        sector, a stray write), not a torn append, which only ever ends a segment. -1 otherwise
        (its length damaged too, or nothing whole after it: a torn tail)."""
        head = os.pread(fd, 4, at)
        after = at + int.from_bytes(head, "big") if len(head) == 4 else stop
        if after - at < FIXED or after >= stop:
            return -1
        found = self._record_in(fd, after, stop)
        return after if found is not None else -1

    def _record_in(self, fd: int, offset: int, stop: int) -> Record | None:
        """The whole record at ``offset`` of a segment, not past ``stop``, or None."""
        head = os.pread(fd, min(_RECORD_READ, stop - offset), offset)
        if len(head) >= 4 and (length := int.from_bytes(head[:4], "big")) > len(head):
            head = os.pread(fd, min(length, stop - offset), offset)
        found = decode(head, 0, len(head))
        return None if found is None else found[0]

    def _take(self, buf: bytes, base: int) -> tuple[int, int]:
        """Take the whole records of ``buf`` (at place ``base``) into memory: (the end of the
        last whole one, len(buf)). The loop a start runs 10 million times: compiled with the
        compiled codec (tiny._codec.take_keys), in Python with the reference codec."""
        cutoff = time.time() - self.window
        at, last = self._take_compiled(buf, base, cutoff) if CODEC == "rust" else self._take_python(buf, base, cutoff)
        if last >= 0:
            found_last = decode(buf, last, len(buf))
            if found_last is not None:
                self.last = (found_last[0].key.decode(), found_last[0].seq, found_last[0].stored)
        return at, len(buf)

    def _take_compiled(self, buf: bytes, base: int, cutoff: float) -> tuple[int, int]:
        """:meth:`_take_python`'s loop, compiled: it hands back a table past its limit to be
        grown, and a slot of the same hash, whose record only this object can read (``_same``)."""
        from tiny._codec import take_keys

        table, at, last = self.table, 0, -1
        while True:
            hashes, places, _, limit = table.slots()
            stop, at, self.newest, self._flush_first, table.size, found, taken, record, h = take_keys(
                buf, at, base, hashes, places, self.newest, self._flush_first, table.size, cutoff, self._floor, limit
            )
            self._taken += taken
            last = max(last, found)
            if stop == _GROW:
                table.grow()
            elif stop == _SAME:
                self._want = buf[record + FIXED : record + FIXED + buf[record + KEY_LENGTH_AT]]
                table.put(h, base + record, self._same)
            else:
                return at, last

    def _take_python(self, buf: bytes, base: int, cutoff: float) -> tuple[int, int]:
        """Take the whole records of ``buf`` (at place ``base``) stored from ``cutoff`` on into
        the table: (the end of the last whole one, the offset of the newest, or -1). decode()
        and KeyTable.put() inlined (the same probe: a slot of the same hash is the same key only
        when its record says so)."""
        view = memoryview(buf)
        unpack_head, unpack_fields, crc32 = HEAD.unpack_from, FIELDS.unpack_from, zlib.crc32
        table, same = self.table, self._same
        hashes, places, mask, limit = table.slots()
        newest, flush_first, last, floor, taken = self.newest, self._flush_first, -1, self._floor, 0
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
                taken += 1
                if flags & FIRST:
                    flush_first = seq
                if stored >= cutoff and seq > floor:
                    key = buf[at + FIXED : at + FIXED + key_length]
                    h = key_hash(key)
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
        self._taken += taken
        return at, last

    def _same(self, where: int) -> bool:
        """Whether the record at ``where`` is of the key a probe looks for (it is kept, read)."""
        record = self._record_at(where)
        self._seen = record
        return record is not None and record.key == self._want

    def _record_at(self, where: int) -> Record | None:
        """The record at place ``where``, read whole once; None when its segment is gone from
        this process (expired), or when it no longer reads whole: then ``unreadable`` is set
        (its segment was cut or overwritten under the server)."""
        number, offset = split(where)
        fd = self._fds.get(number)
        if fd is None:
            return None
        head = os.pread(fd, _RECORD_READ, offset)
        if len(head) >= 4 and (length := int.from_bytes(head[:4], "big")) > len(head):
            head = os.pread(fd, min(length, _LOAD_READ), offset)  # (a longer one could not have been read)
        found = decode(head, 0, len(head))
        if found is None:
            self.unreadable = where
            return None
        return found[0]

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

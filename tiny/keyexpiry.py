"""Expiry of the idempotency keys: the oldest dropped from memory in step with the log, whole segments deleted.

A key counts for ``window`` seconds, and only while it is among the newest ``max_keys`` (those
of the newest flush always count). Keys leave in the order they came, so expiry is a cursor
over the key log (``.tiny/keys/NNNNNNNN.log``, tiny.keylog), from its oldest record on: after
each flush with keys it drops from memory at most twice the records it took since its last
expiry (the flush's own, and the others' that it read: not the segments it skipped, which the
others expired) plus :data:`EXPIRE_SLACK`. A flush's expiry is thus linear in what it wrote and
read anyway: no flush pays for a backlog of keys aged past the window (a data dir idle for a
day), and a process that stores few keys of its own keeps pace with the log all the same, its
table and its open segments within the bound. It reads the cursor's segment
:data:`_WALK_READ` bytes at a time; a commit that expires nothing reads nothing (the record at
the cursor is remembered). A segment walked past whole is deleted
(never the newest), its committed size forgotten first (``on_drop``), and its descriptor
closed; there is no rewrite.

Locking: the data dir's flush lock held by the caller (after the flush's commit point), one
thread. Another process may have deleted a segment first: its absence is no error.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

from tiny.keyload import KeyReader
from tiny.keylog import FIXED, Record, decode, key_hash, place, segment_name

EXPIRE_SLACK = 8  # a commit that took k records since the last expiry expires at most 2k + EXPIRE_SLACK old keys
_WALK_READ = 1 << 16  # bytes expiry reads of the oldest segment at a time


class KeyExpiry(KeyReader):
    """The key log read into memory (tiny.keyload), with its expiry; see the module docstring."""

    def __init__(self, path: Path, *, fsync: bool, window: float, max_keys: int, mode: str, segment_bytes: int) -> None:
        super().__init__(path, fsync=fsync, window=window, max_keys=max_keys, mode=mode, segment_bytes=segment_bytes)
        self.on_drop: Callable[[str], None] = lambda name: None  # a segment deleted: forget its committed size
        self.count = 0  # keys counted at this process's last commit with keys (newest seq - oldest + 1)
        self.expired = 0  # keys this process's commits expired (for tests and bounds)

    def _reset(self) -> None:
        super()._reset()
        self._walk_buf = b""
        self._walk_base = -1  # offset of _walk_buf in the cursor's segment
        self._oldest: tuple[int, float] | None = None  # (seq, stored) of the record at expiry's cursor

    def _expire_taken(self) -> None:
        """Expire at most twice the records taken since the last expiry (read, or this
        process's own: not the seqs of segments it skipped, which the others expired), plus
        EXPIRE_SLACK."""
        self._expire(2 * self._taken + EXPIRE_SLACK)

    def _expire(self, limit: int) -> None:
        """Drop from memory the oldest keys that no longer count, at most ``limit``; delete each
        segment walked past whole (never the newest). Updates ``count``."""
        self._taken = 0
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
                if found is None:  # damaged since, or skipped when read (tiny.keyload): step over it
                    past = self._past_damage(fd, offset, end)
                    self._walk = (number, end if past < 0 else past)
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

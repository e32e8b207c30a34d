"""The idempotency keys: what a flush with keys does with each, over the key log read into memory.

The keys live in the key log, ``.tiny/keys/NNNNNNNN.log`` (tiny.keylog gives its layout), which
a flush with keys appends to like a data file: its records go into the flush's intent with
the day files (tiny.intent, tiny.appender), are written (fsync mode: synced) with them, and
count once the intent's mark, the commit point of every flush, is set; a flush that fails or
dies before it is cut back with its rows by the same recovery. So a flush's keys and its rows
are kept together or not at all, and nothing but the log is written for a key: no B-tree page,
no second file, no second fsync.

:class:`KeyStore` is made of one piece per job, each a module:

- tiny.journal_meta: the journal's meta in SQLite (``.tiny/journal.sqlite3``);
- tiny.keyload: the log read into memory at a process's start, and what others appended since;
- tiny.keyexpiry: the oldest keys dropped in bounded steps, whole segments deleted;
- here: the decisions of a flush with keys (:meth:`KeyStore.decide`), and its new keys taken
  into memory after its commit point (:meth:`KeyStore.commit`).

Every process decides on the whole log, so all processes and servers sharing the data dir
decide alike. A key counts for ``window`` seconds, and only while it is among the newest
``max_keys`` (those of the newest flush always count): :meth:`KeyStore.decide` answers a key
that counts from its record and appends one for each new key (per key, the flush's first
append decides).

Locking: every method but :meth:`KeyStore.close` and :meth:`KeyStore.load` expects the data
dir's flush lock held by the caller (tiny.flushlock), and one thread.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from tiny.commit import Claim, Stored
from tiny.keyexpiry import KeyExpiry
from tiny.keylog import FIRST, FIXED, KEY_LENGTH_AT, encode, key_hash, place, segment_name, split
from tiny.refusals import Found


class KeyStore(KeyExpiry):
    """The keys of the data dir whose journal database is at ``path``; see the module docstring."""

    def _reset(self) -> None:
        super()._reset()
        self._new: list[tuple[int, int, int]] = []  # the flush under way's new keys: (hash, offset in its bytes, seq)
        self._new_at = (0, b"")  # the segment they go to, and their bytes

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
        decided: dict[str, Claim | Stored] = {}
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
                if isinstance(known, Claim):  # a new key of this flush: answered as its first append
                    known = decided[claim.key] = Stored(known.digest, known.answer)
                decisions.append(known)
                continue
            key = claim.key.encode()
            h = key_hash(key)
            stored = self._counting(key, h, now)
            if stored is not None:
                decided[claim.key] = stored
                decisions.append(stored)
                continue
            decided[claim.key] = claim
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
        self._want, self.unreadable = key, -1
        if self.table.find(h, self._same) < 0 or self._seen is None:
            if self.unreadable >= 0:  # a record of this hash (of this key, but for a 2**-64 chance) is lost
                number, offset = split(self.unreadable)
                raise Found(
                    f"the key log {segment_name(number)} no longer holds the record at {offset} this server read "
                    "from it: a key of a committed flush cannot be read back (its segment cut or overwritten under "
                    "the server)"
                )
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
        the log), then expire at most twice the records taken since the last expiry (these and
        the others' the flush read) plus EXPIRE_SLACK of the oldest."""
        new, self._new = self._new, []
        if not new:
            if self._taken and not self._loading:  # replays only, the others' records read
                self._expire_taken()
            return
        number, data = self._new_at
        if size_before is not None and size_before == self._ends.get(number, 0) and self._take_own(number, size_before):
            base = place(number, size_before)
            for h, offset, _ in new:
                self._want = data[offset + FIXED : offset + FIXED + data[offset + KEY_LENGTH_AT]]
                self.table.put(h, base + offset, self._same)
            self._ends[number] = size_before + len(data)
            self._flush_first, self.newest = new[0][2], new[-1][2]
            self._taken += len(new)
        else:
            self.refresh()
        self._expire_taken()

    def _take_own(self, number: int, size_before: int) -> bool:
        """Whether this process reads segment ``number`` on from ``size_before`` (it made it: opened now)."""
        if number == self._segment and number in self._fds:
            return True
        if number != self._segment + 1 or size_before != 0 or self._open_segment(number) is None:
            return False
        self._ends[number] = 0
        self._segment = number
        return True

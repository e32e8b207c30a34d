"""The intent of the flush under way (``.tiny/intent``), its recovery, and the committed sizes read without the lock.

Layout: one record at offset 0: a state byte (``I`` under way, ``-`` committed, ``x`` undone),
the payload's length (4 bytes, big-endian), its CRC-32 (4 bytes), and the payload, JSON
``[first_key, files, last, token]`` or ``[first_key, files, last, token, position]``:

- ``files``: per file the flush appends to (a :class:`FileSpan`), ``[name, size_before,
  size_after, created]``, the name relative to the data dir (records of an earlier format have
  no ``size_after``);
- ``first_key``: null, or (an intent of the previous format, whose keys were in SQLite) the
  first Idempotency-Key the flush stored: the key that made it committed; ``last``: null, or
  (the previous format) ``[key, seq, stored]``, the newest key committed before it. A flush of
  this format names the key log's segment among its files instead (tiny.keys); ``token``:
  unique to this flush (this opening's and a count), so that no two flushes write the same
  record;
- ``position`` (optional): ``[before, after]``, the position in an outside order (cluster mode's
  log) committed before this flush and the one it commits, so that a follower's position
  commits together with its bytes (:meth:`IntentFile.committed_position`).

Bytes after the record are an older, longer record's. Rules:

- Every method but :meth:`IntentFile.peek_committed_sizes` expects the caller to hold the
  data dir's flush lock (tiny.flushlock), whose fence is this file's flock.
- A flush writes its record (:meth:`IntentFile.write`, one ``pwrite``; fsync mode: synced)
  before the first byte of its data, having checked each of its files against its committed
  size (tiny.committed_sizes); it sets the state byte once it ended (a 1-byte ``pwrite``,
  which cannot tear): ``-`` at its commit point (the commit point itself of every flush;
  the previous format's flushes with keys committed them in SQLite first), then records its
  files' sizes after it as committed; ``x`` once it was cut back.
- A record left ``I`` (a crash) is recovered by the next holder of the lock
  (:meth:`IntentFile.recover`): kept and marked ``-`` if it names a first key and that key is
  stored (a flush of the previous format that committed its keys and died before its mark);
  otherwise every file cut back to exactly its size before
  (a file it created removed; fsync mode: synced), then marked ``x``. Recovery cuts only what it
  knows the flush wrote, and refuses (Found) a file longer than the flush could have made it or
  shorter than where it began. A record failing its CRC was torn while written, before any
  data: it is marked ``x``.
- A record within one 512-byte sector (a follower's: a few day files and a position) is, on a
  disk that writes a sector whole (what SQLite's "powersafe overwrite" assumes), on disk whole
  or not at all after a power loss; a torn one loses its position, which
  :meth:`IntentFile.committed_position` then refuses to guess.
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from tiny import layout
from tiny.committed_sizes import SizeTable, shorter_message, ways_past
from tiny.files import size_of
from tiny.flushlock import open_fd
from tiny.refusals import Found

log = logging.getLogger("tiny.intent")

LIVE, FINISHED, UNDONE = b"I", b"-", b"x"  # the state byte: under way, committed, undone
_READ_WHOLE = 1 << 24  # the most a record is read as (one pread)
_UNLOCKED_BYTES = 1 << 16  # a record longer than this is read under the lock


@dataclass(frozen=True, slots=True)
class FileSpan:
    """One file a flush appends to, as its intent records it first."""

    name: str  # relative to the data dir
    size_before: int
    size_after: int | None  # size_before + the bytes the flush writes (None: a record of an earlier format)
    created: bool  # the flush created the file: undoing it removes it


@dataclass(frozen=True, slots=True)
class Record:
    """An intent record as read back."""

    state: bytes  # LIVE, FINISHED or UNDONE
    first_key: str | None
    spans: list[FileSpan]
    last: tuple[str, int, float] | None
    position: tuple[int, int] | None  # (committed before the flush, committed by it)


class IntentFile:
    """The intent file of ``data_dir``; see the module docstring. ``sizes``: the committed
    sizes its flushes are checked against and recorded into (None: not tracked)."""

    def __init__(self, data_dir: Path, fsync: bool = False) -> None:
        self.data_dir = data_dir
        self.path = layout.intent_path(data_dir)
        self.fsync = fsync
        self.fd = -1
        self.sizes: SizeTable | None = None
        self._root = str(data_dir)  # joined as strs: Path joins cost more than the stats
        self._token = ""
        self._written = 0  # records this opening wrote (the token's count)
        self._record = b""  # the record of this process's flush under way (is_ours compares)
        self._spans: list[FileSpan] = []  # its files (mark_committed records their sizes after it)

    def open(self, create: bool = False) -> None:
        """Open the file (``create``: a new, empty one in its place). Refused when it cannot be."""
        self.fd = open_fd(self.path, os.O_RDWR | (os.O_CREAT | os.O_TRUNC if create else 0))
        self._token = f"{os.getpid()}-{os.urandom(6).hex()}"

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def write(
        self,
        spans: list[FileSpan],
        first_key: str | None = None,
        last: tuple[str, int, float] | None = None,
        position: tuple[int, int] | None = None,
    ) -> None:
        """Record a flush about to append to ``spans``, before its data (see the module
        docstring for the fields). First, each file must be at least as long as it is known
        to be committed (Found, naming the file and the bytes missing: the flush writes
        nothing). OSError when the record is written short (a full disk)."""
        self._check_committed(spans)
        self._record, self._spans = self._write_record(LIVE, spans, first_key, last, position), spans
        if self.fsync:
            os.fsync(self.fd)

    def _write_record(
        self,
        state: bytes,
        spans: list[FileSpan],
        first_key: str | None,
        last: tuple[str, int, float] | None,
        position: tuple[int, int] | None,
    ) -> bytes:
        """Write a record at offset 0 with one pwrite; returns it. OSError when written short."""
        self._written += 1
        files = [[s.name, s.size_before, s.size_after, int(s.created)] for s in spans]
        fields: list[object] = [first_key, files, list(last) if last else None, f"{self._token}-{self._written}"]
        if position is not None:
            fields.append(list(position))
        payload = orjson.dumps(fields)
        record = state + len(payload).to_bytes(4, "big") + zlib.crc32(payload).to_bytes(4, "big") + payload
        written = os.pwrite(self.fd, record, 0)
        if written != len(record):  # a short write (disk full): the flush fails, its caller rolls back
            raise OSError(f"the intent was written short ({written} of {len(record)} bytes)")
        return record

    def is_ours(self) -> bool:
        """The file still holds the record this process wrote last (one pread)."""
        return os.pread(self.fd, len(self._record), 0) == self._record

    def mark_committed(self) -> None:
        """Set the state ``-`` (the commit point of a flush without keys), then record the
        sizes its files have after it as committed. OSError when the mark fails."""
        self._mark(FINISHED)
        spans, self._spans = self._spans, []
        self.record_sizes(spans)

    def mark_undone(self) -> None:
        """Set the state ``x``: the flush's files were cut back."""
        self._spans = []
        self._mark(UNDONE)

    def _mark(self, state: bytes) -> None:
        os.pwrite(self.fd, state, 0)  # one byte: it cannot be written in part
        if self.fsync:
            os.fsync(self.fd)

    def read(self) -> Record | None:
        """The record the file holds; None when it holds none or a torn one."""
        return parse(os.pread(self.fd, _READ_WHOLE, 0))

    def recover(self, committed: Callable[[str], bool], forgotten: frozenset[str] = frozenset()) -> int:
        """Recover the flush a crash left unfinished, if any (see the module docstring);
        ``committed(key)`` says whether a first key is stored. Returns the files cut back. A
        file not where the flush could have left it raises Found, the record left as it is.
        ``forgotten``: files left as they are (tiny-admin forget removes or accepts them: their
        bytes of an uncommitted flush go with them)."""
        if os.pread(self.fd, 1, 0) != LIVE:  # the usual case: finished, or never written
            return 0
        record = self.read()
        if record is None:
            log.warning("dropped a torn intent (a flush stopped before writing any data)")
            self._mark(UNDONE)
            return 0
        kept = record.first_key is not None and committed(record.first_key)
        spans = [span for span in record.spans if span.name not in forgotten]
        for span in spans:
            self._check_recoverable(span, kept)
        if kept:
            self._mark(FINISHED)
            self.record_sizes(spans)
            return 0
        self.cut_back(spans)
        log.warning("recovered from an unfinished flush: %s", ", ".join(s.name for s in spans))
        self._mark(UNDONE)
        return len(spans)

    def _check_recoverable(self, span: FileSpan, kept: bool) -> None:
        path = self.data_dir / span.name
        size = size_of(path)  # -1: missing
        if span.size_after is not None and size > span.size_after:
            raise Found(
                f"{path} is {size} bytes, past the {span.size_after} that the unfinished flush in {self.path} "
                "could have left: the data dir was copied while a server wrote to it (the journal is older than "
                "the files; copy a live data dir with `tiny-admin backup`), or the file was written by something else"
            )
        low = span.size_after if kept and span.size_after is not None else -1 if span.created else span.size_before
        if size < low:
            raise Found(
                f"{path} is {max(size, 0)} bytes{'' if size >= 0 else ' (missing)'}, shorter than the {low} that the "
                f"unfinished flush in {self.path} records: the files are older than the journal, or were cut by hand. "
                f"{ways_past(self.data_dir, span.name)}"
            )

    def cut_back(self, spans: Sequence[FileSpan]) -> None:
        """Cut each file back to its size before the flush (one it created, removed)."""
        for span in spans:
            path = self.data_dir / span.name
            try:
                if span.created and span.size_before == 0:
                    path.unlink(missing_ok=True)
                    continue
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                if os.fstat(fd).st_size > span.size_before:
                    os.ftruncate(fd, span.size_before)
                    if self.fsync:
                        os.fsync(fd)
            finally:
                os.close(fd)

    def _check_committed(self, spans: list[FileSpan]) -> None:
        if self.sizes is None:
            return
        for span in spans:
            committed = self.sizes.known(span.name)
            if span.size_before < committed:
                found = -1 if span.created else span.size_before
                raise Found(shorter_message(self.data_dir, span.name, found, committed))

    def record_sizes(self, spans: Sequence[FileSpan]) -> None:
        """The files of a committed flush are committed up to their sizes after it. A failure
        (a disk refusing a new slot) leaves the table lower: a weaker check, never a false one;
        the flush stays committed."""
        if self.sizes is None:
            return
        try:
            for span in spans:
                if span.size_after is not None:
                    self.sizes.record(span.name, span.size_after)
        except OSError as exc:
            log.error("could not record the committed sizes of a flush (%s): %s", self.sizes.path, exc)

    def rewrite_without(self, names: set[str]) -> None:
        """Drop ``names`` from a settled record (not under way), its state kept, in one pwrite:
        their files were forgotten (tiny-admin forget), so the history check at open no longer
        holds them to the sizes this record gives them."""
        record = self.read()
        if record is None or record.state == LIVE or not any(s.name in names for s in record.spans):
            return
        kept = [s for s in record.spans if s.name not in names]
        self._write_record(record.state, kept, record.first_key, record.last, record.position)  # one pwrite
        if self.fsync:
            os.fsync(self.fd)

    def committed_position(self) -> int | None:
        """The outside position committed with the data files: the position of the last flush
        that committed, by its record (after recovery: call with the lock held). None when the
        record carries none; Found when it is torn (the position cannot be known)."""
        raw = os.pread(self.fd, _READ_WHOLE, 0)
        record = parse(raw)
        if record is None:
            if not raw:
                return None
            raise Found(f"the intent {self.path} is torn: the position committed with the files is not known")
        if record.position is None:
            return None
        if record.state == LIVE:
            raise Found(f"the intent {self.path} is of a flush under way: recover it first")
        return record.position[1] if record.state == FINISHED else record.position[0]

    def peek_committed_sizes(self, names: Sequence[str]) -> dict[str, int] | None:
        """The sizes of the files ``names`` (those that exist) below which every byte is
        committed, read without the flush lock, or None when that cannot be known so now.

        A seqlock on this file: every flush writes its record (state, length, CRC, the files
        with their sizes before) before its first byte reaches a file, and marks it after its
        last, and no two flushes write the same record. So when the record's first 9 bytes are
        the same before and after the stats, no flush began or ended meanwhile: with no flush
        under way every byte stat'ed is committed; with one under way (or a crashed one's
        record waiting for recovery), the files it names are committed up to their sizes
        before it, the others up to their sizes. (A flush committed whose mark failed counts as
        under way until the next flush marks it.) A few system calls, never a wait. None when
        the record changed three times in a row, or is torn or too long to read in one go."""
        if self.fd < 0:
            return None
        for _ in range(3):
            raw = os.pread(self.fd, _UNLOCKED_BYTES, 0)
            before: dict[str, int] = {}
            if raw[:1] == LIVE:
                record = parse(raw)
                if record is None:
                    continue  # being written, torn, or longer than read
                before = {span.name: span.size_before for span in record.spans}
            sizes = {}
            for name in names:
                try:
                    size = os.stat(os.path.join(self._root, name)).st_size
                except FileNotFoundError:
                    continue
                sizes[name] = min(size, before[name]) if name in before else size
            if os.pread(self.fd, 9, 0) == raw[:9]:
                return sizes
        return None


def parse(raw: bytes) -> Record | None:
    """The record at the start of ``raw`` (the bytes after it are an older, longer record's);
    None when there is none or it is torn. Spans of the earlier format have no size after."""
    size, crc = int.from_bytes(raw[1:5], "big"), raw[5:9]
    payload = raw[9 : 9 + size]
    if len(raw) < 9 or len(payload) != size or zlib.crc32(payload).to_bytes(4, "big") != crc:
        return None
    fields = orjson.loads(payload)
    spans = [
        FileSpan(f[0], f[1], f[2], bool(f[3])) if len(f) == 4 else FileSpan(f[0], f[1], None, bool(f[2]))
        for f in fields[1]
    ]
    last = tuple(fields[2]) if len(fields) > 2 and fields[2] else None
    position = tuple(fields[4]) if len(fields) > 4 and fields[4] else None
    return Record(raw[:1], fields[0], spans, last, position)  # type: ignore[arg-type]

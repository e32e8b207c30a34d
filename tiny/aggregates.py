"""The aggregate store: downloads per day, package, hour and ip_id of the day files, kept as rows arrive.

The day files stay the source of truth; this is a summary of them that any process can bring
up to date and read. On disk, in ``DATA_DIR/.tiny/`` (tiny.layout):

- ``aggregates.sqlite3`` (and its ``-wal``, ``-shm``): SQLite in WAL mode, written without
  fsync and trusted only by the boot that wrote it or after a sync (:meth:`Aggregates.sync`;
  ``aggregates.boot`` and ``aggregates.lock``: tiny.unsynced). Its tables (tiny.aggregate_sql):
  for each day file, which file it counted and how many of its bytes (tiny.counted_file); per
  day, downloads and bytes per package, per hour, per ip_id (with its downloads per hour and
  per country: tiny.aggregate_count).
- ``aggregates.generation``: the store's generation (tiny.aggregate_generation), which a
  rebuild raises.

Locking. Every write is one SQLite transaction begun ``BEGIN IMMEDIATE`` (tiny.transaction),
whose first step marks the store written under this boot (tiny.unsynced.Marker.before_write):
SQLite's write lock is the store's, and a process waits for another's transaction up to its
busy timeout, then gets :class:`tiny.aggregate_errors.Unavailable`. Readers use their own
snapshot and never wait. A connection is opened while holding the marker's lock
(tiny.unsynced.Marker.admit), which may replace an untrusted store: a connection whose file was
replaced opens the store again at its next fold.

:meth:`Aggregates.fold` reads only the bytes appended since, complete lines only, and adds
them in one transaction per step with the new ``consumed`` (steps sized by tiny.fold_pace):
killed at any point it leaves the old state or the new, and a second process folding at the
same time waits for the first's step and then folds only what is left, so nothing is counted
twice or lost. At its deadline it raises :class:`tiny.aggregate_errors.Behind`, which says
what is left, read at that moment. :meth:`Aggregates.rebuild` counts everything again in one
transaction and raises the generation (``tiny-admin rebuild-aggregates``).

The sizes to fold up to come from the caller, noted under the data dir's flush lock
(tiny.sink.DailyFileSink.committed_sizes): bytes below such a size are committed and no
recovery will ever cut them, so a count never includes a row that vanishes.

Errors say what they are (:class:`tiny.aggregate_errors.Unavailable`, a 503): a full disk, an
I/O error, the store's write lock held past the wait, a day file that cannot be read.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote

from tiny import aggregate_sql as sql
from tiny import codec, layout, limits, unsynced
from tiny.aggregate_count import Sums, count
from tiny.aggregate_errors import Behind, reported, store_error
from tiny.aggregate_generation import generation_path, publish, read_generation
from tiny.aggregate_sql import Counted
from tiny.counted_file import EDGE, DayFile, digest, fingerprint, open_day, same
from tiny.fold_pace import Pace
from tiny.layout import HEADER
from tiny.transaction import immediate

_REBUILD_STEP = limits.FOLD_MAX_STEP  # a rebuild's steps: one transaction, no deadline


def aggregates_path(data_dir: Path) -> Path:
    """The store's SQLite file in ``data_dir``."""
    return layout.state_dir(data_dir) / "aggregates.sqlite3"


class _Folded(NamedTuple):
    rows: int
    consumed: int  # the bytes of the file counted now
    read: int  # the new bytes this step read


class Aggregates:
    """The aggregate store of ``data_dir`` (opened on first use, in this process); its files and
    locking rules are in the module docstring."""

    def __init__(self, data_dir: Path, busy_timeout: float = 10.0) -> None:
        self.data_dir = Path(data_dir)
        self._root = str(self.data_dir)  # (joined as strs: Path joins cost more than the reads)
        self.busy_timeout = busy_timeout  # seconds to wait for another process's transaction
        self.path = aggregates_path(self.data_dir)
        self.marker = unsynced.Marker(self.path)
        self._db: sqlite3.Connection | None = None
        self._closer: weakref.finalize | None = None  # closes it as tiny.unsynced says, also at exit
        self._inode = -1  # the store file's, when this connection opened it
        self._pace = Pace()
        # day -> (its file's stat, the files row it matched): see _counted and _unchanged
        self._seen: OrderedDict[str, tuple[tuple[int, int, int, int], Counted]] = OrderedDict()

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            uri = f"file:{quote(str(self.path))}?mode=rwc"
            try:
                with self.marker.admit(self.busy_timeout):
                    db = sqlite3.connect(
                        uri, uri=True, isolation_level=None, check_same_thread=False, timeout=self.busy_timeout
                    )
                    try:
                        _set_up(db, self.marker, generation_path(self.data_dir), time.monotonic() + self.busy_timeout)
                        self._inode = os.stat(self.path).st_ino
                    except BaseException:
                        db.close()
                        raise
            except (OSError, sqlite3.Error) as exc:  # (a TimeoutError of the marker's lock among them)
                raise store_error(exc) from exc
            self._db = db
            self._closer = weakref.finalize(self, unsynced.close, db, self.marker)
        return self._db

    def close(self) -> None:
        """Close this process's connection (:func:`tiny.unsynced.close`); the next use opens
        the store again. Also done when this object is collected, or at interpreter exit."""
        if self._closer is not None:
            self._closer()
            self._closer = None
        self._db = None

    def sync(self) -> bool:
        """Put every write of the store on disk and mark it so (tiny.unsynced): for a graceful
        stop, so that the next boot trusts the store instead of counting the days again. False
        (nothing done) when there is no store, or another process kept its write lock longer
        than the busy timeout; :class:`tiny.aggregate_errors.Unavailable` when it cannot be
        opened or marked."""
        if not self.path.exists():
            return False
        try:
            with immediate(self.db):  # no write meanwhile; nothing is written by this one
                unsynced.fsync_files(self.path)
                self.marker.mark_synced()
        except sqlite3.OperationalError:
            return False
        return True

    def generation(self) -> int:
        """The store's generation (:func:`read_generation`), as this connection sees it now."""
        with reported():
            return sql.generation(self.db)

    def publish_generation(self) -> None:
        """Write the store's generation to its file if the file says another (lost, or written
        by a rebuild that never committed), under the store's write lock: no rebuild
        publishes meanwhile."""
        with reported(), immediate(self.db):
            generation = self.generation()
            if read_generation(self.data_dir) != generation:
                publish(generation_path(self.data_dir), generation)

    def _reopen_if_replaced(self) -> None:
        """Open the store again if its file is no longer the one this connection has (deleted
        by an operator, or as untrusted by another process: tiny.unsynced.Marker.admit)."""
        if self._db is not None:
            try:
                replaced = os.stat(self.path).st_ino != self._inode
            except FileNotFoundError:
                replaced = True
            if replaced:
                self.close()

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """A write transaction (tiny.transaction.immediate) whose first step marks the store
        written under this boot (tiny.unsynced)."""
        with immediate(self.db):
            self.marker.before_write()
            yield

    def fold(
        self, sizes: Mapping[str, int], within: tuple[str, str] | None = None, deadline: float | None = None
    ) -> int:
        """Bring the days of ``sizes`` (day -> committed size of its file) up to date; returns
        the rows folded in. One transaction per step (see the module docstring), so that a long
        catch-up lets other processes' folds and reads in between. With ``within`` (first and
        last day), a day of that span that is stored but not in ``sizes`` is forgotten: its
        file was removed. At ``deadline`` (time.monotonic(), which is the same clock in every
        process of the machine), :class:`Behind` (what was folded stays: the next fold goes on
        from there). :class:`tiny.aggregate_errors.Unavailable` when the store or a day file
        cannot be read or written (saying why)."""
        with reported():
            self._reopen_if_replaced()
            if within is not None:
                for day in sql.days_within(self.db, within):
                    if day not in sizes:
                        with self._writing():
                            self._forget(day)
            days = list(sizes.items())
            return sum(self._fold_day(days, index, deadline) for index in range(len(days)))

    def _fold_day(self, days: list[tuple[str, int]], index: int, deadline: float | None) -> int:
        """Fold ``days[index]`` up to its size, in steps; Behind (for it and the days after it) at the deadline."""
        day, size = days[index]
        if self._unchanged(day, size):
            return 0  # up to date: a stat and an indexed read
        folded = 0
        with open_day(self._root, day) as file:
            if file is None:
                if sql.has_day(self.db, day):
                    with self._writing():
                        self._forget(day)
                return 0
            counted = self._counted(file)
            if counted is not None and counted >= size:
                return 0  # up to date: an indexed read and two small reads of the file
            while True:
                if deadline is not None and time.monotonic() >= deadline:
                    behind = self._behind(days[index:])
                    if behind is not None:
                        raise behind
                step = self._pace.step(deadline)
                started = time.monotonic()
                if deadline is not None:  # a wait for another process's transaction ends at the deadline too
                    wait = min(self.busy_timeout, max(0.05, deadline - started))
                    self.db.execute(f"PRAGMA busy_timeout = {int(wait * 1000)}")
                try:
                    with self._writing():
                        done = self._fold_step(file, size, step)
                finally:
                    if deadline is not None:
                        self.db.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
                if done is None:
                    return folded
                self._pace.took(done.read, time.monotonic() - started)
                folded += done.rows
                if done.consumed >= size:
                    return folded

    def rebuild(self, sizes: Mapping[str, int]) -> int:
        """Forget every aggregate and fold the days of ``sizes`` from their start, in ONE
        transaction that also raises the store's generation (:func:`read_generation`):
        readers see the old counts until the new ones are complete; other folds wait (up to
        the connection's timeout) meanwhile. Returns the rows folded."""
        folded = 0
        with reported():
            self._reopen_if_replaced()
            with self._writing():
                self._seen.clear()
                sql.forget_all(self.db)
                for day, size in sorted(sizes.items()):
                    with open_day(self._root, day) as file:
                        while file is not None and (done := self._fold_step(file, size, _REBUILD_STEP)) is not None:
                            folded += done.rows
                            if done.consumed >= size:
                                break
                generation = self.generation() + 1
                sql.set_generation(self.db, generation)
                # Published before the commit: no answer from the old counts is ever kept under it.
                publish(generation_path(self.data_dir), generation)
        return folded

    def _counted(self, file: DayFile) -> int | None:
        """The bytes of ``file`` the store has counted; None when it has no count of this file
        (none of its day, or one of another file, or of bytes no longer there). A file found
        to be the one counted, and unchanged for a second before it was opened, is remembered
        with its stat (:meth:`_unchanged`)."""
        row = sql.counted(self.db, file.day)
        if row is None:
            return None
        consumed = row[3]
        edge = min(consumed, EDGE)
        if not same(file, row, file.read(edge, consumed - edge)):
            return None
        if file.seen[3] <= file.opened_ns - limits.SETTLED_NS:
            self._seen[file.day] = (file.seen, row)
            self._seen.move_to_end(file.day)
            while len(self._seen) > limits.SEEN_DAYS:
                self._seen.popitem(last=False)
        return consumed

    def _unchanged(self, day: str, size: int) -> bool:
        """Whether the day's file is, by its stat, the one :meth:`_counted` found counted and
        unchanged since, and the store still has that count, of at least ``size`` bytes. The
        file's change time (ctime) is what says so: every write, truncation, rename or new file
        in its inode stamps it with the time of the change, which the process cannot choose;
        a file unchanged for a second before it was checked keeps it until it changes again,
        and any change after the check stamps a later time (the kernel's clock for it is coarse
        by at most a tick: milliseconds). (A clock stepped back by hand to the very same
        nanosecond is the one case it would not tell.)"""
        seen = self._seen.get(day)
        if seen is None:
            return False
        try:
            stat = os.stat(os.path.join(self._root, layout.day_file(day)))
        except FileNotFoundError:
            return False
        if fingerprint(stat) != seen[0]:
            return False
        row = sql.counted(self.db, day)
        return row == seen[1] and row is not None and row.consumed >= size

    def _fold_step(self, file: DayFile, size: int, step: int) -> _Folded | None:
        """Fold the next complete lines of ``file`` below ``size``, at most ``step`` bytes (in
        the caller's transaction), from its start if the store's count is of another file or of
        bytes no longer there; None when there is nothing (more) to fold."""
        row = sql.counted(self.db, file.day)
        consumed = 0 if row is None else row[3]
        edge = min(consumed, EDGE)
        # The bytes before the counted offset and the new ones, in one read: what is added was
        # read from the file that was checked.
        data = file.read(edge + max(0, min(step, size - consumed)), consumed - edge)
        if row is not None and not same(file, row, data[:edge]):
            self._forget(file.day)  # another file, or cut below what was counted: from its start
            row, consumed, edge = None, 0, 0
            data = file.read(min(step, size), 0)
        end = data.rfind(b"\n", edge) + 1
        if end <= edge:  # nothing new, or a line still being written
            return None
        start = edge + len(HEADER) if consumed == 0 and data.startswith(HEADER) else edge
        sums = count(data, start, end)
        now = consumed + end - edge
        head = row[1] if row is not None and consumed >= EDGE else digest(data[: min(now, EDGE)])
        self._add(file.day, file.inode, head, digest(data[end - min(now, EDGE) : end]), now, sums)
        return _Folded(sums.rows, now, end - edge)

    def _behind(self, days: list[tuple[str, int]]) -> Behind | None:
        """What is left to fold of ``days``, read now; None when nothing is. The rows left are
        counted (their line ends) when the bytes are at most limits.EXACT_LEFT_*, else estimated."""
        behind: list[tuple[str, int, int]] = []  # (day, bytes counted, size)
        for day, size in days:
            with open_day(self._root, day) as file:
                counted = 0 if file is None else (self._counted(file) or 0)
            if file is not None and size > counted:
                behind.append((day, counted, size))
        if not behind:
            return None
        left = sum(size - counted for _, counted, size in behind)
        first = behind[0][0]
        if left <= (limits.EXACT_LEFT_COMPILED if codec.CODEC == "rust" else limits.EXACT_LEFT_PYTHON):
            rows = sum(self._rows_between(day, counted, size) for day, counted, size in behind)
            return Behind(first, left, rows, True, len(behind))
        return Behind(first, left, self._rows_in(first, left), False, len(behind))

    def _rows_between(self, day: str, start: int, end: int) -> int:
        """The rows (complete lines, not the header) of the day file from ``start`` to ``end``."""
        with open_day(self._root, day) as file:
            if file is None:
                return 0
            header = 1 if start == 0 and file.read(len(HEADER), 0) == HEADER else 0
            if codec.CODEC == "rust":
                from tiny import _codec

                return int(_codec.count_lines(file.fd, start, end, 0)[0]) - header
            lines = 0
            while start < end and (chunk := file.read(min(end - start, 1 << 20), start)):
                lines += chunk.count(b"\n")
                start += len(chunk)
            return lines - header

    def _rows_in(self, day: str, nbytes: int) -> int | None:
        """About how many rows ``nbytes`` of ``day`` hold, by the rows per byte counted so far in
        that day, or in every day (None with fewer than 1,000 rows counted)."""
        for which in (day, None):
            rows, consumed = sql.rows_and_bytes_counted(self.db, which)
            if rows and consumed and rows >= 1000:
                return round(nbytes * rows / consumed)
        return None

    def _add(self, day: str, inode: int, head: bytes, tail: bytes, consumed: int, sums: Sums) -> None:
        sql.add(self.db, day, Counted(inode, head, tail, consumed), sums)

    def _forget(self, day: str) -> None:
        self._seen.pop(day, None)
        sql.forget(self.db, day)


def _set_up(db: sqlite3.Connection, marker: unsynced.Marker, generation_file: Path, deadline: float) -> None:
    """WAL mode, no fsync (tiny.unsynced; with no boot id to mark, synchronous=NORMAL), and
    the tables of tiny.aggregate_sql.VERSION (a store of another version, or an older one without a version,
    is emptied: counted again from the files by the next folds). SQLite answers "locked" at
    once, without its busy wait, to a change of journal mode while another process opens the
    same new file: tried again until ``deadline`` (every step can be repeated)."""
    while True:
        try:
            if db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                marker.before_write()
                db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={'NORMAL' if unsynced.BOOT is None else 'OFF'}")
            if sql.version(db) != sql.VERSION:
                _create(db, marker, generation_file)
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _create(db: sqlite3.Connection, marker: unsynced.Marker, generation_file: Path) -> None:
    """The tables of tiny.aggregate_sql.VERSION in place of whatever is there, and a new generation drawn and
    published, in one transaction (DDL is transactional in SQLite: a second process doing
    the same waits, then finds it done)."""
    with immediate(db):
        marker.before_write()
        if sql.version(db) != sql.VERSION:
            generation = secrets.randbits(62) + 1  # never 0, never one an earlier store had (but by chance)
            sql.create(db, generation)
            publish(generation_file, generation)
            sql.set_version(db)

"""The live aggregates of the day files: downloads per day, package, hour and ip_id, kept as rows arrive.

The day files stay the source of truth; this is a summary of them that any process can bring
up to date and read, in ``DATA_DIR/.tiny/aggregates.sqlite3`` (SQLite, WAL, written without
fsync and trusted only by the boot that wrote it or after a sync: tiny.unsynced). For each day file
it records how many of its bytes are folded in (``files.consumed``, with the file's inode), and
per day: downloads and bytes per package, per hour, per ip_id (with its downloads per hour and
per country). :meth:`Aggregates.fold` reads only the bytes appended since, complete lines only,
and adds them in ONE transaction with the new ``consumed``: killed at any point it leaves the
old state or the new, and a second process folding at the same time waits for the first
(``BEGIN IMMEDIATE``) and then folds only what is left, so nothing is counted twice or lost.

The sizes to fold up to come from the caller, noted under the data dir's flush lock
(tiny.sink.DailyFileSink.committed_sizes): bytes below such a size are committed and no
recovery will ever cut them, so a count never includes a row that vanishes. A day file found
shorter than what was folded, or another file under its name (its inode), is folded again
from its start: that day's aggregates are rebuilt. ``tiny-admin rebuild-aggregates`` rebuilds
them all from the files.

Counting rows: a row is a line of the day file after its header (lines end at LF only: a
string may hold U+2028 or U+0085, which Python's ``splitlines`` would also break at), read by
tiny.cranlog.read_row (the row queries read a whale's rows by the same rule); a quoted ``"NA"``
is the string, a bare ``NA`` is missing. A row that does not parse is skipped
and counted (``files.skipped``): the CSV the sink writes always parses. With the compiled codec
in use (tiny.codec.CODEC), ``tiny._codec.tally`` counts the usual rows of a block with the GIL
released and hands every other line back to :meth:`_Sums.add`, the rule book (about 3x faster
a fold; BENCHMARKS.md "Analytics beside ingest").
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import weakref
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from tiny import codec, layout, unsynced
from tiny.cranlog import read_row
from tiny.layout import HEADER
from tiny.transaction import immediate

_VERSION = 2  # PRAGMA user_version: a store of another version is emptied and counted again
_TABLES = (
    """CREATE TABLE files (
    day TEXT PRIMARY KEY, inode INTEGER NOT NULL, consumed INTEGER NOT NULL,
    rows INTEGER NOT NULL, bytes_hi INTEGER NOT NULL, bytes_lo INTEGER NOT NULL, skipped INTEGER NOT NULL
) WITHOUT ROWID""",
    """CREATE TABLE packages (
    day TEXT NOT NULL, package TEXT NOT NULL, downloads INTEGER NOT NULL, PRIMARY KEY (day, package)
) WITHOUT ROWID""",
    """CREATE TABLE hours (
    day TEXT NOT NULL, hour INTEGER NOT NULL, downloads INTEGER NOT NULL, PRIMARY KEY (day, hour)
) WITHOUT ROWID""",
    """CREATE TABLE ips (
    day TEXT NOT NULL, ip INTEGER NOT NULL, downloads INTEGER NOT NULL,
    bytes_hi INTEGER NOT NULL, bytes_lo INTEGER NOT NULL, PRIMARY KEY (day, ip)
) WITHOUT ROWID""",
    """CREATE TABLE ip_hours (
    day TEXT NOT NULL, ip INTEGER NOT NULL, hour INTEGER NOT NULL, downloads INTEGER NOT NULL,
    PRIMARY KEY (day, ip, hour)
) WITHOUT ROWID""",
    """CREATE TABLE ip_countries (
    day TEXT NOT NULL, ip INTEGER NOT NULL, country TEXT NOT NULL, downloads INTEGER NOT NULL,
    PRIMARY KEY (day, ip, country)
) WITHOUT ROWID""",
    "CREATE INDEX packages_by_name ON packages (package, day)",
    "CREATE INDEX ips_by_downloads ON ips (day, downloads DESC, ip)",  # a day's top whales: an index range
)
_PER_DAY = ("packages", "hours", "ips", "ip_hours", "ip_countries")
# SQLite integers are signed 64-bit; ip_ids and sizes are unsigned 64-bit (and byte sums grow
# past 2^64). An ip_id is stored minus 2^63 (order kept: the top whales' ties stay by ip_id);
# a byte total as two columns, hi = total >> 32 and lo = total & 0xFFFFFFFF, carried on every
# add, so that it stays exact while hi fits 63 bits: up to 2^95 bytes per day and ip_id.
IP_OFFSET = 1 << 63
_LO = 0xFFFFFFFF
# (SQLite evaluates every SET expression on the row as it was: lo's carry goes into hi.)
_ADD_BYTES = (
    "bytes_hi = bytes_hi + excluded.bytes_hi + ((bytes_lo + excluded.bytes_lo) >> 32), "
    "bytes_lo = (bytes_lo + excluded.bytes_lo) & 4294967295"
)


def join_bytes(hi: int, lo: int) -> int:
    """A byte total from its two stored columns."""
    return (hi << 32) + lo


_READ_BLOCK = 8 * 1024**2  # bytes folded per step: memory stays bounded on a big day


class Behind(RuntimeError):
    """A fold ran out of time before the day was up to date: ``(day, bytes left to fold)``."""

    def __init__(self, day: str, left: int) -> None:
        super().__init__(day, left)
        self.day, self.left = day, left

    def __str__(self) -> str:
        return f"the aggregates of {self.day} are catching up ({self.left / 1e6:.1f} MB of it left to count)"


class Unavailable(RuntimeError):
    """The store could not be opened or marked (tiny.unsynced): its lock held past the busy
    timeout, or its marker not writable (a full disk, a wrong file in its place)."""

    def __str__(self) -> str:
        return f"the aggregate store is unavailable ({self.args[0]})"


def aggregates_path(data_dir: Path) -> Path:
    return layout.state_dir(data_dir) / "aggregates.sqlite3"


@dataclass
class _Sums:
    """What one fold adds for one day."""

    rows: int = 0
    bytes: int = 0
    skipped: int = 0

    def __post_init__(self) -> None:
        self.packages: defaultdict[str, int] = defaultdict(int)
        self.hours: defaultdict[int, int] = defaultdict(int)
        self.ips: defaultdict[int, list[int]] = defaultdict(lambda: [0, 0])
        self.ip_hours: defaultdict[tuple[int, int], int] = defaultdict(int)
        self.ip_countries: defaultdict[tuple[int, str], int] = defaultdict(int)

    def add(self, line: str) -> None:
        row = read_row(line)  # the rule book: which lines are rows, and their fields
        if row is None:
            self.skipped += 1
            return
        self.rows += 1
        self.bytes += row.size
        if row.package is not None:
            self.packages[row.package] += 1
        self.hours[row.hour] += 1
        totals = self.ips[row.ip_id]
        totals[0] += 1
        totals[1] += row.size
        self.ip_hours[row.ip_id, row.hour] += 1
        if row.country is not None:
            self.ip_countries[row.ip_id, row.country] += 1


def count(block: bytes, start: int, end: int) -> _Sums:
    """The sums of the day-file lines in ``block[start:end]`` (``end`` just past an LF)."""
    if codec.CODEC == "rust":
        from tiny import _codec

        rows, nbytes, packages, hours, ips, ip_hours, ip_countries, deferred = _codec.tally(block, start, end)
        sums = _Sums(rows, nbytes)
        sums.packages.update(packages)
        sums.hours.update((hour, n) for hour, n in enumerate(hours) if n)
        sums.ips.update(ips)
        sums.ip_hours.update(ip_hours)
        sums.ip_countries.update(ip_countries)
        for first, last in deferred:  # the lines the compiled count leaves to the rule book
            sums.add(block[first:last].decode("utf-8", "replace"))
        return sums
    return count_reference(block, start, end)


def count_reference(block: bytes, start: int, end: int) -> _Sums:
    """:func:`count` by the rule book alone (no compiled codec)."""
    sums = _Sums()
    if end > start:
        for line in block[start : end - 1].decode("utf-8", "replace").split("\n"):
            sums.add(line)
    return sums


class Aggregates:
    """The aggregate store of ``data_dir`` (opened on first use, in this process)."""

    def __init__(self, data_dir: Path, busy_timeout: float = 10.0) -> None:
        self.data_dir = Path(data_dir)
        self.busy_timeout = busy_timeout  # seconds to wait for another process's transaction
        self.path = aggregates_path(self.data_dir)
        self.marker = unsynced.Marker(self.path)
        self._db: sqlite3.Connection | None = None
        self._closer: weakref.finalize | None = None  # closes it as tiny.unsynced says, also at exit
        self._inode = -1  # the store file's, when this connection opened it

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
                        _set_up(db, self.marker, time.monotonic() + self.busy_timeout)
                        self._inode = os.stat(self.path).st_ino
                    except BaseException:
                        db.close()
                        raise
            except OSError as exc:  # (a TimeoutError of the lock among them)
                raise Unavailable(exc) from exc
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
        than the busy timeout; :class:`Unavailable` when it cannot be opened or marked."""
        if not self.path.exists():
            return False
        try:
            with immediate(self.db):  # no write meanwhile; nothing is written by this one
                unsynced.fsync_files(self.path)
                self.marker.mark_synced()
        except sqlite3.OperationalError:
            return False
        return True

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
            try:
                self.marker.before_write()
            except OSError as exc:
                raise Unavailable(exc) from exc
            yield

    def fold(
        self, sizes: Mapping[str, int], within: tuple[str, str] | None = None, deadline: float | None = None
    ) -> int:
        """Bring the days of ``sizes`` (day -> committed size of its file) up to date; returns
        the rows folded in. One transaction per block of at most _READ_BLOCK bytes, so that
        a long catch-up lets other processes' folds and reads in between. With ``within``
        (first and last day), a day of that span that is stored but not in ``sizes`` is
        forgotten: its file was removed. Past ``deadline`` (time.monotonic()), between two
        blocks, :class:`Behind` (what was folded stays: the next fold goes on from there)."""
        folded = 0
        self._reopen_if_replaced()
        if within is not None:
            stored = self.db.execute("SELECT day FROM files WHERE day BETWEEN ? AND ?", within).fetchall()
            for (day,) in stored:
                if day not in sizes:
                    with self._writing():
                        self._forget(day)
        for day, size in sizes.items():
            row = self.db.execute("SELECT inode, consumed FROM files WHERE day = ?", (day,)).fetchone()
            if row is not None and row[1] >= size and row[0] == _inode(self.data_dir, day):
                continue  # up to date: an indexed read and a stat
            while True:
                with self._writing():
                    rows = self._fold_block(day, size)
                if rows is None:
                    break
                folded += rows
                if deadline is not None and time.monotonic() > deadline:
                    consumed = self.db.execute("SELECT consumed FROM files WHERE day = ?", (day,)).fetchone()
                    raise Behind(day, size - (consumed[0] if consumed else 0))
        return folded

    def rebuild(self, sizes: Mapping[str, int]) -> int:
        """Forget every aggregate and fold the days of ``sizes`` from their start, in ONE
        transaction: readers see the old counts until the new ones are complete; other
        folds wait (up to the connection's timeout) meanwhile. Returns the rows folded."""
        folded = 0
        self._reopen_if_replaced()
        with self._writing():
            for table in ("files", *_PER_DAY):
                self.db.execute(f"DELETE FROM {table}")
            for day, size in sorted(sizes.items()):
                while (rows := self._fold_block(day, size)) is not None:
                    folded += rows
        return folded

    def _fold_block(self, day: str, size: int) -> int | None:
        """Fold the next block of the day's complete lines below ``size`` (in the caller's
        transaction); the rows folded, or None when there is nothing (more) to fold."""
        try:
            fd = os.open(layout.day_path(self.data_dir, day), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            self._forget(day)
            return None
        try:
            stat = os.fstat(fd)
            row = self.db.execute("SELECT inode, consumed FROM files WHERE day = ?", (day,)).fetchone()
            consumed = 0
            if row is not None and row[0] == stat.st_ino and row[1] <= stat.st_size:
                consumed = row[1]
            elif row is not None:
                self._forget(day)  # another file, or cut below what was folded: from its start
            if consumed >= size:
                return None
            block = os.pread(fd, min(_READ_BLOCK, size - consumed), consumed)
            end = block.rfind(b"\n") + 1
            if end == 0:  # a line still being written (or one longer than a block: never a CRAN row)
                return None
            start = len(HEADER) if consumed == 0 and block.startswith(HEADER) else 0
            sums = count(block, start, end)
            self._add(day, stat.st_ino, consumed + end, sums)
            return sums.rows
        finally:
            os.close(fd)

    def _add(self, day: str, inode: int, consumed: int, sums: _Sums) -> None:
        db = self.db
        hi, lo = sums.bytes >> 32, sums.bytes & _LO
        db.execute(
            "INSERT INTO files (day, inode, consumed, rows, bytes_hi, bytes_lo, skipped) VALUES (?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (day) DO UPDATE SET inode = excluded.inode, consumed = excluded.consumed, "
            f"rows = rows + excluded.rows, {_ADD_BYTES}, skipped = skipped + excluded.skipped",
            (day, inode, consumed, sums.rows, hi, lo, sums.skipped),
        )
        add = "ON CONFLICT DO UPDATE SET downloads = downloads + excluded.downloads"
        db.executemany(
            f"INSERT INTO packages VALUES (?, ?, ?) {add}",
            ((day, package, count) for package, count in sums.packages.items()),
        )
        db.executemany(
            f"INSERT INTO hours VALUES (?, ?, ?) {add}",
            ((day, hour, count) for hour, count in sums.hours.items()),
        )
        db.executemany(
            f"INSERT INTO ips VALUES (?, ?, ?, ?, ?) {add}, {_ADD_BYTES}",
            ((day, ip - IP_OFFSET, count, size >> 32, size & _LO) for ip, (count, size) in sums.ips.items()),
        )
        db.executemany(
            f"INSERT INTO ip_hours VALUES (?, ?, ?, ?) {add}",
            ((day, ip - IP_OFFSET, hour, count) for (ip, hour), count in sums.ip_hours.items()),
        )
        db.executemany(
            f"INSERT INTO ip_countries VALUES (?, ?, ?, ?) {add}",
            ((day, ip - IP_OFFSET, country, count) for (ip, country), count in sums.ip_countries.items()),
        )

    def _forget(self, day: str) -> None:
        self.db.execute("DELETE FROM files WHERE day = ?", (day,))
        for table in _PER_DAY:
            self.db.execute(f"DELETE FROM {table} WHERE day = ?", (day,))


def _set_up(db: sqlite3.Connection, marker: unsynced.Marker, deadline: float) -> None:
    """WAL mode, no fsync (tiny.unsynced; with no boot id to mark, synchronous=NORMAL), and
    the tables of _VERSION (a store of another version, or an older one without a version,
    is emptied: counted again from the files by the next folds). SQLite answers "locked" at
    once, without its busy wait, to a change of journal mode while another process opens the
    same new file: tried again until ``deadline`` (every step can be repeated)."""
    while True:
        try:
            if db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                marker.before_write()
                db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={'NORMAL' if unsynced.BOOT is None else 'OFF'}")
            if db.execute("PRAGMA user_version").fetchone()[0] != _VERSION:
                _create(db, marker)
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _create(db: sqlite3.Connection, marker: unsynced.Marker) -> None:
    """The tables of _VERSION in place of whatever is there, in one transaction (DDL is
    transactional in SQLite: a second process doing the same waits, then finds it done)."""
    with immediate(db):
        marker.before_write()
        if db.execute("PRAGMA user_version").fetchone()[0] != _VERSION:
            for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
                db.execute(f'DROP TABLE "{table}"')
            for statement in _TABLES:
                db.execute(statement)
            db.execute(f"PRAGMA user_version = {_VERSION}")


def _inode(data_dir: Path, day: str) -> int | None:
    try:
        return os.stat(layout.day_path(data_dir, day)).st_ino
    except FileNotFoundError:
        return None

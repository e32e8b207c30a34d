"""The live aggregates of the day files: downloads per day, package, hour and ip_id, kept as rows arrive.

The day files stay the source of truth; this is a summary of them that any process can bring
up to date and read, in ``DATA_DIR/.tiny/aggregates.sqlite3`` (SQLite, WAL, written without
fsync and trusted only by the boot that wrote it or after a sync: tiny.unsynced). For each day
file it records which file it counted and how many of its bytes (``files``: the inode, the
digests of its first bytes and of the bytes just before ``consumed``), and per day: downloads
and bytes per package, per hour, per ip_id (with its downloads per hour and per country).
:meth:`Aggregates.fold` reads only the bytes appended since, complete lines only, and adds
them in one transaction per step with the new ``consumed``: killed at any point it leaves the
old state or the new, and a second process folding at the same time waits for the first's
step (``BEGIN IMMEDIATE``) and then folds only what is left, so nothing is counted twice or
lost.

The sizes to fold up to come from the caller, noted under the data dir's flush lock
(tiny.sink.DailyFileSink.committed_sizes): bytes below such a size are committed and no
recovery will ever cut them, so a count never includes a row that vanishes.

Which file was counted. A day file is the one counted when it has the inode recorded, holds
at least ``consumed`` bytes, and its first _EDGE bytes (fewer while it is shorter) and the
_EDGE bytes just before ``consumed`` have the digests recorded (``consumed`` is always just
past an LF, so the second also proves that the count stopped at a line's end). Any other file
under the day's name, or this one cut back, is counted again from its start (that day's
aggregates are rebuilt), checked on every fold, in any process, after any restart: a file cut
back by hand (shorter, or grown again past the counted offset with other bytes there), a file
deleted and written again (ext4 gives the next file created the inode just freed: its bytes
tell it apart), a file rewritten in place. What this cannot see is an edit that keeps the
length, the first and the last counted 4 KiB and changes bytes in between: ``tiny-admin
rebuild-aggregates`` counts everything again (and raises the store's generation, which tells
every server's cached answers: :func:`read_generation`). A day file that is not a regular file
(a FIFO, a device) is refused at once (:class:`NotARegularFile`), never waited on.

Time. A fold with a deadline keeps to it within a step: each step (one transaction) is sized
from how long the last ones took here, wall clock, to take about FOLD_STEP_SECONDS (at most
FOLD_MAX_STEP bytes, which bounds memory), and no smaller than FOLD_MIN_STEP (tiny.limits); at the deadline the
fold stops and raises :class:`Behind`, which says what is left, read at that moment.

Counting rows: a row is a line of the day file after its header (lines end at LF only: a
string may hold U+2028 or U+0085, which Python's ``splitlines`` would also break at), read by
tiny.cranlog.read_row (the row queries read a whale's rows by the same rule); a quoted ``"NA"``
is the string, a bare ``NA`` is missing. A row that does not parse is skipped
and counted (``files.skipped``): the CSV the sink writes always parses. With the compiled codec
in use (tiny.codec.CODEC), ``tiny._codec.tally`` counts the usual rows of a block with the GIL
released and hands every other line back to :meth:`Sums.add`, the rule book (about 3x faster
a fold; BENCHMARKS.md "Analytics beside ingest").

Errors say what they are (:class:`Unavailable`, a 503): a full disk, an I/O error, the store's
write lock held past the wait, a day file that cannot be read.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import sqlite3
import stat
import threading
import time
import weakref
from collections import OrderedDict, defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote

from blake3 import blake3

from tiny import aggregate_sql as sql
from tiny import codec, layout, limits, unsynced
from tiny.aggregate_sql import Counted
from tiny.cranlog import read_row
from tiny.layout import HEADER
from tiny.transaction import immediate

# bytes at a day file's start, and just before its counted offset, that identify it (the store's
# format: a change needs a new tiny.aggregate_sql.VERSION)
_EDGE = 4096
_REBUILD_STEP = limits.FOLD_MAX_STEP  # a rebuild's steps: one transaction, no deadline
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_IOERR, _SQLITE_FULL = 5, 6, 10, 13  # primary result codes


def _amount(nbytes: int) -> str:
    if nbytes >= 1_000_000:
        return f"{nbytes / 1e6:.1f} MB"
    if nbytes >= 1_000:
        return f"{nbytes / 1e3:.1f} KB"
    return f"{nbytes} bytes"


class Behind(RuntimeError):
    """A fold reached its deadline before the days it was given were up to date: ``day``, the
    first that is not; ``left``, the bytes left to fold in it and the days after it; ``rows``,
    the rows in them (None: not said); ``exact``, whether ``rows`` was counted (or estimated
    from the rows per byte counted so far); ``days``, how many days have bytes left. All read
    when it is raised."""

    def __init__(self, day: str, left: int, rows: int | None = None, exact: bool = True, days: int = 1) -> None:
        super().__init__(day, left, rows, exact, days)
        self.day, self.left, self.rows, self.exact, self.days = day, left, rows, exact, days

    def counting(self) -> dict[str, str | int | None]:
        """What is left, for a client to show: ``{"day", "rows_left", "bytes_left"}`` (the
        rows None when not said)."""
        return {"day": self.day, "rows_left": self.rows, "bytes_left": self.left}

    def __str__(self) -> str:
        which = self.day if self.days == 1 else f"{self.day} and {self.days - 1} more day(s)"
        if self.rows is None:
            return f"the aggregates of {which} are catching up: {_amount(self.left)} left to count"
        rows = f"{'' if self.exact else 'about '}{self.rows:,} rows"
        return f"the aggregates of {which} are catching up: {rows} left to count ({_amount(self.left)})"


class Unavailable(RuntimeError):
    """The store cannot answer now, and why (:func:`store_error`): a full disk, an I/O error,
    its write lock or its marker's lock (tiny.unsynced) held past the wait, its marker not
    writable (a wrong file in its place), a day file that cannot be read."""

    def __str__(self) -> str:
        return str(self.args[0])


class NotARegularFile(Unavailable):
    """A day file that is a FIFO, a device, a socket or a directory: refused, not read."""


def store_error(exc: OSError | sqlite3.Error) -> Unavailable:
    """What an error from the store's files or from SQLite means, said as such."""
    if isinstance(exc, sqlite3.Error):
        code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
        full, failed, busy = code == _SQLITE_FULL, code == _SQLITE_IOERR, code in (_SQLITE_BUSY, _SQLITE_LOCKED)
    else:
        full, failed = exc.errno in (errno.ENOSPC, errno.EDQUOT), exc.errno == errno.EIO
        busy = isinstance(exc, TimeoutError)
    if full:
        return Unavailable(f"the disk under the aggregate store is full ({exc})")
    if failed:
        return Unavailable(f"the disk under the aggregate store failed: an I/O error ({exc})")
    if busy:
        return Unavailable(
            f"the aggregate store is busy: another process held its write lock for the whole wait ({exc}), "
            "as a fold of a long day or tiny-admin rebuild-aggregates does"
        )
    return Unavailable(f"the aggregate store is unavailable ({exc})")


@contextlib.contextmanager
def _reported() -> Iterator[None]:
    """The store's OSErrors and SQLite errors as :class:`Unavailable` (store_error)."""
    try:
        yield
    except (OSError, sqlite3.Error) as exc:
        raise store_error(exc) from exc


def aggregates_path(data_dir: Path) -> Path:
    return layout.state_dir(data_dir) / "aggregates.sqlite3"


def generation_path(data_dir: Path) -> Path:
    return layout.state_dir(data_dir) / "aggregates.generation"


def read_generation(data_dir: Path) -> int:
    """The store's generation as it last published it (0: none). The store draws it at random
    when it is made and raises it by one at each rebuild (in the same transaction, with the
    file written before the commit), so a process that keeps answers from the store
    (tiny.live) learns with one small read that it was rebuilt or made again."""
    try:
        fd = os.open(generation_path(data_dir), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    try:
        text = os.pread(fd, 32, 0)
    finally:
        os.close(fd)
    try:
        return int(text)
    except ValueError:
        return 0


def _publish(path: Path, generation: int) -> None:
    """Write ``generation`` to the generation file ``path`` (replaced whole: a reader sees the old or the new)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_bytes(b"%d\n" % generation)
    os.replace(tmp, path)


def open_regular(path: Path | str) -> int:
    """A read-only descriptor of the regular file at ``path`` (a symlink to one is read through).
    FileNotFoundError when there is none; :class:`NotARegularFile`, at once, for anything else:
    a FIFO's open(2) would wait for a writer, a device's could do anything. Checked before the
    open, and on the open file (opened O_NONBLOCK, so that one swapped in between is never
    waited on either)."""
    return _open_regular(path)[0]


def _open_regular(path: Path | str) -> tuple[int, os.stat_result]:
    """:func:`open_regular`'s descriptor, and the fstat of the file it has open."""
    check_regular(path, os.stat(path).st_mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        opened = os.fstat(fd)
        check_regular(path, opened.st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd, opened


def check_regular(path: Path | str, mode: int) -> None:
    """:class:`NotARegularFile`, naming ``path`` and what it is, unless ``mode`` (its st_mode)
    is a regular file's."""
    kind = _kind(mode)
    if kind is not None:
        raise NotARegularFile(f"{os.path.basename(path)} is not a regular file but a {kind}: refused, not read")


def _kind(mode: int) -> str | None:
    """None for a regular file, else what it is."""
    if stat.S_ISREG(mode):
        return None
    kinds = (
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISDIR, "directory"),
    )
    return next((name for test, name in kinds if test(mode)), "special file")


def _fingerprint(stat: os.stat_result) -> tuple[int, int, int, int]:
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def _digest(data: bytes) -> bytes:
    return blake3(data).digest(16)


class _DayFile(NamedTuple):
    day: str
    fd: int
    inode: int
    seen: tuple[int, int, int, int]  # (inode, size, mtime_ns, ctime_ns), stat'ed just after the open
    opened_ns: int  # time.time_ns() just before the open

    def read(self, size: int, offset: int) -> bytes:
        try:
            return os.pread(self.fd, size, offset)
        except OSError as exc:
            raise Unavailable(f"the day file {layout.day_file(self.day)} could not be read ({exc})") from exc


class _Folded(NamedTuple):
    rows: int
    consumed: int  # the bytes of the file counted now
    read: int  # the new bytes this step read


class _Pace:
    """How long a fold step takes in this process, wall clock, per byte: the size of the next."""

    def __init__(self) -> None:
        self.seconds_per_byte = 0.0

    def step(self, deadline: float | None) -> int:
        if not self.seconds_per_byte:
            return limits.FOLD_FIRST_STEP
        budget = limits.FOLD_STEP_SECONDS
        if deadline is not None:
            budget = min(budget, limits.FOLD_MARGIN * (deadline - time.monotonic()))
        return int(min(limits.FOLD_MAX_STEP, max(limits.FOLD_MIN_STEP, budget / self.seconds_per_byte)))

    def took(self, nbytes: int, seconds: float) -> None:
        if nbytes >= limits.FOLD_MIN_STEP:  # (a last short step would say more about its fixed costs than the bytes')
            rate = seconds / nbytes
            self.seconds_per_byte = (self.seconds_per_byte + rate) / 2 if self.seconds_per_byte else rate


@dataclass
class Sums:
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


def count(block: bytes, start: int, end: int) -> Sums:
    """The sums of the day-file lines in ``block[start:end]`` (``end`` just past an LF)."""
    if codec.CODEC == "rust":
        from tiny import _codec

        rows, nbytes, packages, hours, ips, ip_hours, ip_countries, deferred = _codec.tally(block, start, end)
        sums = Sums(rows, nbytes)
        sums.packages.update(packages)
        sums.hours.update((hour, n) for hour, n in enumerate(hours) if n)
        sums.ips.update(ips)
        sums.ip_hours.update(ip_hours)
        sums.ip_countries.update(ip_countries)
        for first, last in deferred:  # the lines the compiled count leaves to the rule book
            sums.add(block[first:last].decode("utf-8", "replace"))
        return sums
    return count_reference(block, start, end)


def count_reference(block: bytes, start: int, end: int) -> Sums:
    """:func:`count` by the rule book alone (no compiled codec)."""
    sums = Sums()
    if end > start:
        for line in block[start : end - 1].decode("utf-8", "replace").split("\n"):
            sums.add(line)
    return sums


class Aggregates:
    """The aggregate store of ``data_dir`` (opened on first use, in this process)."""

    def __init__(self, data_dir: Path, busy_timeout: float = 10.0) -> None:
        self.data_dir = Path(data_dir)
        self._root = str(self.data_dir)  # (joined as strs: Path joins cost more than the reads)
        self.busy_timeout = busy_timeout  # seconds to wait for another process's transaction
        self.path = aggregates_path(self.data_dir)
        self.marker = unsynced.Marker(self.path)
        self._db: sqlite3.Connection | None = None
        self._closer: weakref.finalize | None = None  # closes it as tiny.unsynced says, also at exit
        self._inode = -1  # the store file's, when this connection opened it
        self._pace = _Pace()
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

    def generation(self) -> int:
        """The store's generation (:func:`read_generation`), as this connection sees it now."""
        with _reported():
            return sql.generation(self.db)

    def publish_generation(self) -> None:
        """Write the store's generation to its file if the file says another (lost, or written
        by a rebuild that never committed), under the store's write lock: no rebuild
        publishes meanwhile."""
        with _reported(), immediate(self.db):
            generation = self.generation()
            if read_generation(self.data_dir) != generation:
                _publish(generation_path(self.data_dir), generation)

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

    @contextlib.contextmanager
    def _day_file(self, day: str) -> Iterator[_DayFile | None]:
        """The day's file, open (None when there is none); NotARegularFile for a FIFO, a device..."""
        name = layout.day_file(day)
        opened_ns = time.time_ns()
        try:
            fd, stat = _open_regular(os.path.join(self._root, name))
        except FileNotFoundError:
            yield None
            return
        except OSError as exc:
            raise Unavailable(f"the day file {name} could not be opened ({exc})") from exc
        try:
            yield _DayFile(day, fd, stat.st_ino, _fingerprint(stat), opened_ns)
        finally:
            os.close(fd)

    def fold(
        self, sizes: Mapping[str, int], within: tuple[str, str] | None = None, deadline: float | None = None
    ) -> int:
        """Bring the days of ``sizes`` (day -> committed size of its file) up to date; returns
        the rows folded in. One transaction per step (see the module docstring), so that a long
        catch-up lets other processes' folds and reads in between. With ``within`` (first and
        last day), a day of that span that is stored but not in ``sizes`` is forgotten: its
        file was removed. At ``deadline`` (time.monotonic(), which is the same clock in every
        process of the machine), :class:`Behind` (what was folded stays: the next fold goes on
        from there). :class:`Unavailable` when the store or a day file cannot be read or
        written (saying why)."""
        with _reported():
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
        with self._day_file(day) as file:
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
        with _reported():
            self._reopen_if_replaced()
            with self._writing():
                self._seen.clear()
                sql.forget_all(self.db)
                for day, size in sorted(sizes.items()):
                    with self._day_file(day) as file:
                        while file is not None and (done := self._fold_step(file, size, _REBUILD_STEP)) is not None:
                            folded += done.rows
                            if done.consumed >= size:
                                break
                generation = self.generation() + 1
                sql.set_generation(self.db, generation)
                # Published before the commit: no answer from the old counts is ever kept under it.
                _publish(generation_path(self.data_dir), generation)
        return folded

    def _counted(self, file: _DayFile) -> int | None:
        """The bytes of ``file`` the store has counted; None when it has no count of this file
        (none of its day, or one of another file, or of bytes no longer there). A file found
        to be the one counted, and unchanged for a second before it was opened, is remembered
        with its stat (:meth:`_unchanged`)."""
        row = sql.counted(self.db, file.day)
        if row is None:
            return None
        consumed = row[3]
        edge = min(consumed, _EDGE)
        if not self._same(file, row, file.read(edge, consumed - edge)):
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
        if _fingerprint(stat) != seen[0]:
            return False
        row = sql.counted(self.db, day)
        return row == seen[1] and row is not None and row.consumed >= size

    def _same(self, file: _DayFile, row: tuple[int, bytes, bytes, int], before: bytes) -> bool:
        """Whether ``file`` is the one ``row`` of ``files`` counted, ``before`` being its bytes
        just before the counted offset (the _EDGE bytes there, fewer near its start)."""
        inode, head, tail, consumed = row
        if inode != file.inode or len(before) != min(consumed, _EDGE) or _digest(before) != tail:
            return False
        return _digest(before if consumed <= _EDGE else file.read(_EDGE, 0)) == head

    def _fold_step(self, file: _DayFile, size: int, step: int) -> _Folded | None:
        """Fold the next complete lines of ``file`` below ``size``, at most ``step`` bytes (in
        the caller's transaction), from its start if the store's count is of another file or of
        bytes no longer there; None when there is nothing (more) to fold."""
        row = sql.counted(self.db, file.day)
        consumed = 0 if row is None else row[3]
        edge = min(consumed, _EDGE)
        # The bytes before the counted offset and the new ones, in one read: what is added was
        # read from the file that was checked.
        data = file.read(edge + max(0, min(step, size - consumed)), consumed - edge)
        if row is not None and not self._same(file, row, data[:edge]):
            self._forget(file.day)  # another file, or cut below what was counted: from its start
            row, consumed, edge = None, 0, 0
            data = file.read(min(step, size), 0)
        end = data.rfind(b"\n", edge) + 1
        if end <= edge:  # nothing new, or a line still being written
            return None
        start = edge + len(HEADER) if consumed == 0 and data.startswith(HEADER) else edge
        sums = count(data, start, end)
        now = consumed + end - edge
        head = row[1] if row is not None and consumed >= _EDGE else _digest(data[: min(now, _EDGE)])
        self._add(file.day, file.inode, head, _digest(data[end - min(now, _EDGE) : end]), now, sums)
        return _Folded(sums.rows, now, end - edge)

    def _behind(self, days: list[tuple[str, int]]) -> Behind | None:
        """What is left to fold of ``days``, read now; None when nothing is. The rows left are
        counted (their line ends) when the bytes are at most limits.EXACT_LEFT_*, else estimated."""
        behind: list[tuple[str, int, int]] = []  # (day, bytes counted, size)
        for day, size in days:
            with self._day_file(day) as file:
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
        with self._day_file(day) as file:
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
            _publish(generation_file, generation)
            sql.set_version(db)

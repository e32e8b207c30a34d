"""Which day file the aggregate store counted: a file told apart by its inode and the digests of two of its edges.

For each day file the store (tiny.aggregates) records which file it counted and how many of its
bytes (``files`` in tiny.aggregate_sql: the inode, the digests of its first bytes and of the
bytes just before ``consumed``). A day file is the one counted when it has the inode recorded,
holds at least ``consumed`` bytes, and its first :data:`EDGE` bytes (fewer while it is shorter)
and the :data:`EDGE` bytes just before ``consumed`` have the digests recorded (:func:`same`;
``consumed`` is always just past an LF, so the second also proves that the count stopped at a
line's end). Any other file under the day's name, or this one cut back, is counted again from
its start (that day's aggregates are rebuilt), checked on every fold, in any process, after any
restart: a file cut back by hand (shorter, or grown again past the counted offset with other
bytes there), a file deleted and written again (ext4 gives the next file created the inode just
freed: its bytes tell it apart), a file rewritten in place. What this cannot see is an edit that
keeps the length, the first and the last counted 4 KiB and changes bytes in between:
``tiny-admin rebuild-aggregates`` counts everything again. A day file that is not a regular
file (a FIFO, a device) is refused at once (tiny.regular_files.NotARegularFile), never waited
on (:func:`open_day`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import NamedTuple

from blake3 import blake3

from tiny import layout
from tiny.aggregate_errors import Unavailable
from tiny.regular_files import open_regular_stat

# bytes at a day file's start, and just before its counted offset, that identify it (the store's
# format: a change needs a new tiny.aggregate_sql.VERSION)
EDGE = 4096


def fingerprint(stat: os.stat_result) -> tuple[int, int, int, int]:
    """``(inode, size, mtime_ns, ctime_ns)`` of a file's stat: what says it is unchanged since."""
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def digest(data: bytes) -> bytes:
    """The digest of an edge's bytes, as the store records it."""
    return blake3(data).digest(16)


class DayFile(NamedTuple):
    """A day file, open for reading (:func:`open_day`)."""

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


@contextlib.contextmanager
def open_day(root: str, day: str) -> Iterator[DayFile | None]:
    """The day's file under the data dir ``root``, open (None when there is none); closed on
    leaving. NotARegularFile for a FIFO, a device...; :class:`Unavailable` when it cannot be
    opened."""
    name = layout.day_file(day)
    opened_ns = time.time_ns()
    try:
        fd, stat = open_regular_stat(os.path.join(root, name))
    except FileNotFoundError:
        yield None
        return
    except OSError as exc:
        raise Unavailable(f"the day file {name} could not be opened ({exc})") from exc
    try:
        yield DayFile(day, fd, stat.st_ino, fingerprint(stat), opened_ns)
    finally:
        os.close(fd)


def same(file: DayFile, row: tuple[int, bytes, bytes, int], before: bytes) -> bool:
    """Whether ``file`` is the one ``row`` of ``files`` (inode, head digest, tail digest,
    consumed) counted, ``before`` being its bytes just before the counted offset (the EDGE
    bytes there, fewer near its start)."""
    inode, head, tail, consumed = row
    if inode != file.inode or len(before) != min(consumed, EDGE) or digest(before) != tail:
        return False
    return digest(before if consumed <= EDGE else file.read(EDGE, 0)) == head

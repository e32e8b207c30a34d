"""Opening a file only if it is a regular one: a FIFO, a device... is refused at once, never waited on.

:func:`open_regular` gives a read-only descriptor of a regular file (a symlink to one is read
through); :func:`check_regular` checks an st_mode already at hand. Anything else raises
:class:`NotARegularFile` (an :class:`tiny.aggregate_errors.Unavailable`: a 503 that names the
file and what it is). Used by the aggregate store (tiny.aggregates), the dashboard's answers
(tiny.analytics.answers) and the row reads (tiny.analytics.rows, tiny.analytics.service).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tiny.aggregate_errors import Unavailable


class NotARegularFile(Unavailable):
    """A day file that is a FIFO, a device, a socket or a directory: refused, not read."""


def open_regular(path: Path | str) -> int:
    """A read-only descriptor of the regular file at ``path`` (a symlink to one is read through).
    FileNotFoundError when there is none; :class:`NotARegularFile`, at once, for anything else:
    a FIFO's open(2) would wait for a writer, a device's could do anything. Checked before the
    open, and on the open file (opened O_NONBLOCK, so that one swapped in between is never
    waited on either)."""
    return open_regular_stat(path)[0]


def open_regular_stat(path: Path | str) -> tuple[int, os.stat_result]:
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

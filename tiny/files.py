"""File helpers the journal's pieces and the aggregate store share: system calls, no policy.

None of them locks anything; whoever calls them holds what its own module says (the flush lock
for the data files, tiny.unsynced's lock for the store's marker).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

IOV_MAX = 1024  # buffers one writev(2) takes (Linux's IOV_MAX)
APPEND = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC  # how a flush opens its files (RDWR: the last byte is read)


def size_of(path: str | Path) -> int:
    """A file's size, -1 when it does not exist."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return -1


def open_for_append(path: str) -> tuple[int, bool]:
    """A descriptor appending to the file at ``path`` (RDWR: its last byte can be read), and
    whether this call created it. An existing file costs one open(2); a new one its directory
    (made if missing) and an O_EXCL create, so that "created" is only ever a file this call made."""
    try:
        return os.open(path, APPEND), False
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        return os.open(path, APPEND | os.O_CREAT | os.O_EXCL, 0o644), True
    except FileExistsError:  # made meanwhile by someone else
        return os.open(path, APPEND), False


def write_fully(fd: int, parts: list[bytes]) -> None:
    """Append ``parts`` with one writev(2): no copy of them joined first; more calls only after
    a short write (a disk filling up) or past IOV_MAX buffers."""
    views = [memoryview(part) for part in parts if part]
    first = 0
    while first < len(views):
        written = os.writev(fd, views[first : first + IOV_MAX])
        if written == 0:  # pragma: no cover - writev(2) returns 0 only for empty buffers
            raise OSError(errno.EIO, "write returned 0")
        while written:
            if written >= len(views[first]):
                written -= len(views[first])
                first += 1
            else:
                views[first] = views[first][written:]
                written = 0


def write_durably(path: Path, data: bytes) -> None:
    """Write ``data`` as the whole of the file at ``path`` and fsync it (not its directory)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` (a file created in it) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

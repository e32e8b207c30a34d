"""One flush's bytes appended to the data files under its intent: the part of a flush keys play no part in.

A :class:`FileFlush` (from :meth:`Appender.flush`) goes, with the data dir's flush lock held by
the caller throughout (tiny.flushlock) and after the intent's recovery:

1. :meth:`FileFlush.write`: opens each file it appends to (names relative to the data dir, in
   name order; a new file made with O_EXCL, so that "created" is only ever a file this flush
   made), notes its size (fstat) and the bytes it will add (the header of a new file, by its
   suffix; an LF first when a file's last byte is not one: bytes the sink did not write are
   never removed), writes the intent (tiny.intent: the sizes before and after, checked first
   against the committed sizes), then each file with one ``writev`` of its parts (O_APPEND);
   fsync mode: the files and the directories of new files synced.
2. :meth:`FileFlush.confirm`, right before the commit point: :class:`LockLost` unless the lock
   file is still linked, the intent still holds this flush's record, and each file is still
   linked and exactly as long as the flush left it (another writer may have taken a new lock
   file's lock while this one was paused).
3. The commit point: for a flush with keys, the keys' commit (tiny.keys), then
   :meth:`FileFlush.finish`; without keys :meth:`FileFlush.finish` itself (the intent's mark;
   then the files' committed sizes recorded).
4. A failure before the commit point: :meth:`FileFlush.roll_back` cuts each file back to its
   size before (one it created, removed; fsync mode: synced) and marks the intent undone;
   after a :class:`LockLost`, nothing is cut (another writer may hold the lock now: its
   recovery does it).

:meth:`FileFlush.close` closes the descriptors, always. Cluster mode's follower appends the
log's batches with these alone, its position given to :meth:`FileFlush.write`, and the mark
as its commit point (tiny.intent ``committed_position``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from tiny.commit.errors import Refused
from tiny.files import fsync_dir, open_for_append, write_fully
from tiny.flushlock import FlushLock
from tiny.intent import FileSpan, IntentFile


class LockLost(Refused):
    """At its commit point a flush found that what it locked and wrote is no longer what the
    data dir has (the lock file replaced, its intent overwritten, a file of it cut or written by
    someone else): it was not committed, and its files and intent are left as they are for the
    next recovery, which holds the data dir's real lock."""


def _no_crash(point: str) -> None:
    return None


class Appender:
    """Appends to the data files of ``data_dir`` under ``lock`` and ``intent``; ``headers``
    maps a file suffix to the bytes that open every new file with that suffix."""

    def __init__(
        self, data_dir: Path, lock: FlushLock, intent: IntentFile, *, headers: Mapping[str, bytes], fsync: bool
    ) -> None:
        self.data_dir = data_dir
        self.lock, self.intent = lock, intent
        self.headers = dict(headers)
        self.fsync = fsync
        self.root = str(data_dir)  # joined as a str on the hot path: Path joins cost more

    def flush(self) -> FileFlush:
        return FileFlush(self)


class FileFlush:
    """One flush's files; see the module docstring. Lock held by the caller for every call."""

    __slots__ = ("_appender", "_kept", "intended", "opened")

    def __init__(self, appender: Appender) -> None:
        self._appender = appender
        self.opened: list[tuple[int, FileSpan]] = []  # each file's descriptor and span, as opened
        self._kept: set[int] = set()  # descriptors the caller opened and keeps (close() leaves them)
        self.intended = False  # the intent is written: the flush's mark is its to set

    def write(
        self,
        files: Mapping[str, list[bytes]],
        *,
        first_key: str | None = None,
        last: tuple[str, int, float] | None = None,
        position: tuple[int, int] | None = None,
        crash: Callable[[str], None] = _no_crash,
        kept: Mapping[str, tuple[int, int]] | None = None,
    ) -> None:
        """Append each file's parts with one write, after the intent (see the module docstring).
        ``crash`` is called at "before-writes" and "between-writes" (tiny.crashpoints).
        ``kept``: files the caller holds open for appending (O_APPEND), by name: (descriptor,
        size now, known under the lock); they are written like the others but not opened,
        stat'ed or closed here (the key log's segment, tiny.keys)."""
        a = self._appender
        writes: list[tuple[int, list[bytes]]] = []
        new_dirs: set[str] = set()
        for name in sorted(files):
            held = kept.get(name) if kept else None
            if held is not None:
                (fd, size), created = held, False
                self._kept.add(fd)
            else:
                path = os.path.join(a.root, name)
                fd, created = open_for_append(path)
                size = os.fstat(fd).st_size
            self.opened.append((fd, FileSpan(name, size, size, created)))  # the size after follows
            parts = files[name]
            if size == 0:
                parts = [a.headers.get(Path(name).suffix, b""), *parts]
            elif name[0] != "." and os.pread(fd, 1, size - 1) != b"\n":  # (.tiny/: the key log's binary records)
                parts = [b"\n", *parts]  # the last row someone else wrote lacks its LF: keep it whole
            self.opened[-1] = (fd, FileSpan(name, size, size + sum(map(len, parts)), created))
            writes.append((fd, parts))
            if created:
                new_dirs.add(os.path.dirname(os.path.join(a.root, name)))
        if not self.opened:
            return
        a.intent.write([span for _, span in self.opened], first_key, last, position)
        self.intended = True
        crash("before-writes")
        for number, (fd, parts) in enumerate(writes):
            write_fully(fd, parts)
            if number == 0:
                crash("between-writes")
        if a.fsync:
            # The ack promises the rows survive a crash: the file data, and the directory
            # entry of any file this flush created, reach the disk before the commit.
            for fd, _ in self.opened:
                os.fsync(fd)
            for directory in new_dirs:
                fsync_dir(Path(directory))

    def confirm(self) -> None:
        """Right before the commit point: LockLost unless the lock, the intent and the files
        are still as this flush left them. One fstat per file, one pread, one fstat."""
        if not self.intended:
            return
        a = self._appender
        changed = None
        if not a.lock.still_linked():
            changed = f"the lock file {a.lock.path} was deleted or replaced"
        elif not a.intent.is_ours():
            changed = f"the intent file {a.intent.path} holds another flush's record"
        else:
            for fd, span in self.opened:
                stat = os.fstat(fd)
                if stat.st_nlink == 0 or stat.st_size != span.size_after:
                    changed = (
                        f"{a.data_dir / span.name} is {stat.st_size} bytes"
                        f"{'' if stat.st_nlink else ' and deleted'}, not the {span.size_after} this flush left"
                    )
                    break
        if changed is not None:
            raise LockLost(
                f"a flush was not committed: {changed} while it ran (another writer may have taken the lock "
                "and recovered it); nothing of it is kept"
            )

    def finish(self) -> None:
        """Mark the intent committed, then record the files' committed sizes. OSError when the
        mark failed (the commit point of a flush without keys: the caller rolls back)."""
        if self.intended:
            self._appender.intent.mark_committed()

    def roll_back(self) -> None:
        """Cut every file back to its size before (one this flush created, removed), then mark
        the intent undone. OSError when that fails: the intent stays live for the next recovery."""
        a = self._appender
        for fd, span in self.opened:
            if span.created:
                (a.data_dir / span.name).unlink(missing_ok=True)
            else:
                os.ftruncate(fd, span.size_before)
        if a.fsync:
            for fd, span in self.opened:
                if not span.created:
                    os.fsync(fd)
        if self.intended:
            a.intent.mark_undone()

    def close(self) -> None:
        for fd, _ in self.opened:
            if fd in self._kept:
                continue
            os.close(fd)
        self.opened = []

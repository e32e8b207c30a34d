"""The local commit point: a flush made durable by the data dir's own journal, under ``.tiny/``.

:class:`LocalCommit` is the :class:`~tiny.commit.CommitPoint` of one host's data dir, composed
of the journal's pieces, each with its own file, layout and rules:

- tiny.datadir: the data dir's identity, the journal's first start, ``--new-journal``;
- tiny.flushlock: the flush lock (``.tiny/lock``, fenced by the intent's flock) and its holder;
- tiny.intent: the intent of the flush under way (``.tiny/intent``), its recovery, the
  committed sizes read without the lock; tiny.committed_sizes, the files' committed sizes;
- tiny.keys, tiny.keylog: the idempotency keys, in the key log (``.tiny/keys/*.log``) and in
  memory, their expiry; the journal's meta (``.tiny/journal.sqlite3``);
- tiny.appender: the flush's bytes written to the data files; tiny.crashpoints, the crash tests' hooks.

A flush (:meth:`LocalCommit.commit`, docs/exactly-once.md numbers its steps): take the lock
(both flocks, the holder recorded, the lock, intent and journal files checked), recover what a
crash left, decide the keys (the log's new records read, each key looked up in memory; a new
key becomes a record), write the intent and the files with the key log's records among them,
confirm that the lock and the files are still this flush's, mark the intent (the commit point
of every flush: rows and keys count together), take the new keys into memory, release. A
failure before the commit point cuts the files back, key records included, before anything is
answered (:class:`~tiny.commit.WriteFailed` for the disk's sake,
:class:`~tiny.commit.Refused` for the data dir's); a failure after it is a success. What could
not be undone is left to the next recovery (:attr:`LocalCommit.unfinished`: :meth:`recover`).

With fsync, the intent reaches the disk before the data, the data, the key records and new
directory entries before the intent's mark; so the same holds across a power loss. Without,
every step is written, which a killed process cannot lose.

Not thread-safe: a LocalCommit belongs to one thread (the sink's), except :meth:`digest`,
:meth:`peek_committed_sizes`, :meth:`waiting` and :meth:`blocked_elsewhere`, which never wait.
:meth:`open` starts one more thread, which reads the keys from the key log into memory; a flush
with keys waits for it (at most its deadline), and :meth:`close` stops it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tiny import layout, limits
from tiny.appender import Appender, FileFlush, LockLost
from tiny.commit import Append, Receipt, Refused, Stored, Unavailable, WriteFailed, keyed_digest
from tiny.crashpoints import CrashPoints
from tiny.datadir import close_files, open_journal
from tiny.files import size_of
from tiny.flushlock import FlushLock, held_elsewhere
from tiny.intent import IntentFile
from tiny.keylog import SEGMENT_BYTES
from tiny.keys import KeyStore

if TYPE_CHECKING:
    from tiny.config import Config

log = logging.getLogger("tiny.commit.local")

_WAIT_REPORTED_AFTER = 1.0  # seconds of waiting for (or another's holding of) the lock before it is reported


def _nowhere(point: str) -> None:
    """No crash point (a flush that writes nothing)."""


def _described(exc: OSError | sqlite3.Error) -> str:
    """What the disk said, and of which file when it says (a permission or size limit is the
    file's: the operator must know which)."""
    reason = getattr(exc, "strerror", None) or str(exc)
    filename = getattr(exc, "filename", None)
    return f"{reason} ({filename})" if filename else reason


class LocalCommit:
    """The journal of ``data_dir``; see the module docstring. ``headers`` maps a file suffix to
    the bytes that open every new file with that suffix; ``crash_at``: tiny.crashpoints;
    ``cluster``: tiny.datadir ``open_journal``'s (False: a server of one host, which also holds
    the journal's key window and bound to its own)."""

    def __init__(
        self,
        data_dir: Path,
        *,
        fsync: bool = False,
        window: float = limits.IDEMPOTENCY_WINDOW,
        max_keys: int = limits.IDEMPOTENCY_MAX_KEYS,
        mode: str = "wal",
        lock_timeout: float = limits.LOCK_TIMEOUT,
        headers: Mapping[str, bytes] | None = None,
        crash_at: str = "",
        cluster: bool | None = None,
        segment_bytes: int = SEGMENT_BYTES,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.cluster = cluster  # tiny.datadir open_journal's: False refuses a data dir that follows a cluster
        self.fsync = fsync
        self.keys = KeyStore(
            layout.journal_path(self.data_dir),
            fsync=fsync,
            window=window,
            max_keys=max_keys,
            mode=mode,
            segment_bytes=segment_bytes,
        )
        self.keys.on_drop = self._forget_size
        self.keys.committed_size = self._committed_size
        self.lock = FlushLock(self.data_dir, lock_timeout)
        self.intent = IntentFile(self.data_dir, fsync)
        self.appender = Appender(self.data_dir, self.lock, self.intent, headers=headers or {}, fsync=fsync)
        self.crash = CrashPoints(crash_at, self.data_dir)
        self.dir_id: str | None = None  # the data dir's id, once open; a reopening must find the same
        self._secret: bytes | None = None  # the keys' digest secret; None while not open
        self._unfinished = False
        self._holding = False  # this commit point holds the lock (locked()): recover() takes it not again
        self._loader: threading.Thread | None = None  # reads the keys after open()
        self._loader_started = False  # open() was asked for the keys
        self._load_error: Exception | None = None

    @classmethod
    def from_config(cls, config: Config, **extra: Any) -> LocalCommit:
        """The journal of ``config``'s data dir for a server of one host, by its flags
        (durability, the keys' window and bound, which the journal's must equal, journal mode,
        lock timeout); ``extra``: the other arguments (``headers``, ``crash_at``)."""
        return cls(
            config.data_dir,
            fsync=config.durability == "fsync",
            window=config.idempotency_window,
            max_keys=config.idempotency_max_keys,
            mode=config.journal_mode,
            lock_timeout=config.lock_timeout,
            cluster=False,
            **extra,
        )

    @property
    def is_open(self) -> bool:
        return self._secret is not None

    @property
    def wait_bound(self) -> float:
        return self.lock.lock_timeout

    @property
    def unfinished(self) -> bool:
        return self._unfinished

    @property
    def key_count(self) -> int:
        """Keys in the journal at this process's last commit with keys."""
        return self.keys.count

    def open(self, accept_new: bool = False, check_sizes: bool = True, keys: bool = True) -> None:
        """Attach to the data dir's journal, creating it in a data dir that has none
        (tiny.datadir says what is refused, and what ``accept_new`` replaces). ``check_sizes``
        False: every check but the files' committed sizes (tiny-admin forget only). ``keys``
        False: the key log's keys are not read into memory (the operator's commands, the start's
        check; a flush with keys then refuses). On any failure nothing stays open."""
        if self.is_open:
            return
        try:
            identity = open_journal(
                self.lock,
                self.intent,
                self.keys,
                known_id=self.dir_id,
                accept_new=accept_new,
                check_sizes=check_sizes,
                cluster=self.cluster,
                bounds=self.cluster is False,  # a server of one host: its key bounds are the journal's
            )
        except (sqlite3.Error, OSError) as exc:
            self.close()
            raise Refused(f"the journal {self.keys.path} cannot be used: {exc}") from None
        except BaseException:
            self.close()
            raise
        self.dir_id, self._secret = identity.dir_id, identity.secret
        self._loader_started = keys
        if keys:
            # The keys are read on a thread of their own, without the lock (what attach_log
            # noted under it is committed): 10 million take seconds, and the worker's loop must
            # beat meanwhile. A flush with keys waits for them (_keys_read), at most its deadline.
            self._loader = threading.Thread(target=self._load_keys, name="tiny-keys-load", daemon=True)
            self._loader.start()

    def _load_keys(self) -> None:
        try:
            self.keys.load()
        except Exception as exc:
            self._load_error = exc

    def keys_read(self, timeout: float | None = None) -> bool:
        """Whether the keys have been read from the key log since :meth:`open` (waiting at most ``timeout``)."""
        loader = self._loader
        if loader is not None:
            loader.join(timeout)
            if loader.is_alive():
                return False
        return self.is_open and self._load_error is None and self._loader_started

    def _keys_read(self, deadline: float) -> None:
        """Wait for the keys' reading, at most until ``deadline``: Unavailable past it, Refused
        when the log could not be read (the next opening reads it again)."""
        if self._loader is None and self._load_error is None and self._loader_started:
            return
        if not self._loader_started:
            raise Refused("the journal was opened without its keys (an operator's command): it takes no keyed flush")
        if self._loader is not None:
            self._loader.join(max(0.0, deadline - time.monotonic()))
            if self._loader.is_alive():
                raise Unavailable(
                    f"the keys are still being read from the key log ({self.keys.table.size:,} so far, "
                    f"{self.keys.segment_count} segments): keyed writes wait until they are all in memory"
                )
            self._loader = None
        if self._load_error is not None:
            raise Refused(f"the key log could not be read: {self._load_error}")

    def close(self) -> None:
        """Close every file and the database (also after a failed :meth:`open`); a reading of
        the keys still under way is stopped first."""
        if self._loader is not None:
            self.keys.stop_loading = True
            self._loader.join()
            self._loader = None
            self.keys.stop_loading = False
        self._loader_started = False
        self._load_error = None
        self._secret = None
        close_files(self.lock, self.intent, self.keys)
        self.lock.close()

    def digest(self, body: bytes) -> bytes:
        """128 bits of BLAKE3 of a (decompressed) body keyed with the journal's secret, so that
        no client can forge a second body that passes for the first. Any thread; once open."""
        assert self._secret is not None, "LocalCommit.open() first"
        return keyed_digest(self._secret, body)

    @contextlib.contextmanager
    def locked(self, timeout: float | None = None) -> Iterator[None]:
        """Hold the data dir's flush lock (waiting at most ``timeout``, default the lock
        timeout; LockTimeout naming the holder), the lock, intent and journal files checked to
        be the ones opened (Found otherwise). For the operator's commands; a flush takes it itself."""
        with self.lock.holding(timeout):
            self.keys.check_file()
            self._holding = True
            try:
                yield
            finally:
                self._holding = False

    def stop_waits_at(self, when: float) -> None:
        self.lock.give_up_at = when

    def commit(self, appends: Sequence[Append], deadline: float) -> Receipt:
        """One flush of ``appends`` (see the module docstring), waiting for the lock until
        ``deadline`` at most. Raises LockTimeout (an Unavailable), Refused (the data dir: a file
        found shorter than committed, a lock lost, the journal replaced), or WriteFailed."""
        try:
            if any(append.claim for append in appends):
                self._keys_read(deadline)
            with self.lock.holding(max(0.0, deadline - time.monotonic())):
                self.keys.check_file()
                return self._commit_locked(appends)
        except (OSError, sqlite3.Error) as exc:
            raise WriteFailed(f"the disk refused the write: {_described(exc)}") from exc

    def _commit_locked(self, appends: Sequence[Append]) -> Receipt:
        self.intent.recover(self.keys.is_stored)
        claims = [append.claim for append in appends]
        files: dict[str, list[bytes]] = {}
        decisions: list[Stored | None]
        kept: dict[str, tuple[int, int]] = {}
        logged = None  # the key log's segment this flush appends to
        if any(claims):
            decisions, records = self.keys.decide(claims)
            if records is not None:
                logged, data, held = records
                files[logged] = [data]
                if held is not None:
                    kept[logged] = held
        else:
            decisions = [None] * len(appends)
        for append, decision in zip(appends, decisions, strict=True):
            if decision is None:
                for name, data in append.chunks.items():
                    files.setdefault(name, []).append(data)
        flush = self.appender.flush()
        # A flush that writes nothing (a /healthz probe's, a replay's) is no crash test's flush.
        reach = self.crash.reach if files else _nowhere
        try:
            self._write_and_commit(flush, files, kept, reach)
            try:
                self.keys.commit(next((span.size_before for _, span in flush.opened if span.name == logged), None))
            except OSError as exc:  # committed all the same: the next flush reads the log on from here
                log.error("could not read a committed flush's keys back (the next flush will): %s", exc)
            reach("after-finish")
        finally:
            flush.close()
        return Receipt(decisions)

    def _write_and_commit(
        self,
        flush: FileFlush,
        files: dict[str, list[bytes]],
        kept: dict[str, tuple[int, int]],
        reach: Callable[[str], None],
    ) -> None:
        """The intent, the files and the key log, the check before the commit point, the mark."""
        try:
            flush.write(files, crash=reach, kept=kept)
            reach("after-writes")
            flush.confirm()
            reach("after-commit")  # confirmed, the key log written: not committed until the mark
            flush.finish()  # the commit point of every flush
        except LockLost:
            # Another writer may hold the data dir's lock now and may have written after these
            # files: nothing is cut here; the next recovery, under that lock, does it.
            self.keys.rollback()
            self._unfinished = True
            raise
        except BaseException:
            self.keys.rollback()
            self._roll_back(flush)  # before any answer: a failed flush keeps nothing, its keys included
            raise

    def _committed_size(self, name: str) -> int:
        return 0 if self.intent.sizes is None else self.intent.sizes.known(name)

    def _forget_size(self, name: str) -> None:
        """A key log segment deleted by expiry: its committed size is no longer expected. With
        fsync, durably so before the deletion: slots are never synced otherwise (a slot lost
        to a power loss is a weaker check), but a deletion that outlived a forgetting lost with
        it would be a false refusal at the next start (a committed segment missing)."""
        if self.intent.sizes is not None:
            self.intent.sizes.forget(name)
            if self.fsync:
                self.intent.sizes.sync()

    def _roll_back(self, flush: FileFlush) -> None:
        """Cut a failed flush's files back and mark its intent undone; if that fails too, the
        intent stays live and the next recovery (at the latest, the stop's) does it."""
        try:
            flush.roll_back()
        except (OSError, sqlite3.Error) as exc:
            self._unfinished = True
            log.critical("could not roll back a failed flush (the next flush will): %s", exc)

    def recover(self) -> None:
        """Undo (or finish) a flush a crash or a failure left unfinished: under the flush lock,
        which it takes (at most the lock timeout) unless :meth:`locked` holds it already."""
        try:
            if self._holding:
                self.intent.recover(self.keys.is_stored)
                return
            if not self.is_open:
                self.open()
            with self.locked():
                self.intent.recover(self.keys.is_stored)
        except (OSError, sqlite3.Error) as exc:
            raise WriteFailed(f"recovery failed: {getattr(exc, 'strerror', None) or exc}") from exc
        self._unfinished = False

    def peek_committed_sizes(self, names: Sequence[str]) -> dict[str, int] | None:
        """Without the lock (tiny.intent ``peek_committed_sizes``); callable on the event loop."""
        return self.intent.peek_committed_sizes(names)

    def committed_sizes(self, names: Sequence[str]) -> dict[str, int]:
        """Noted under the flush lock, after recovery: no flush is half done then, and no later
        recovery cuts below them."""
        with self.locked():
            self.intent.recover(self.keys.is_stored)
            return {name: size for name in names if (size := size_of(self.data_dir / name)) >= 0}

    def writable(self, names: Sequence[str], size: int) -> str | None:
        """Room for ``size`` bytes on the data dir's file system (statvfs, what an unprivileged
        writer may use), and each file of ``names`` opened for appending (or, missing, its
        folder writable), as the flush opens them, with room under the process's file size
        limit; nothing is written."""
        try:
            room = os.statvfs(self.data_dir)
            free = room.f_bavail * room.f_frsize
            if free < size:
                return f"{self.data_dir} has {free:,} bytes free, fewer than the {size:,} a write needs"
            largest = resource.getrlimit(resource.RLIMIT_FSIZE)[0]  # a file past it is EFBIG
            for name in names:
                path = self.data_dir / name
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
                except FileNotFoundError:
                    folder = path.parent if path.parent.is_dir() else self.data_dir
                    if not os.access(folder, os.W_OK):
                        return f"{folder} cannot be written to"
                    continue
                try:
                    if largest != resource.RLIM_INFINITY and os.fstat(fd).st_size + size > largest:
                        return f"{path} would pass this process's file size limit ({largest:,} bytes)"
                finally:
                    os.close(fd)
        except OSError as exc:
            return f"{exc.filename or self.data_dir}: {exc.strerror or exc}"
        return None

    def waiting(self) -> str | None:
        waiting = self.lock.waiting_since
        if waiting and time.monotonic() - waiting > _WAIT_REPORTED_AFTER:
            return f"waiting {time.monotonic() - waiting:.1f} s for the data dir's flush lock, {self.lock.waiting_for}"
        return None

    def blocked_elsewhere(self) -> str | None:
        """The lock held by another process for over a second, seen by a try that never waits."""
        return held_elsewhere(self.data_dir, _WAIT_REPORTED_AFTER)

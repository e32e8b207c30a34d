"""The data dir's identity, its journal's first start, and ``--new-journal``: opening the journal's files.

On disk (tiny.layout): ``DATA_DIR/.tiny-id`` holds the data dir's random id; the first line of
``.tiny/lock`` (tiny.flushlock) and the keys' ``meta`` table (tiny.keys) hold it too, and so
does the header of ``.tiny/sizes`` (tiny.committed_sizes). The id file lives outside
``.tiny/`` so that removing that folder is noticed too. A first start writes the id as
``.tiny-id.new`` first and renames it last, so that a first start interrupted anywhere is
finished by the next one.

:func:`open_journal` attaches a :class:`~tiny.flushlock.FlushLock`, an
:class:`~tiny.intent.IntentFile` and a :class:`~tiny.keys.KeyStore` to the data dir's files,
holding the lock file's flock from its start (and the intent's, the fence, as soon as the
intent file is open) to its end, waiting at most the lock's timeout for them. It creates them
in a data dir that has none, and otherwise refuses (:class:`~tiny.refusals.Found`) a journal,
lock or intent file that is missing, empty, damaged or holds another id, a journal that lacks
the newest key an intent of the previous format says was committed, files (the key log's
segments among them) shorter than the last committed flush left them or than their committed sizes, and an
unfinished flush it cannot undo safely; a journal in another mode is refused (Refused) even
with ``accept_new``. ``accept_new`` instead moves ``.tiny`` aside as
``.tiny.replaced-<time>`` and starts a fresh journal under the data dir's id, undoing the
unfinished flush it records where that is safe. On a failure the caller closes the pieces
(tiny.commit.local does): nothing stays open.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shlex
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from tiny import layout
from tiny.commit.errors import Refused
from tiny.committed_sizes import SizeTable, SizeTableError, check_all, ways_past
from tiny.files import fsync_dir, size_of, write_durably
from tiny.flushlock import FlushLock
from tiny.intent import FINISHED, LIVE, FileSpan, IntentFile, parse
from tiny.journal_meta import bounds_text, described, seconds_text
from tiny.keys import KeyStore
from tiny.refusals import NEW_JOURNAL_FLAG, Found

log = logging.getLogger("tiny.datadir")

_CLOCK_SLACK = 3600.0  # seconds of clock difference between hosts the history check tolerates


@dataclass(frozen=True, slots=True)
class Identity:
    """An opened journal's data dir id and its keys' digest secret."""

    dir_id: str
    secret: bytes


def open_journal(
    lock: FlushLock,
    intent: IntentFile,
    keys: KeyStore,
    *,
    known_id: str | None = None,
    accept_new: bool = False,
    check_sizes: bool = True,
    cluster: bool | None = None,
    bounds: bool = False,
) -> Identity:
    """Open (or create) the journal files of ``lock.data_dir`` into the three pieces and
    recover an unfinished flush; see the module docstring. ``known_id``: the id this process
    used the data dir under before (a reopening must find the same). ``check_sizes`` False:
    every check but the files' committed sizes (tiny-admin forget, which settles them).
    ``cluster`` False: a server of one host, which refuses (Refused) a data dir that follows a
    cluster (tiny.cluster.binding: its writes would make this host's files differ from every
    other's); True or None: no such check (cluster mode checks the binding itself; the
    operator's commands work on either). ``bounds``: ``keys``' window and bound are a server's,
    which the journal's must equal (:func:`pin_key_bounds`). The caller closes the pieces on any
    failure."""
    state = layout.state_dir(lock.data_dir)
    if known_id is not None and not state.is_dir():
        # A reopening (after a refusal; a /healthz probe's, too) makes nothing: a data dir moved
        # away would be made again empty at its old path, and the move back would land inside it.
        raise Found(f"the data dir {lock.data_dir} (its journal's folder {state}) is gone: moved or deleted")
    try:
        state.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise Refused(f"cannot create the journal's folder {state}: {exc.strerror or exc}") from None
    lock.open()
    deadline = time.monotonic() + lock.lock_timeout
    opening = _Opening(lock, intent, keys, known_id, check_sizes, local_only=cluster is False)
    with lock.holding_lock_file(lock.lock_timeout):
        try:
            identity = opening.attach(deadline)
            intent.recover(keys.is_stored)
        except Found as found:
            opening.close_files()
            if not accept_new:
                raise
            identity = opening.start_fresh(found.what)
        if bounds:
            pin_key_bounds(keys, lock.data_dir)
        keys.note_file()
        keys.attach_log()  # after recovery: every byte of the log is committed now (read later, unlocked)
    return identity


def pin_key_bounds(keys: KeyStore, data_dir: Path) -> None:
    """Record ``keys``' window and bound in a journal that has none; Refused when it holds
    others. Servers that kept keys differently would disagree on whether a retry's key still
    counts: one would answer it as stored, another write its rows again. The lock held."""
    mine = bounds_text(keys.window, keys.max_keys)
    found = keys.meta("key_bounds")
    if found is None:
        keys.set_meta("key_bounds", mine)
        return
    if found == mine:
        return
    window = seconds_text(keys.window)
    change = f"tiny-admin set-key-bounds {shlex.quote(str(data_dir))} {window} {keys.max_keys}"
    try:
        kept = described(found)
    except ValueError:
        raise Refused(
            f"the journal of {data_dir} records its key bounds as {found[:64]!r}, which is not a window and a "
            f"bound: stop every server on {data_dir}, then run: {change}"
        ) from None
    raise Refused(
        f"the journal of {data_dir} keeps Idempotency-Keys for {kept}, and this server was started with "
        f"--idempotency-window {window} --idempotency-max-keys "
        f"{keys.max_keys}: every server on a data dir must keep keys alike (else a retry one answers as stored, "
        f"another writes again). To change them, stop every server on {data_dir}, then run: {change}"
    )


def close_files(lock: FlushLock, intent: IntentFile, keys: KeyStore) -> None:
    """Close the keys, the intent (and its fence) and the sizes; the lock file stays open."""
    keys.close()
    lock.fence_fd = -1
    intent.close()
    if intent.sizes is not None:
        intent.sizes.close()
        intent.sizes = None


class _Opening:
    """One opening of a data dir's journal (the lock file's flock held throughout)."""

    def __init__(
        self, lock: FlushLock, intent: IntentFile, keys: KeyStore, known_id: str | None, sizes: bool, local_only: bool
    ) -> None:
        self.lock, self.intent, self.keys = lock, intent, keys
        self.data_dir = lock.data_dir
        self.known_id = known_id
        self.check_sizes = sizes
        self.local_only = local_only

    def close_files(self) -> None:
        close_files(self.lock, self.intent, self.keys)

    def attach(self, deadline: float) -> Identity:
        """The existing journal, its identity checked; or the first one, created."""
        identity_path, journal_path = layout.identity_path(self.data_dir), self.keys.path
        found_id, pending = read_identity(identity_path), read_identity(_pending(identity_path))
        if found_id is None:
            return self._attach_without_id(pending)
        if self.known_id is not None and found_id != self.known_id:
            raise Found(f"{identity_path} now holds {found_id}, but this server used the data dir as {self.known_id}")
        if not journal_path.exists():
            raise Found(f"the journal {journal_path} of data dir {found_id} is missing")
        meta = self.keys.connect_existing()
        if "data_dir_id" not in meta:
            raise Found(f"the journal {journal_path} holds no data dir id: it is empty, truncated or replaced")
        if meta["data_dir_id"].decode() != found_id:
            raise Found(
                f"the journal {journal_path} belongs to data dir {meta['data_dir_id'].decode()}, "
                f"but this data dir is {found_id}"
            )
        if self.local_only and "cluster_id" in meta:
            raise Refused(
                f"the data dir {self.data_dir} follows the PostgreSQL cluster {meta['cluster_id'].decode()} "
                "(cluster mode): start its server with --cluster naming that cluster. A server without it would "
                "write to these files alone, and this host's files would differ from every other host's; to use "
                "them on one host, start a server on a copy of the day files in a new data dir"
            )
        lock_id = self.lock.data_dir_id()
        if lock_id != found_id:
            raise Found(
                f"the lock file {self.lock.path} was deleted or replaced (it holds {lock_id or 'no id'}, the data "
                f"dir is {found_id}): a server still running may hold the old one. Once no server runs on "
                f"{self.data_dir}, `tiny-admin restore-lock {self.data_dir}` writes it again, keeping every key"
            )
        try:
            self.intent.open()
        except Refused:
            raise Found(
                f"the intent file {self.intent.path} is missing: an unfinished flush may not be undone"
            ) from None
        self.lock.fence_fd = self.intent.fd
        self.lock.take_fence(deadline)
        self._check_mode(meta.get("journal_mode", b"").decode())
        self.keys.read_newest()
        committed = self._check_history()
        self._open_sizes(found_id, tracked="sizes" in meta)
        if self.check_sizes:
            self._check_sizes(committed)
        return Identity(found_id, bytes(meta["digest_key"]))

    def _attach_without_id(self, pending: str | None) -> Identity:
        identity_path, journal_path = layout.identity_path(self.data_dir), self.keys.path
        if self.known_id is not None:
            raise Found(f"{identity_path} is gone while this server used the data dir (its id was {self.known_id})")
        if not journal_path.exists():
            if pending is None and self.intent.path.exists():
                raise Found(f"the journal {journal_path} is missing, but {self.intent.path} is there")
            return self.create(pending or uuid.uuid4().hex)  # a new data dir, or an interrupted first start
        meta = self.keys.connect_existing()
        if pending is not None and meta.get("data_dir_id") == pending.encode():
            self.close_files()
            return self.create(pending)  # the first start was interrupted after the journal was made
        if "data_dir_id" not in meta:
            raise Found(
                f"the journal {journal_path} is of an earlier format (it has no data dir id) or empty, "
                f"and {identity_path} is missing"
            )
        raise Found(
            f"{identity_path} is missing, but the journal {journal_path} belongs to data dir "
            f"{meta['data_dir_id'].decode()}"
        )

    def _check_mode(self, mode: str) -> None:
        if mode != self.keys.mode:
            self.close_files()
            raise Refused(
                f"the journal {self.keys.path} is in {mode!r} mode, and this server was started with "
                f"--journal-mode {self.keys.mode}: every server on a data dir must use the same mode. To change "
                f"it, stop every server on {self.data_dir}, then run: tiny-admin set-journal-mode "
                f"{self.data_dir} {self.keys.mode}"
            )

    def create(self, dir_id: str) -> Identity:
        """The journal, intent, sizes and lock id of data dir ``dir_id``; the id file last."""
        identity_path = layout.identity_path(self.data_dir)
        write_durably(_pending(identity_path), dir_id.encode() + b"\n")
        secret = self.keys.create(dir_id)
        self.intent.open(create=True)
        fcntl.flock(self.intent.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new: nobody else holds it
        self.lock.fence_fd = self.intent.fd
        self.intent.sizes = SizeTable.create(str(layout.sizes_path(self.data_dir)), dir_id)
        self.lock.write_id(dir_id)
        if self.keys.fsync:
            os.fsync(self.intent.fd)
            os.fsync(self.lock.fd)
        fsync_dir(layout.state_dir(self.data_dir))
        os.replace(_pending(identity_path), identity_path)
        fsync_dir(self.data_dir)
        found = sum(1 for entry in os.scandir(self.data_dir) if layout.day_of(entry.name) and entry.is_file())
        if found:  # files served before, or put here to be served: said loudly either way
            log.warning(
                "created a journal for the %d day files already in %s: no key of a batch before it is known, so "
                "a batch retried from before is written again (if a journal was here and was deleted with %s, "
                "stop and restore both from a backup instead)",
                found,
                self.data_dir,
                layout.identity_path(self.data_dir).name,
            )
        else:
            log.info("created the journal of data dir %s in %s", dir_id, layout.state_dir(self.data_dir))
        return Identity(dir_id, secret)

    def start_fresh(self, reason: str) -> Identity:
        """``accept_new``: move ``.tiny`` aside and create a fresh journal (on the old lock
        file, which moves with it, until the new one is held). An unfinished flush it records
        is undone where that is safe: a flush without keys, or a write that did not complete;
        rows that may have been acknowledged are kept."""
        state = layout.state_dir(self.data_dir)
        log.warning("%s: starting a fresh journal, as %s asks (%s)", reason, NEW_JOURNAL_FLAG, state)
        self._undo_orphan_intent()
        aside = state.with_name(f"{state.name}.replaced-{datetime.now(UTC):%Y%m%dT%H%M%S.%fZ}")
        os.rename(state, aside)
        log.warning("the old journal's folder is kept as %s", aside)
        state.mkdir()
        self.lock.take_new_file()
        return self.create(read_identity(layout.identity_path(self.data_dir)) or uuid.uuid4().hex)

    def _undo_orphan_intent(self) -> None:
        try:
            record = parse(self.intent.path.read_bytes())
        except OSError:
            return
        if record is None or record.state != LIVE:
            return
        spans = record.spans
        complete = all(s.size_after is not None and size_of(self.data_dir / s.name) >= s.size_after for s in spans)
        if record.first_key is not None and complete:
            log.warning("kept the rows of an unfinished flush with keys: it may have been acknowledged")
            return
        self.intent.cut_back(spans)
        log.warning("undid an unfinished flush: %s", ", ".join(s.name for s in spans))

    def _check_history(self) -> list[FileSpan]:
        """The keys hold what the intent vouches for, and the files what the last committed
        flush wrote (Found otherwise); returns the files of that flush when it is known
        committed (their sizes after it are committed sizes)."""
        record = self.intent.read()
        if record is None:
            return []
        if record.last is not None:
            key, seq, stored = record.last
            recent = stored > time.time() - self.keys.window + _CLOCK_SLACK
            if not self.keys.is_stored(key) and self.keys.newest < seq and recent:
                raise Found(
                    f"the journal {self.keys.path} lacks the key {key!r} (seq {seq}) that {self.intent.path} says "
                    f"was committed at {datetime.fromtimestamp(stored, UTC):%Y-%m-%d %H:%M:%S} UTC: it lost commits "
                    "(its -wal deleted, or the journal restored from an older copy)"
                )
        if record.state != FINISHED or (record.first_key is not None and not self.keys.is_stored(record.first_key)):
            return []
        if not self.check_sizes:  # tiny-admin forget: it checks the files it is told of, then drops them here
            return []
        for span in record.spans:
            size = size_of(self.data_dir / span.name)
            if span.size_after is not None and size < span.size_after:
                raise Found(
                    f"{self.data_dir / span.name} is {max(size, 0)} bytes, shorter than the {span.size_after} the "
                    f"last committed flush left (per {self.intent.path}): the files are older than the journal "
                    "(restored, or copied while a server wrote), or were cut by hand. "
                    f"{ways_past(self.data_dir, span.name)}"
                )
        return [span for span in record.spans if span.size_after is not None]

    def _open_sizes(self, dir_id: str, tracked: bool) -> None:
        """The files' committed sizes; a journal that never had them (an earlier format) gets an
        empty table now. Found when one that has them finds the table missing, damaged or
        another data dir's."""
        path = str(layout.sizes_path(self.data_dir))
        try:
            if not tracked:
                self.intent.sizes = SizeTable.create(path, dir_id)
                self.keys.set_meta("sizes", b"1")
                return
            self.intent.sizes = SizeTable.open(path, dir_id)
        except SizeTableError as exc:
            raise Found(
                f"the files' committed sizes {exc}: the journal cannot tell whether acknowledged rows are gone"
            ) from None
        except OSError as exc:
            raise Refused(f"cannot use the files' committed sizes {path}: {exc.strerror or exc}") from None

    def _check_sizes(self, committed: list[FileSpan]) -> None:
        """Every file at least as long as it is known committed (Found otherwise); then the
        sizes of the last committed flush recorded (its writer may have died before it did)."""
        sizes = self.intent.sizes
        assert sizes is not None
        try:
            check_all(sizes, self.data_dir)
        except OSError as exc:
            raise Refused(f"cannot read the files' committed sizes {sizes.path}: {exc}") from None
        self.intent.record_sizes(committed)


def read_identity(path: Path) -> str | None:
    """The id an id file holds; None when it does not exist; Refused when it is damaged."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise Refused(f"cannot read the data dir's id {path}: {exc}") from None
    if not text or not all(char in "0123456789abcdef" for char in text):
        raise Refused(f"the data dir's id file {path} is damaged (it holds {text[:40]!r})")
    return text


def _pending(identity_path: Path) -> Path:
    return identity_path.with_name(identity_path.name + ".new")

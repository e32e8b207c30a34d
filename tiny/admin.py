"""Operator commands on a data dir: a live backup, its journal mode and key bounds, its aggregates, files forgotten.

Usage (``tiny-admin`` once installed, or ``python -m tiny.admin`` from the source tree):
    tiny-admin backup DATA_DIR DEST [--lock-timeout 30] [--cluster DSN --host-name NAME]
    tiny-admin set-journal-mode DATA_DIR {wal,delete}
    tiny-admin set-key-bounds DATA_DIR WINDOW MAX_KEYS
    tiny-admin rebuild-aggregates DATA_DIR [--lock-timeout 30]
    tiny-admin forget DATA_DIR FILE... [--remove] [--lock-timeout 30]

``backup`` copies a data dir while servers write to it, so that the copy is one the server
accepts and that holds exactly what was acknowledged at one instant: it takes the data dir's
flush lock for as long as it takes to note every file's size, the intent and the key log's
segments (microseconds: ingest waits that long, never for the copy), then copies, with
the lock released, each file up to its noted size (the day files and rejects only grow) and
the journal's meta through SQLite's online backup, the key log's segments up to their noted
sizes (read through descriptors opened under the lock: expiry may delete one meanwhile), and
the files' committed sizes as they were at that instant (none past the sizes copied). A
retry of any batch against the copy then writes it exactly once. A plain ``cp -r`` of a live
data dir is refused by the server instead (the journal and the files come from different
moments: tiny.datadir). DEST must not exist.

In cluster mode the copy carries the data dir's position in the log (its intent) and its
binding to the cluster (its journal): a host started on it follows the log from there. With
``--cluster DSN --host-name NAME``, the backup also registers NAME in the log's followers at
that position, while it holds the lock (so before this host's follower can report a later one):
the log then keeps every batch the copy lacks until NAME's server starts on it and reports,
or ``--follower-retention`` passes, however long the copy takes to reach its host.

``set-journal-mode`` changes the mode every server on the data dir must use (``wal`` on one
host, ``delete`` for writers on several hosts); stop every server on the data dir first.

``set-key-bounds`` changes how long (``--idempotency-window`` seconds) and how many
(``--idempotency-max-keys``) Idempotency-Keys every server on the data dir keeps: a server
started with others is refused (their decisions on a retry would differ); stop every server
on the data dir first, then start them all with the new flags.

``rebuild-aggregates`` counts the downloads API's aggregates (tiny.aggregates) again from the
day files, e.g. after a day file was edited by hand; servers may run meanwhile: they go on
answering from the old counts until the new ones replace them in one transaction, and a
query that must bring the counts up to date waits (a 503 after 10 s). The same transaction
raises the store's generation, so every running server drops the answers it kept at their
next query (tiny.live). A day file that is not a regular file (a FIFO...) is refused, and
nothing is changed.

``forget`` is the knowing way past a data file deleted or cut on purpose (say, a day no longer
kept), which the journal otherwise refuses until the file is restored (its committed size,
tiny.committed_sizes: acknowledged rows are gone). Servers may run meanwhile. Under the flush
lock, after recovery, for each FILE (a day file or a rejects file, named relative to DATA_DIR or
as a path inside it): a missing file's committed size is forgotten; a file shorter than its
committed size is accepted at the size it has; with ``--remove``, a file that is there is
removed, and its committed size forgotten. A file that is whole without ``--remove``, a name
that is not a data file, or a missing file with nothing committed to it refuses the command
before anything changes. It keeps every key: a retry of a batch whose rows were in a forgotten
file is answered "replayed" within the window, not written again (``--new-journal``, the other
way, forgets every key). The counts of the downloads API follow by themselves (a day file
found shorter than what was counted is counted again). A data dir that follows a cluster is
refused: its files are the log's, byte for byte on every host, and are rebuilt, never forgotten
(docs/scaling-out.md).

``restore-lock`` writes the lock file (``.tiny/lock``) again after it was deleted or replaced by
hand, which every start refuses: a server still running may hold the old one, and two writers
would then append at once. Refused while a process of this host holds the journal, the lock or
the intent file open, or holds the intent's lock (the fence), and unless the data dir's id
(``.tiny-id``) and the journal's agree. Every key is kept (``--new-journal``, the other way,
forgets them).

Exit status: 0 done, 1 refused (the message says why), 2 bad usage.
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import shutil
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path

from tiny import layout, procfs
from tiny.aggregate_errors import Unavailable
from tiny.aggregates import Aggregates, aggregates_path
from tiny.cluster.dsn import cluster_string
from tiny.commit import CommitError, Refused
from tiny.commit.local import LocalCommit
from tiny.config import host_name, max_keys, seconds
from tiny.files import fsync_dir
from tiny.flushlock import HOLDER_AT, FlushLock
from tiny.forgetting import forget
from tiny.journal_meta import MODES, bounds_text, described, missing_journal, seconds_text, stored_mode
from tiny.keylog import KEYS_DIR, records, segment_number
from tiny.refusals import Found

log = logging.getLogger("tiny.admin")
_COPY_BLOCK = 1 << 20


def _existing(data_dir: Path, journal: bool = False) -> None:
    """Refused unless ``data_dir`` is a directory (``journal``: with a journal of this version),
    before anything is made in it: a mistyped path is not a data dir to create."""
    if not data_dir.is_dir():
        raise Refused(f"{data_dir} is not a directory: nothing was done")
    missing = missing_journal(data_dir) if journal else None
    if missing is not None:
        raise Refused(f"{missing}; nothing was done")


def _none_running(data_dir: Path, *, intent: bool = False) -> None:
    """Refused while a process of this host (that this user can see) holds the data dir's
    journal or lock file open (``intent``: or its intent file): a server running on it."""
    files = {layout.journal_path(data_dir), layout.lock_path(data_dir)}
    if intent:
        files.add(layout.intent_path(data_dir))
    running = procfs.holders(files)
    if running:
        raise Refused(
            f"processes {', '.join(map(str, running))} hold the journal of {data_dir} open (servers running on it): "
            "stop every server first; a worker of theirs that restarted would be refused. Nothing was changed"
        )


def backup(
    data_dir: Path, dest: Path, lock_timeout: float = 30.0, hold: tuple[str, str] | None = None
) -> dict[str, int]:
    """Copy the live data dir ``data_dir`` to the new directory ``dest`` (see the module
    docstring); returns the files and bytes copied, the keys kept and (cluster mode) the
    position copied. ``hold``: (the cluster's DSN, a follower name) to register at that
    position. CommitError when the data dir's journal is refused, FileExistsError when
    ``dest`` exists, Refused when the hold cannot be registered (nothing is copied then)."""
    _existing(data_dir, journal=True)
    if dest.exists():
        raise FileExistsError(f"{dest} exists; back up into a new directory")
    if dest.resolve().is_relative_to(data_dir.resolve()):
        raise Refused(
            f"{dest} is inside the data dir {data_dir}: every later backup would copy it again, and a server "
            "would serve its day files' folder as data; back up outside it (nothing was done)"
        )
    journal = LocalCommit(data_dir, mode=stored_mode(data_dir) or "wal", lock_timeout=lock_timeout)
    journal.open(keys=False)
    segments: dict[str, tuple[int, int]] = {}
    try:
        with journal.locked():  # one instant: the files, the intent and the keys agree
            sizes = _file_sizes(data_dir)
            intent = layout.intent_path(data_dir).read_bytes()
            committed = layout.sizes_path(data_dir).read_bytes()  # each at most the size noted now
            lock_line = layout.lock_path(data_dir).read_bytes()[:64]
            segments = _key_log_sizes(data_dir)
            position = _position(journal, hold is not None)
            if hold is not None:
                _hold(hold, position or 0)
        # Built aside and renamed into place whole: a backup that fails (a full disk) leaves
        # no DEST that a server would take for a data dir, its files cut mid-row.
        dest.parent.mkdir(parents=True, exist_ok=True)
        aside = dest.parent / f".{dest.name}.partial-{os.getpid()}"
        try:
            aside.mkdir()
            layout.state_dir(aside).mkdir()
            copied = 0
            for name, size in sorted(sizes.items()):
                copied += _copy_prefix(data_dir / name, aside / name, size)
            _copy_journal(journal, layout.journal_path(aside))
            kept = _copy_key_log(segments, aside)
            layout.intent_path(aside).write_bytes(intent)
            layout.sizes_path(aside).write_bytes(committed)
            layout.lock_path(aside).write_bytes(lock_line)
            shutil.copyfile(layout.identity_path(data_dir), layout.identity_path(aside))
            for folder in [*(path for path in aside.rglob("*") if path.is_dir()), aside]:
                fsync_dir(folder)
            aside.rename(dest)
            fsync_dir(dest.parent)
        except OSError as exc:
            shutil.rmtree(aside, ignore_errors=True)
            raise OSError(f"the backup into {dest} failed ({exc.strerror or exc}); nothing of it was left") from exc
    finally:
        journal.close()
        for fd, _ in segments.values():
            os.close(fd)
    return {"files": len(sizes), "bytes": copied, "keys": kept, "position": position if position is not None else -1}


def _position(journal: LocalCommit, needed: bool) -> int | None:
    """The log position committed with the files (cluster mode), or None (one host; or a torn
    intent, which a hold refuses: the position cannot be known)."""
    try:
        return journal.intent.committed_position()
    except Found:
        if needed:
            raise
        return None


def _hold(hold: tuple[str, str], position: int) -> None:
    """Register follower ``hold[1]`` at ``position`` in the log of the cluster ``hold[0]``."""
    from tiny.cluster.errors import ClusterError
    from tiny.cluster.log import CommitLog
    from tiny.commit.cluster import TIMEOUTS

    log = CommitLog(hold[0], timeouts=TIMEOUTS)
    try:
        log.report(hold[1], position)
    except ClusterError as exc:
        raise Refused(
            f"the log could not register {hold[1]} at position {position}: {exc}; nothing was copied"
        ) from None
    finally:
        log.close()


def _file_sizes(data_dir: Path) -> dict[str, int]:
    """Every data file's size (day files, rejects, anything else but the journal's own)."""
    sizes = {}
    for path in data_dir.rglob("*"):
        relative = path.relative_to(data_dir)
        if relative.parts[0].startswith(layout.STATE_DIR) or not path.is_file():
            continue  # .tiny/, .tiny-id, and .tiny.replaced-* folders
        sizes[str(relative)] = path.stat().st_size
    return sizes


def _copy_prefix(source: Path, target: Path, size: int) -> int:
    """The first ``size`` bytes of ``source`` into ``target`` (the bytes a file had at the backup's instant)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    left = size
    with open(source, "rb") as reader, open(target, "wb") as writer:
        while left > 0 and (block := reader.read(min(_COPY_BLOCK, left))):
            writer.write(block)
            left -= len(block)
        writer.flush()
        os.fsync(writer.fileno())
    if left:
        raise OSError(f"{source} shrank below {size} bytes while it was copied")
    return size


def _key_log_sizes(data_dir: Path) -> dict[str, tuple[int, int]]:
    """Each key log segment (tiny.keylog), by its name relative to ``data_dir``: a descriptor
    opened now and its size now (lock held: every byte below it belongs to a flush)."""
    folder = data_dir / KEYS_DIR
    if not folder.is_dir():
        return {}
    found = {}
    for entry in os.scandir(folder):
        if segment_number(entry.name) is not None:
            fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC)
            found[f"{KEYS_DIR}/{entry.name}"] = (fd, os.fstat(fd).st_size)
    return found


def _copy_key_log(segments: dict[str, tuple[int, int]], dest: Path) -> int:
    """The segments up to their noted sizes into ``dest``; returns the keys copied."""
    kept = 0
    for name, (fd, size) in sorted(segments.items()):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        data = os.pread(fd, size, 0)
        if len(data) != size:
            raise OSError(f"the key log segment {name} shrank below {size} bytes while it was copied")
        with open(target, "wb") as writer:
            writer.write(data)
            writer.flush()
            os.fsync(writer.fileno())
        kept += sum(1 for _ in records(data))
    return kept


def _copy_journal(journal: LocalCommit, target: Path) -> None:
    """SQLite's online backup of the journal's meta into ``target``, in its mode."""
    copy = sqlite3.connect(target)
    try:
        journal.keys.db.backup(copy)
        mode = copy.execute("SELECT value FROM meta WHERE name = 'journal_mode'").fetchone()[0]
        copy.execute(f"PRAGMA journal_mode={'WAL' if bytes(mode) == b'wal' else 'DELETE'}")
    finally:
        copy.close()


def set_journal_mode(data_dir: Path, mode: str, lock_timeout: float = 30.0) -> str:
    """Switch the data dir's journal to ``mode``; returns the mode it had. Every server on the
    data dir must be stopped: Refused while a process of this host holds the journal open (and,
    for one it cannot see, SQLite refuses to leave WAL mode while another process has the journal
    open; entering it, it does not refuse)."""
    _existing(data_dir, journal=True)
    _none_running(data_dir)
    current = stored_mode(data_dir) or "wal"
    journal = LocalCommit(data_dir, mode=current, lock_timeout=lock_timeout)
    journal.open(keys=False)
    try:
        with journal.locked():
            try:
                db = journal.keys.db
                found = db.execute(f"PRAGMA journal_mode={'WAL' if mode == 'wal' else 'DELETE'}").fetchone()[0]
            except sqlite3.OperationalError as exc:
                raise Refused(f"SQLite refused the change ({exc}): stop every server on {data_dir} first") from None
            if found.lower() != mode:
                raise Refused(f"SQLite kept the journal in {found} mode: stop every server on {data_dir} first")
            db.execute("UPDATE meta SET value = ? WHERE name = 'journal_mode'", (mode.encode(),))
    finally:
        journal.close()
    return current


def set_key_bounds(data_dir: Path, window: float, max_keys: int, lock_timeout: float = 30.0) -> str:
    """Record that every server on ``data_dir`` keeps keys ``window`` seconds and at most
    ``max_keys`` (tiny.datadir ``pin_key_bounds``); returns what the journal held before
    ("none": no server has opened it since it was made). Stop every server on it first: a
    running one goes on with its own bounds until it restarts, when it is refused: Refused when
    a process of this host holds the data dir's journal open (that this user can see)."""
    _existing(data_dir, journal=True)  # none: the first server to start records its own flags
    _none_running(data_dir)
    journal = LocalCommit(data_dir, mode=stored_mode(data_dir) or "wal", lock_timeout=lock_timeout)
    journal.open(keys=False)
    try:
        with journal.locked():
            before = journal.keys.meta("key_bounds")
            journal.keys.set_meta("key_bounds", bounds_text(window, max_keys))
    finally:
        journal.close()
    if before is None:
        return "none"
    try:
        return f"{described(before)} keys"
    except ValueError:
        return f"a damaged record ({before[:64]!r})"


def rebuild_aggregates(data_dir: Path, lock_timeout: float = 30.0) -> int:
    """Count the aggregates of ``data_dir`` again from its day files, up to the sizes they had,
    committed, at one instant (noted under the flush lock, after recovery), and raise the
    store's generation; returns the rows. Unavailable when a day file is not a regular file
    or the store cannot be written (the store is left as it was). Refused for a directory with
    neither a journal nor a day file (a mistyped path: no journal is made there)."""
    _existing(data_dir)
    if missing_journal(data_dir) is not None and not any(layout.day_of(name) for name in os.listdir(data_dir)):
        raise Refused(f"{data_dir} has neither a journal nor a day file: it is no data dir; nothing was done")
    journal = LocalCommit(data_dir, mode=stored_mode(data_dir) or "wal", lock_timeout=lock_timeout)
    journal.open(keys=False)
    try:
        with journal.locked():
            journal.recover()
            sizes = {day: entry.stat().st_size for entry in os.scandir(data_dir) if (day := layout.day_of(entry.name))}
    finally:
        journal.close()
    store = Aggregates(data_dir, busy_timeout=600.0)
    try:
        rows = store.rebuild(sizes)
        store.sync()  # on disk before the command returns: the next boot keeps it
        return rows
    finally:
        store.close()


def restore_lock(data_dir: Path) -> str:
    """Write the data dir's lock file again (see the module docstring); returns the data dir's id."""
    _existing(data_dir, journal=True)
    _none_running(data_dir, intent=True)
    identity = layout.identity_path(data_dir).read_text().strip()
    db = sqlite3.connect(f"file:{layout.journal_path(data_dir)}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT value FROM meta WHERE name = 'data_dir_id'").fetchone()
    finally:
        db.close()
    if row is None or bytes(row[0]).decode() != identity:
        raise Refused(f"the journal of {data_dir} is not this data dir's ({identity}): nothing was changed")
    lock = FlushLock(data_dir, 0.0)
    if lock.path.exists():
        lock.open()
        try:
            if lock.data_dir_id() == identity:
                raise Refused(f"the lock file {lock.path} is the data dir's: there is nothing to restore")
        finally:
            lock.close()
    fence = os.open(layout.intent_path(data_dir), os.O_RDWR | os.O_CLOEXEC)
    try:
        try:  # a writer paused mid-flush still holds it, whatever happened to the lock file
            fcntl.flock(fence, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Refused(f"a process holds {layout.intent_path(data_dir)}'s lock: a flush may be under way") from None
        aside = lock.path.with_name(f"{lock.path.name}.new-{os.getpid()}")
        aside.write_bytes(identity.encode().ljust(HOLDER_AT - 1) + b"\n")
        with open(aside, "rb+") as written:
            os.fsync(written.fileno())
        aside.replace(lock.path)
        fsync_dir(lock.path.parent)
    finally:
        os.close(fence)  # (its flock with it)
    return identity


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    parser = argparse.ArgumentParser(prog="tiny-admin", description="Operator commands on a Tiny Data Server data dir.")
    commands = parser.add_subparsers(dest="command", required=True)
    copy = commands.add_parser("backup", help="a consistent copy of a data dir, also while servers write to it")
    copy.add_argument("data_dir", type=Path)
    copy.add_argument("dest", type=Path, help="a new directory")
    copy.add_argument("--lock-timeout", type=seconds, default=30.0, help="seconds to wait for the flush lock (30)")
    copy.add_argument(
        "--cluster",
        type=cluster_string,
        help="cluster mode: the cluster's DSN, to register --host-name at the copy's position",
    )
    copy.add_argument(
        "--host-name", type=host_name, help="cluster mode: the follower name of the host that will start on the copy"
    )
    change = commands.add_parser("set-journal-mode", help="change the journal mode (stop every server first)")
    change.add_argument("data_dir", type=Path)
    change.add_argument("mode", choices=MODES)
    bounds = commands.add_parser(
        "set-key-bounds", help="change how long and how many Idempotency-Keys are kept (stop every server first)"
    )
    bounds.add_argument("data_dir", type=Path)
    bounds.add_argument("window", type=seconds, help="seconds a key is kept at least (--idempotency-window)")
    bounds.add_argument("max_keys", type=max_keys, help="keys kept at most (--idempotency-max-keys)")
    rebuild = commands.add_parser(
        "rebuild-aggregates", help="count the downloads API's aggregates again from the day files"
    )
    rebuild.add_argument("data_dir", type=Path)
    rebuild.add_argument("--lock-timeout", type=seconds, default=30.0, help="seconds to wait for the flush lock (30)")
    gone = commands.add_parser(
        "forget", help="accept, knowingly, data files deleted or cut on purpose (every key is kept)"
    )
    gone.add_argument("data_dir", type=Path)
    gone.add_argument("files", nargs="+", help="day or rejects files, relative to DATA_DIR or paths inside it")
    gone.add_argument("--remove", action="store_true", help="remove the files that are there, too")
    gone.add_argument("--lock-timeout", type=seconds, default=30.0, help="seconds to wait for the flush lock (30)")
    relock = commands.add_parser(
        "restore-lock", help="write the lock file again after it was deleted by hand (stop every server first)"
    )
    relock.add_argument("data_dir", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "backup":
            if (args.cluster is None) != (args.host_name is None):
                parser.error("backup: --cluster and --host-name go together")
            hold = (args.cluster, args.host_name) if args.cluster else None
            done = backup(args.data_dir, args.dest, args.lock_timeout, hold)
            at = f", at position {done['position']} of the log" if done["position"] >= 0 else ""
            held = f" ({args.host_name} holds the log from there)" if hold else ""
            print(
                f"copied {done['files']} files ({done['bytes']} bytes) and {done['keys']} keys to {args.dest}{at}{held}"
            )
        elif args.command == "forget":
            print("\n".join(forget(args.data_dir, args.files, args.remove, args.lock_timeout)))
        elif args.command == "restore-lock":
            print(f"wrote the lock file of data dir {restore_lock(args.data_dir)} in {layout.lock_path(args.data_dir)}")
        elif args.command == "rebuild-aggregates":
            rows = rebuild_aggregates(args.data_dir, args.lock_timeout)
            print(f"counted {rows:,} rows of {args.data_dir} into {aggregates_path(args.data_dir)}")
        elif args.command == "set-key-bounds":
            before = set_key_bounds(args.data_dir, args.window, args.max_keys)
            print(
                f"the keys of {args.data_dir} were kept for {before}, now for {seconds_text(args.window)} s and at "
                f"most {args.max_keys:,}: start every server on it with --idempotency-window "
                f"{seconds_text(args.window)} --idempotency-max-keys {args.max_keys}"
            )
        else:
            before = set_journal_mode(args.data_dir, args.mode)
            print(f"the journal of {args.data_dir} was in {before} mode, now {args.mode}")
    except (CommitError, OSError, sqlite3.Error, Unavailable) as exc:
        print(f"tiny-admin: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

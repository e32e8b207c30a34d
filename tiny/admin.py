"""Operator commands on a data dir: a consistent backup of a live one, its journal mode, its aggregates.

Usage (``tiny-admin`` once installed, or ``python -m tiny.admin`` from the source tree):
    tiny-admin backup DATA_DIR DEST [--lock-timeout 30]
    tiny-admin set-journal-mode DATA_DIR {wal,delete}
    tiny-admin rebuild-aggregates DATA_DIR [--lock-timeout 30]

``backup`` copies a data dir while servers write to it, so that the copy is one the server
accepts and that holds exactly what was acknowledged at one instant: it takes the data dir's
flush lock for as long as it takes to note every file's size, the intent and the newest
idempotency key (microseconds: ingest waits that long, never for the copy), then copies, with
the lock released, each file up to its noted size (the day files and rejects only grow) and
the journal through SQLite's online backup, dropping the keys stored after that instant, and
the files' committed sizes as they were at that instant (none past the sizes copied). A
retry of any batch against the copy then writes it exactly once. A plain ``cp -r`` of a live
data dir is refused by the server instead (the journal and the files come from different
moments: tiny.journal). DEST must not exist.

``set-journal-mode`` changes the mode every server on the data dir must use (``wal`` on one
host, ``delete`` for writers on several hosts); stop every server on the data dir first.

``rebuild-aggregates`` counts the downloads API's aggregates (tiny.aggregates) again from the
day files, e.g. after a day file was edited by hand; servers may run meanwhile: they go on
answering from the old counts until the new ones replace them in one transaction, and a
query that must bring the counts up to date waits (a 503 after 10 s). The same transaction
raises the store's generation, so every running server drops the answers it kept at their
next query (tiny.live). A day file that is not a regular file (a FIFO...) is refused, and
nothing is changed.

Exit status: 0 done, 1 refused (the message says why), 2 bad usage.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path

from tiny import layout
from tiny.aggregates import Aggregates, Unavailable, aggregates_path
from tiny.journal import MODES, Journal, JournalError, stored_mode

log = logging.getLogger("tiny.admin")
_COPY_BLOCK = 1 << 20


def backup(data_dir: Path, dest: Path, lock_timeout: float = 30.0) -> dict[str, int]:
    """Copy the live data dir ``data_dir`` to the new directory ``dest`` (see the module
    docstring); returns the files and bytes copied and the keys kept. JournalError when the
    data dir's journal is refused, FileExistsError when ``dest`` exists."""
    if dest.exists():
        raise FileExistsError(f"{dest} exists; back up into a new directory")
    journal = Journal(data_dir, mode=stored_mode(data_dir) or "wal", lock_timeout=lock_timeout)
    journal.open()
    try:
        with journal.locked():  # one instant: the files, the intent and the keys agree
            sizes = _file_sizes(data_dir)
            intent = layout.intent_path(data_dir).read_bytes()
            committed = layout.sizes_path(data_dir).read_bytes()  # each at most the size noted now
            lock_line = layout.lock_path(data_dir).read_bytes()[:64]
            newest = journal.last[1] if journal.last else 0
        dest.mkdir(parents=True)
        layout.state_dir(dest).mkdir()
        copied = 0
        for name, size in sorted(sizes.items()):
            copied += _copy_prefix(data_dir / name, dest / name, size)
        kept = _copy_journal(journal, layout.journal_path(dest), newest)
        layout.intent_path(dest).write_bytes(intent)
        layout.sizes_path(dest).write_bytes(committed)
        layout.lock_path(dest).write_bytes(lock_line)
        shutil.copyfile(layout.identity_path(data_dir), layout.identity_path(dest))
    finally:
        journal.close()
    return {"files": len(sizes), "bytes": copied, "keys": kept}


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


def _copy_journal(journal: Journal, target: Path, newest: int) -> int:
    """SQLite's online backup of the journal into ``target``, without the keys stored after
    seq ``newest`` (their rows are past the copied sizes); returns the keys kept."""
    copy = sqlite3.connect(target)
    try:
        journal.db.backup(copy)
        copy.execute("DELETE FROM idempotency_keys WHERE seq > ?", (newest,))
        copy.commit()
        mode = copy.execute("SELECT value FROM meta WHERE name = 'journal_mode'").fetchone()[0]
        copy.execute(f"PRAGMA journal_mode={'WAL' if bytes(mode) == b'wal' else 'DELETE'}")
        return int(copy.execute("SELECT count(*) FROM idempotency_keys").fetchone()[0])
    finally:
        copy.close()


def set_journal_mode(data_dir: Path, mode: str, lock_timeout: float = 30.0) -> str:
    """Switch the data dir's journal to ``mode``; returns the mode it had. Every server on the
    data dir must be stopped (SQLite refuses to leave WAL mode while another process has the
    journal open: JournalError)."""
    current = stored_mode(data_dir)
    if current is None:
        raise JournalError(f"{data_dir} has no journal of this version to change")
    journal = Journal(data_dir, mode=current, lock_timeout=lock_timeout)
    journal.open()
    try:
        with journal.locked():
            try:
                found = journal.db.execute(f"PRAGMA journal_mode={'WAL' if mode == 'wal' else 'DELETE'}").fetchone()[0]
            except sqlite3.OperationalError as exc:
                raise JournalError(
                    f"SQLite refused the change ({exc}): stop every server on {data_dir} first"
                ) from None
            if found.lower() != mode:
                raise JournalError(f"SQLite kept the journal in {found} mode: stop every server on {data_dir} first")
            journal.db.execute("UPDATE meta SET value = ? WHERE name = 'journal_mode'", (mode.encode(),))
    finally:
        journal.close()
    return current


def rebuild_aggregates(data_dir: Path, lock_timeout: float = 30.0) -> int:
    """Count the aggregates of ``data_dir`` again from its day files, up to the sizes they had,
    committed, at one instant (noted under the flush lock, after recovery), and raise the
    store's generation; returns the rows. Unavailable when a day file is not a regular file
    or the store cannot be written (the store is left as it was)."""
    journal = Journal(data_dir, mode=stored_mode(data_dir) or "wal", lock_timeout=lock_timeout)
    journal.open()
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


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    parser = argparse.ArgumentParser(prog="tiny-admin", description="Operator commands on a Tiny Data Server data dir.")
    commands = parser.add_subparsers(dest="command", required=True)
    copy = commands.add_parser("backup", help="a consistent copy of a data dir, also while servers write to it")
    copy.add_argument("data_dir", type=Path)
    copy.add_argument("dest", type=Path, help="a new directory")
    copy.add_argument("--lock-timeout", type=float, default=30.0, help="seconds to wait for the flush lock (30)")
    change = commands.add_parser("set-journal-mode", help="change the journal mode (stop every server first)")
    change.add_argument("data_dir", type=Path)
    change.add_argument("mode", choices=MODES)
    rebuild = commands.add_parser(
        "rebuild-aggregates", help="count the downloads API's aggregates again from the day files"
    )
    rebuild.add_argument("data_dir", type=Path)
    rebuild.add_argument("--lock-timeout", type=float, default=30.0, help="seconds to wait for the flush lock (30)")
    args = parser.parse_args(argv)
    try:
        if args.command == "backup":
            done = backup(args.data_dir, args.dest, args.lock_timeout)
            print(f"copied {done['files']} files ({done['bytes']} bytes) and {done['keys']} keys to {args.dest}")
        elif args.command == "rebuild-aggregates":
            rows = rebuild_aggregates(args.data_dir, args.lock_timeout)
            print(f"counted {rows:,} rows of {args.data_dir} into {aggregates_path(args.data_dir)}")
        else:
            before = set_journal_mode(args.data_dir, args.mode)
            print(f"the journal of {args.data_dir} was in {before} mode, now {args.mode}")
    except (JournalError, OSError, sqlite3.Error, Unavailable) as exc:
        print(f"tiny-admin: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

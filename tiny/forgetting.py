"""``tiny-admin forget``: data files deleted or cut on purpose, accepted knowingly (every key kept).

See tiny.admin's module docstring for the command; the committed sizes it changes are
tiny.committed_sizes'.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from tiny import layout
from tiny.commit import Refused
from tiny.commit.local import LocalCommit
from tiny.committed_sizes import SizeTable
from tiny.files import size_of
from tiny.journal_meta import missing_journal, stored_mode


def forget(data_dir: Path, files: Sequence[str], remove: bool = False, lock_timeout: float = 30.0) -> list[str]:
    """Forget, knowingly, what was committed to the data files ``files`` of ``data_dir`` (see
    the module docstring); returns one line per file saying what was done. Refused, with
    nothing changed, when a name is not a data file, a file is whole and ``remove`` is not
    given, or a missing file has nothing committed to it; CommitError when the journal is."""
    missing = missing_journal(data_dir)
    if missing is not None:
        raise Refused(f"{missing}: there is nothing to forget")
    mode = stored_mode(data_dir) or "wal"
    names = list(dict.fromkeys(_data_file(data_dir, given) for given in files))
    journal = LocalCommit(data_dir, mode=mode, lock_timeout=lock_timeout)
    journal.open(check_sizes=False, keys=False)  # every other check holds
    try:
        _refuse_a_cluster_host(journal)
        with journal.locked():
            table = journal.intent.sizes
            assert table is not None
            plans = [_plan(data_dir, table, name, remove) for name in names]  # before any change
            # No flush half done, but for the files forgotten: whatever an unfinished flush
            # wrote to them goes with what is forgotten of them.
            journal.intent.recover(journal.keys.is_stored, forgotten=frozenset(names))
            done = [_carry_out(data_dir, table, *plan) for plan in plans]
            journal.intent.rewrite_without(set(names))  # the last flush's sizes of them are forgotten too
    finally:
        journal.close()
    return done


def _refuse_a_cluster_host(journal: LocalCommit) -> None:
    """Refused when the data dir follows a cluster: its files are the log's batches, the same
    bytes on every host, and a file forgotten here would go on differing from every other
    host's while this host's follower appended the rest."""
    from tiny.cluster.binding import bound

    found = bound(journal)
    if found is not None:
        raise Refused(
            f"{journal.data_dir} follows the PostgreSQL cluster {found.cluster_id} (cluster mode): its files must "
            "stay the log's, byte for byte, so nothing of them is forgotten. Rebuild the data dir instead: remove "
            "it and start the host again (its follower applies the log), or start it on a copy of a peer's "
            "(tiny-admin backup; docs/scaling-out.md). Nothing was changed"
        )


def _data_file(data_dir: Path, given: str) -> str:
    """The name, relative to ``data_dir``, of the data file ``given`` names: a path that lies
    inside the data dir (taken from the current directory), or a name relative to it. Refused
    for anything that is not a day file or a rejects file."""
    path = Path(given)
    root = data_dir.resolve()
    inside = (Path.cwd() / path).parent.resolve() / path.name
    name = str(inside.relative_to(root)) if inside.is_relative_to(root) else os.path.normpath(given)
    if not layout.is_data_file(name):
        raise Refused(
            f"{given} is not a data file of {data_dir} (a day file YYYY-MM-DD.csv or rejects/YYYY-MM-DD.ndjson): "
            "nothing was changed"
        )
    return name


def _plan(data_dir: Path, table: SizeTable, name: str, remove: bool) -> tuple[str, int, int, bool]:
    """(name, its size now (-1: missing), the size committed to it, whether it is removed), or
    Refused when forgetting it is not what the operator can mean."""
    committed = max((size for _, size in table.slots_of(name)), default=0)
    size = size_of(data_dir / name)
    if size < 0 and committed == 0:
        raise Refused(f"{data_dir / name} does not exist and nothing was committed to it: nothing was changed")
    if size >= committed and not remove:
        raise Refused(
            f"{data_dir / name} is whole ({size} bytes, {committed} committed): there is nothing to forget; "
            "--remove removes it and its committed size. Nothing was changed"
        )
    return name, size, committed, remove and size >= 0


def _carry_out(data_dir: Path, table: SizeTable, name: str, size: int, committed: int, removed: bool) -> str:
    path = data_dir / name
    if removed:
        # The forgetting reaches the disk before the file goes: a power loss between the two
        # then leaves a file whose size no one expects (run the command again), never a
        # committed file missing, which every start would refuse.
        table.forget(name)
        table.sync()
        path.unlink()
        return f"removed {path} ({size} bytes) and its committed size ({committed} bytes)"
    if size < 0:
        table.forget(name)
        return f"forgot {path}: it is missing; the {committed} bytes committed to it are no longer expected"
    table.accept(name, size)
    return f"accepted {path} at {size} bytes: the {committed - size} bytes cut from its end are forgotten"

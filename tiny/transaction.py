"""One SQLite write transaction, taken at once: ``with immediate(db): ...``.

``BEGIN IMMEDIATE`` takes the database's write lock at the start (waiting up to the
connection's busy timeout for another process's transaction), so that what is read inside is
what the writes build on; COMMIT at the end, ROLLBACK on any exception (re-raised). The
journal's keys and the aggregate store both write this way.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator


@contextlib.contextmanager
def immediate(db: sqlite3.Connection) -> Iterator[None]:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")

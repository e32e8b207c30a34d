"""What the aggregate store says when it cannot answer now: :class:`Behind` or :class:`Unavailable`.

Both are 503s to a client (tiny.handlers.analytics, tiny.handlers.cran_api). :class:`Behind`
is raised by a fold that reached its deadline (tiny.aggregates.Aggregates.fold) and says what
is left, read when it is raised. :class:`Unavailable` says what the store's trouble is (a full
disk, an I/O error, the store's write lock held past the wait, a day file that cannot be
read): :func:`store_error` turns an OSError or a SQLite error into one, and :func:`reported`
does so for a block of store code.
"""

from __future__ import annotations

import contextlib
import errno
import sqlite3
from collections.abc import Iterator

_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_IOERR, _SQLITE_FULL = 5, 6, 10, 13  # primary result codes


def _amount(nbytes: int) -> str:
    if nbytes >= 1_000_000:
        return f"{nbytes / 1e6:.1f} MB"
    if nbytes >= 1_000:
        return f"{nbytes / 1e3:.1f} KB"
    return f"{nbytes} bytes"


class Behind(RuntimeError):
    """A fold reached its deadline before the days it was given were up to date: ``day``, the
    first that is not; ``left``, the bytes left to fold in it and the days after it; ``rows``,
    the rows in them (None: not said); ``exact``, whether ``rows`` was counted (or estimated
    from the rows per byte counted so far); ``days``, how many days have bytes left. All read
    when it is raised."""

    def __init__(self, day: str, left: int, rows: int | None = None, exact: bool = True, days: int = 1) -> None:
        super().__init__(day, left, rows, exact, days)
        self.day, self.left, self.rows, self.exact, self.days = day, left, rows, exact, days

    def counting(self) -> dict[str, str | int | None]:
        """What is left, for a client to show: ``{"day", "rows_left", "bytes_left"}`` (the
        rows None when not said)."""
        return {"day": self.day, "rows_left": self.rows, "bytes_left": self.left}

    def __str__(self) -> str:
        which = self.day if self.days == 1 else f"{self.day} and {self.days - 1} more day(s)"
        if self.rows is None:
            return f"the aggregates of {which} are catching up: {_amount(self.left)} left to count"
        rows = f"{'' if self.exact else 'about '}{self.rows:,} rows"
        return f"the aggregates of {which} are catching up: {rows} left to count ({_amount(self.left)})"


class Unavailable(RuntimeError):
    """The store cannot answer now, and why (:func:`store_error`): a full disk, an I/O error,
    its write lock or its marker's lock (tiny.unsynced) held past the wait, its marker not
    writable (a wrong file in its place), a day file that cannot be read."""

    def __str__(self) -> str:
        return str(self.args[0])


def store_error(exc: OSError | sqlite3.Error) -> Unavailable:
    """What an error from the store's files or from SQLite means, said as such."""
    if isinstance(exc, sqlite3.Error):
        code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
        full, failed, busy = code == _SQLITE_FULL, code == _SQLITE_IOERR, code in (_SQLITE_BUSY, _SQLITE_LOCKED)
    else:
        full, failed = exc.errno in (errno.ENOSPC, errno.EDQUOT), exc.errno == errno.EIO
        busy = isinstance(exc, TimeoutError)
    if full:
        return Unavailable(f"the disk under the aggregate store is full ({exc})")
    if failed:
        return Unavailable(f"the disk under the aggregate store failed: an I/O error ({exc})")
    if busy:
        return Unavailable(
            f"the aggregate store is busy: another process held its write lock for the whole wait ({exc}), "
            "as a fold of a long day or tiny-admin rebuild-aggregates does"
        )
    return Unavailable(f"the aggregate store is unavailable ({exc})")


@contextlib.contextmanager
def reported() -> Iterator[None]:
    """The store's OSErrors and SQLite errors as :class:`Unavailable` (store_error)."""
    try:
        yield
    except (OSError, sqlite3.Error) as exc:
        raise store_error(exc) from exc

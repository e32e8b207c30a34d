"""The aggregate store's tables and every SQL statement over them: the schema, the fold's writes, the answers' reads.

The store (tiny.aggregates) is a SQLite file. Its tables, one row per:

- ``files``: day file counted: its inode, the digests of its first bytes (``head``) and of
  the bytes just before ``consumed`` (``tail``), the bytes counted (``consumed``), and its
  rows, bytes and skipped lines;
- ``packages``, ``hours``, ``ips``: day and package, hour, ip_id: its downloads (and an
  ip_id's bytes);
- ``ip_hours``, ``ip_countries``: day, ip_id and hour or country: its downloads;
- ``meta``: the store's generation (tiny.aggregate_generation).

Encodings. SQLite integers are signed 64-bit; ip_ids and sizes are unsigned 64-bit (and byte
sums grow past 2^64). An ip_id is stored minus 2^63 (:data:`IP_OFFSET`; order kept: the top
whales' ties stay by ip_id); a byte total as two columns, hi = total >> 32 and lo = total &
0xFFFFFFFF, carried on every add, so that it stays exact while hi fits 63 bits: up to 2^95
bytes per day and ip_id. The functions here take and return ip_ids and byte totals as they
are; only this module knows how they are stored.

Every function runs in the caller's connection and transaction (the caller opens them:
tiny.aggregates for the writes, one snapshot per answer for the reads).
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from tiny.aggregate_count import Sums

VERSION = 3  # PRAGMA user_version: a store of another version is emptied and counted again
HOURS = 24  # the hours of a day (the ``hour`` columns: 0..23, UTC)
IP_OFFSET = 1 << 63
_LO = 0xFFFFFFFF
_TABLES = (
    """CREATE TABLE files (
    day TEXT PRIMARY KEY, inode INTEGER NOT NULL, head BLOB NOT NULL, tail BLOB NOT NULL,
    consumed INTEGER NOT NULL, rows INTEGER NOT NULL, bytes_hi INTEGER NOT NULL, bytes_lo INTEGER NOT NULL,
    skipped INTEGER NOT NULL
) WITHOUT ROWID""",
    """CREATE TABLE packages (
    day TEXT NOT NULL, package TEXT NOT NULL, downloads INTEGER NOT NULL, PRIMARY KEY (day, package)
) WITHOUT ROWID""",
    """CREATE TABLE hours (
    day TEXT NOT NULL, hour INTEGER NOT NULL, downloads INTEGER NOT NULL, PRIMARY KEY (day, hour)
) WITHOUT ROWID""",
    """CREATE TABLE ips (
    day TEXT NOT NULL, ip INTEGER NOT NULL, downloads INTEGER NOT NULL,
    bytes_hi INTEGER NOT NULL, bytes_lo INTEGER NOT NULL, PRIMARY KEY (day, ip)
) WITHOUT ROWID""",
    """CREATE TABLE ip_hours (
    day TEXT NOT NULL, ip INTEGER NOT NULL, hour INTEGER NOT NULL, downloads INTEGER NOT NULL,
    PRIMARY KEY (day, ip, hour)
) WITHOUT ROWID""",
    """CREATE TABLE ip_countries (
    day TEXT NOT NULL, ip INTEGER NOT NULL, country TEXT NOT NULL, downloads INTEGER NOT NULL,
    PRIMARY KEY (day, ip, country)
) WITHOUT ROWID""",
    "CREATE TABLE meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID",  # the generation
    "CREATE INDEX packages_by_name ON packages (package, day)",
    "CREATE INDEX ips_by_downloads ON ips (day, downloads DESC, ip)",  # a day's top whales: an index range
)
_PER_DAY = ("packages", "hours", "ips", "ip_hours", "ip_countries")
# (SQLite evaluates every SET expression on the row as it was: lo's carry goes into hi.)
_ADD_BYTES = (
    "bytes_hi = bytes_hi + excluded.bytes_hi + ((bytes_lo + excluded.bytes_lo) >> 32), "
    "bytes_lo = (bytes_lo + excluded.bytes_lo) & 4294967295"
)
_ADD = "ON CONFLICT DO UPDATE SET downloads = downloads + excluded.downloads"


def join_bytes(hi: int, lo: int) -> int:
    """A byte total from its two stored columns."""
    return (hi << 32) + lo


# -- the schema -----------------------------------------------------------------------------


def version(db: sqlite3.Connection) -> int:
    """The store's schema version (PRAGMA user_version; 0 for a new file)."""
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def create(db: sqlite3.Connection, generation: int) -> None:
    """Every table dropped, the tables of VERSION made, ``generation`` stored (in the caller's
    transaction: DDL is transactional in SQLite)."""
    for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
        db.execute(f'DROP TABLE "{table}"')
    for statement in _TABLES:
        db.execute(statement)
    db.execute("INSERT INTO meta VALUES ('generation', ?)", (generation,))


def set_version(db: sqlite3.Connection) -> None:
    db.execute(f"PRAGMA user_version = {VERSION}")


def generation(db: sqlite3.Connection) -> int:
    return int(db.execute("SELECT value FROM meta WHERE name = 'generation'").fetchone()[0])


def set_generation(db: sqlite3.Connection, value: int) -> None:
    db.execute("UPDATE meta SET value = ? WHERE name = 'generation'", (value,))


# -- the fold's reads and writes ------------------------------------------------------------


class Counted(NamedTuple):
    """A ``files`` row: which file of a day was counted, and how far."""

    inode: int
    head: bytes
    tail: bytes
    consumed: int


def counted(db: sqlite3.Connection, day: str) -> Counted | None:
    """Which file of ``day`` the store counted and how far; None when it has no count of the day."""
    row = db.execute("SELECT inode, head, tail, consumed FROM files WHERE day = ?", (day,)).fetchone()
    return None if row is None else Counted(*row)


def days_within(db: sqlite3.Connection, within: tuple[str, str]) -> list[str]:
    """The days counted from ``within[0]`` to ``within[1]``."""
    return [day for (day,) in db.execute("SELECT day FROM files WHERE day BETWEEN ? AND ?", within).fetchall()]


def has_day(db: sqlite3.Connection, day: str) -> bool:
    return db.execute("SELECT 1 FROM files WHERE day = ?", (day,)).fetchone() is not None


def rows_and_bytes_counted(db: sqlite3.Connection, day: str | None) -> tuple[int | None, int | None]:
    """The rows and the file bytes counted of ``day`` (None: of every day)."""
    where, args = ("WHERE day = ?", (day,)) if day is not None else ("", ())
    rows, consumed = db.execute(f"SELECT SUM(rows), SUM(consumed) FROM files {where}", args).fetchone()
    return rows, consumed


def add(db: sqlite3.Connection, day: str, counted: Counted, sums: Sums) -> None:
    """Add ``sums`` to ``day``'s aggregates and record ``counted`` as its file's count."""
    hi, lo = sums.bytes >> 32, sums.bytes & _LO
    db.execute(
        "INSERT INTO files (day, inode, head, tail, consumed, rows, bytes_hi, bytes_lo, skipped) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (day) DO UPDATE SET inode = excluded.inode, "
        "head = excluded.head, tail = excluded.tail, consumed = excluded.consumed, "
        f"rows = rows + excluded.rows, {_ADD_BYTES}, skipped = skipped + excluded.skipped",
        (day, *counted, sums.rows, hi, lo, sums.skipped),
    )
    db.executemany(
        f"INSERT INTO packages VALUES (?, ?, ?) {_ADD}",
        ((day, package, count) for package, count in sums.packages.items()),
    )
    db.executemany(
        f"INSERT INTO hours VALUES (?, ?, ?) {_ADD}",
        ((day, hour, count) for hour, count in sums.hours.items()),
    )
    db.executemany(
        f"INSERT INTO ips VALUES (?, ?, ?, ?, ?) {_ADD}, {_ADD_BYTES}",
        ((day, ip - IP_OFFSET, count, size >> 32, size & _LO) for ip, (count, size) in sums.ips.items()),
    )
    db.executemany(
        f"INSERT INTO ip_hours VALUES (?, ?, ?, ?) {_ADD}",
        ((day, ip - IP_OFFSET, hour, count) for (ip, hour), count in sums.ip_hours.items()),
    )
    db.executemany(
        f"INSERT INTO ip_countries VALUES (?, ?, ?, ?) {_ADD}",
        ((day, ip - IP_OFFSET, country, count) for (ip, country), count in sums.ip_countries.items()),
    )


def forget(db: sqlite3.Connection, day: str) -> None:
    """Every aggregate of ``day``, and its file's count, deleted."""
    db.execute("DELETE FROM files WHERE day = ?", (day,))
    for table in _PER_DAY:
        db.execute(f"DELETE FROM {table} WHERE day = ?", (day,))


def forget_all(db: sqlite3.Connection) -> None:
    for table in ("files", *_PER_DAY):
        db.execute(f"DELETE FROM {table}")


# -- the dashboard's reads: one day -----------------------------------------------------------


def day_version(db: sqlite3.Connection, day: str) -> tuple[int, bytes, bytes, int, int] | None:
    """What changes whenever the day's counts do: its file's count and rows; None: no count."""
    row = db.execute("SELECT inode, head, tail, consumed, rows FROM files WHERE day = ?", (day,)).fetchone()
    return None if row is None else (row[0], row[1], row[2], row[3], row[4])


def day_totals(db: sqlite3.Connection, day: str) -> tuple[int, int]:
    """The day's downloads (rows) and bytes."""
    rows, hi, lo = db.execute("SELECT rows, bytes_hi, bytes_lo FROM files WHERE day = ?", (day,)).fetchone()
    return rows, join_bytes(hi, lo)


def day_hourly(db: sqlite3.Connection, day: str) -> list[int]:
    """The day's downloads in each hour, 0 to 23."""
    hourly = [0] * HOURS
    for hour, count in db.execute("SELECT hour, downloads FROM hours WHERE day = ?", (day,)):
        hourly[hour] = count
    return hourly


def downloaders(db: sqlite3.Connection, day: str) -> int:
    """The distinct ip_ids of the day."""
    return int(db.execute("SELECT COUNT(*) FROM ips WHERE day = ?", (day,)).fetchone()[0])


def top_ips(db: sqlite3.Connection, day: str, top: int) -> list[tuple[int, int, int]]:
    """(ip_id, downloads, bytes) of the day's ``top`` ip_ids, most downloads first, ties by
    smaller ip_id: an index range of ``ips_by_downloads``."""
    ranked = db.execute(
        "SELECT ip, downloads, bytes_hi, bytes_lo FROM ips WHERE day = ? ORDER BY downloads DESC, ip LIMIT ?",
        (day, top),
    ).fetchall()
    return [(ip + IP_OFFSET, count, join_bytes(hi, lo)) for ip, count, hi, lo in ranked]


def ip_hourly(db: sqlite3.Connection, day: str, ip_id: int) -> list[int]:
    """The downloads of ``ip_id`` in each hour of the day, 0 to 23."""
    hourly = [0] * HOURS
    query = "SELECT hour, downloads FROM ip_hours WHERE day = ? AND ip = ?"
    for hour, count in db.execute(query, (day, ip_id - IP_OFFSET)):
        hourly[hour] = count
    return hourly


def ip_country(db: sqlite3.Connection, day: str, ip_id: int) -> str | None:
    """The most frequent country of ``ip_id`` that day (ties alphabetical); None if it had none."""
    row = db.execute(
        "SELECT country FROM ip_countries WHERE day = ? AND ip = ? ORDER BY downloads DESC, country LIMIT 1",
        (day, ip_id - IP_OFFSET),
    ).fetchone()
    return row[0] if row else None


# -- the CRAN downloads API's reads: spans of days ------------------------------------------


def rows_between(db: sqlite3.Connection, start: str, end: str) -> int:
    """The rows of every day from ``start`` to ``end`` (every package, and none)."""
    (count,) = db.execute("SELECT COALESCE(SUM(rows), 0) FROM files WHERE day BETWEEN ? AND ?", (start, end)).fetchone()
    return int(count)


def rows_per_day(db: sqlite3.Connection, start: str, end: str) -> list[tuple[str, int]]:
    """(day, rows) of each day counted from ``start`` to ``end``."""
    return db.execute("SELECT day, rows FROM files WHERE day BETWEEN ? AND ?", (start, end)).fetchall()


def package_sum(db: sqlite3.Connection, package: str, start: str, end: str) -> int:
    """The downloads of ``package`` from ``start`` to ``end``."""
    (count,) = db.execute(
        "SELECT COALESCE(SUM(downloads), 0) FROM packages WHERE package = ? AND day BETWEEN ? AND ?",
        (package, start, end),
    ).fetchone()
    return int(count)


def package_per_day(db: sqlite3.Connection, package: str, start: str, end: str) -> list[tuple[str, int]]:
    """(day, downloads of ``package``) of each day it was downloaded from ``start`` to ``end``."""
    return db.execute(
        "SELECT day, downloads FROM packages WHERE package = ? AND day BETWEEN ? AND ?", (package, start, end)
    ).fetchall()


def ranked_packages(db: sqlite3.Connection, start: str, end: str, limit: int) -> list[tuple[str, int]]:
    """(package, downloads from ``start`` to ``end``), most first, ties by name; at most
    ``limit`` (-1: all)."""
    return db.execute(
        "SELECT package, SUM(downloads) AS n FROM packages WHERE day BETWEEN ? AND ? "
        "GROUP BY package ORDER BY n DESC, package LIMIT ?",
        (start, end, limit),
    ).fetchall()


def rising_packages(
    db: sqlite3.Connection, week: tuple[str, str], before: tuple[str, str], weeks: int, least: int
) -> list[tuple[str, float]]:
    """(package, increase in percent) of the 100 packages downloaded at least ``least`` times in
    ``week`` (its first and last day) whose count rose most against their average week over the
    ``weeks`` weeks of ``before`` (its first day, and the day after its last), most first, ties by
    name: that week / the average week, as the public service computes it."""
    return db.execute(
        "SELECT w.package, 100.0 * ? * w.n / b.n AS increase FROM "
        "(SELECT package, SUM(downloads) AS n FROM packages WHERE day BETWEEN ? AND ? GROUP BY package "
        " HAVING SUM(downloads) >= ?) AS w JOIN "
        "(SELECT package, SUM(downloads) AS n FROM packages WHERE day >= ? AND day < ? GROUP BY package) AS b "
        "ON w.package = b.package ORDER BY increase DESC, w.package LIMIT 100",
        (weeks, week[0], week[1], least, before[0], before[1]),
    ).fetchall()

"""The data dir's layout: which file holds what, under ``DATA_DIR``.

- ``YYYY-MM-DD.csv``: one day's CRAN log rows (the day of the records' ``date`` field),
  opened by :data:`HEADER` exactly once; the columns are :data:`COLUMNS`.
- ``rejects/YYYY-MM-DD.ndjson``: the refused lines of requests received that UTC day
  (:mod:`tiny.rejects` renders them).
- ``.tiny/``: the journal (:mod:`tiny.commit.local`): ``lock``, the flush lock every writer
  takes (:mod:`tiny.flushlock`); ``intent``, the flush under way, marked finished between
  flushes (:mod:`tiny.intent`); ``sizes``, the size each file was committed up to
  (:mod:`tiny.committed_sizes`); ``keys/NNNNNNNN.log``, the idempotency keys' log
  (:mod:`tiny.keylog`); and ``journal.sqlite3`` (with SQLite's ``-wal`` and ``-shm`` beside
  it), the journal's meta (:mod:`tiny.keys`).
- ``.tiny/aggregates.sqlite3`` (and its ``-wal``, ``-shm``), ``aggregates.boot`` and
  ``aggregates.lock``: the live aggregates of the day files (tiny.aggregates, tiny.unsynced),
  a summary that is deleted and counted again from the files whenever it is not trusted.
- ``.tiny-id``: the data dir's identity (:mod:`tiny.datadir`), a random id that its lock file
  and journal also hold, so that a journal or lock deleted, replaced or brought from another
  data dir is noticed. It lives outside ``.tiny/`` so that removing that folder is noticed too.

Everything else (the sink, the handlers, the analytics, the benchmarks and tests, and the
Rust crate's column list, which a test holds equal to :data:`COLUMNS`) asks this module
for names instead of spelling them out.
"""

from __future__ import annotations

import re
from datetime import date as Date
from datetime import datetime
from pathlib import Path

COLUMNS = ("date", "time", "size", "r_version", "r_arch", "r_os", "package", "version", "country", "ip_id")
HEADER = (",".join(f'"{column}"' for column in COLUMNS) + "\n").encode()
DAY_SUFFIX = ".csv"
REJECTS_DIR = "rejects"
STATE_DIR = ".tiny"
IDENTITY_FILE = ".tiny-id"
_DAY_FILE = re.compile(r"(\d{4}-\d{2}-\d{2})\.csv\Z")
_REJECTS_FILE = re.compile(rf"{REJECTS_DIR}/\d{{4}}-\d{{2}}-\d{{2}}\.ndjson\Z")


def day_file(day: str) -> str:
    """The day file of ``day`` (``YYYY-MM-DD``), relative to DATA_DIR."""
    return f"{day}{DAY_SUFFIX}"


def day_path(data_dir: Path, day: str) -> Path:
    """``data_dir/YYYY-MM-DD.csv``."""
    return data_dir / day_file(day)


def day_of(name: str) -> str | None:
    """The ``YYYY-MM-DD`` a file name is the day file of, or None for any other name."""
    match = _DAY_FILE.match(name)
    return match.group(1) if match else None


def is_data_file(name: str) -> bool:
    """``name`` (relative to DATA_DIR) is a day file or a rejects file: a file flushes append to."""
    return _DAY_FILE.match(name) is not None or _REJECTS_FILE.match(name) is not None


def parse_day(text: str) -> str:
    """``text`` if it is a real calendar date ``YYYY-MM-DD`` (a possible day file); else ValueError."""
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
        raise ValueError(f"not a date YYYY-MM-DD: {text!r}")
    Date.fromisoformat(text)  # ValueError for 2014-02-30 and year 0000
    return text


def rejects_file(received: datetime) -> str:
    """The rejects file, relative to DATA_DIR, for a request received at ``received`` (UTC)."""
    return f"{REJECTS_DIR}/{received:%Y-%m-%d}.ndjson"


def state_dir(data_dir: Path) -> Path:
    """``data_dir/.tiny``: the journal's directory."""
    return data_dir / STATE_DIR


def lock_path(data_dir: Path) -> Path:
    """The flush lock every writer of ``data_dir`` takes (flock)."""
    return state_dir(data_dir) / "lock"


def journal_path(data_dir: Path) -> Path:
    """The journal's SQLite database."""
    return state_dir(data_dir) / "journal.sqlite3"


def intent_path(data_dir: Path) -> Path:
    """The intent of the flush under way: the files it appends to and their sizes before."""
    return state_dir(data_dir) / "intent"


def sizes_path(data_dir: Path) -> Path:
    """The committed size of every file a flush appended to (tiny.committed_sizes)."""
    return state_dir(data_dir) / "sizes"


def identity_path(data_dir: Path) -> Path:
    """``data_dir/.tiny-id``: the data dir's id, written once when its journal is created."""
    return data_dir / IDENTITY_FILE

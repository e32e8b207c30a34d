"""Type stub of ``tiny._codec``, the compiled codec (rust/tiny_codec/src/lib.rs, built by maturin).

``encode(body, max_days, max_rejects)`` returns the fields of :class:`tiny.codec.Batch` as a
plain tuple: the CSV rows per day, the first ``max_rejects`` rejects ``(line_number, reason,
raw_line)``, the valid and invalid counts, and the line range of the rejects left out.
It takes ``bytes`` only (PyO3's ``&[u8]``: a bytearray or memoryview raises TypeError) and
never raises for any bytes. The constants say what the module is (its version and the hash of
the sources it was built from) and what it enforces; tiny.codec holds them equal to its own.

``tally(block, start, end)`` counts the day-file lines of ``block[start:end]`` for the aggregate
store (tiny.aggregate_count.count): rows, bytes, downloads per package, per hour (24 counts),
``[downloads, bytes]`` per ip_id, downloads per ``(ip_id, hour)`` and per ``(ip_id, country)``,
and the ``(start, end)`` of each line it leaves to the rule book (tiny.aggregate_count.Sums.add).

``count_lines(fd, start, end, tail)`` counts the LFs among bytes ``start..end`` of an open
file (tiny.analytics.answers.count_rows): the count, the bytes read (fewer at the end of the
file) and the last ``tail`` of them.

``key_hash(key)`` is the key table's hash of an Idempotency-Key (tiny.keylog), never 0, keyed anew
in each process; ``take_keys(...)`` takes the key log's whole records of a buffer into the key
table's two arrays, the GIL released (tiny.keyload ``_take_compiled`` and rust/tiny_codec/src/keys.rs).
"""

from array import array

__all__ = [
    "BUILD_ID", "COLUMNS", "MAX_DAYS", "MAX_REJECTS", "MAX_STRING", "REASONS", "count_lines", "encode",
    "key_hash", "take_keys", "tally",
]  # fmt: skip

__version__: str
BUILD_ID: str  # FNV-1a 64 of the sources it was built from (rust/tiny_codec/build.rs)
MAX_DAYS: int
MAX_REJECTS: int
MAX_STRING: int
COLUMNS: list[str]
REASONS: list[str]

def encode(
    body: bytes, max_days: int = 16, max_rejects: int = 1000
) -> tuple[dict[str, bytes], list[tuple[int, str, bytes]], int, int, tuple[int, int] | None]: ...
def tally(
    block: bytes, start: int, end: int
) -> tuple[
    int,
    int,
    dict[str, int],
    list[int],
    dict[int, list[int]],
    dict[tuple[int, int], int],
    dict[tuple[int, str], int],
    list[tuple[int, int]],
]: ...
def count_lines(fd: int, start: int, end: int, tail: int = 256) -> tuple[int, int, bytes]: ...
def key_hash(key: bytes) -> int: ...
def take_keys(
    buf: bytes,
    start: int,
    base: int,
    hashes: array[int],
    places: array[int],
    newest: int,
    flush_first: int,
    size: int,
    cutoff: float,
    floor: int,
    limit: float,
) -> tuple[int, int, int, int, int, int, int, int, int]: ...

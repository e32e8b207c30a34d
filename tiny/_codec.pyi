"""Type stub of ``tiny._codec``, the compiled codec (rust/tiny_codec/src/lib.rs, built by maturin).

``encode(body, max_days, max_rejects)`` returns the fields of :class:`tiny.codec.Batch` as a
plain tuple: the CSV rows per day, the first ``max_rejects`` rejects ``(line_number, reason,
raw_line)``, the valid and invalid counts, and the line range of the rejects left out.
It takes ``bytes`` only (PyO3's ``&[u8]``: a bytearray or memoryview raises TypeError) and
never raises for any bytes.
"""

__all__ = ["encode"]

def encode(
    body: bytes, max_days: int = 16, max_rejects: int = 1000
) -> tuple[dict[str, bytes], list[tuple[int, str, bytes]], int, int, tuple[int, int] | None]: ...

"""Type stub of ``tiny._codec``, the compiled codec (rust/tiny_codec/src/lib.rs, built by maturin).

``encode(body)`` returns the fields of :class:`tiny.codec.Batch` as a plain tuple: the CSV
rows per day, the rejects ``(line_number, reason, raw_line)``, and the valid and invalid counts.
It takes ``bytes`` only (PyO3's ``&[u8]``: a bytearray or memoryview raises TypeError) and
never raises for any bytes.
"""

__all__ = ["encode"]

def encode(body: bytes) -> tuple[dict[str, bytes], list[tuple[int, str, bytes]], int, int]: ...

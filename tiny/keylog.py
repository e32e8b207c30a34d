"""The idempotency keys' log (``.tiny/keys/NNNNNNNN.log``) and the window's keys in memory.

Layout: numbered segments, each a run of records, a record per key a flush stored::

    length (4 bytes, big-endian: the whole record) | CRC-32 of the rest (4)
    | seq (8) | stored (8, a big-endian double: UNIX time) | flags (1: FIRST) | key length (1)
    | digest length (1) | key (ASCII) | digest | answer

``seq`` numbers the keys in the order they were stored, one after another across segments;
``FIRST`` marks the first record of a flush. A record whose length runs past the end of its
segment, or whose CRC-32 fails, is torn (a crash or a power loss inside its write): reading
stops there and never takes it, or anything after it, for a key (tiny.keyload steps over one
damaged inside the log, whose length leads to a whole record). A segment is appended to until
it holds :data:`SEGMENT_BYTES`; the next record goes to the next number. Expiry drops whole
segments, oldest first, once every key of one is past the window or the bound: there is no
rewrite, since keys only ever leave in the order they came (the oldest first).

In memory, :class:`KeyTable`: an open-addressing hash table (linear probing) of two arrays of
64-bit integers, the key's hash (:data:`key_hash`, randomized per process) and the record's place
(segment number << 40 | offset). 16 bytes a slot, at most :data:`_LOAD` full: 23-48 bytes a
key, nothing per key on the Python heap. A hit is confirmed by reading the record (its key,
digest and answer stay on disk).
"""

from __future__ import annotations

import functools
import os
import struct
import zlib
from array import array
from collections.abc import Callable, Iterator
from typing import NamedTuple

from tiny import layout, limits
from tiny.codec import CODEC

SEGMENT_BYTES = 64 * 1024**2  # a segment's size before the next one starts
FIRST = 1  # flag: the first record of its flush
HEAD = struct.Struct(">II")  # the record's length, CRC-32 of the rest
FIELDS = struct.Struct(">QdBBB")  # seq, stored, flags, key length, digest length
FIXED = HEAD.size + FIELDS.size
KEY_LENGTH_AT = HEAD.size + 17  # the key length's byte in a record (after seq, stored and flags)
MAX_RECORD = FIXED + 255 + 255 + limits.MAX_ANSWER  # a record's bytes at most: its key, digest and answer
_OFFSET_BITS = 40  # a place: segment << 40 | offset (segments up to 1 TiB)
_OFFSET_MASK = (1 << _OFFSET_BITS) - 1
_LOAD = 0.7  # the table grows (doubles) past this share of full slots
KEYS_DIR = f"{layout.STATE_DIR}/keys"


@functools.lru_cache(maxsize=16)
def segment_name(number: int) -> str:
    """Segment ``number``'s file, relative to the data dir (as intents name files)."""
    return f"{KEYS_DIR}/{number:08d}.log"


def segment_number(name: str) -> int | None:
    """The number of a segment's file name (no folder), or None when it is not one."""
    stem, dot, suffix = name.partition(".")
    return int(stem) if dot and suffix == "log" and len(stem) == 8 and stem.isdigit() else None


def segments_for(max_keys: int, segment_bytes: int = SEGMENT_BYTES) -> int:
    """Segments a log of ``max_keys`` keys spans at most, each a descriptor every process holds:
    full ones of the biggest records, the newest and one more that expiry has yet to walk past."""
    return -(-max_keys * MAX_RECORD // segment_bytes) + 2


def segment_numbers(directory: str) -> list[int]:
    """The numbers of the segments in ``directory`` (a data dir's KEYS_DIR), oldest first; none
    when it does not exist."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(number for name in names if (number := segment_number(name)) is not None)


def place(segment: int, offset: int) -> int:
    return segment << _OFFSET_BITS | offset


def split(where: int) -> tuple[int, int]:
    return where >> _OFFSET_BITS, where & _OFFSET_MASK


def _python_key_hash(key: bytes) -> int:
    """The table's hash of ``key`` (never 0, which marks an empty slot): Python's own."""
    return hash(key) or 1


# The table's hash of a key (never 0): the compiled codec's with it (tiny._codec.key_hash, the
# hash its start loop, take_keys, fills the table by; SipHash keyed anew in each process, as
# Python's is), Python's with the reference codec. One process uses one.
key_hash: Callable[[bytes], int] = _python_key_hash
if CODEC == "rust":
    from tiny import _codec

    key_hash = _codec.key_hash


class Record(NamedTuple):
    seq: int
    stored: float
    flags: int
    key: bytes
    digest: bytes
    answer: bytes


def encode(seq: int, stored: float, flags: int, key: bytes, digest: bytes, answer: bytes) -> bytes:
    """One record (see the module docstring). ValueError for a key or digest over 255 bytes."""
    if len(key) > 255 or len(digest) > 255:
        raise ValueError("a key and a digest are at most 255 bytes")
    rest = FIELDS.pack(seq, stored, flags, len(key), len(digest)) + key + digest + answer
    return HEAD.pack(HEAD.size + len(rest), zlib.crc32(rest)) + rest


def decode(buf: bytes | memoryview, at: int, end: int) -> tuple[Record, int] | None:
    """The record at ``at`` of ``buf`` (not past ``end``) and the offset after it; None when it
    is torn (runs past ``end``, or fails its CRC) or too short to be one."""
    if end - at < FIXED:
        return None
    length, crc = HEAD.unpack_from(buf, at)
    stop = at + length
    if length < FIXED or stop > end or zlib.crc32(buf[at + HEAD.size : stop]) != crc:
        return None
    seq, stored, flags, key_length, digest_length = FIELDS.unpack_from(buf, at + HEAD.size)
    key_at = at + FIXED
    digest_at = key_at + key_length
    answer_at = digest_at + digest_length
    if answer_at > stop:
        return None
    record = Record(
        seq, stored, flags, bytes(buf[key_at:digest_at]), bytes(buf[digest_at:answer_at]), bytes(buf[answer_at:stop])
    )
    return record, stop


def records(buf: bytes, start: int = 0) -> Iterator[tuple[int, Record]]:
    """Each whole record of ``buf`` from ``start`` with its offset, up to the first torn one."""
    at, end = start, len(buf)
    view = memoryview(buf)
    while at < end:
        found = decode(view, at, end)
        if found is None:
            return
        yield at, found[0]
        at = found[1]


class KeyTable:
    """The window's keys: hash -> the place of the key's newest record (see the module
    docstring). The caller confirms a hit by the record's key (``same``)."""

    __slots__ = ("_hashes", "_mask", "_places", "size")

    def __init__(self, capacity: int = 1024) -> None:
        capacity = max(16, 1 << (max(capacity, 1) - 1).bit_length())
        self._mask = capacity - 1
        self._hashes = array("q", bytes(8 * capacity))
        self._places = array("q", bytes(8 * capacity))
        self.size = 0

    @property
    def capacity(self) -> int:
        return self._mask + 1

    @property
    def nbytes(self) -> int:
        return 16 * self.capacity

    def find(self, h: int, same: Callable[[int], bool]) -> int:
        """The place stored for the key whose hash is ``h`` (``same(place)`` says whether a
        place holds that key), or -1."""
        hashes, mask = self._hashes, self._mask
        i = h & mask
        while True:
            found = hashes[i]
            if found == 0:
                return -1
            if found == h and same(self._places[i]):
                return self._places[i]
            i = (i + 1) & mask

    def put(self, h: int, where: int, same: Callable[[int], bool]) -> None:
        """The key of hash ``h`` is now at ``where``: its slot updated, or a new one taken."""
        hashes, mask = self._hashes, self._mask
        i = h & mask
        while True:
            found = hashes[i]
            if found == 0:
                break
            if found == h and same(self._places[i]):
                self._places[i] = where
                return
            i = (i + 1) & mask
        hashes[i], self._places[i] = h, where
        self.size += 1
        if self.size > _LOAD * (mask + 1):
            self._resize(2 * (mask + 1))

    def add(self, h: int, where: int) -> None:
        """A key known not to be in the table (a first start's fast path)."""
        hashes, mask = self._hashes, self._mask
        i = h & mask
        while hashes[i]:
            i = (i + 1) & mask
        hashes[i], self._places[i] = h, where
        self.size += 1
        if self.size > _LOAD * (mask + 1):
            self._resize(2 * (mask + 1))

    def remove(self, h: int, where: int) -> bool:
        """Drop the slot of hash ``h`` at place ``where`` (a key expired); False when there is
        none (the key was stored again since: its slot holds the newer place). Backward-shift
        deletion: no tombstones, so lookups stay as short as the keys present make them."""
        hashes, places, mask = self._hashes, self._places, self._mask
        i = h & mask
        while True:
            found = hashes[i]
            if found == 0:
                return False
            if found == h and places[i] == where:
                break
            i = (i + 1) & mask
        j = i
        while True:
            j = (j + 1) & mask
            found = hashes[j]
            if found == 0:
                break
            home = found & mask
            if (i < j and i < home <= j) or (i > j and (home > i or home <= j)):
                continue  # j's entry sits between its home and here: it stays
            hashes[i], places[i] = found, places[j]
            i = j
        hashes[i] = places[i] = 0
        self.size -= 1
        return True

    def slots(self) -> tuple[array[int], array[int], int, float]:
        """The arrays, the mask and the size past which the table grows (for a caller's inlined
        probe, tiny.keys; it adds ``size`` and calls :meth:`grow` itself)."""
        return self._hashes, self._places, self._mask, _LOAD * (self._mask + 1)

    def grow(self) -> None:
        self._resize(2 * (self._mask + 1))

    def _resize(self, capacity: int) -> None:
        old_hashes, old_places = self._hashes, self._places
        self._mask = capacity - 1
        self._hashes = array("q", bytes(8 * capacity))
        self._places = array("q", bytes(8 * capacity))
        hashes, places, mask = self._hashes, self._places, self._mask
        for h, where in zip(old_hashes, old_places, strict=True):
            if h:
                i = h & mask
                while hashes[i]:
                    i = (i + 1) & mask
                hashes[i], places[i] = h, where

    def reserve(self, keys: int) -> None:
        """Room for ``keys`` without growing (a start that knows about how many it will read)."""
        wanted = 1 << max(int(keys / _LOAD) + 1, 16).bit_length()
        if wanted > self.capacity:
            self._resize(wanted)

"""Per data file, the size below which the journal knows every byte was committed: ``.tiny/sizes``.

A day file shorter than what was committed to it has lost acknowledged rows (cut or replaced by
hand, an older copy restored, a data dir copied file by file while a server wrote to it), and
the keys of those rows would answer their retries "replayed". The journal therefore keeps, for
every file a flush ever appended to, the size that flush left once it was committed
(tiny.intent records it after each commit point), and compares: every file at open
(:func:`check_all`, tiny.datadir), and each flush's files before it writes (tiny.intent,
against the size the flush fstat'ed anyway); a refusal (:func:`shorter_message`) names the file,
the bytes missing, and the two knowing ways past it. This module is that table and its check.

The file is a row of 64-byte slots, each one ``pwrite`` at an offset that is a multiple of 64
(so within one disk sector): slot 0 is the header (``TINYSIZE``, the format, the data dir's
id); every other slot holds one file's name (relative to the data dir, at most
:data:`MAX_NAME` bytes), its size, and a CRC-32 of both. A flush rewrites the slot of each
file it committed (one ``pwrite``); a file seen for the first time gets a new slot at the end.
Every write comes after the commit point of the flush it records, so a slot never says more
than what was committed: a crash before the write leaves the slot lower (a weaker check, never
a false refusal). A slot that fails its CRC is ignored. Readers and writers hold the data
dir's flush lock. :meth:`SizeTable.forget` and :meth:`SizeTable.accept` (tiny-admin forget, an
operator's knowing loss) overwrite every slot of a name, each with one ``pwrite``: with zeros
(a slot that fails its CRC, ignored), or the first with the size accepted (a forget: 0, nothing
known, in a form an older version ignores). So a forgotten file keeps its slot, and every
process, started before the forget or since, goes on with that one: a name has one live slot,
its first, and every process checks the file against the same size. (A table of an older
version, whose forget zeroed every slot, may hold duplicates: a process opening the table gives a
name's first slot the largest of their sizes and zeroes the others, and a process whose slot stops
being the name's moves to the first.) A new slot is a process's only once written whole.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from pathlib import Path

from tiny import layout
from tiny.files import size_of
from tiny.refusals import Found, forget_command

SLOT = 64
MAX_NAME = 48
_MAGIC = b"TINYSIZE1 "
_BODY = SLOT - 8  # the bytes the CRC covers: the name (or the header) and the size
_FORGOTTEN = b"FGT0"  # a forgotten file's slot ends so (_forgotten)


class SizeTableError(Exception):
    """The table cannot be used as found (missing, damaged, another data dir's); the message says which."""


def _slot(body: bytes) -> bytes:
    return body + zlib.crc32(body).to_bytes(4, "big") + b"\0\0\0\0"


def _forgotten(name: bytes) -> bytes:
    """The slot of a forgotten file (``name`` padded): size 0 under the inverted CRC-32 and a
    marker, which an older version's check fails (it ignores the slot, as it did its zeroed
    ones: a missing file with a size of 0 would be refused at its start)."""
    body = name + bytes(8)
    return body + (zlib.crc32(body) ^ 0xFFFFFFFF).to_bytes(4, "big") + _FORGOTTEN


def _body(slot: bytes) -> bytes | None:
    """The CRC-checked first 56 bytes of a slot (a forgotten one's say size 0); None when torn."""
    if len(slot) != SLOT:
        return None
    crc = zlib.crc32(slot[:_BODY])
    if crc.to_bytes(4, "big") == slot[_BODY : _BODY + 4]:
        return slot[:_BODY]
    if slot[_BODY + 4 :] == _FORGOTTEN and (crc ^ 0xFFFFFFFF).to_bytes(4, "big") == slot[_BODY : _BODY + 4]:
        return slot[:MAX_NAME] + bytes(8)
    return None


def _padded(name: str) -> bytes:
    return name.encode().ljust(MAX_NAME, b"\0")


def _live(run: bytes, base: int) -> Iterator[tuple[int, bytes, int]]:
    """(offset, padded name, size) of each slot of ``run`` (read at offset ``base``) that passes
    its check, in offset order."""
    for at in range(0, len(run) - SLOT + 1, SLOT):
        body = _body(run[at : at + SLOT])
        if body is not None:
            yield base + at, body[:MAX_NAME], int.from_bytes(body[MAX_NAME:], "big")


class SizeTable:
    """The committed sizes of one data dir's files (see the module docstring). Open it with
    :meth:`open` or :meth:`create`; every call but those expects the flush lock held."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd = fd
        self._slots: dict[str, tuple[int, bytes]] = {}  # name -> its slot's offset and padded name
        self._count = 1  # slots read so far (the header is slot 0)

    @classmethod
    def create(cls, path: str, dir_id: str) -> SizeTable:
        """A new, empty table for data dir ``dir_id`` at ``path`` (replacing any file there)."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.pwrite(fd, _slot((_MAGIC + dir_id.encode()).ljust(_BODY, b"\0")), 0)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd)

    @classmethod
    def open(cls, path: str, dir_id: str) -> SizeTable:
        """The table at ``path`` (under the flush lock: duplicate slots are merged); SizeTableError
        when it is missing, damaged or of another data dir."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SizeTableError(f"{path} is missing") from None
        table = cls(path, fd)
        try:
            header = _body(os.pread(fd, SLOT, 0))
            if header is None or not header.startswith(_MAGIC):
                raise SizeTableError(f"{path} is damaged (its header is not this format's)")
            found = header[len(_MAGIC) :].rstrip(b"\0").decode(errors="replace")
            if found != dir_id:
                raise SizeTableError(f"{path} belongs to data dir {found}, not to {dir_id}")
            duplicates: list[tuple[int, str, int]] = []
            table._merge_duplicates(table._read_new_slots(duplicates), duplicates)
        except BaseException:
            table.close()
            raise
        return table

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _read_new_slots(self, duplicates: list[tuple[int, str, int]] | None = None) -> dict[str, int]:
        """Learn the slots appended since the last read (by any process: one pread of the
        tail); returns the sizes they hold. A name's slot is its first live one: a later
        duplicate (a table an older version wrote) is taken only when the slot this process
        knew is no longer the name's; the others are added to ``duplicates`` as (offset, name,
        size)."""
        start = self._count * SLOT
        tail = os.pread(self._fd, max(os.fstat(self._fd).st_size - start, 0), start)
        sizes: dict[str, int] = {}
        for offset, padded, size in _live(tail, start):
            name = padded.rstrip(b"\0").decode(errors="replace")
            held = self._slots.get(name)
            if name in sizes or (held is not None and held[0] < start and self._size_at(held) >= 0):
                if duplicates is not None:
                    duplicates.append((offset, name, size))
                continue
            sizes[name] = size
            self._slots[name] = (offset, padded)
        self._count += len(tail) // SLOT
        return sizes

    def _size_at(self, slot: tuple[int, bytes]) -> int:
        """The size ``slot`` (offset, padded name) holds now; -1 when it fails its CRC (zeroed
        by an accept, torn) or holds another name."""
        body = _body(os.pread(self._fd, SLOT, slot[0]))
        if body is None or body[:MAX_NAME] != slot[1]:
            return -1
        return int.from_bytes(body[MAX_NAME:], "big")

    def _live_slot(self, name: str) -> int:
        """The slot this process knew for ``name`` is no longer the name's (an accept zeroed a
        duplicate, a power loss tore it): point the name at its first live slot and return its
        size, or forget the slot (the next record reads the table's new slots, or gives the
        name a new one) and return 0. One read of the whole table, once per such slot."""
        slots = self.slots_of(name)
        if not slots:
            self._slots.pop(name, None)
            return 0
        self._slots[name] = (slots[0][0], _padded(name))
        return slots[0][1]

    def known(self, name: str) -> int:
        """The size below which ``name`` is committed, as last recorded (0: never recorded, or
        forgotten). One pread when this process knows the file's slot."""
        slot = self._slots.get(name)
        if slot is None:
            self._read_new_slots()
            slot = self._slots.get(name)
            if slot is None:
                return 0
        size = self._size_at(slot)
        return self._live_slot(name) if size < 0 else size

    def record(self, name: str, size: int) -> None:
        """``name`` is committed up to ``size`` (after the commit point; one pwrite). A name
        longer than MAX_NAME bytes is not tracked (the sink writes day files and rejects only).
        A new slot is this process's only once written whole: one the disk refused is left to
        the next name."""
        slot = self._slots.get(name)
        if slot is None:
            self._read_new_slots()
            slot = self._slots.get(name)
        if slot is not None:
            os.pwrite(self._fd, _slot(slot[1] + size.to_bytes(8, "big")), slot[0])
            return
        encoded = name.encode()
        if len(encoded) > MAX_NAME:
            return
        slot = (self._count * SLOT, _padded(name))
        written = os.pwrite(self._fd, _slot(slot[1] + size.to_bytes(8, "big")), slot[0])
        if written != SLOT:
            raise OSError(f"a slot of {self.path} was written short ({written} of {SLOT} bytes)")
        self._slots[name] = slot
        self._count += 1

    def items(self) -> dict[str, int]:
        """Every file's recorded size (for the check at open; forgotten ones left out): one
        read of the whole table."""
        self._slots, self._count = {}, 1
        return {name: size for name, size in self._read_new_slots().items() if size}

    def _merge_duplicates(self, sizes: dict[str, int], duplicates: list[tuple[int, str, int]]) -> None:
        """Names in several live slots (a table an older version wrote): each one's first gets
        the largest of their sizes, then the others are zeroed, so that every process goes on
        with the first; a crash between the writes leaves no slot above what was committed.
        ``sizes``: the first slots' sizes, as read; ``duplicates``: the others (offset, name, size)."""
        for offset, name, size in duplicates:
            if size > sizes[name]:
                os.pwrite(self._fd, _slot(self._slots[name][1] + size.to_bytes(8, "big")), self._slots[name][0])
                sizes[name] = size
            os.pwrite(self._fd, bytes(SLOT), offset)

    def slots_of(self, name: str) -> list[tuple[int, int]]:
        """Every slot of ``name`` that passes its CRC: (offset, size), read from the whole table."""
        whole = os.pread(self._fd, max(os.fstat(self._fd).st_size - SLOT, 0), SLOT)
        padded = _padded(name)
        return [(offset, size) for offset, found, size in _live(whole, SLOT) if found == padded]

    def forget(self, name: str) -> None:
        """Nothing is known committed to ``name`` any more: its first slot says 0 (it stays the
        name's, so that every process goes on writing that one), any other is zeroed."""
        self.accept(name, 0)

    def sync(self) -> None:
        """Make the slots written so far durable (before a file they forgot is deleted)."""
        os.fsync(self._fd)

    def accept(self, name: str, size: int) -> None:
        """``name`` is committed up to ``size`` only (less than recorded): its first slot says
        so, any other is zeroed (a process that knew one moves to the first: :meth:`known`)."""
        slots = self.slots_of(name)
        for offset, _ in slots[1:]:
            os.pwrite(self._fd, bytes(SLOT), offset)
        if slots:
            padded = _padded(name)
            os.pwrite(self._fd, _slot(padded + size.to_bytes(8, "big")) if size else _forgotten(padded), slots[0][0])
            self._slots[name] = (slots[0][0], padded)


def shorter_message(data_dir: Path, name: str, found: int, committed: int) -> str:
    """The refusal of a file of ``data_dir`` found ``found`` bytes long (-1: missing) where
    ``committed`` bytes are known committed: what is missing, and the two ways past it."""
    what = "is missing" if found < 0 else f"is {found} bytes"
    lost = "keys of acknowledged batches are" if name.startswith(layout.STATE_DIR) else "acknowledged rows are"
    return (
        f"{data_dir / name} {what}: {committed - max(found, 0)} bytes shorter than the {committed} that the "
        f"journal knows were committed to it ({layout.sizes_path(data_dir)}): {lost} gone (the "
        "file cut, replaced or deleted by hand, an older copy restored, or the data dir copied file by file while "
        f"a server wrote to it: `tiny-admin backup` copies a live one). {ways_past(data_dir, name)}"
    )


def ways_past(data_dir: Path, name: str) -> str:
    """What to do about the file ``name`` found shorter than committed (the refusal's end,
    before the ``--new-journal`` sentence every Found ends with): a data file may be forgotten
    knowingly; a key log segment (under .tiny/) holds keys, which only a restore keeps."""
    if name.startswith(layout.STATE_DIR):
        return (
            "Restore the key log's segment from a copy (the keys in it are gone: the retry of a batch "
            "stored under one of them would be written again)"
        )
    return (
        f"Restore the file; or, if its rows were removed on purpose, run `{forget_command(data_dir, name)}`, "
        "which forgets them and keeps every key (the retry of a batch that was in them is answered replayed)"
    )


def check_all(table: SizeTable, data_dir: Path) -> None:
    """Every file of the table is at least as long as it is known committed; Found, naming the
    first that is not and the bytes it misses, otherwise. One read of the table, a stat a file."""
    for name, size in table.items().items():
        found = size_of(data_dir / name)
        if found < size:
            raise Found(shorter_message(data_dir, name, found, size))

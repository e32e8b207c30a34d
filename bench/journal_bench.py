"""The journal's cost per flush, in-process: the local commit point (tiny.commit.local) alone, no HTTP, no codec.

Each round runs ``--flushes`` flushes of one small append to one day file without a key, on
a journal that holds ``--keys`` random keys first, and prints the process CPU per flush of
each step, taken one by one with the journal's pieces (taking the lock with its checks of the
files' identity and its holder record, recovery's check, the intent with the check of the
file's committed size, the check before the commit point, marking the intent committed with
the record of the file's committed size) in microseconds; then the same flushes whole, without
a key and with a fresh key each, as the sink asks for them (``LocalCommit.commit``: the steps,
the file's opening and write, the key log's records read, decided, written and taken into
memory, and the decisions). The data
dir is a temp dir under ``--dir`` (default: the system's), removed afterwards.

Usage:
    python bench/journal_bench.py [--flushes 3000] [--keys 20000] [--rounds 2] [--dir DIR] [--keys-per-flush 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tiny.appender import FileFlush
from tiny.commit import Claim
from tiny.commit.local import LocalCommit
from tiny.flushlock import Holding
from tiny.intent import FileSpan

STEPS = ("lock", "recover", "intend", "confirm", "finish")


@dataclass
class _Append:
    chunks: dict[str, bytes]
    claim: Claim | None


def _claims(keyed: bool, per_flush: int) -> list[Claim]:
    # 60 characters, as bench/run.py's
    new = (f"bench-{uuid.uuid4().hex}-{uuid.uuid4().hex[:24]}" for _ in range(per_flush if keyed else 0))
    return [Claim(key, b"d" * 16, b"a" * 120) for key in new]


def steps(journal: LocalCommit, day: Path, count: int) -> dict[str, float]:
    """CPU µs per flush of each step of a flush without a key, over ``count`` flushes."""
    spent = dict.fromkeys(STEPS, 0.0)
    clock = time.process_time
    fd = os.open(day, os.O_RDWR | os.O_APPEND)
    try:
        for _ in range(count):
            held: list[Holding] = []
            flush = journal.appender.flush()

            def lock(held: list[Holding] = held) -> None:  # the flock, the files' checks, the holder
                held.append(journal.lock.holding())
                journal.keys.check_file()

            def intend(flush: FileFlush = flush) -> None:
                size = os.fstat(fd).st_size  # the size the flush fstat's; the committed size checked
                flush.opened.append((fd, FileSpan(day.name, size, size + 2, False)))
                journal.intent.write([flush.opened[0][1]])
                flush.intended = True

            order: tuple[tuple[str, Callable[[], object]], ...] = (
                ("lock", lock),
                ("recover", lambda: journal.intent.recover(journal.keys.is_stored)),
                ("intend", intend),
                ("write", lambda: os.write(fd, b"x\n")),  # the data: not the journal's
                ("confirm", flush.confirm),  # the lock, the intent and the file still the flush's
                ("finish", journal.intent.mark_committed),  # with the record of the file's committed size
            )
            for step, run in order:
                started = clock()
                run()
                if step != "write":
                    spent[step] += clock() - started
            held[0].__exit__(None, None, None)
    finally:
        os.close(fd)
    return {step: seconds / count * 1e6 for step, seconds in spent.items()}


def whole(journal: LocalCommit, day: Path, count: int, keyed: bool, per_flush: int = 1) -> float:
    """CPU µs per flush of ``LocalCommit.commit``, over ``count`` flushes."""
    spent = 0.0
    for _ in range(count):
        claims = _claims(keyed, per_flush)
        appends = [_Append({day.name: b"x\n"}, claim) for claim in claims] or [_Append({day.name: b"x\n"}, None)]
        started = time.process_time()
        journal.commit(appends, time.monotonic() + 5)
        spent += time.process_time() - started
    return spent / count * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flushes", type=int, default=3000)
    parser.add_argument("--keys", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--keys-per-flush", type=int, default=1, help="keyed appends in one flush (1)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        data = Path(tmp)
        journal = LocalCommit(data)
        journal.open()
        journal.keys_read(60)
        for start in range(0, args.keys, 256):
            warm = [
                Claim(f"warm-{uuid.uuid4().hex}", b"d" * 16, b"a" * 120) for _ in range(min(256, args.keys - start))
            ]
            journal.commit([_Append({}, claim) for claim in warm], time.monotonic() + 5)
        day = data / "2014-05-04.csv"
        day.write_bytes(b"h\n")
        for _ in range(args.rounds):
            spent = steps(journal, day, args.flushes)
            detail = ", ".join(f"{step} {us:.1f}" for step, us in spent.items())
            print(f"{'no key':10}  {sum(spent.values()):6.1f} µs/flush  ({detail})")
            for keyed in (False, True):
                name = "with a key" if keyed else "no key"
                print(f"{name:10}  {whole(journal, day, args.flushes, keyed, args.keys_per_flush):6.1f} µs/flush whole")
        journal.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

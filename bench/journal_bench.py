"""The journal's cost per flush, in-process: tiny.journal.Journal alone, no HTTP, no codec.

Each round runs ``--flushes`` flushes of one small append to one day file, without a key and
then with a fresh key each, on a journal that holds ``--keys`` random keys first, and prints
the process CPU per flush of each step (taking the lock with its checks of the files'
identity and its holder record, recovery's check, the claim, the intent with the check of the
file's committed size, the check before the commit point, the commit, marking the intent
committed with the record of the file's committed size) in microseconds. The data dir is a temp dir under
``--dir`` (default: the system's), removed afterwards.

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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tiny.journal import Claim, Intent, Journal

STEPS = ("lock", "recover", "claim", "intend", "confirm", "commit", "finish")


def intend(journal: Journal, fd: int, day: Path, first_key: str | None, intents: list[Intent]) -> None:
    """The flush's intent, as the sink writes it (the size it fstat's; the committed size checked)."""
    size = os.fstat(fd).st_size
    intents.append(Intent(day.name, size, size + 2, False))
    journal.intend(intents, first_key)


def flushes(journal: Journal, day: Path, count: int, keyed: bool, per_flush: int = 1) -> dict[str, float]:
    """CPU µs per flush of each step, over ``count`` flushes."""
    spent = dict.fromkeys(STEPS, 0.0)
    clock = time.process_time
    fd = os.open(day, os.O_WRONLY | os.O_APPEND)
    try:
        for _ in range(count):
            # 60 characters, as bench/run.py's
            new = (f"bench-{uuid.uuid4().hex}-{uuid.uuid4().hex[:24]}" for _ in range(per_flush if keyed else 0))
            keys = [Claim(key, b"d" * 16, b"a" * 120) for key in new]
            held = []
            intents: list[Intent] = []
            steps = (
                ("lock", lambda held=held: held.append(journal.locked())),  # the flock, the files' checks, the holder
                ("recover", journal.recover),
                ("claim", lambda keys=keys: journal.claim(keys)),
                (
                    "intend",
                    lambda first=keys[0].key if keys else None, intents=intents: intend(
                        journal, fd, day, first, intents
                    ),
                ),
                ("write", lambda: os.write(fd, b"x\n")),  # the data: not the journal's
                # the lock, the intent and the file still the flush's, as the sink asks before its commit point
                ("confirm", lambda intents=intents: journal.confirm([(fd, intents[0])])),
                ("commit", journal.commit),
                ("finish", journal.finish),  # with the record of the file's committed size
            )
            for step, run in steps:
                started = clock()
                run()
                if step != "write":
                    spent[step] += clock() - started
            held[0].__exit__(None, None, None)
    finally:
        os.close(fd)
    return {step: seconds / count * 1e6 for step, seconds in spent.items()}


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
        journal = Journal(data)
        journal.open()
        with journal.locked():
            journal.claim([Claim(f"warm-{uuid.uuid4().hex}", b"d" * 16, b"a" * 120) for _ in range(args.keys)])
            journal.commit()
        day = data / "2014-05-04.csv"
        day.write_bytes(b"h\n")
        for _ in range(args.rounds):
            for keyed in (False, True):
                steps = flushes(journal, day, args.flushes, keyed, args.keys_per_flush)
                detail = ", ".join(f"{step} {us:.1f}" for step, us in steps.items())
                print(f"{'with a key' if keyed else 'no key':10}  {sum(steps.values()):6.1f} µs/flush  ({detail})")
        journal.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

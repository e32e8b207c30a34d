"""The commit point: the one interface through which the sink makes a flush durable.

A flush is a group of appends, in arrival order, each the bytes it adds to some files
(relative to the data dir) and, for a request with an Idempotency-Key, a :class:`Claim` (the
key, the digest of the body, the answer to replay). A commit point makes the whole group
durable at once or not at all, deciding the keys as it does, and says so with a
:class:`Receipt`; or it raises one of the errors of tiny.commit.errors, which say whether
anything may have been kept. Implementations:

- :class:`tiny.commit.local.LocalCommit`: the data dir's own journal (the flush lock, the
  intent, the files' committed sizes, the keys in SQLite: docs/exactly-once.md);
- :class:`tiny.commit.cluster.ClusterCommit` (cluster mode) wraps tiny.cluster.log.CommitLog,
  whose ``commit`` is one PostgreSQL transaction; each host's follower (tiny.follower) then
  appends the committed batches to its day files with the pieces the local commit point is
  made of, keys aside (tiny.flushlock, tiny.intent with its position, tiny.appender).

Its operations, and why they are five calls and not more. ``begin`` (the flush lock taken and
an unfinished flush recovered; or a transaction begun), ``decide`` the keys (per key, the
flush's first append decides; a key stored within the window answers from what it stored and
writes nothing), ``write`` the bytes (an intent, then one write per file; or rows), and
``commit`` are one call, :meth:`CommitPoint.commit`: the bytes a flush writes depend on its key
decisions, the PostgreSQL log decides, stores and commits in one pipelined transaction, and
nothing the sink does belongs between those steps (the crash points of the tests are the local
implementation's own, tiny.crashpoints). ``recover`` is its own call
(:meth:`CommitPoint.recover`): a flush that failed to undo itself is finished by the next
flush, or by the stop. The rest is what the sink needs around them: opening (refused with the
reason, tried again later), the keyed digest, the committed sizes of files for the live
aggregates, and what a flush waits for, for /healthz.

Thread rules: a commit point belongs to the one sink thread of its process, except
:meth:`CommitPoint.digest`, :meth:`CommitPoint.peek_committed_sizes`,
:meth:`CommitPoint.waiting` and :meth:`CommitPoint.blocked_elsewhere`, which never wait and
which the event loop calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from blake3 import blake3

from tiny.commit.errors import CommitError, OutcomeUnknown, Refused, Unavailable, WriteFailed

__all__ = [
    "DIGEST_BYTES",
    "Append",
    "Claim",
    "CommitError",
    "CommitPoint",
    "OutcomeUnknown",
    "Receipt",
    "Refused",
    "Stored",
    "Unavailable",
    "WriteFailed",
    "keyed_digest",
]

DIGEST_BYTES = 16  # 128 bits of keyed BLAKE3: no collision can be forged without the secret


@dataclass(frozen=True, slots=True)
class Claim:
    """What a request with an Idempotency-Key asks to have recorded with its rows."""

    key: str
    digest: bytes  # keyed_digest of the decompressed body
    answer: bytes  # the 200 answer to replay


@dataclass(frozen=True, slots=True)
class Stored:
    """What a commit point holds for a key: the digest of its body and the answer it got; and,
    where the commit point keeps one global order (cluster mode), ``position``: the place in it
    of the flush that wrote the key's rows, for a replay's ``Tiny-Position`` (None: the local
    commit point, which has no order, or a flush that wrote no bytes)."""

    digest: bytes
    answer: bytes
    position: int | None = None


@dataclass(frozen=True, slots=True)
class Receipt:
    """A committed flush. ``decisions[i]`` for append i: None, its bytes were written; or the
    :class:`Stored` digest and answer it is answered from (it wrote nothing). ``position``: the
    flush's place in the cluster's one global order (None: the local commit point, which has
    none, or a flush that wrote no bytes)."""

    decisions: list[Stored | None]
    position: int | None = None


class Append(Protocol):
    """One append of a flush, as the sink queues it."""

    @property
    def chunks(self) -> Mapping[str, bytes]:
        """File name, relative to the data dir -> the bytes the append adds to it."""
        ...

    @property
    def claim(self) -> Claim | None: ...


class CommitPoint(Protocol):
    """Where a flush becomes durable; see the module docstring."""

    @property
    def is_open(self) -> bool: ...

    @property
    def wait_bound(self) -> float:
        """Seconds an append may wait for its flush to begin, from when it was queued."""
        ...

    @property
    def unfinished(self) -> bool:
        """A flush of this process failed and could not undo itself: :meth:`recover` does."""
        ...

    def open(self, accept_new: bool = False) -> None:
        """Attach (creating what a new data dir lacks). Raises Refused (the reason) or
        Unavailable; ``accept_new``: replace what is found wrong by a fresh start, knowingly."""
        ...

    def close(self) -> None: ...

    def digest(self, body: bytes) -> bytes:
        """The keyed digest a key is stored with (any thread, once open)."""
        ...

    def commit(self, appends: Sequence[Append], deadline: float) -> Receipt:
        """Begin, decide the keys, write, commit: one flush of ``appends``, waiting for the way
        in until ``deadline`` (time.monotonic()) at most. Raises a CommitError otherwise."""
        ...

    def recover(self) -> None:
        """Undo (or finish) a flush left unfinished, waiting at most :attr:`wait_bound`."""
        ...

    def stop_waits_at(self, when: float) -> None:
        """No wait for the way in goes past ``when`` (time.monotonic()): the server stops."""
        ...

    def peek_committed_sizes(self, names: Sequence[str]) -> dict[str, int] | None:
        """The sizes of the files ``names`` (those that exist) below which every byte is
        committed, without waiting; None when that cannot be known so now."""
        ...

    def committed_sizes(self, names: Sequence[str]) -> dict[str, int]:
        """The same, noted when no flush is half done (waiting at most :attr:`wait_bound`)."""
        ...

    def waiting(self) -> str | None:
        """What this process has waited for, for over a second, to begin a flush; or None."""
        ...

    def writable(self, names: Sequence[str], size: int) -> str | None:
        """Why the disk would refuse ``size`` more bytes to the files ``names`` now, seen
        without writing anything (no room for them, a file that cannot be opened for appending),
        or None. (After the disk refused a flush: whether it would take that flush now.)"""
        ...

    def blocked_elsewhere(self) -> str | None:
        """What outside this process would make a flush wait now (never waits); or None."""
        ...


def keyed_digest(secret: bytes, body: bytes) -> bytes:
    """128 bits of BLAKE3 of ``body`` keyed with ``secret`` (32 bytes)."""
    return blake3(body, key=secret).digest(DIGEST_BYTES)

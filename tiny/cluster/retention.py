"""Retention of the commit log: what it keeps, and bounded steps that delete the rest.

- Batches: a batch's bytes (``tiny.chunks``) are kept until every follower seen within
  ``stale_after`` seconds (default :data:`STALE_AFTER`, one day) has applied it. A follower not
  seen for longer stops holding the log: it may come back to :class:`~tiny.cluster.errors.LogTrimmed`
  and then needs a copy of a peer's day files. With no follower seen within the bound,
  nothing is trimmed (the log never drops what no live follower has confirmed). The trimmed
  boundary (``tiny.retention.trimmed``) only grows.
- Flush ids (``tiny.flushes``): kept :data:`FLUSH_ID_GRACE` seconds (an hour) after their
  commit, and after their batch is trimmed, so a lost COMMIT is always settled against them
  (tiny.cluster.resolve looks for them within seconds).
- Idempotency keys: each key counts for ``window`` seconds; at most ``max_keys`` are kept, the
  oldest (by ``seq``) going first. A key past the window is also taken over by the next flush
  that claims it (tiny.cluster.log), whatever retention did.

Each :func:`step` deletes at most ``limit`` rows of each kind, and reads at most ``limit``
rows to find them (never one unbounded DELETE): a backlog (a log idle for a day, a follower
back after hours) is worked off a step at a time. Steps of several hosts may run at once:
the trim takes the retention row's lock, key expiry deletes the rows it examined by their
``seq`` (a key taken over meanwhile has a new one and stays).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tiny.cluster.session import Session

STALE_AFTER = 86_400.0  # seconds: a follower not seen for longer stops holding the log
FLUSH_ID_GRACE = 3_600.0  # seconds a flush's id is kept after its commit
STEP = 1_000  # rows of each kind one step deletes at most

_OLDEST_KEYS = """
SELECT seq, stored < now() - make_interval(secs => %s) FROM tiny.idempotency_keys ORDER BY seq LIMIT %s
"""
_EXPIRE = """
WITH gone AS (DELETE FROM tiny.idempotency_keys WHERE seq = ANY(%s::bigint[]) RETURNING 1)
UPDATE tiny.head SET keys = keys - (SELECT count(*) FROM gone) RETURNING (SELECT count(*) FROM gone)
"""
_FLOOR = """
SELECT r.trimmed,
       (SELECT min(applied) FROM tiny.followers WHERE seen >= now() - make_interval(secs => %s)),
       (SELECT position FROM tiny.head)
FROM tiny.retention r FOR UPDATE
"""
_TRIM = """
DELETE FROM tiny.chunks WHERE flush_id IN (SELECT flush_id FROM tiny.flushes WHERE position > %s AND position <= %s)
"""
_FORGET = """
DELETE FROM tiny.flushes WHERE flush_id IN (
    SELECT flush_id FROM (
        SELECT flush_id, position FROM tiny.flushes
        WHERE committed < now() - make_interval(secs => %s) ORDER BY committed LIMIT %s
    ) old
    WHERE old.position IS NULL OR old.position <= (SELECT trimmed FROM tiny.retention)
)
RETURNING 1
"""


@dataclass(frozen=True, slots=True)
class Retained:
    """What one step deleted."""

    keys: int
    batches: int
    flush_ids: int


def step(session: Session, window: float, max_keys: int, stale_after: float, limit: int) -> Retained:
    """One bounded step of each kind, each its own transaction."""
    return Retained(
        expire_keys(session, window, max_keys, limit),
        trim_batches(session, stale_after, limit),
        forget_flushes(session, limit),
    )


def expire_keys(session: Session, window: float, max_keys: int, limit: int) -> int:
    """Delete up to ``limit`` of the oldest keys that are past ``window`` or beyond ``max_keys``
    (oldest first; never one younger than an older one kept); how many were deleted."""
    oldest = session.execute(_OLDEST_KEYS, (window, limit))
    [(count,)] = session.execute("SELECT keys FROM tiny.head")
    excess = int(count) - max_keys
    doomed: list[int] = []
    for seq, expired in oldest:
        if not expired and len(doomed) >= excess:
            break
        doomed.append(seq)
    if not doomed:
        return 0
    [(deleted,)] = _transaction(session, _EXPIRE, (doomed,))
    return int(deleted)


def trim_batches(session: Session, stale_after: float, limit: int) -> int:
    """Delete the bytes of up to ``limit`` batches that every follower seen within
    ``stale_after`` seconds has applied (never past the head: a follower that reports a
    position the log never reached trims nothing it has not); how many positions were trimmed."""
    session.execute("BEGIN")
    try:
        [(trimmed, floor, head)] = session.execute(_FLOOR, (stale_after,))
        upto = min(int(floor), int(head), int(trimmed) + limit) if floor is not None else int(trimmed)
        if upto <= trimmed:
            session.execute("ROLLBACK")
            return 0
        session.execute(_TRIM, (trimmed, upto))
        session.execute("UPDATE tiny.retention SET trimmed = %s", (upto,))
        session.execute("COMMIT")
    except BaseException:
        if session.usable:
            session.execute("ROLLBACK")
        raise
    return upto - int(trimmed)


def forget_flushes(session: Session, limit: int, grace: float = FLUSH_ID_GRACE) -> int:
    """Delete up to ``limit`` flush ids older than ``grace`` seconds whose batch is trimmed (or
    that wrote no bytes); how many."""
    return len(_transaction(session, _FORGET, (grace, limit)))


def _transaction(session: Session, sql: str, params: tuple[object, ...]) -> list[tuple[Any, ...]]:
    """``sql`` in a transaction of its own; its rows."""
    session.execute("BEGIN")
    try:
        rows = session.execute(sql, params)
        session.execute("COMMIT")
    except BaseException:
        if session.usable:
            session.execute("ROLLBACK")
        raise
    return rows

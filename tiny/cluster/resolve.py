"""Settling a COMMIT whose answer was lost, or came with the warning that its wait for the standby was cancelled.

Every flush inserts its own random id in ``tiny.flushes`` in its transaction, so whether it
committed is a lookup, on whichever node is primary now, repeated until the time bound
(``Timeouts.resolve``). What is found, and what the flush is then:

- its id, and every synchronous standby has flushed the primary's WAL past it: committed,
  durable; the answer is its position;
- its id, but no synchronous standby confirms it within the bound: unknown
  (:class:`~tiny.cluster.errors.OutcomeUnknown`): it is on the primary only, and a failover
  may take it back;
- no id, on a primary of another timeline (another node was promoted, or this one promoted
  again): not committed (:class:`~tiny.cluster.errors.NotCommitted`): if the old primary
  committed it locally, that commit is not on the new timeline and pg_rewind removes it;
- no id, on the same timeline, the flush's backend still running (its pid and start time in
  pg_stat_activity): still in flight, looked at again;
- no id, on the same timeline, the backend gone: not committed (an ended transaction that
  committed is visible);
- no primary reachable until the bound: unknown.

The backend is looked at before the id: a backend seen gone has ended, so its commit, if any,
is visible to the look that follows.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg

from tiny.cluster.errors import NotCommitted, OutcomeUnknown, Unavailable
from tiny.cluster.replication import wait_synced
from tiny.cluster.session import Lost, Origin, Session, Timeouts

_ALIVE = "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND backend_start = %s"
_FOUND = "SELECT position, pg_current_wal_insert_lsn()::text FROM tiny.flushes WHERE flush_id = %s"
_PAUSE = 0.05  # seconds between two looks
LOOK_BUDGET = 1.0  # seconds a look started just before the deadline may still take
_PENDING = object()


def settle(connect: Callable[[], Session], flush_id: str, origin: Origin, timeouts: Timeouts, why: str) -> int | None:
    """The position of flush ``flush_id`` (None: it wrote no bytes) once it is known durable;
    raises NotCommitted once it is known absent, OutcomeUnknown when neither is known within
    ``timeouts.resolve`` seconds. ``origin``: who ran the flush's transaction; ``why``: what
    happened to its COMMIT, for the messages."""
    deadline = time.monotonic() + timeouts.resolve
    seen = "no primary answered"
    while True:
        try:
            session = connect()
            with session.budget(max(LOOK_BUDGET, deadline - time.monotonic())):
                outcome = _look(session, flush_id, origin, deadline)
            seen = f"its backend {origin.backend_pid} still runs on {origin.server}, the flush not visible"
        except (Unavailable, Lost, psycopg.Error) as exc:
            seen = str(exc).splitlines()[0]
            outcome = _PENDING
        if outcome is not _PENDING:
            if isinstance(outcome, NotCommitted):
                raise NotCommitted(f"{why}; {outcome}", timeouts.retry_after)
            return outcome  # type: ignore[return-value]
        if time.monotonic() + _PAUSE > deadline:
            raise OutcomeUnknown(
                f"{why}; whether flush {flush_id} committed is unknown after {timeouts.resolve:g} s ({seen})",
                timeouts.retry_after,
                flush_id,
            )
        time.sleep(_PAUSE)


def _look(session: Session, flush_id: str, origin: Origin, deadline: float) -> object:
    same_timeline = session.origin.timeline == origin.timeline
    alive = same_timeline and session.execute(_ALIVE, (origin.backend_pid, origin.backend_start))[0][0] > 0
    found = session.execute(_FOUND, (flush_id,))
    if found:
        position, lsn = found[0]
        if wait_synced(session, lsn, max(0.0, deadline - time.monotonic())):
            return position
        raise OutcomeUnknown(
            f"flush {flush_id} is on the primary ({session.origin.server}) but no synchronous standby confirmed it",
            session.timeouts.retry_after,
            flush_id,
        )
    if not same_timeline:
        return NotCommitted(
            f"flush {flush_id} is not on the new primary ({session.origin.server}, timeline "
            f"{session.origin.timeline}, was {origin.timeline})",
            session.timeouts.retry_after,
        )
    if alive:
        return _PENDING
    return NotCommitted(f"flush {flush_id} ended without committing", session.timeouts.retry_after)

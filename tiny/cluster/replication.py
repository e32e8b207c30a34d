"""Whether the synchronous standbys have a position of the primary's WAL: what makes a commit safe from a failover.

With Patroni's strict synchronous mode only a synchronous standby can be promoted, so a
transaction whose commit record a synchronous standby has flushed survives any failover, and
one that only the primary has (a COMMIT whose wait for the standby was cancelled, or a primary
restarted after a crash) may be taken back. :func:`wait_synced` waits, bounded, until every
standby that pg_stat_replication reports as synchronous has flushed the primary's WAL up to a
given LSN; none reported (strict mode with no standby streaming) is not synced.
"""

from __future__ import annotations

import time

from tiny.cluster.session import Session

_SYNCED = (
    "SELECT count(*) FILTER (WHERE flush_lsn >= %s::pg_lsn), count(*) "
    "FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')"
)
_FIRST_POLL, _MAX_POLL = 0.001, 0.02  # seconds between two looks, doubling


def wait_synced(session: Session, lsn: str, seconds: float) -> bool:
    """Wait at most ``seconds`` until every synchronous standby has flushed ``lsn`` (a pg_lsn as
    text, read on this primary); whether it did. Raises session.Lost or psycopg.Error as
    :meth:`Session.execute` does."""
    deadline = time.monotonic() + seconds
    pause = _FIRST_POLL
    while True:
        [(flushed, standbys)] = session.execute(_SYNCED, (lsn,))
        if standbys and flushed == standbys:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(pause, left))
        pause = min(pause * 2, _MAX_POLL)

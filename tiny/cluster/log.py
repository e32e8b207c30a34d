"""The commit log: a flush as one synchronously replicated PostgreSQL transaction, keyed as the journal keys it.

:class:`CommitLog` is the commit point of cluster mode (its contract, used by the sink):

- :meth:`CommitLog.open` connects to whichever node is primary (a libpq string naming every
  node; each host tried once for at most ``Timeouts.connect``), creates or checks the schema
  (tiny.cluster.schema), refuses a cluster that does not commit synchronously, and reads the
  cluster's id and digest secret (:meth:`CommitLog.digest`: keyed BLAKE3 as
  :meth:`tiny.commit.local.LocalCommit.digest`, the same secret on every host).
- :meth:`CommitLog.commit` takes a flush's appends, each ``(chunks, claim)`` in arrival order
  (``chunks``: file name relative to the data dir -> bytes; ``claim``: a
  :class:`~tiny.commit.Claim` or None), and makes them one transaction: the keys are decided
  with the local journal's rules (per key, the flush's first append decides; a key stored
  within the window answers from its stored digest and answer and writes nothing; a key past
  the window is taken over as new), claimed with one ``INSERT ... ON CONFLICT`` whose rows
  come in key order (so two hosts claiming the same keys wait for each other in one order and
  never deadlock); the writing appends' bytes are stored per file (one row per file, the
  appends concatenated in order); a flush that writes bytes takes the next position of the
  one global order by updating the single head row as its last statement (so positions are
  gapless and become visible in their order: a follower reading ``position > applied`` never
  skips one that commits later); every flush inserts its own id, so a flush whose every append
  is a replay still writes and its COMMIT still waits for the synchronous standby; one that
  takes a position also NOTIFYs :data:`CHANNEL`, which PostgreSQL delivers once the COMMIT
  (its wait for the standby included) is done, so a follower that LISTENs wakes at once. It returns
  :class:`Committed` only when COMMIT returned without PostgreSQL's "canceling wait for
  synchronous replication" warning on a primary that names a synchronous standby, or when a
  lost or doubtful COMMIT was settled as durable (tiny.cluster.resolve). Otherwise it raises
  :class:`~tiny.cluster.errors.NotCommitted` or :class:`~tiny.cluster.errors.Unavailable`
  (nothing was kept) or :class:`~tiny.cluster.errors.OutcomeUnknown` (it may have been). No
  wait is cancelled: every bound is a deadline on the socket (tiny.cluster.session). A call
  takes at most :attr:`CommitLog.bound` seconds.
- :meth:`CommitLog.read` gives a follower the batches after a position, in order, but only
  those the synchronous standbys have flushed: the rows and the primary's WAL position are
  read in one statement (one snapshot), then the read waits (``Timeouts.read_wait``) until the
  synchronous standbys have flushed that position, and returns nothing if they do not. So a
  failover can never take back a batch a follower wrote.
- :meth:`CommitLog.head` is the newest position the synchronous standbys have (read-your-writes);
  :meth:`CommitLog.report` records a follower's applied position (tiny.cluster.retention keeps
  the batches until every follower seen recently has applied them).

Not thread-safe: a CommitLog belongs to one thread (the sink's, or a follower's), except
:meth:`CommitLog.digest`, which any thread may call once the log is open.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from blake3 import blake3

from tiny.cluster import resolve, retention, schema
from tiny.cluster.errors import LogTrimmed, NotCommitted, Unavailable
from tiny.cluster.replication import wait_synced
from tiny.cluster.session import Lost, Session, Timeouts, Watchdog, connect, host_count
from tiny.commit import DIGEST_BYTES, Claim, Stored

Append = tuple[Mapping[str, bytes], Claim | None]
MAX_READ_BATCHES = 1024  # batches one read returns at most (and max_bytes)
CHANNEL = "tiny_log"  # every flush that takes a position NOTIFYs it as it commits: followers LISTEN
_SYNC_WARNING = "synchronous replication"  # in both of PostgreSQL's warnings: cancelled, and terminated

_CLAIM = """
INSERT INTO tiny.idempotency_keys AS k (key, digest, answer, stored, flush_id)
SELECT c.key, c.digest, c.answer, now(), %(flush)s
FROM unnest(%(keys)s::text[], %(digests)s::bytea[], %(answers)s::bytea[]) AS c (key, digest, answer)
ORDER BY c.key
ON CONFLICT (key) DO UPDATE
SET seq = nextval('tiny.key_seq'), digest = EXCLUDED.digest, answer = EXCLUDED.answer,
    stored = EXCLUDED.stored, flush_id = EXCLUDED.flush_id
WHERE k.stored < now() - make_interval(secs => %(window)s)
RETURNING k.key, k.xmax = 0
"""
_HELD = """
SELECT k.key, k.digest, k.answer,
       CASE WHEN f.flush_id IS NULL THEN (SELECT trimmed FROM tiny.retention) ELSE f.position END
FROM tiny.idempotency_keys k LEFT JOIN tiny.flushes f ON f.flush_id = k.flush_id
WHERE k.key = ANY(%s::text[]) AND k.flush_id <> %s
"""
_CHUNKS = (
    "INSERT INTO tiny.chunks (flush_id, file, data) SELECT %s, f, d FROM unnest(%s::text[], %b::bytea[]) AS c (f, d)"
)
_POSITION = """
WITH h AS (UPDATE tiny.head SET position = position + %(step)s, keys = keys + %(new)s RETURNING position)
INSERT INTO tiny.flushes (flush_id, position, bytes)
SELECT %(flush)s, CASE WHEN %(step)s = 1 THEN h.position END, %(bytes)s FROM h
RETURNING position, current_setting('synchronous_standby_names') <> ''
"""
_REPLAY_ONLY = """
INSERT INTO tiny.flushes (flush_id, position, bytes) VALUES (%s, NULL, 0)
RETURNING position, current_setting('synchronous_standby_names') <> ''
"""
_HEAD = "SELECT pg_current_wal_insert_lsn()::text, position FROM tiny.head"
_READ = """
WITH l AS MATERIALIZED (
         SELECT pg_current_wal_insert_lsn()::text AS lsn, (SELECT trimmed FROM tiny.retention) AS trimmed
     ),
     f0 AS (
         SELECT position, flush_id, bytes FROM tiny.flushes WHERE position > %(after)s ORDER BY position LIMIT %(n)s
     ),
     f AS (SELECT position, flush_id, sum(bytes) OVER (ORDER BY position) - bytes AS before FROM f0)
SELECT l.lsn, l.trimmed, f.position, c.file, c.data
FROM l LEFT JOIN (f LEFT JOIN tiny.chunks c ON c.flush_id = f.flush_id) ON f.before < %(max)s
ORDER BY f.position, c.file
"""
_REPORTED = "SELECT applied FROM tiny.followers WHERE name = %s FOR UPDATE"
_REPORT = """
INSERT INTO tiny.followers (name, applied, seen) VALUES (%s, %s, now())
ON CONFLICT (name) DO UPDATE SET applied = EXCLUDED.applied, seen = EXCLUDED.seen
"""


@dataclass(frozen=True, slots=True)
class Committed:
    """A flush durable on the primary and a synchronous standby.

    ``decisions[i]`` for append i: None, its rows were written; or the :class:`Stored` digest
    and answer it is answered from (it wrote nothing), whose ``position`` is that of the flush
    that wrote the key's rows (this one, for a later append of a key this flush writes).
    ``position``: the flush's place in the global order (None: it wrote no bytes). ``held``:
    for each key answered from the log, the position of the flush that wrote it (None when
    that flush wrote no bytes; the log's trimmed boundary, an upper bound every follower seen
    has applied, when the flush's id is forgotten: tiny.cluster.retention).
    """

    decisions: list[Stored | None]
    position: int | None
    flush_id: str
    held: dict[str, int | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Batch:
    """One flush's bytes, as a follower appends them: file name -> bytes, files in name order."""

    position: int
    files: dict[str, bytes]


@dataclass(slots=True)
class _Plan:
    """A flush decided: what each append does, what each file gets."""

    decisions: list[Stored | None]
    files: dict[str, list[bytes]]
    held: dict[str, int | None]
    new_keys: int
    begun: bool  # the transaction is open (the claim ran in it)
    repeats: list[int] = field(default_factory=list)  # appends answered from a key this flush writes

    def decided(self, position: int | None) -> list[Stored | None]:
        """The decisions, each later append of a key this flush writes given its ``position``."""
        decisions = list(self.decisions)
        for index in self.repeats:
            stored = decisions[index]
            assert stored is not None
            decisions[index] = Stored(stored.digest, stored.answer, position)
        return decisions


class CommitLog:
    """The cluster's commit log, reached through ``dsn`` (every node, any order)."""

    def __init__(
        self,
        dsn: str,
        window: float = 86_400.0,
        max_keys: int = 10_000_000,
        timeouts: Timeouts | None = None,
    ) -> None:
        self.dsn = dsn
        self.window = window
        self.max_keys = max_keys
        self.timeouts = timeouts or Timeouts()
        self.cluster_id: str | None = None
        self.digest_key: bytes | None = None
        self._session: Session | None = None
        self._watchdog: Watchdog | None = None

    @property
    def bound(self) -> float:
        """The longest one :meth:`commit` takes, in seconds: a connect (each host once), the
        claim (``Timeouts.statement``), the writes with COMMIT (``Timeouts.commit``), and
        settling a lost COMMIT (``Timeouts.resolve``, and the connect and look that may start
        just before its end)."""
        t = self.timeouts
        connect = t.connect * host_count(self.dsn)
        return connect + t.statement + t.commit + t.resolve + connect + resolve.LOOK_BUDGET

    def open(self) -> None:
        """Connect, create or check the schema and the cluster's settings, read the cluster's
        id and digest secret. Raises Unavailable (no primary within the bound) or ClusterError."""
        if self._watchdog is None:
            self._watchdog = Watchdog()
        session = self._connected()
        try:
            meta = schema.create_or_check(session)
        except (Lost, psycopg.Error) as exc:
            self._drop()
            raise Unavailable(
                f"the primary failed while the schema was checked: {exc}", self.timeouts.retry_after
            ) from exc
        self.cluster_id, self.digest_key = meta.cluster_id, meta.digest_key

    def close(self) -> None:
        self._drop()
        if self._watchdog is not None:
            self._watchdog.close()
            self._watchdog = None

    def digest(self, body: bytes) -> bytes:
        """128 bits of BLAKE3 of ``body`` keyed with the cluster's secret (as Journal.digest)."""
        assert self.digest_key is not None, "CommitLog.open() first"
        return blake3(body, key=self.digest_key).digest(DIGEST_BYTES)

    # -- a flush -----------------------------------------------------------------------------

    def commit(self, appends: Sequence[Append]) -> Committed:
        """Commit one flush (see the module's docstring). Raises Unavailable, NotCommitted
        (nothing kept) or OutcomeUnknown (maybe kept); returns only what is durable.

        Two round trips with keys, one without (libpq's pipeline mode): BEGIN and the claim;
        then the bytes, the position and COMMIT together, so the head row's lock is held for
        the COMMIT alone (its wait for the standby included), not for one more round trip."""
        flush_id = str(uuid.uuid4())
        if not appends:
            return Committed([], None, flush_id)
        session = self._connected()
        t = self.timeouts
        try:
            with session.budget(t.statement):
                plan = self._decide(session, appends, flush_id)
        except Lost as exc:
            self._drop()
            raise NotCommitted(f"the primary was lost before COMMIT: {exc}", t.retry_after) from exc
        except psycopg.Error as exc:
            self._rollback(session)
            raise NotCommitted(f"the primary refused the flush: {exc}", t.retry_after) from exc
        try:
            statements = self._writes(plan, flush_id)
            results = session.run(statements, seconds=t.commit)  # COMMIT's bound covers them
        except Lost as exc:
            self._drop()
            return self._settle(plan, flush_id, session, f"COMMIT got no answer ({exc})")
        except psycopg.Error as exc:  # a statement refused: those after it, COMMIT included, did not run
            self._rollback(session)
            raise NotCommitted(f"the primary refused the flush: {exc}", t.retry_after) from exc
        [(position, synchronous)] = next(
            rows for (sql, _), rows in zip(statements, results, strict=True) if sql in (_POSITION, _REPLAY_ONLY)
        )
        warned = [w for w in session.warnings if _SYNC_WARNING in w]
        if warned or not synchronous or not session.usable:
            why = warned or ("no synchronous standby named" if not synchronous else "and the connection closed")
            return self._settle(plan, flush_id, session, f"COMMIT answered {why}")
        return Committed(plan.decided(position), position, flush_id, plan.held)

    def _writes(self, plan: _Plan, flush_id: str) -> list[tuple[str, Any]]:
        """The flush's statements after the claim, COMMIT last (BEGIN first when there was no claim)."""
        names = sorted(plan.files)
        datas = [b"".join(plan.files[name]) for name in names]
        size = sum(len(data) for data in datas)
        statements: list[tuple[str, Any]] = [] if plan.begun else [("BEGIN", ())]
        if names:
            statements.append((_CHUNKS, (flush_id, names, datas)))
        if size or plan.new_keys:
            params = {"step": 1 if size else 0, "new": plan.new_keys, "flush": flush_id, "bytes": size}
            statements.append((_POSITION, params))
        else:
            statements.append((_REPLAY_ONLY, (flush_id,)))
        if plan.files:  # (a flush with files writes bytes: it takes a position) followers wake
            statements.append((f"NOTIFY {CHANNEL}", ()))
        return [*statements, ("COMMIT", ())]

    def _decide(self, session: Session, appends: Sequence[Append], flush_id: str) -> _Plan:
        """Claim the flush's keys (BEGIN and the claim in one round trip; nothing without keys)
        and decide each append: per key, the first append of the flush decides."""
        deciding: dict[str, Claim] = {}
        for _, claim in appends:
            if claim is not None and claim.key not in deciding:
                deciding[claim.key] = claim
        ours, held, new_keys = self._claim(session, list(deciding.values()), flush_id)
        decisions: list[Stored | None] = []
        files: dict[str, list[bytes]] = {}
        writing: set[str] = set()
        repeats: list[int] = []
        for chunks, claim in appends:
            if claim is not None and claim.key not in ours:
                decisions.append(held[claim.key][0])
                continue
            if claim is not None and claim.key in writing:
                first = deciding[claim.key]
                repeats.append(len(decisions))
                decisions.append(Stored(first.digest, first.answer))
                continue
            if claim is not None:
                writing.add(claim.key)
            decisions.append(None)
            for name, data in chunks.items():
                if data:
                    files.setdefault(name, []).append(data)
        held_at = {key: value[1] for key, value in held.items()}
        return _Plan(decisions, files, held_at, new_keys, begun=bool(deciding), repeats=repeats)

    def _claim(
        self, session: Session, claims: list[Claim], flush_id: str
    ) -> tuple[set[str], dict[str, tuple[Stored, int | None]], int]:
        """Insert (or take over, when past the window) each distinct key, in an open
        transaction; the keys this flush now holds, those held before it (digest, answer,
        position), and how many rows are new."""
        if not claims:
            return set(), {}, 0
        keys = [c.key for c in claims]
        params = {
            "keys": keys,
            "digests": [c.digest for c in claims],
            "answers": [c.answer for c in claims],
            "flush": flush_id,
            "window": self.window,
        }
        _, rows, others = session.run([("BEGIN", ()), (_CLAIM, params), (_HELD, (keys, flush_id))])
        ours = {key for key, _ in rows}
        new_keys = sum(1 for _, inserted in rows if inserted)
        held = {
            key: (Stored(bytes(digest), bytes(answer), position), position) for key, digest, answer, position in others
        }
        missing = set(keys) - ours - set(held)
        if missing:  # a key that conflicted, then vanished (retention deleted it meanwhile): refuse, retry
            raise psycopg.errors.SerializationFailure(f"keys changed during the claim: {sorted(missing)[:3]}")
        return ours, held, new_keys

    def _settle(self, plan: _Plan, flush_id: str, session: Session, why: str) -> Committed:
        position = resolve.settle(self._connected, flush_id, session.origin, self.timeouts, why)
        return Committed(plan.decided(position), position, flush_id, plan.held)

    # -- followers ---------------------------------------------------------------------------

    def head(self) -> int:
        """The newest position the synchronous standbys have (every position up to it is
        durable). Raises Unavailable when no primary answers or no standby confirms in time."""
        session = self._connected()
        try:
            [(lsn, position)] = session.execute(_HEAD)
            if wait_synced(session, lsn, self.timeouts.read_wait):
                return int(position)
        except (Lost, psycopg.Error) as exc:
            self._rollback(session)
            raise Unavailable(f"the primary failed while reading the head: {exc}", self.timeouts.retry_after) from exc
        raise Unavailable("no synchronous standby confirmed the head in time", self.timeouts.retry_after)

    def read(self, after: int, max_bytes: int = 16 * 1024**2) -> list[Batch]:
        """The batches after position ``after``, in order: as many as fit in ``max_bytes`` (at
        least one), at most MAX_READ_BATCHES, and only once the synchronous standbys have them
        (none when they do not confirm within ``Timeouts.read_wait``: ask again). Raises
        LogTrimmed when retention deleted positions after ``after``, Unavailable when no
        primary answers."""
        session = self._connected()
        try:
            rows = session.execute(_READ, {"after": after, "n": MAX_READ_BATCHES, "max": max(1, max_bytes)})
            batches, lsn, trimmed = _batches(rows, after)
            if not batches or wait_synced(session, lsn, self.timeouts.read_wait):
                return batches
            return []
        except (Lost, psycopg.Error) as exc:
            self._rollback(session)
            raise Unavailable(f"the primary failed during a read: {exc}", self.timeouts.retry_after) from exc

    def report(self, follower: str, applied: int) -> int | None:
        """Record that ``follower`` has applied every position up to ``applied`` (it may go
        back: a follower whose files were restored holds the log from there); returns the
        position the log held for it before (None: none), by which a follower sees another
        host report under its name. Commits without waiting for the standby: a report lost in
        a failover only makes retention keep more."""
        session = self._connected()
        try:
            statements = [
                ("BEGIN", ()),
                ("SET LOCAL synchronous_commit = local", ()),
                (_REPORTED, (follower,)),
                (_REPORT, (follower, applied)),
            ]
            rows = session.run([*statements, ("COMMIT", ())])[2]
        except (Lost, psycopg.Error) as exc:
            self._rollback(session)
            raise Unavailable(f"the primary failed during a report: {exc}", self.timeouts.retry_after) from exc
        return None if not rows or rows[0][0] is None else int(rows[0][0])

    def retain(self, stale_after: float = retention.STALE_AFTER, limit: int = retention.STEP) -> retention.Retained:
        """One bounded step of retention (tiny.cluster.retention): expire keys, trim applied
        batches, forget old flush ids. Call it periodically; each call deletes at most about
        ``limit`` rows of each kind."""
        session = self._connected()
        try:
            return retention.step(session, self.window, self.max_keys, stale_after, limit)
        except (Lost, psycopg.Error) as exc:
            self._rollback(session)
            raise Unavailable(f"the primary failed during retention: {exc}", self.timeouts.retry_after) from exc

    # -- the connection ----------------------------------------------------------------------

    def connect(self) -> None:
        """Make sure of a connection to the primary (one kept from before, if still usable);
        Unavailable, within ``Timeouts.connect`` x hosts, when none accepts writes."""
        self._connected()

    def _connected(self) -> Session:
        if self._session is not None and self._session.usable:
            return self._session
        self._drop()
        if self._watchdog is None:
            self._watchdog = Watchdog()
        self._session = connect(self.dsn, self.timeouts, self._watchdog)
        return self._session

    def _drop(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def _rollback(self, session: Session) -> None:
        try:
            if session.usable:
                session.execute("ROLLBACK")
                return
        except (Lost, psycopg.Error):
            pass
        self._drop()


def _batches(rows: list[tuple[Any, ...]], after: int) -> tuple[list[Batch], str, int]:
    """The read's rows as consecutive batches from ``after + 1``; raises LogTrimmed when the
    log no longer holds them."""
    lsn, trimmed = rows[0][0], int(rows[0][1])
    if after < trimmed:
        raise LogTrimmed(
            f"the log no longer holds positions {after + 1}-{trimmed} (retention deleted them once every "
            f"follower seen had applied them): start this host on a copy of a peer's data dir, made with "
            f"`tiny-admin backup` on a host that has applied position {trimmed} or later (docs/scaling-out.md)",
            trimmed + 1,
        )
    batches: list[Batch] = []
    for _, _, position, name, data in rows:
        if position is None:
            break
        if data is None:
            raise LogTrimmed(f"position {position} was trimmed while it was read", position)
        if not batches or batches[-1].position != position:
            if position != after + len(batches) + 1:
                raise LogTrimmed(f"position {after + len(batches) + 1} is missing from the log", position)
            batches.append(Batch(position, {}))
        batches[-1].files[name] = bytes(data)
    return batches, lsn, trimmed

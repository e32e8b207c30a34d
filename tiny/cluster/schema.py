"""The commit log's tables in PostgreSQL (schema ``tiny``), created once by the first host and checked by every other.

Tables (all in the PostgreSQL schema ``tiny``):

- ``meta (name, value)``: ``schema_version`` (:data:`VERSION`), ``cluster_id`` (a random
  UUID: the cluster's identity, which each host keeps beside its day files), ``digest_key``
  (32 random bytes: the secret of the keyed BLAKE3 digests, the same on every host, so a
  digest computed on one host is compared on another).
- ``head``: one row, ``position`` (the newest position of the one global order: gapless, taken
  by each flush that writes bytes as its last statement, so a follower reading ``position >
  applied`` never skips one that commits later) and ``keys`` (how many idempotency keys are
  stored: max_keys is enforced from it without counting).
- ``flushes (flush_id, position, bytes, committed)``: one row per committed flush, written by
  its own transaction, so a COMMIT whose answer was lost is settled by looking for its id;
  ``position`` is NULL for a flush that wrote no bytes (every append a replay).
- ``chunks (flush_id, file, data)``: what a flush appends to each file (the name relative to
  the data dir), its writing appends' bytes concatenated in arrival order; TOASTed with lz4
  where the server has it (pglz, PostgreSQL's default, halves the commits of 1,600-row
  batches here).
- ``idempotency_keys (seq, key, digest, answer, stored, flush_id)``: as the local journal's,
  ``stored`` by the primary's clock, ``flush_id`` the flush that wrote the key's rows; ``seq``
  numbers the keys in the order stored (oldest first for expiry).
- ``followers (name, applied, seen)``: each host's follower, its applied position, when it
  last reported.
- ``retention``: one row, ``trimmed``: every position up to it has had its chunks deleted.

Creation takes a transaction-scoped advisory lock, so hosts starting together create it once;
a schema of another version is refused (:class:`~tiny.cluster.errors.ClusterError`), never
altered in place.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

import psycopg

from tiny.cluster.errors import ClusterError
from tiny.cluster.session import Session

VERSION = 1
SCHEMA = "tiny"
DIGEST_KEY_BYTES = 32
_CREATE_LOCK = 0x74696E79  # pg_advisory_xact_lock key ("tiny") held while the schema is created

_DDL = """
CREATE SCHEMA tiny;
CREATE TABLE tiny.meta (name text PRIMARY KEY, value bytea NOT NULL);
CREATE TABLE tiny.head (
    single boolean PRIMARY KEY DEFAULT true CHECK (single),
    position bigint NOT NULL,
    keys bigint NOT NULL
);
INSERT INTO tiny.head VALUES (true, 0, 0);
CREATE TABLE tiny.flushes (
    flush_id uuid PRIMARY KEY,
    position bigint UNIQUE,
    bytes bigint NOT NULL,
    committed timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX flushes_committed ON tiny.flushes (committed);
CREATE TABLE tiny.chunks (
    flush_id uuid NOT NULL,
    file text NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (flush_id, file)
);
CREATE SEQUENCE tiny.key_seq;
CREATE TABLE tiny.idempotency_keys (
    seq bigint PRIMARY KEY DEFAULT nextval('tiny.key_seq'),
    key text NOT NULL UNIQUE,
    digest bytea NOT NULL,
    answer bytea NOT NULL,
    stored timestamptz NOT NULL,
    flush_id uuid NOT NULL
);
CREATE TABLE tiny.followers (name text PRIMARY KEY, applied bigint NOT NULL, seen timestamptz NOT NULL);
CREATE TABLE tiny.retention (
    single boolean PRIMARY KEY DEFAULT true CHECK (single),
    trimmed bigint NOT NULL
);
INSERT INTO tiny.retention VALUES (true, 0);
"""


@dataclass(frozen=True, slots=True)
class Meta:
    """What every host of one cluster shares."""

    cluster_id: str
    digest_key: bytes


def create_or_check(session: Session) -> Meta:
    """Create the schema if absent (one host does, under the advisory lock), else check its
    version; then check that the cluster commits synchronously and that this role sees the
    standbys' positions. Returns the cluster's id and digest secret. Raises ClusterError with
    what was found and what to do."""
    session.execute("BEGIN")
    try:
        session.execute("SELECT pg_advisory_xact_lock(%s)", (_CREATE_LOCK,))
        [(namespace, table)] = session.execute("SELECT to_regnamespace('tiny'), to_regclass('tiny.meta')")
        if namespace is not None and table is None:
            raise ClusterError(
                f"the database has a schema {SCHEMA!r} that is not a Tiny commit log (no tiny.meta): "
                "point the servers at another database, or rename that schema"
            )
        if table is None:
            _create(session)
        meta = dict(session.execute("SELECT name, value FROM tiny.meta"))
        session.execute("COMMIT")
    except BaseException:
        if session.usable:
            session.execute("ROLLBACK")
        raise
    version = bytes(meta.get("schema_version", b"?")).decode(errors="replace")
    if version != str(VERSION):
        raise ClusterError(
            f"the PostgreSQL schema {SCHEMA!r} has version {version}, this server knows version {VERSION}: "
            "run the server version that created it, or move the schema aside (ALTER SCHEMA tiny RENAME TO ...) "
            "to start a new, empty log"
        )
    check_settings(session)
    return Meta(bytes(meta["cluster_id"]).decode(), bytes(meta["digest_key"]))


def check_settings(session: Session) -> None:
    """Refuse a cluster that would acknowledge commits the standbys do not have: synchronous
    commit must wait for the standby's flush (``on`` or ``remote_apply``) and name at least one
    synchronous standby; and this role must read the standbys' positions (pg_stat_replication
    hides them from roles without pg_read_all_stats), which followers' reads wait for."""
    commit, standbys, sees = session.execute(
        "SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'), "
        "pg_has_role('pg_read_all_stats', 'USAGE')"
    )[0]
    if commit not in ("on", "remote_apply") or not str(standbys).strip():
        raise ClusterError(
            f"the PostgreSQL primary runs synchronous_commit={commit!r} with synchronous_standby_names="
            f"{standbys!r}: a commit would be acknowledged before a standby has it. Run the cluster with "
            "synchronous replication (Patroni: synchronous_mode and synchronous_mode_strict)"
        )
    if not sees:
        raise ClusterError(
            "this PostgreSQL role cannot read the standbys' positions in pg_stat_replication: "
            "GRANT pg_read_all_stats TO the role the servers connect as"
        )


def _create(session: Session) -> None:
    for statement in _DDL.split(";"):
        if statement.strip():
            session.execute(statement)
    session.execute("SAVEPOINT compression")
    try:  # lz4 (PostgreSQL built --with-lz4, as Debian's is): 2x the commits of pglz for 1,600-row batches
        session.execute("ALTER TABLE tiny.chunks ALTER COLUMN data SET COMPRESSION lz4")
    except psycopg.Error:
        session.execute("ROLLBACK TO SAVEPOINT compression")
    meta = {
        "schema_version": str(VERSION).encode(),
        "cluster_id": str(uuid.uuid4()).encode(),
        "digest_key": os.urandom(DIGEST_KEY_BYTES),
    }
    for name, value in meta.items():
        session.execute("INSERT INTO tiny.meta (name, value) VALUES (%s, %s)", (name, value))

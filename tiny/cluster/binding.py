"""Which cluster a data dir follows: bound at its first start in cluster mode, every other refused.

A host's day files are the log's batches applied in order from position 1 (tiny.follower),
so they make sense only against the log they came from. The data dir's journal (tiny.keys,
table ``meta``) therefore holds ``cluster_id`` (the cluster's random id, tiny.cluster.schema)
and ``cluster_digest_key`` (the cluster's digest secret, kept so that a keyed request's
digest can be computed while no primary answers). Rules:

- :func:`bind`, under the data dir's flush lock: a data dir bound to this cluster is
  accepted; one bound to another is refused (its files are another log's); an unbound one is
  bound only if it holds nothing written without the cluster (no day or rejects file, no key
  of its own journal, no intent with bytes but no position), since those bytes are in no log
  and no other host has them. The secret is written before the id: a start killed between the
  two leaves the data dir unbound, and the next one binds it.
- A data dir bound to a cluster is refused by a server without ``--cluster``
  (tiny.datadir ``open_journal(cluster=False)``): its writes would be this host's alone.
- ``tiny-admin backup`` copies the journal, so a peer's copy follows the same cluster.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tiny import layout
from tiny.commit.errors import Refused
from tiny.commit.local import LocalCommit

_ID, _SECRET = "cluster_id", "cluster_digest_key"


@dataclass(frozen=True, slots=True)
class Binding:
    """The cluster a data dir follows, and that cluster's digest secret."""

    cluster_id: str
    digest_key: bytes


def bound(local: LocalCommit) -> Binding | None:
    """The binding the open data dir's journal holds, or None."""
    cluster_id, secret = local.keys.meta(_ID), local.keys.meta(_SECRET)
    if cluster_id is None or secret is None:
        return None
    return Binding(cluster_id.decode(errors="replace"), secret)


def bind(local: LocalCommit, cluster_id: str, digest_key: bytes) -> Binding:
    """Bind the open data dir to cluster ``cluster_id`` (see the module docstring), or check
    that it is bound to it; Refused, saying why, otherwise."""
    with local.locked():
        found = bound(local)
        if found is not None:
            check(found, cluster_id, local)
            return found
        written = _written_alone(local)
        if written:
            raise Refused(
                f"the data dir {local.data_dir} holds {written}, written without the cluster: cluster mode starts a "
                "host on an empty data dir (its follower applies the whole log) or on a copy of a peer's "
                "(tiny-admin backup); give this one's files to a server of one host"
            )
        local.keys.set_meta(_SECRET, digest_key)
        local.keys.set_meta(_ID, cluster_id.encode())
    return Binding(cluster_id, digest_key)


def check(found: Binding, cluster_id: str, local: LocalCommit) -> None:
    """Refused unless ``found`` (a data dir's binding) is cluster ``cluster_id``'s."""
    if found.cluster_id != cluster_id:
        raise Refused(
            f"the data dir {local.data_dir} follows the cluster {found.cluster_id}, but --cluster reaches the "
            f"cluster {cluster_id}: its files are that other log's. Point --cluster at its cluster, or start this "
            "host on an empty data dir"
        )


def _written_alone(local: LocalCommit) -> str | None:
    """What the data dir holds that no log has, or None."""
    if local.keys.last is not None or local.keys.holds_keys():
        return f"Idempotency-Keys in its own journal ({local.keys.path.parent / 'keys'})"
    record = local.intent.read()
    if record is not None and record.spans and record.position is None:
        return f"bytes of a flush of its own journal ({local.intent.path})"
    for name in _data_files(local):
        return f"the data file {local.data_dir / name}"
    return None


def _data_files(local: LocalCommit) -> list[str]:
    """The day files and rejects files of the data dir (the first found is enough: at most 2)."""
    found: list[str] = []
    for folder, prefix in ((local.data_dir, ""), (local.data_dir / layout.REJECTS_DIR, f"{layout.REJECTS_DIR}/")):
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    if layout.is_data_file(prefix + entry.name):
                        found.append(prefix + entry.name)
                        break
        except FileNotFoundError:
            continue
    return found

"""Cluster mode's commit point: a flush committed as one synchronously replicated PostgreSQL transaction.

:class:`ClusterCommit` is the :class:`~tiny.commit.CommitPoint` of a host in cluster mode
(``--cluster``). A flush is :meth:`tiny.cluster.log.CommitLog.commit`: the keys decided with
the local journal's rules, the bytes of each file and the flush's position in the one global
order stored, all in one transaction whose COMMIT returned only once a synchronous standby
has it. The host's day files are not written here: every host's follower (tiny.follower)
appends the committed batches in order, this one's included. What it keeps of the local
journal (tiny.commit.local, opened with ``cluster=True``): the data dir's identity and
checks, the binding to one cluster (tiny.cluster.binding), and the committed sizes the
follower's flushes leave, which the reads count up to.

The way in is a connection to whichever node is primary: a flush waits for one, trying again
every :data:`PRIMARY_POLL` seconds, until its deadline (``wait_bound``, ``--lock-timeout``,
from when its first request was queued), then fails :class:`~tiny.commit.Unavailable` (503 +
Retry-After). Once connected, the commit itself takes at most ``CommitLog.bound`` seconds
(:data:`TIMEOUTS`; a frozen primary: the claim's statement bound, or COMMIT's and the
settling's). Its outcomes, and what each is for the client:

- committed: the receipt, with the flush's position (the ``Tiny-Position`` of its 200s; a
  replay's is the position of the flush that wrote its key, tiny.commit ``Stored.position``);
- tiny.cluster's Unavailable or NotCommitted: :class:`~tiny.commit.Unavailable`, nothing kept;
- tiny.cluster's OutcomeUnknown (a COMMIT whose answer was lost and could not be settled in
  time): :class:`~tiny.commit.OutcomeUnknown`, the handler's "may or may not have been
  written: retry with the same Idempotency-Key";
- any other ClusterError (the schema, the settings, another cluster): Refused.

``on_outcome(name)`` is called with ``written``, ``unavailable``, ``unknown`` or ``refused``
after each flush that had appends (the metrics). Not thread-safe: it belongs to the sink's
thread, except :meth:`digest`, :meth:`peek_committed_sizes`, :meth:`waiting` and
:meth:`blocked_elsewhere`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tiny import limits
from tiny.cluster import binding
from tiny.cluster.errors import ClusterError
from tiny.cluster.errors import OutcomeUnknown as LogOutcomeUnknown
from tiny.cluster.errors import Unavailable as LogUnavailable
from tiny.cluster.log import CommitLog
from tiny.cluster.session import Timeouts
from tiny.commit import Append, OutcomeUnknown, Receipt, Refused, Unavailable, keyed_digest
from tiny.commit.local import LocalCommit
from tiny.refusals import Found

log = logging.getLogger("tiny.commit.cluster")

# The commit log's bounds in cluster mode: a frozen primary costs a flush at most the claim's
# 4 s, or COMMIT's 8 s and 4 s to settle it, so that an answer comes before nginx's 15 s read
# timeout passes the request (with its key) to another host.
TIMEOUTS = Timeouts(connect=2, statement=4.0, commit=8.0, resolve=4.0, read_wait=2.0, retry_after=2)
PRIMARY_POLL = 0.25  # seconds between two tries to reach a primary while a flush waits for one
_WAIT_REPORTED_AFTER = 1.0  # seconds of waiting for a primary before /healthz reports it
REBUILD = (
    "In cluster mode a host's data dir is rebuilt, not repaired: stop its server, then remove the data dir "
    "(its follower applies the log again from position 1, while the log holds it) or put a copy of a "
    "peer's in its place (tiny-admin backup; docs/scaling-out.md)"
)


class ClusterCommit:
    """The commit point of ``data_dir`` in the cluster reached through ``dsn``; see the module
    docstring. ``wait_bound``: seconds a flush waits for a primary (``--lock-timeout``, also
    the data dir's lock timeout for the committed sizes)."""

    def __init__(
        self,
        data_dir: Path,
        dsn: str,
        *,
        window: float = limits.IDEMPOTENCY_WINDOW,
        max_keys: int = limits.IDEMPOTENCY_MAX_KEYS,
        wait_bound: float = limits.LOCK_TIMEOUT,
        fsync: bool = False,
        headers: Mapping[str, bytes] | None = None,
        crash_at: str = "",
        timeouts: Timeouts = TIMEOUTS,
        on_outcome: Callable[[str], None] | None = None,
    ) -> None:
        self.local = LocalCommit(
            data_dir,
            fsync=fsync,
            lock_timeout=wait_bound,
            headers=headers,
            crash_at=crash_at,
            cluster=True,
        )
        self.log = CommitLog(dsn, window=window, max_keys=max_keys, timeouts=timeouts)
        self.binding: binding.Binding | None = None
        self._log_open = False
        self._give_up_at = float("inf")
        self._waiting_since = 0.0  # time.monotonic() since a flush waits for a primary; 0 when not
        self._waited_for = ""  # why the last try to reach one failed
        self._on_outcome = on_outcome or (lambda outcome: None)

    @property
    def is_open(self) -> bool:
        return self.local.is_open and self.binding is not None

    @property
    def wait_bound(self) -> float:
        return self.local.wait_bound

    @property
    def unfinished(self) -> bool:
        return self.local.unfinished

    def open(self, accept_new: bool = False) -> None:
        """Open the data dir (every check of the local journal; a refusal says how to rebuild
        it) and its binding; an unbound data dir is bound now, which needs the primary
        (Unavailable without one). ``accept_new`` is refused: see :data:`REBUILD`."""
        if self.is_open:
            return
        if accept_new:
            raise Refused(f"--new-journal does not apply to cluster mode. {REBUILD}")
        try:
            self.local.open()
        except Found as found:
            # the way out first: /healthz carries a follower's error cut to 512 bytes, and what
            # was found ends with the local journal's ways past it (tiny-admin forget), which a
            # data dir that follows a cluster refuses
            raise Refused(f"{REBUILD}. Found: {found.what}", found.retry_after) from None
        try:
            found_binding = binding.bound(self.local)
            if found_binding is None:
                self.open_log()
                assert self.log.cluster_id is not None and self.log.digest_key is not None
                found_binding = binding.bind(self.local, self.log.cluster_id, self.log.digest_key)
                log.info("data dir %s now follows the cluster %s", self.local.data_dir, found_binding.cluster_id)
            self.binding = found_binding
        except BaseException:
            self.close()
            raise

    def open_log(self) -> None:
        """Open the commit log (connect, check the schema and settings) once, and check that it
        is the cluster the data dir follows. Unavailable without a primary; Refused otherwise."""
        if self._log_open:
            return
        try:
            self.log.open()
        except LogUnavailable as exc:
            raise Unavailable(str(exc), exc.retry_after) from None
        except ClusterError as exc:
            self.log.close()
            raise Refused(str(exc)) from None
        assert self.log.cluster_id is not None
        if self.binding is not None:
            try:
                binding.check(self.binding, self.log.cluster_id, self.local)
            except Refused:
                self.log.close()
                raise
        self._log_open = True

    def close(self) -> None:
        self.binding = None
        self._log_open = False
        self.log.close()
        self.local.close()

    def digest(self, body: bytes) -> bytes:
        """The cluster's keyed digest (the same secret on every host), known without a primary."""
        assert self.binding is not None, "ClusterCommit.open() first"
        return keyed_digest(self.binding.digest_key, body)

    def commit(self, appends: Sequence[Append], deadline: float) -> Receipt:
        """One flush (see the module docstring): a primary waited for until ``deadline``, then
        one transaction. With no appends: only the wait for a primary (a probe of the way in)."""
        self._way_in(deadline)
        if not appends:
            return Receipt([])
        try:
            committed = self.log.commit([(append.chunks, append.claim) for append in appends])
        except LogUnavailable as exc:  # NotCommitted too: nothing of it was kept
            self._on_outcome("unavailable")
            raise Unavailable(f"{exc}", exc.retry_after) from None
        except LogOutcomeUnknown as exc:
            self._on_outcome("unknown")
            raise OutcomeUnknown(f"{exc}", exc.retry_after) from None
        except ClusterError as exc:
            self._on_outcome("refused")
            raise Refused(f"{exc}") from None
        except Exception as exc:  # a fault of ours, after COMMIT may have been sent: never "nothing kept"
            log.exception("a flush to the commit log failed unexpectedly")
            self._on_outcome("unknown")
            raise OutcomeUnknown(f"the flush failed unexpectedly: {exc!r}", TIMEOUTS.retry_after) from None
        self._on_outcome("written")
        return Receipt(committed.decisions, committed.position)

    def _way_in(self, deadline: float) -> None:
        """Return once connected to a primary (the log open); Unavailable past ``deadline``,
        also when it has passed already (the appends waited out their bound behind an earlier
        flush): a commit never begins past it, so a request takes at most its wait bound and
        one commit's."""
        started = time.monotonic()
        if started >= min(deadline, self._give_up_at):
            raise Unavailable(
                f"the flushes ahead of this one took the {self.wait_bound:g} s it may wait for a primary",
                TIMEOUTS.retry_after,
            )
        try:
            while True:
                try:
                    self.open_log()
                    self.log.connect()
                    return
                except (Unavailable, LogUnavailable) as exc:
                    self._waited_for = str(exc).splitlines()[0]
                    retry_after = exc.retry_after
                end = min(deadline, self._give_up_at)
                if time.monotonic() + PRIMARY_POLL > end:
                    raise Unavailable(
                        f"no PostgreSQL primary within {time.monotonic() - started:.1f} s: {self._waited_for}",
                        retry_after,
                    )
                self._waiting_since = self._waiting_since or started
                time.sleep(PRIMARY_POLL)
        finally:
            self._waiting_since = 0.0

    def recover(self) -> None:
        self.local.recover()

    def stop_waits_at(self, when: float) -> None:
        self._give_up_at = when
        self.local.stop_waits_at(when)

    def peek_committed_sizes(self, names: Sequence[str]) -> dict[str, int] | None:
        """The sizes the follower's flushes committed (tiny.intent), without waiting."""
        return self.local.peek_committed_sizes(names)

    def committed_sizes(self, names: Sequence[str]) -> dict[str, int]:
        return self.local.committed_sizes(names)

    def writable(self, names: Sequence[str], size: int) -> str | None:
        """The local data dir's (the follower appends the batches to its files)."""
        return self.local.writable(names, size)

    def waiting(self) -> str | None:
        since = self._waiting_since
        if since and time.monotonic() - since > _WAIT_REPORTED_AFTER:
            return f"waiting {time.monotonic() - since:.1f} s for a PostgreSQL primary: {self._waited_for}"
        return self.local.waiting()

    def blocked_elsewhere(self) -> str | None:
        """None: the way in is a primary, not the data dir's lock (which the follower holds
        while it applies; its own health is reported apart, tiny.follower_status)."""
        return None

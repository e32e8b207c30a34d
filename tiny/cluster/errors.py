"""What the commit log raises: each error says whether anything of the flush may have been kept."""

from __future__ import annotations


class ClusterError(Exception):
    """The commit log cannot be used as found (its schema, the cluster's settings, a follower's
    position): the message says what was found and what to do; meant for the operator."""


class Unavailable(ClusterError):
    """No primary could be reached within the bound: nothing of the flush was kept. The caller
    answers 503 with ``Retry-After: retry_after``; a retry is processed afresh."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class NotCommitted(Unavailable):
    """The flush's transaction is known not to have committed (it failed before COMMIT was sent,
    or its outcome was resolved: absent on a new primary, or its backend ended without it):
    nothing of the flush was kept, and a retry is processed afresh."""


class OutcomeUnknown(ClusterError):
    """The flush may have committed or not, and that could not be settled within the bound (the
    primary was lost during COMMIT and no primary answered in time, or the flush is on the
    primary but no synchronous standby confirmed it). Nothing may be answered as written: the
    caller answers 503 "outcome unknown, retry with the same Idempotency-Key" (a retry with the
    key is answered from the log if it did commit; one without a key may write the rows twice)."""

    def __init__(self, message: str, retry_after: int, flush_id: str) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.flush_id = flush_id


class LogTrimmed(ClusterError):
    """A follower asked for positions the log no longer holds (retention deleted them): it must
    be copied from a peer that has them (the message says from which position on)."""

    def __init__(self, message: str, oldest: int) -> None:
        super().__init__(message)
        self.oldest = oldest

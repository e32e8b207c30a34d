"""What a commit point raises: each error says whether anything of the flush may have been kept.

Every error is a :class:`CommitError` whose message is meant for the operator and for the
client's 503, and whose ``retry_after`` (seconds) is the ``Retry-After`` the client gets. The
sink and the handlers see only these, whichever commit point made them:

- :class:`Refused`: the commit point refused the flush as a whole (a data dir or a cluster found
  wrong, a lock lost before the commit point): every append of the group fails at once, none is
  retried on its own; nothing was kept.
- :class:`Unavailable` (a Refused): the way in (the data dir's flush lock, a primary) was not
  free within the bound: nothing was kept, and an append whose own wait bound is still ahead
  may be flushed again.
- :class:`WriteFailed`: one file's write failed (disk full, EFBIG, EIO): nothing of the flush
  was kept, and each of its appends is flushed again on its own, so that one request's file
  never fails another's.
- :class:`OutcomeUnknown`: the flush may or may not have been committed, and it could not be
  settled within the bound (cluster mode only): nothing may be answered as written or as not
  kept; a retry with the same Idempotency-Key is answered from the commit point if it did commit.
"""

from __future__ import annotations

DEFAULT_RETRY_AFTER = 5  # seconds, the Retry-After of a flush that failed


class CommitError(Exception):
    """A flush that was not committed (or, for :class:`OutcomeUnknown`, may not have been)."""

    def __init__(self, message: str, retry_after: int = DEFAULT_RETRY_AFTER) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    def again(self) -> CommitError:
        """The same error as a new instance (one per request answered: no traceback shared)."""
        return type(self)(str(self), self.retry_after)


class Refused(CommitError):
    """The commit point refused the whole flush; nothing of it was kept."""


class Unavailable(Refused):
    """The way in was not free within the bound; nothing was kept; retrying later may succeed."""


class WriteFailed(CommitError):
    """A file's write failed; nothing of the flush was kept; its appends are retried one by one."""


class OutcomeUnknown(CommitError):
    """The flush may have been committed; nothing may be answered as written or as not kept."""

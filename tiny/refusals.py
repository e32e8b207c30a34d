"""What the data dir's journal refuses as found, and the operator's two knowing ways past it.

:class:`Found` is a refusal (tiny.commit.errors.Refused) of something found in the data dir
that its journal cannot vouch for: a journal, lock, intent or size table missing, damaged or
another data dir's; files older or newer than the journal. Its message says what was found and
ends with how to start a fresh journal knowingly (:data:`NEW_JOURNAL_FLAG`, which forgets every
key). A data file shorter than what was committed to it names, besides, the narrower way:
:func:`forget_command`, which forgets that file's lost rows and keeps every key
(tiny.admin ``forget``).
"""

from __future__ import annotations

from pathlib import Path

from tiny.commit.errors import DEFAULT_RETRY_AFTER, Refused

NEW_JOURNAL_FLAG = "--new-journal"
_ACCEPT = (
    f"If that is known and wanted, stop every server on this data dir and start one with {NEW_JOURNAL_FLAG}: "
    "it moves .tiny aside and starts a fresh journal (its keys are then forgotten: a batch retried with "
    "an earlier Idempotency-Key is written again)"
)


class Found(Refused):
    """Something found in the data dir that a fresh journal (``--new-journal``) would replace;
    ``what`` says what, and the message ends with how to accept that."""

    def __init__(self, what: str, retry_after: int | None = None) -> None:
        message = what if what.endswith(f"{_ACCEPT}.") else f"{what}. {_ACCEPT}."  # (again(): said once)
        super().__init__(message, DEFAULT_RETRY_AFTER if retry_after is None else retry_after)
        self.what = what


def forget_command(data_dir: Path, name: str) -> str:
    """The command that forgets, knowingly, the rows lost from the data file ``name``."""
    return f"tiny-admin forget {data_dir} {name}"

"""``profile``: kernprof's line-profiling decorator when run under ``kernprof -l``, else a no-op.

Usage: ``kernprof -l app.py`` (one worker, in this process), post some batches, Ctrl-C, then
``python -m line_profiler app.py.lprof``. Only the functions decorated with ``@profile``
(the hot path: codec, handler, sink flush) are timed line by line.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable[..., object])


def _identity(func: F) -> F:
    return func


# kernprof -l puts a LineProfiler instance into builtins as `profile` before running app.py.
profile: Callable[[F], F] = getattr(builtins, "profile", _identity)


def active() -> bool:
    """Whether kernprof runs this process (then the server serves in it, without forking)."""
    return profile is not _identity

"""The descriptor budget of a worker: the limit raised at start, the share connections may take.

Every worker process holds, besides its connections, its listening socket and event loop,
the files of one sink flush (:func:`sink_files`), its metrics files, its analytics
pool's pipes and a few more. :func:`connection_limit` keeps room for all of those, so that
an accepted batch never fails for lack of a descriptor: a connection past the limit is
closed at once instead (tiny.httpserver).
"""

from __future__ import annotations

import resource

from tiny import keylog
from tiny.config import Config

RESERVED = 64  # descriptors a worker needs besides its connections and the sink's files
MAX_DEFAULT_CONNECTIONS = 10_000  # an idle connection costs about 10-20 KB of memory too


def sink_files(config: Config) -> int:
    """Files one sink flush may hold open: 32, or one request's worth (its days and rejects file)."""
    return max(32, config.max_days + 1)


def key_log_files(config: Config) -> int:
    """Key log segments a worker holds open (tiny.keylog), one descriptor each: those
    ``--idempotency-max-keys`` keys of the biggest records span (388 at the default bound), or
    the segments the log has now and two more, when it is longer (a bound lowered over a log
    written under a higher one, which expiry shortens step by step); none in cluster mode,
    whose keys are in PostgreSQL."""
    if config.cluster:
        return 0
    now = len(keylog.segment_numbers(str(config.data_dir / keylog.KEYS_DIR)))
    return max(keylog.segments_for(config.idempotency_max_keys), now + 2)


def raise_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; returns the new soft limit.

    Workers forked afterwards inherit it.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def connection_limit(config: Config, sink_files: int, nofile: int | None = None) -> int:
    """Open connections one worker may hold: ``--max-connections``, or what the descriptor
    limit leaves after the sink's files, the key log's (:func:`key_log_files`) and RESERVED
    (at most MAX_DEFAULT_CONNECTIONS).

    Raises ValueError, naming the flag, when the limit leaves no room for connections or
    ``--max-connections`` asks for more than it leaves.
    """
    if nofile is None:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    keys = key_log_files(config)
    room = nofile - sink_files - keys - RESERVED
    held = f"{sink_files} for the sink, {keys} for the key log (--idempotency-max-keys) and {RESERVED} others"
    if room < 1:
        raise ValueError(f"RLIMIT_NOFILE {nofile} leaves no room for connections after {held} (--max-connections)")
    if config.max_connections > room:
        raise ValueError(
            f"--max-connections {config.max_connections} is more than RLIMIT_NOFILE {nofile} leaves "
            f"for connections ({room}, after {held})"
        )
    return config.max_connections or min(room, MAX_DEFAULT_CONNECTIONS)

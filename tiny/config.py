"""Server configuration: one frozen value built once from flags and the environment."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tiny import limits

ENV_PREFIX = "TINY_"
DURABILITIES = ("write", "fsync")
_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


@dataclass(frozen=True)
class Config:
    """Everything the server needs to know; validated by :func:`parse`."""

    port: int = 8000
    address: str = "127.0.0.1"
    processes: int = 0
    data_dir: Path = Path("data")
    durability: str = "write"
    max_body: int = limits.MAX_BODY
    token: str | None = None
    token_file: Path | None = None
    max_backlog: int = limits.MAX_BACKLOG
    idle_timeout: float = limits.IDLE_TIMEOUT
    body_timeout: float = limits.BODY_TIMEOUT
    drain_timeout: float = limits.DRAIN_TIMEOUT
    max_days: int = limits.MAX_DAYS
    max_rejects: int = limits.MAX_REJECTS
    max_connections: int = 0
    analytics_processes: int = limits.ANALYTICS_PROCESSES
    analytics_nice: str = "idle"
    analytics_cpu: float = limits.ANALYTICS_CPU
    analytics_max_queued: int = limits.ANALYTICS_MAX_QUEUED
    analytics_cache_bytes: int = limits.ANALYTICS_CACHE_BYTES
    read_rate: float = limits.READ_RATE
    idempotency_window: float = limits.IDEMPOTENCY_WINDOW
    idempotency_max_keys: int = limits.IDEMPOTENCY_MAX_KEYS
    journal_mode: str = "wal"
    lock_timeout: float = limits.LOCK_TIMEOUT
    stall_timeout: float = limits.STALL_TIMEOUT
    new_journal: bool = False
    no_fork: bool = False
    public_downloads: bool = False
    lean: bool = True  # the lean way into POST /ingest (tiny.handlers.lean); off: the handler only (benchmarks)
    crash_at: str = ""  # fault injection for the crash tests (tiny.sink); not in --help
    token_source: str = ""  # where the token came from: "file", "environment" or "command line"

    def worker_count(self) -> int:
        """The number of worker processes: ``processes``, or one per usable core when 0."""
        return self.processes or usable_cpus()


def usable_cpus(cgroup_cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """Cores this process may use: its CPU affinity, capped by a cgroup v2 CPU quota.

    Inside a container started with ``--cpus 2`` (or compose ``cpus: 2``) this is 2, not
    the host's core count.
    """
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = cgroup_cpu_max.read_text().split()
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


def parse_size(text: str) -> int:
    """Parse a byte count such as ``67108864``, ``64MiB`` or ``512k``."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"not a size: {text!r}")
    unit = (match.group(2) or "").lower()[:1]
    return int(match.group(1)) * _UNITS[unit]


def _positive_size(text: str) -> int:
    try:
        value = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be greater than 0")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError("must be 0-65535")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def _niceness(text: str) -> str:
    """``idle`` (SCHED_IDLE) or a nice value 0-19."""
    text = text.strip().lower()
    if text != "idle" and not (text.isdigit() and 0 <= int(text) <= 19):
        raise argparse.ArgumentTypeError("must be 'idle' or a nice value 0-19")
    return text


def _number(text: str, highest: float, what: str) -> float:
    """A number from 0 to ``highest``; ``what`` names it in the error (and gives an example)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}") from None
    if not 0 <= value <= highest:
        raise argparse.ArgumentTypeError(f"must be from 0 to {highest:.10g}")
    return value


def _cpus(text: str) -> float:
    """A number of CPUs, 0 or more (0.25: a quarter of one)."""
    return _number(text, 1024, "a number of CPUs, e.g. 0.25")


def _journal_mode(text: str) -> str:
    if text not in ("wal", "delete"):
        raise argparse.ArgumentTypeError("must be 'wal' or 'delete'")
    return text


def _crash_point(text: str) -> str:
    """``point[:probability[:kill|stop|stop-once]]`` (tiny.sink.CRASH_POINTS), or empty."""
    from tiny.sink import CRASH_POINTS

    point, _, rest = text.partition(":")
    chance, _, how = rest.partition(":")
    if text and point not in CRASH_POINTS:
        raise argparse.ArgumentTypeError("not a crash point")
    if chance and not 0 <= float(chance) <= 1:
        raise argparse.ArgumentTypeError("the probability must be 0-1")
    if how not in ("", "kill", "stop", "stop-once"):
        raise argparse.ArgumentTypeError("the action must be 'kill', 'stop' or 'stop-once'")
    return text


def _max_keys(text: str) -> int:
    """At least the keys one flush may commit (limits.MAX_FLUSH_APPENDS): below that, a flush
    would push out keys it is committing itself."""
    value = int(text)
    if value < limits.MAX_FLUSH_APPENDS:
        raise argparse.ArgumentTypeError(f"must be at least {limits.MAX_FLUSH_APPENDS}, the keys one flush may commit")
    return value


def _boolean(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError("must be true or false (1/0, yes/no)")


def _seconds(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _rate(text: str) -> float:
    """A number per second, 0 or more (0: no limit)."""
    return _number(text, 1_000_000, "a number per second, e.g. 2.5")


# (flag, type, help); the default comes from Config, the environment overrides it. A flag
# without help is for the tests only and stays out of --help.
_FLAGS: list[tuple[str, object, str | None]] = [
    ("port", _port, "TCP port to listen on"),
    ("address", str, "address to bind"),
    ("processes", _non_negative_int, "worker processes; 0 = one per core"),
    ("data_dir", Path, "directory of the daily CSV files and rejects/"),
    ("durability", str, "acknowledge after write(2) ('write') or after fsync ('fsync')"),
    ("max_body", _positive_size, "largest request body, compressed and decompressed (bytes, or 64MiB)"),
    (
        "token",
        str,
        "require 'Authorization: Bearer TOKEN' on every API request; unset = no auth. "
        "On the command line it shows in ps: prefer --token-file or TINY_TOKEN",
    ),
    ("token_file", Path, "a file whose content is the token (a Docker secret's path works)"),
    ("max_backlog", _positive_size, "unwritten bytes per process before /ingest answers 503"),
    ("idle_timeout", _seconds, "seconds a connection may idle or take to send its headers"),
    ("body_timeout", _seconds, "seconds a client may take to send a request body"),
    ("drain_timeout", _seconds, "seconds SIGTERM waits for requests in flight before exiting"),
    ("max_days", _positive_int, "distinct days one request may hold; records of further days are invalid"),
    ("max_rejects", _non_negative_int, "invalid lines kept per request in rejects/; the rest are summarised"),
    ("max_connections", _non_negative_int, "open connections per worker process; 0 = from the descriptor limit"),
    (
        "analytics_processes",
        _positive_int,
        "analytics pool processes per worker and lane (answers: started with the worker; row reads: on the first)",
    ),
    ("analytics_nice", _niceness, "CPU priority of the analytics pool: 'idle' (SCHED_IDLE) or a nice value 0-19"),
    (
        "analytics_cpu",
        _cpus,
        "CPUs all analytics pool processes of the server may use together (a cgroup quota where one can be "
        "made); 0 = no quota",
    ),
    ("analytics_max_queued", _positive_int, "distinct analytics computations queued per worker before 503"),
    ("analytics_cache_bytes", _positive_size, "analytics results cached per worker, in bytes (or 64MiB)"),
    (
        "read_rate",
        _rate,
        "reads (/api, /downloads, /top, /trending, /badges) a worker process starts per second while ingest "
        "requests are in flight in it; the rest wait their turn (up to 10 s, then 503); 0 = no pacing",
    ),
    ("idempotency_window", _seconds, "seconds an Idempotency-Key is kept at least (a retry within it writes nothing)"),
    ("idempotency_max_keys", _max_keys, "Idempotency-Keys kept at most; past it the oldest go first"),
    (
        "journal_mode",
        _journal_mode,
        "the journal's SQLite mode: 'wal' (one host), or 'delete' (writers on several hosts); every server "
        "on a data dir must use the same (tiny-admin set-journal-mode changes it)",
    ),
    (
        "lock_timeout",
        _seconds,
        "seconds a flush waits for the data dir's flush lock (another process holds it) before its requests "
        "get 503 with Retry-After",
    ),
    (
        "stall_timeout",
        _seconds,
        "seconds a worker's event loop may stall (its disk thread: this plus --lock-timeout) before the "
        "parent kills and replaces it",
    ),
    (
        "new_journal",
        _boolean,
        "start with a fresh journal where the data dir's is missing, damaged, replaced, from another data dir "
        "or inconsistent with the files (the old .tiny is moved aside; its keys are forgotten). Stop every "
        "other server on the data dir first",
    ),
    (
        "public_downloads",
        _boolean,
        "serve the downloads API (/downloads, /top, /trending, /badges: counts per package, never an ip_id) "
        "without the token, e.g. for badges in public READMEs",
    ),
    (
        "no_fork",
        _boolean,
        "run the one worker in this process, with no parent to restart it or watch it stall (for debuggers; "
        "implied under kernprof); needs --processes 1",
    ),
    ("crash_at", _crash_point, None),
    ("lean", _boolean, None),
]


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """An argparse parser whose defaults come from TINY_<FLAG> variables, then Config."""
    environ = os.environ if environ is None else environ
    defaults = Config()
    parser = argparse.ArgumentParser(
        description="Tiny Data Server: POST NDJSON CRAN log records, get daily CSV files.",
        epilog="Every flag can also be set as an environment variable TINY_<FLAG>, e.g. TINY_PORT=8001.",
    )
    for name, kind, text in _FLAGS:
        env_name = ENV_PREFIX + name.upper()
        default = environ.get(env_name, getattr(defaults, name))
        shown = "unset" if default is None else default
        if name == "token" and default is not None:
            shown = "set, not shown"  # --help must never print a secret
        extra: dict[str, object] = {"nargs": "?", "const": True} if kind is _boolean else {}
        parser.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type=kind,  # type: ignore[arg-type]
            default=default,
            choices=DURABILITIES if name == "durability" else None,
            help=f"{text} (env {env_name}; default {shown})" if text else argparse.SUPPRESS,
            **extra,  # type: ignore[arg-type]
        )
    return parser


def parse(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Build the Config from command-line flags over TINY_* environment variables.

    Environment values go through the same conversion and checks as flags; a bad value
    exits with argparse's usage error naming the flag.
    """
    parser = build_parser(environ)
    # argparse runs string defaults (our TINY_* values) through the flag's type too,
    # so a bad environment value fails here exactly like a bad flag.
    args = parser.parse_args(argv)
    values = {name: getattr(args, name) for name, _, _ in _FLAGS}
    if values["durability"] not in DURABILITIES:
        parser.error(f"argument --durability: must be one of {', '.join(DURABILITIES)}")
    if values["token"] == "":
        values["token"] = None
    for name, kind, _ in _FLAGS:  # a default from Config is not run through the flag's type
        if kind is _boolean:
            values[name] = _boolean(values[name])
    if values["no_fork"] and values["processes"] != 1:
        parser.error("argument --no-fork: needs --processes 1")
    argv = sys.argv[1:] if argv is None else argv
    on_command_line = any(arg == "--token" or arg.startswith("--token=") for arg in argv)
    values["token"], values["token_source"] = _token(parser, args, on_command_line)
    return Config(**values)


def _token(parser: argparse.ArgumentParser, args: argparse.Namespace, on_command_line: bool) -> tuple[str | None, str]:
    """The token and where it came from: --token-file (read now), --token, or TINY_TOKEN."""
    if args.token_file is not None:
        if args.token:
            parser.error("argument --token-file: give the token once, by --token-file or by --token / TINY_TOKEN")
        try:
            token = args.token_file.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            parser.error(f"argument --token-file: cannot read {args.token_file}: {exc}")
        if not token:
            parser.error(f"argument --token-file: {args.token_file} is empty")
        return token, "file"
    if not args.token:
        return None, ""
    return args.token, "command line" if on_command_line else "environment"

"""Server configuration: one frozen value built once from flags and the environment."""

from __future__ import annotations

import argparse
import math
import os
import re
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tiny import affinity, limits
from tiny.cluster import dsn
from tiny.token_source import token_of

ENV_PREFIX = "TINY_"
DURABILITIES = ("write", "fsync")
ROLES = ("ingest", "read")
# Numbers are written in ASCII digits, with no sign, no "_", no hex, no nan or infinity:
# float() and int() take all of those (and other scripts' digits), and a nan passes every
# comparison check unnoticed.
_WHOLE = re.compile(r"\s*([0-9]+)\s*", re.ASCII)
_DECIMAL = re.compile(r"\s*((?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\s*", re.ASCII)
_SIZE = re.compile(r"\s*([0-9]+)\s*([kmgt]i?b?|b)?\s*", re.ASCII | re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}  # binary units, "MB" too
_MAX_DIGITS = 30  # digits read at most: int() of thousands of digits costs time, and no bound here needs more
_MAX_COUNT = 10**9  # the largest count any flag takes: beyond it a value can only be a mistake
_MAX_SIZE = 1024**4  # 1 TiB: more than any body, backlog or cache can be in memory
_MAX_SECONDS = 1e9  # about 31 years
_MIN_SECONDS = 0.001
_MIN_STALL_SECONDS = 1.0  # 4 heartbeats (tiny.heartbeat.BEAT_SECONDS): less kills workers that are only busy
_MIN_CPUS = 0.01  # the least cgroup quota: 1 ms of every 100 ms period (tiny.analytics.cpu)
_MIN_RATE = 0.001  # one read per 1000 s; far below it the pace's interval and Retry-After grow absurd (1e-320: inf)
_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", re.ASCII)
_SECRET_VALUES = {"token", "cluster"}  # flags whose values no message or --help shows


@dataclass(frozen=True)
class Config:
    """Everything the server needs to know; validated by :func:`parse`."""

    port: int = 8000
    address: str = "127.0.0.1"
    processes: int = 0
    cpu_affinity: str = "auto"  # tiny.affinity: "auto", "none" or the first CPU's index
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
    lean: bool = True  # the fast head parser of the commonest POST /ingest (tiny.fasthead); off: Tornado's reads all
    cluster: str = ""  # cluster mode's PostgreSQL (a libpq string naming every node); "": the local journal
    role: str = "ingest"  # cluster mode: "ingest" (ingest and reads) or "read" (reads only)
    host_name: str = ""  # cluster mode: this host's follower name in the log; "": the hostname
    read_wait: float = 10.0  # cluster mode: seconds a read waits for its host to apply its position
    follower_retention: float = 86_400.0  # cluster mode: seconds the log keeps batches for a follower unseen
    crash_at: str = ""  # fault injection for the crash tests (tiny.crashpoints); not in --help
    token_source: str = ""  # where the token came from: "file", "environment" or "command line"

    def follower_name(self) -> str:
        """Cluster mode: this host's follower name in the log (``--host-name``, or the hostname)."""
        return self.host_name or socket.gethostname()

    def worker_count(self) -> int:
        """The number of worker processes: ``processes``, or one per usable core when 0."""
        return self.processes or usable_cpus()


def usable_cpus(cgroup_cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """Cores this process may use: its CPU affinity, capped by a cgroup v2 CPU quota.

    Inside a container started with ``--cpus 2`` (or compose ``cpus: 2``) this is 2, not
    the host's core count. A ``cpu.max`` that is not two positive whole numbers (or ``max``
    and one) is not a quota: the affinity counts.
    """
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = (int(field) for field in cgroup_cpu_max.read_text().split())
    except (OSError, ValueError):  # unreadable, "max 100000", or not two numbers
        return cores
    if quota > 0 and period > 0:
        cores = min(cores, max(1, math.ceil(quota / period)))
    return cores


def parse_size(text: str) -> int:
    """Parse a byte count such as ``67108864``, ``64MiB`` or ``512k`` (ASCII digits, no sign)."""
    match = _SIZE.fullmatch(text)
    if not match or len(match.group(1)) > _MAX_DIGITS:
        raise ValueError(f"not a size: {_shown(text)}")
    unit = (match.group(2) or "").lower()[:1]
    return int(match.group(1)) * _UNITS[unit]


def _shown(text: str) -> str:
    """``text`` quoted for an error message, cut short."""
    return repr(text if len(text) <= 40 else text[:40] + "...")


def _whole(low: int, high: int, why: str = "") -> Callable[[str], int]:
    """The check of a flag that takes a whole number from ``low`` to ``high`` (``why``: the reason of the bounds)."""

    def convert(text: str) -> int:
        match = _WHOLE.fullmatch(text)
        if match and len(match.group(1)) <= _MAX_DIGITS and low <= int(match.group(1)) <= high:
            return int(match.group(1))
        raise argparse.ArgumentTypeError(f"must be a whole number from {low} to {high}{why}")

    return convert


def _decimal(low: float, high: float, what: str, zero: str = "") -> Callable[[str], float]:
    """The check of a flag that takes ``what`` (a number, decimals allowed) from ``low`` to
    ``high``, or 0 when ``zero`` says what 0 means."""

    def convert(text: str) -> float:
        match = _DECIMAL.fullmatch(text)
        value = float(match.group(1)) if match else math.nan  # "1e999" is inf: out of range
        if value == 0 and match and match.group(1).lower().partition("e")[0].strip("0."):
            value = math.nan  # "1e-400" is no zero, though float() makes it one: out of range
        if (zero and value == 0) or low <= value <= high:  # nan is neither
            return value
        also = f", or 0 ({zero})" if zero else ""
        raise argparse.ArgumentTypeError(f"must be {what} from {low:.10g} to {high:.10g}{also}")

    return convert


def _size(text: str) -> int:
    """A byte count from 1 to 1 TiB."""
    try:
        value = parse_size(text)
    except ValueError:
        value = 0
    if not 1 <= value <= _MAX_SIZE:
        raise argparse.ArgumentTypeError("must be a size from 1 to 1TiB (bytes, or with k/M/G/T: 64MiB)")
    return value


def _niceness(text: str) -> str:
    """``idle`` (SCHED_IDLE) or a nice value 0-19."""
    if text.strip().lower() == "idle":
        return "idle"
    try:
        return str(_whole(0, 19)(text))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError("must be 'idle' or a nice value from 0 to 19") from None


def _cpu_affinity(text: str) -> str:
    """``auto``, ``none`` or a whole number (tiny.affinity)."""
    try:
        return affinity.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _one_of(*choices: str) -> Callable[[str], str]:
    def convert(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError("must be " + " or ".join(repr(choice) for choice in choices))
        return text

    return convert


def _crash_point(text: str) -> str:
    """``point[:probability[:kill|stop|kill-once|stop-once]]`` (tiny.crashpoints.CRASH_POINTS), or empty."""
    from tiny.crashpoints import CRASH_POINTS

    point, _, rest = text.partition(":")
    chance, _, how = rest.partition(":")
    if text and point not in CRASH_POINTS:
        raise argparse.ArgumentTypeError("not a crash point")
    if chance:
        _decimal(0, 1, "a probability")(chance)
    if how not in ("", "kill", "stop", "kill-once", "stop-once"):
        raise argparse.ArgumentTypeError("the action must be 'kill', 'stop', 'kill-once' or 'stop-once'")
    return text


def _host_name(text: str) -> str:
    """1-63 letters, digits, '.', '_' or '-', starting with a letter or digit; or empty."""
    if text and not _HOST_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(
            "must be 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return text


def host_name(text: str) -> str:
    """The check of ``--host-name`` for the other commands (tiny-admin backup): not empty."""
    if not text:
        raise argparse.ArgumentTypeError("must name the host")
    return _host_name(text)


def _boolean(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError("must be true or false (1/0, yes/no)")


_T = TypeVar("_T")


def _named(kind: Callable[[str], _T]) -> Callable[[str], _T]:
    """``kind`` of a value that must not be empty (an unset shell variable, ``TINY_DATA_DIR=``,
    would otherwise be the current directory, or every address)."""

    def convert(text: str) -> _T:
        if not text.strip():
            raise argparse.ArgumentTypeError("must not be empty")
        return kind(text)

    return convert


_port = _whole(0, 65535)
_processes = _whole(0, 1024)  # more worker processes than any host has cores is a mistake
_processes_per_lane = _whole(1, 1024)
_count = _whole(0, _MAX_COUNT)
_positive_count = _whole(1, _MAX_COUNT)
# below the keys one flush may commit, a flush would push out keys it is committing itself
_max_keys = _whole(limits.MAX_FLUSH_APPENDS, _MAX_COUNT, " (at least the keys one flush may commit)")
_max_days = _whole(1, 10_000)  # each day of a request is a file one flush holds open (tiny.descriptors)
_seconds = _decimal(_MIN_SECONDS, _MAX_SECONDS, "a number of seconds")
seconds = _seconds  # the same check for the other commands' seconds (tiny-admin, tiny-replay)
max_keys = _max_keys  # the same check for tiny-admin set-key-bounds
_stall_seconds = _decimal(_MIN_STALL_SECONDS, _MAX_SECONDS, "a number of seconds")
_cpus = _decimal(_MIN_CPUS, 1024, "a number of CPUs", zero="no quota")
_rate = _decimal(_MIN_RATE, 1_000_000, "a number per second", zero="no pacing")


# (flag, type, help); the default comes from Config, the environment overrides it. A flag
# without help is for the tests only and stays out of --help.
_FLAGS: list[tuple[str, Callable[[str], object], str | None]] = [
    ("port", _port, "TCP port to listen on"),
    ("address", _named(str), "address to bind"),
    ("processes", _processes, "worker processes; 0 = one per core"),
    (
        "cpu_affinity",
        _cpu_affinity,
        "pin each worker to one core: 'auto' (when there is a worker per usable core), 'none', or K "
        "(worker i on the (K+i)-th usable core, wrapping)",
    ),
    ("data_dir", _named(Path), "directory of the daily CSV files and rejects/"),
    ("durability", _one_of(*DURABILITIES), "acknowledge after write(2) ('write') or after fsync ('fsync')"),
    ("max_body", _size, "largest request body, compressed and decompressed (bytes, or 64MiB)"),
    (
        "token",
        str,
        "require 'Authorization: Bearer TOKEN' on every API request; unset = no auth. "
        "On the command line it shows in ps: prefer --token-file or TINY_TOKEN",
    ),
    ("token_file", Path, "a file whose content is the token (a Docker secret's path works)"),
    ("max_backlog", _size, "unwritten bytes per process before /ingest answers 503"),
    ("idle_timeout", _seconds, "seconds a connection may idle, take to send its headers, or leave an answer untaken"),
    ("body_timeout", _seconds, "seconds a client may take to send a request body"),
    ("drain_timeout", _seconds, "seconds SIGTERM waits for requests in flight before exiting"),
    ("max_days", _max_days, "distinct days one request may hold; records of further days are invalid"),
    ("max_rejects", _count, "invalid lines kept per request in rejects/; the rest are summarised"),
    ("max_connections", _count, "open connections per worker process; 0 = from the descriptor limit"),
    (
        "analytics_processes",
        _processes_per_lane,
        "analytics pool processes per worker and lane (answers: started with the worker; row reads: on the first)",
    ),
    ("analytics_nice", _niceness, "CPU priority of the analytics pool: 'idle' (SCHED_IDLE) or a nice value 0-19"),
    (
        "analytics_cpu",
        _cpus,
        "CPUs all analytics pool processes of the server may use together (a cgroup quota where one can be "
        "made), 0.01 or more; 0 = no quota",
    ),
    ("analytics_max_queued", _positive_count, "distinct analytics computations queued per worker before 503"),
    (
        "analytics_cache_bytes",
        _size,
        "every analytics cache of a worker and its pool processes together, in bytes (or 128MiB)",
    ),
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
        _one_of("wal", "delete"),
        "the journal's SQLite mode: 'wal' (one host), or 'delete' (writers on several hosts); every server "
        "on a data dir must use the same (tiny-admin set-journal-mode changes it)",
    ),
    (
        "lock_timeout",
        _seconds,
        "seconds a flush waits for the data dir's flush lock (another process holds it), in cluster mode for a "
        "PostgreSQL primary, before its requests get 503 with Retry-After",
    ),
    (
        "stall_timeout",
        _stall_seconds,
        "seconds a worker's event loop may stall (its disk thread: this plus --lock-timeout) before the "
        "parent kills and replaces it; at least 1",
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
    (
        "cluster",
        dsn.checked,
        "cluster mode: the PostgreSQL cluster that commits every batch for every host, as a libpq connection "
        "string naming every node with target_session_attrs=read-write (a password only in a passfile: "
        "passfile=PATH or PGPASSFILE); unset = this data dir's own journal, one host (docs/scaling-out.md)",
    ),
    ("role", _one_of(*ROLES), "cluster mode: 'ingest' (ingest and reads) or 'read' (reads only: /ingest gets 421)"),
    (
        "host_name",
        _host_name,
        "cluster mode: this host's follower name in the log, unique per host; empty = the hostname",
    ),
    (
        "read_wait",
        _seconds,
        "cluster mode: seconds a read waits for this host to apply the position it needs (Tiny-Wait-Position, "
        "or the log's head when the read began) before it gets 503 with Retry-After",
    ),
    (
        "follower_retention",
        _seconds,
        "cluster mode: seconds the log keeps batches for a host whose follower stopped reporting; past it that "
        "host needs a copy of a peer's data dir",
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
        default = environ.get(env_name(name), getattr(defaults, name))
        shown = "unset" if default is None or default == "" else default
        if name in _SECRET_VALUES and default:
            shown = "set, not shown"  # --help must never print a secret
        extra: dict[str, object] = {"nargs": "?", "const": True} if kind is _boolean else {}
        parser.add_argument(
            flag_name(name),
            dest=name,
            type=_naming(kind, name),
            default=default,
            help=f"{text} (env {env_name(name)}; default {shown})" if text else argparse.SUPPRESS,
            **extra,  # type: ignore[arg-type]
        )
    return parser


def flag_name(name: str) -> str:
    """The command-line flag of the Config field ``name``: ``--lock-timeout``."""
    return "--" + name.replace("_", "-")


def env_name(name: str) -> str:
    """The environment variable of the Config field ``name``: ``TINY_LOCK_TIMEOUT``."""
    return ENV_PREFIX + name.upper()


def _naming(kind: Callable[[str], object], name: str) -> Callable[[str], object]:
    """``kind`` whose refusal names the flag and its environment variable, and the value
    refused: argparse prefixes the flag only, and the value may have come from the environment."""

    def convert(text: str) -> object:
        try:
            return kind(text)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            where = f"{flag_name(name)} or {env_name(name)} in the environment"
            value = "the value given" if name in _SECRET_VALUES else _shown(text)
            raise argparse.ArgumentTypeError(f"{exc}, not {value} (from {where})") from None

    convert.__name__ = getattr(kind, "__name__", name)
    return convert


def parse(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Build the Config from command-line flags over TINY_* environment variables.

    Environment values go through the same conversion and checks as flags; a bad value
    exits (status 2) with argparse's usage error naming the flag, its environment variable
    and the value. Every number is checked against its flag's range: nan, infinities, signs,
    hex, "_" separators and digits of other scripts are refused.
    """
    parser = build_parser(environ)
    # argparse runs string defaults (our TINY_* values) through the flag's type too,
    # so a bad environment value fails here exactly like a bad flag.
    args = parser.parse_args(argv)
    values = {name: getattr(args, name) for name, _, _ in _FLAGS}
    for name, kind, _ in _FLAGS:  # a default from Config is not run through the flag's type
        if kind is _boolean:
            values[name] = _boolean(values[name])
    if values["no_fork"] and values["processes"] != 1:
        parser.error("argument --no-fork: needs --processes 1")
    _check_cluster(parser, values)
    argv = sys.argv[1:] if argv is None else argv
    on_command_line = any(arg == "--token" or arg.startswith("--token=") for arg in argv)
    values["token"], values["token_source"] = token_of(parser, args, on_command_line)
    return Config(**values)


def _check_cluster(parser: argparse.ArgumentParser, values: dict[str, object]) -> None:
    """The flags that only cluster mode takes, and those it refuses."""
    if not values["cluster"]:
        if values["role"] != "ingest":
            parser.error("argument --role: a host for reads only follows a cluster: give --cluster too")
        return
    if values["no_fork"]:
        parser.error("argument --no-fork: cluster mode runs its follower as a process of the server's parent")
    if values["new_journal"]:
        parser.error(
            "argument --new-journal: in cluster mode a data dir is rebuilt from the log or from a peer's copy "
            "(docs/scaling-out.md), never with a fresh journal over its files"
        )
    problem = dsn.passfile_problem(str(values["cluster"]), os.environ)
    if problem:
        parser.error(f"argument --cluster: {problem}")

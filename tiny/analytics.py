"""Download analytics over the day files ("whales"), computed in a process pool off the ingest path.

Who downloaded most on a day (the whales), how their traffic compares with everyone's hour by
hour, and what exactly one whale downloaded, like the cranwhales app, read from the day files
themselves so that every worker process and every container answers the same.

Processes. Each worker process creates, on its first analytics query, a
``ProcessPoolExecutor`` of ``TINY_ANALYTICS_PROCESSES`` (default 1) processes started with
"spawn" (nothing of the worker's event loop, sockets or locks is inherited). All parsing,
aggregation and chart drawing runs there; the worker only stats files and awaits small
results (dicts, lists, SVG bytes), so a query never blocks the event loop that serves
``/ingest``. Pool processes run at the lowest CPU priority, ``SCHED_IDLE``
(``TINY_ANALYTICS_NICE=idle``, the default; or a nice value such as 10), with polars on
``TINY_ANALYTICS_THREADS`` (default 1) threads, so the ingest workers always win the CPU;
each one exits when its worker process is gone. :func:`shutdown` stops the pool. At most
``TINY_ANALYTICS_MAX_QUEUED`` (default 32) distinct computations wait per worker: past that a
query is refused (Busy, a 503) rather than queued without bound.

Caching. A day file only grows (the sink appends under flock; a failed flush may cut it back),
so ``(path, size, mtime_ns)`` names one version of it. The worker keeps an LRU of the last
``_CACHE_DAYS`` day files, each with the results computed for its current version; a new
version drops them. Concurrent identical queries share one computation. The pool process
keeps the parsed frame and the aggregate of its last ``_FRAME_CACHE`` file versions.

Reading a file that is being appended to: the pool reads exactly the first ``size`` bytes
(the stat the key came from) and ignores a last line without its LF (a write in progress).

Engine: polars reads the day CSV with quote processing off (bare ``NA`` is missing, a quoted
``"NA"`` stays the string NA, e.g. Namibia's country code) and unquotes the strings itself;
a file whose strings hold commas falls back to the exact pure-Python parser
(:func:`tiny.cranlog.parse_row`). bench/analytics_bench.py measured polars against the
pure-Python reader (see BENCHMARKS.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import io
import logging
import multiprocessing
import os
import re
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from datetime import date as Date
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported lazily in the pool process only: workers never load them
    import polars as pl
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

log = logging.getLogger("tiny.analytics")

DEFAULT_TOP = 6
MAX_TOP = 100  # the aggregate of a day holds this many whales; any top N <= MAX_TOP is derived from it
DEFAULT_LIMIT = 1000
MAX_LIMIT = 100_000
HOURS = 24
CHART_VIEWS = ("traffic", "whales", "hourly", "detail")
_DAY_FILE = re.compile(r"^(\d{4}-\d{2}-\d{2})\.csv$")
_CACHE_DAYS = 4  # day files whose results a worker keeps
_CACHE_RESULTS = 64  # results kept per day file (charts and downloads per N / ip_id)
_FRAME_CACHE = 2  # parsed day files a pool process keeps
_MAX_QUEUED = 32  # distinct computations queued per worker before 503 (TINY_ANALYTICS_MAX_QUEUED)
_DETAIL_PACKAGES = 30  # packages named on the detail chart's y axis; the rest are "other"
_PARENT_POLL_SECONDS = 1.0

# fmt: off
_ADJECTIVES = (
    "agile", "amber", "ancient", "breezy", "bold", "brave", "bright", "brisk", "bubbly", "calm",
    "candid", "cheerful", "chilly", "clever", "cloudy", "colossal", "cosmic", "cozy", "crimson", "crisp",
    "curious", "curly", "daring", "dapper", "dazzling", "eager", "early", "electric", "elegant", "emerald",
    "fancy", "fearless", "feisty", "fierce", "fluffy", "flying", "foggy", "frosty", "fuzzy", "gentle",
    "giant", "giddy", "gleaming", "golden", "graceful", "grumpy", "happy", "hasty", "hidden", "humble",
    "hungry", "icy", "jolly", "jumpy", "keen", "kind", "lively", "lucky", "lunar", "majestic",
    "merry", "mighty", "misty", "modest", "nimble", "noble", "odd", "patient", "peppy", "plucky",
    "polite", "proud", "quick", "quiet", "quirky", "rapid", "relieved", "restless", "rosy", "rusty",
    "salty", "sandy", "serene", "shiny", "shy", "silent", "silly", "silver", "sleepy", "slick",
    "snowy", "solar", "sparkly", "speedy", "spicy", "spotted", "steady", "stormy", "striped", "sunny",
    "swift", "tidy", "tiny", "tireless", "velvet", "vivid", "wandering", "wild", "windy", "wise",
    "witty", "zany", "zesty", "freezing", "jazzy", "lofty", "mellow", "nifty", "perky", "rowdy",
)
_ANIMALS = (
    "aardvark", "albatross", "alpaca", "antelope", "armadillo", "badger", "barracuda", "beaver", "bison", "bobcat",
    "buffalo", "camel", "capybara", "caribou", "cheetah", "chicken", "chinchilla", "cobra", "condor", "cougar",
    "coyote", "crane", "cricket", "dingo", "dolphin", "donkey", "dove", "dragonfly", "eagle", "eel",
    "elephant", "elk", "falcon", "ferret", "finch", "flamingo", "fox", "frog", "gazelle", "gecko",
    "gerbil", "giraffe", "gnu", "goat", "gopher", "gorilla", "grouse", "hamster", "hare", "hedgehog",
    "heron", "hippo", "hornet", "hyena", "ibex", "iguana", "impala", "jackal", "jaguar", "jellyfish",
    "kangaroo", "kiwi", "koala", "lemur", "leopard", "lion", "llama", "lobster", "lynx", "magpie",
    "manatee", "marmot", "meerkat", "mole", "mongoose", "moose", "narwhal", "newt", "ocelot", "octopus",
    "okapi", "orca", "ostrich", "otter", "owl", "panda", "panther", "parrot", "pelican", "penguin",
    "pony", "porcupine", "puffin", "puma", "quail", "rabbit", "raccoon", "raven", "reindeer", "salamander",
    "seal", "shark", "sloth", "snake", "sparrow", "squid", "squirrel", "stork", "swan", "tapir",
    "tiger", "toucan", "turtle", "urchin", "vulture", "walrus", "weasel", "whale", "wombat", "zebra",
)
# fmt: on


class DayNotFound(LookupError):
    """No day file for the date (answered 404)."""


class WhaleNotFound(LookupError):
    """The ip_id downloaded nothing on that day (answered 404)."""


class Busy(RuntimeError):
    """Too many computations queued in this worker, or the pool process died (answered 503)."""


def whale_name(date: str, ip_id: int) -> str:
    """A stable, memorable ``adjective_animal`` name for an ip_id on a date.

    A hash of ``"<date>/<ip_id>"`` (blake2b, not Python's salted ``hash``), so every process
    and every run gives the same name. Names are not unique: two ip_ids of a day may share one.
    """
    digest = int.from_bytes(hashlib.blake2b(f"{date}/{ip_id}".encode(), digest_size=8).digest(), "big")
    adjective = _ADJECTIVES[digest % len(_ADJECTIVES)]
    animal = _ANIMALS[(digest // len(_ADJECTIVES)) % len(_ANIMALS)]
    return f"{adjective}_{animal}"


def parse_date(text: str) -> str:
    """``text`` if it is a real calendar date ``YYYY-MM-DD``; ValueError otherwise."""
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
        raise ValueError(f"not a date YYYY-MM-DD: {text!r}")
    Date.fromisoformat(text)  # ValueError for 2014-02-30 and year 0000
    return text


@dataclass(frozen=True)
class DayFile:
    """One version of a day file: what a cached result is keyed on."""

    date: str
    path: str
    size: int
    mtime_ns: int

    @property
    def version(self) -> tuple[int, int]:
        return (self.size, self.mtime_ns)


def stat_day(data_dir: Path, date: str) -> DayFile:
    """The current version of ``data_dir/<date>.csv``; DayNotFound if there is none."""
    path = data_dir / f"{date}.csv"
    try:
        st = path.stat()
    except FileNotFoundError:
        raise DayNotFound(date) from None
    return DayFile(date, str(path), st.st_size, st.st_mtime_ns)


def list_days(data_dir: Path) -> list[DayFile]:
    """Every day file in ``data_dir``, oldest date first."""
    days = []
    try:
        entries = list(os.scandir(data_dir))
    except FileNotFoundError:
        return []
    for entry in entries:
        match = _DAY_FILE.match(entry.name)
        if match and entry.is_file():
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue
            days.append(DayFile(match.group(1), entry.path, st.st_size, st.st_mtime_ns))
    return sorted(days, key=lambda day: day.date)


# --------------------------------------------------------------------------------------------
# The worker side: cache, single flight, the pool.

_pool: concurrent.futures.ProcessPoolExecutor | None = None
_pool_pid = 0
_closed_pid = 0  # the process whose pool was shut down: no new pool there


def _executor() -> concurrent.futures.ProcessPoolExecutor:
    """This process's pool, created on first use (after the fork: one per worker process)."""
    global _pool, _pool_pid
    if _closed_pid == os.getpid():
        raise Busy("the server is shutting down")
    if _pool is None or _pool_pid != os.getpid():
        processes = int(os.environ.get("TINY_ANALYTICS_PROCESSES", "1"))
        threads = int(os.environ.get("TINY_ANALYTICS_THREADS", "1"))
        niceness = os.environ.get("TINY_ANALYTICS_NICE", "idle")
        _pool = concurrent.futures.ProcessPoolExecutor(
            max_workers=processes,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_pool_init,
            initargs=(os.getpid(), threads, niceness),
        )
        _pool_pid = os.getpid()
        log.info("analytics pool started: %d process(es), %d polars thread(s), nice %s", processes, threads, niceness)
    return _pool


def _replace_broken(broken: concurrent.futures.ProcessPoolExecutor | None) -> None:
    """Forget a pool whose process died (killed, out of memory): the next query starts a new one."""
    global _pool
    if broken is not None and _pool is broken:
        log.error("the analytics process died; starting a new one")
        _pool = None
        broken.shutdown(wait=False, cancel_futures=True)


def shutdown() -> None:
    """Stop this process's pool, if any: queued work is cancelled, running work is killed.

    Call once at worker shutdown (tiny.server, after the sink is closed). Does not block.
    """
    global _pool, _closed_pid
    pool, _pool, _closed_pid = _pool, None, os.getpid()
    if pool is None or _pool_pid != os.getpid():
        return
    pool.shutdown(wait=False, cancel_futures=True)
    # An idle pool process exits on the shutdown sentinel; a busy one would first finish its
    # query (up to seconds), which the interpreter's exit would wait for. Nothing it computes
    # is needed any more, so stop it now. (_processes: the executor has no public handle.)
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        if process.is_alive():
            process.terminate()


_MISSING = object()


class _DayResults:
    """The results computed for one version of one day file, least recently used first."""

    def __init__(self, version: tuple[int, int]) -> None:
        self.version = version
        self.results: OrderedDict[tuple[Any, ...], Any] = OrderedDict()


class Analytics:
    """The analytics of one worker process: queries in, small results out, cached per day file.

    Every public method stats the day file (DayNotFound if absent), answers from the cache
    when that version was computed already, and otherwise awaits the pool, never blocking
    the event loop. Busy when ``max_queued`` distinct computations are queued already.
    """

    def __init__(self, data_dir: Path, max_queued: int | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.max_queued = max_queued or int(os.environ.get("TINY_ANALYTICS_MAX_QUEUED", _MAX_QUEUED))
        self._cache: OrderedDict[str, _DayResults] = OrderedDict()
        self._pending: dict[tuple[Any, ...], asyncio.Future[Any]] = {}

    async def days(self) -> list[dict[str, Any]]:
        """``[{"date", "rows", "bytes"}, ...]`` for every day file, oldest first.

        Rows known for a file's current version come from the cache; the others are counted
        in one pool job (however many days there are).
        """
        days = list_days(self.data_dir)
        rows = {day.path: self._known_rows(day) for day in days}
        missing = tuple(day for day in days if rows[day.path] is None)
        if missing:

            def store(counts: list[int]) -> None:
                for day, count in zip(missing, counts, strict=True):
                    self._store(day, ("rows",), count)

            key = ("rows", tuple((day.path, day.version) for day in missing))
            counts = await self._run(key, store, _pool_count_rows, missing)
            rows.update((day.path, count) for day, count in zip(missing, counts, strict=True))
        return [{"date": day.date, "rows": rows[day.path], "bytes": day.size} for day in days]

    async def summary(self, date: str, top: int) -> dict[str, Any]:
        """Totals, distinct downloaders, and downloads per hour of all traffic vs the top N whales."""
        aggregate = await self._aggregate(date)
        whales = aggregate["whales"][:top]
        hourly_whales = [sum(whale["hourly"][hour] for whale in whales) for hour in range(HOURS)]
        return {
            "date": date,
            "top": top,
            "downloads": aggregate["downloads"],
            "bytes": aggregate["bytes"],
            "downloaders": aggregate["downloaders"],
            "whale_downloads": sum(whale["downloads"] for whale in whales),
            "hourly": [
                {"hour": hour, "all": aggregate["hourly"][hour], "whales": hourly_whales[hour]} for hour in range(HOURS)
            ],
        }

    async def whales(self, date: str, top: int) -> dict[str, Any]:
        """The top N whales: ip_id, name, country, downloads, bytes; most downloads first."""
        aggregate = await self._aggregate(date)
        fields = ("ip_id", "name", "country", "downloads", "bytes")
        return {"date": date, "top": top, "whales": [{k: w[k] for k in fields} for w in aggregate["whales"][:top]]}

    async def hourly(self, date: str, top: int) -> dict[str, Any]:
        """Downloads per hour (24 numbers) of each of the top N whales."""
        aggregate = await self._aggregate(date)
        fields = ("ip_id", "name", "country", "downloads", "hourly")
        return {"date": date, "top": top, "whales": [{k: w[k] for k in fields} for w in aggregate["whales"][:top]]}

    async def downloads(self, date: str, ip_id: int, limit: int) -> dict[str, Any]:
        """One ip_id's downloads of the day in time order (the first ``limit``); WhaleNotFound if none."""
        day = stat_day(self.data_dir, date)
        result = await self._cached(day, ("downloads", ip_id, limit), _pool_downloads, day, ip_id, limit)
        if result is None:
            raise WhaleNotFound(ip_id)
        return dict(result)

    async def chart(self, date: str, view: str, top: int, ip_id: int | None = None) -> bytes:
        """One dashboard view as SVG (see CHART_VIEWS); ``detail`` shows ``ip_id`` (default: the top whale)."""
        if view not in CHART_VIEWS:
            raise ValueError(f"unknown chart {view!r}")
        day = stat_day(self.data_dir, date)
        if view == "detail" and ip_id is None:
            whales = (await self._aggregate(date))["whales"]
            if not whales:
                raise WhaleNotFound(0)
            ip_id = whales[0]["ip_id"]
        query = ("chart", view, top if view != "detail" else 0, ip_id if view == "detail" else 0)
        svg = await self._cached(day, query, _pool_chart, day, view, top, ip_id)
        if svg is None:
            raise WhaleNotFound(ip_id)
        return bytes(svg)

    async def _aggregate(self, date: str) -> dict[str, Any]:
        day = stat_day(self.data_dir, date)
        result: dict[str, Any] = await self._cached(day, ("aggregate",), _pool_aggregate, day)
        return result

    def _known_rows(self, day: DayFile) -> int | None:
        for query in (("aggregate",), ("rows",)):
            found = self._lookup(day, query)
            if found is not _MISSING:
                return int(found["downloads"] if query == ("aggregate",) else found)
        return None

    async def _cached(self, day: DayFile, query: tuple[Any, ...], func: Callable[..., Any], *args: Any) -> Any:
        """``func(*args)`` in the pool, or its cached result for this version of the day file."""
        found = self._lookup(day, query)
        if found is not _MISSING:
            return found
        key = (day.path, day.version, query)
        return await self._run(key, lambda result: self._store(day, query, result), func, *args)

    async def _run(
        self, key: tuple[Any, ...], store: Callable[[Any], None], func: Callable[..., Any], *args: Any
    ) -> Any:
        """``func(*args)`` in the pool, once for all concurrent callers with the same ``key``;
        ``store`` gets the result as soon as it is there (even if every caller went away)."""
        future = self._pending.get(key)
        if future is None:
            if len(self._pending) >= self.max_queued:
                raise Busy(f"{len(self._pending)} analytics queries are queued")
            pool = _executor()
            try:
                future = asyncio.get_running_loop().run_in_executor(pool, func, *args)
            except BrokenProcessPool:  # its process died since the last query
                _replace_broken(pool)
                raise Busy("the analytics process died; it is being restarted") from None
            self._pending[key] = future
            future.add_done_callback(lambda done: self._settle(key, store, pool, done))
        try:
            # shield: a client that goes away does not cancel a computation others may await
            return await asyncio.shield(future)
        except BrokenProcessPool:
            raise Busy("the analytics process died; it is being restarted") from None

    def _settle(
        self,
        key: tuple[Any, ...],
        store: Callable[[Any], None],
        pool: concurrent.futures.ProcessPoolExecutor,
        done: asyncio.Future[Any],
    ) -> None:
        self._pending.pop(key, None)
        if done.cancelled():
            return
        error = done.exception()
        if isinstance(error, BrokenProcessPool):
            _replace_broken(pool)
        elif error is None:
            store(done.result())

    def _lookup(self, day: DayFile, query: tuple[Any, ...]) -> Any:
        entry = self._cache.get(day.path)
        if entry is None or entry.version != day.version or query not in entry.results:
            return _MISSING
        self._cache.move_to_end(day.path)
        entry.results.move_to_end(query)
        return entry.results[query]

    def _store(self, day: DayFile, query: tuple[Any, ...], result: Any) -> None:
        entry = self._cache.get(day.path)
        if entry is None or entry.version != day.version:
            entry = self._cache[day.path] = _DayResults(day.version)  # a new version drops the old results
        entry.results[query] = result
        while len(entry.results) > _CACHE_RESULTS:
            entry.results.popitem(last=False)
        self._cache.move_to_end(day.path)
        while len(self._cache) > _CACHE_DAYS:
            self._cache.popitem(last=False)


# --------------------------------------------------------------------------------------------
# The pool side: everything below runs in the analytics process.

_frames: OrderedDict[tuple[str, int, int], Any] = OrderedDict()
_counted: dict[str, tuple[int, int, bytes]] = {}  # path -> (bytes counted, LFs in them, their last _TAIL bytes)
_TAIL = 256
_aggregates: OrderedDict[tuple[str, int, int], dict[str, Any]] = OrderedDict()
_STRING_COLUMNS = ("time", "package", "version", "country")
_USED_COLUMNS = ("time", "size", "package", "version", "country", "ip_id")


def _pool_init(parent: int, threads: int, niceness: str) -> None:
    """Runs first in each pool process: threads, priority, signals, and the parent watch."""
    os.environ["POLARS_MAX_THREADS"] = str(threads)  # read when polars is first imported
    os.environ.setdefault("MPLBACKEND", "Agg")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group; the worker decides
    if niceness == "idle":
        # SCHED_IDLE: this process runs only when no normal task wants the CPU, and a waking
        # ingest worker preempts it at once (a nice 10 task still gets ~10% and a time slice).
        os.nice(19)
        with contextlib.suppress(OSError):  # a seccomp profile may refuse it: nice 19 is close
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    elif int(niceness):
        os.nice(int(niceness))
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="parent-watch").start()


def _watch_parent(parent: int) -> None:
    # A worker killed with -9 cannot stop its pool: the pool process notices and exits.
    while os.getppid() == parent:
        time.sleep(_PARENT_POLL_SECONDS)
    os._exit(0)


def read_complete_lines(path: str, size: int) -> bytes:
    """The first ``size`` bytes of ``path`` up to and including the last LF among them."""
    with open(path, "rb") as handle:
        data = handle.read(size)
    return data[: data.rfind(b"\n") + 1]


def count_rows(path: str, size: int) -> int:
    """Rows (complete lines after the header) among the first ``size`` bytes of a day file.

    Incremental: a file that grew since the last count in this process is counted from where
    that count stopped, if the bytes just before that point are still the same (a flush the
    sink cut back and rewrote differently gets a full recount).
    """
    known = _counted.pop(path, None)
    start, lines, tail = 0, 0, b""
    with open(path, "rb") as handle:
        if known is not None and known[0] <= size:
            handle.seek(known[0] - len(known[2]))
            if handle.read(len(known[2])) == known[2]:
                start, lines, tail = known
        handle.seek(start)
        left = size - start
        while left > 0:
            chunk = handle.read(min(left, 1 << 20))
            if not chunk:
                break
            lines += chunk.count(b"\n")
            left -= len(chunk)
            tail = (tail + chunk)[-_TAIL:]
    _counted[path] = (size - left, lines, tail)
    while len(_counted) > 64:
        del _counted[next(iter(_counted))]
    return max(lines - 1, 0)


def _schema() -> dict[str, Any]:
    import polars as pl

    return {
        "date": pl.String,
        "time": pl.String,
        "size": pl.UInt64,
        "r_version": pl.String,
        "r_arch": pl.String,
        "r_os": pl.String,
        "package": pl.String,
        "version": pl.String,
        "country": pl.String,
        "ip_id": pl.UInt64,
    }


def parse_fast(data: bytes) -> pl.DataFrame:
    """Parse day-file bytes with polars, quote processing off (bare NA = null, "NA" = "NA").

    Raises polars' ComputeError when a string holds a comma (the row has too many fields).
    """
    import polars as pl

    frame = pl.read_csv(
        data,
        has_header=False,
        skip_rows=1,
        schema=_schema(),
        quote_char=None,
        null_values="NA",
        columns=[list(_schema()).index(c) for c in _USED_COLUMNS],
    )
    unquote = [
        pl.col(c).str.strip_prefix('"').str.strip_suffix('"').str.replace_all('""', '"', literal=True)
        for c in _STRING_COLUMNS
    ]
    return frame.with_columns(unquote)


def parse_exact(data: bytes) -> pl.DataFrame:
    """Parse day-file bytes row by row with tiny.cranlog.parse_row (any valid CSV; slow)."""
    import polars as pl

    from tiny.cranlog import parse_row

    columns: dict[str, list[Any]] = {c: [] for c in _USED_COLUMNS}
    for line in data.decode("utf-8", "replace").split("\n")[1:]:
        try:
            row = parse_row(line)
        except ValueError:
            continue  # the empty string after the last LF, or a line that is not a row
        if isinstance(row["size"], int) and isinstance(row["ip_id"], int):
            for c in _USED_COLUMNS:
                columns[c].append(row[c])
    schema = _schema()
    return pl.DataFrame(columns, schema={c: schema[c] for c in _USED_COLUMNS})


def _frame(day: DayFile) -> pl.DataFrame:
    """The parsed day file (cached per version), with an ``hour`` column."""
    import polars as pl

    key = (day.path, day.size, day.mtime_ns)
    frame = _frames.get(key)
    if frame is not None:
        _frames.move_to_end(key)
        return frame
    data = read_complete_lines(day.path, day.size)
    try:
        has_rows = data.find(b"\n", data.find(b"\n") + 1) != -1  # a header and at least one row
        frame = parse_fast(data) if has_rows else parse_exact(data)
    except pl.exceptions.PolarsError:
        frame = parse_exact(data)
    frame = frame.with_columns(hour=pl.col("time").str.slice(0, 2).cast(pl.Int32, strict=False))
    _frames[key] = frame
    while len(_frames) > _FRAME_CACHE:
        _frames.popitem(last=False)
    return frame


def aggregate_frame(frame: pl.DataFrame, date: str) -> dict[str, Any]:
    """Totals, hourly counts and the top MAX_TOP whales (with their hourly counts) of a day.

    Whales: most downloads first, ties by smaller ip_id; country is the whale's most frequent
    non-missing country (ties: alphabetical first), None when it never had one.
    """
    import polars as pl

    per_ip = frame.group_by("ip_id").agg(downloads=pl.len(), bytes=pl.col("size").sum())
    top = per_ip.sort(["downloads", "ip_id"], descending=[True, False]).head(MAX_TOP)
    ids = top["ip_id"].to_list()
    mine = frame.filter(pl.col("ip_id").is_in(ids))
    countries = (
        mine.drop_nulls("country")
        .group_by(["ip_id", "country"])
        .len()
        .sort(["ip_id", "len", "country"], descending=[False, True, False])
        .group_by("ip_id", maintain_order=True)
        .first()
    )
    country = dict(zip(countries["ip_id"].to_list(), countries["country"].to_list(), strict=True))
    hourly: dict[int, list[int]] = {ip: [0] * HOURS for ip in ids}
    for ip, hour, n in mine.drop_nulls("hour").group_by(["ip_id", "hour"]).len().iter_rows():
        if 0 <= hour < HOURS:
            hourly[ip][hour] = n
    hourly_all = [0] * HOURS
    for hour, n in frame.drop_nulls("hour").group_by("hour").len().iter_rows():
        if 0 <= hour < HOURS:
            hourly_all[hour] = n
    whales = [
        {
            "ip_id": ip,
            "name": whale_name(date, ip),
            "country": country.get(ip),
            "downloads": n,
            "bytes": int(size or 0),
            "hourly": hourly[ip],
        }
        for ip, n, size in top.select("ip_id", "downloads", "bytes").iter_rows()
    ]
    return {
        "downloads": frame.height,
        "bytes": int(frame["size"].sum() or 0),
        "downloaders": frame["ip_id"].n_unique(),
        "hourly": hourly_all,
        "whales": whales,
    }


def whale_downloads(frame: pl.DataFrame, date: str, ip_id: int, limit: int) -> dict[str, Any] | None:
    """One ip_id's downloads in time order (file order within a second), the first ``limit``."""
    import polars as pl

    mine = frame.filter(pl.col("ip_id") == ip_id)
    if mine.height == 0:
        return None
    ordered = mine.sort("time", maintain_order=True)
    countries = mine["country"].drop_nulls().value_counts().sort(["count", "country"], descending=[True, False])
    return {
        "date": date,
        "ip_id": ip_id,
        "name": whale_name(date, ip_id),
        "country": countries["country"][0] if countries.height else None,
        "total": mine.height,
        "bytes": int(mine["size"].sum() or 0),
        "packages": mine["package"].n_unique(),
        "limit": limit,
        "truncated": mine.height > limit,
        "downloads": ordered.head(limit).select("time", "package", "version", "size").to_dicts(),
    }


def _day_aggregate(day: DayFile) -> dict[str, Any]:
    key = (day.path, day.size, day.mtime_ns)
    aggregate = _aggregates.get(key)
    if aggregate is None:
        aggregate = _aggregates[key] = aggregate_frame(_frame(day), day.date)
        while len(_aggregates) > _FRAME_CACHE * 2:
            _aggregates.popitem(last=False)
    return aggregate


def _pool_count_rows(days: tuple[DayFile, ...]) -> list[int]:
    return [count_rows(day.path, day.size) for day in days]


def _pool_aggregate(day: DayFile) -> dict[str, Any]:
    return _day_aggregate(day)


def _pool_downloads(day: DayFile, ip_id: int, limit: int) -> dict[str, Any] | None:
    return whale_downloads(_frame(day), day.date, ip_id, limit)


def _pool_chart(day: DayFile, view: str, top: int, ip_id: int | None) -> bytes | None:
    aggregate = _day_aggregate(day)
    whales = aggregate["whales"][:top]
    if view == "traffic":
        return render_traffic(day.date, aggregate, whales)
    if view == "whales":
        return render_whales(day.date, whales)
    if view == "hourly":
        return render_hourly(day.date, whales)
    assert view == "detail" and ip_id is not None
    return render_detail(day.date, _frame(day), ip_id)


# --------------------------------------------------------------------------------------------
# Charts (matplotlib, SVG, in the pool process). Element ids (gid) name what tests count.

_WHALE_COLOR = "#e4572e"
_OTHER_COLOR = "#9cc3e6"
_INK = "#333333"


def _figure(width: float, height: float) -> Figure:
    import matplotlib

    matplotlib.rcParams.update(
        {
            "svg.fonttype": "none",  # text stays text: small files, selectable, searchable
            "svg.hashsalt": "tiny",  # deterministic element ids
            "font.size": 10,
            "axes.edgecolor": "#999999",
            "axes.labelcolor": _INK,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "xtick.color": _INK,
            "ytick.color": _INK,
        }
    )
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _svg(figure: Figure) -> bytes:
    out = io.BytesIO()
    figure.savefig(out, format="svg", metadata={"Date": None}, dpi=150)  # dpi: of rasterized parts only
    return out.getvalue()


def _label(whale: dict[str, Any]) -> str:
    return f"{whale['name']} ({whale['country'] or '??'})"


def _hour_axis(axes: Axes) -> None:
    axes.set_xlim(-0.6, HOURS - 0.4)
    axes.set_xticks(range(0, HOURS, 3))


def render_traffic(date: str, aggregate: dict[str, Any], whales: list[dict[str, Any]]) -> bytes:
    """Downloads per hour, stacked: the top whales below, everyone else above."""
    hours = range(HOURS)
    whale_counts = [sum(w["hourly"][h] for w in whales) for h in hours]
    others = [aggregate["hourly"][h] - whale_counts[h] for h in hours]
    figure = _figure(9.0, 4.2)
    axes = figure.add_subplot()
    bottom = axes.bar(hours, whale_counts, color=_WHALE_COLOR, label=f"top {len(whales)} whales")
    top = axes.bar(hours, others, bottom=whale_counts, color=_OTHER_COLOR, label="everyone else")
    for h in hours:
        bottom.patches[h].set_gid(f"traffic-whales-{h}")
        top.patches[h].set_gid(f"traffic-others-{h}")
    _hour_axis(axes)
    share = sum(whale_counts) / max(aggregate["downloads"], 1)
    axes.set_title(f"All traffic by hour (UTC), {date}: top {len(whales)} whales made {share:.0%}", loc="left")
    axes.set_xlabel("hour of day (UTC)")
    axes.set_ylabel("downloads")
    axes.legend(frameon=False, loc="upper left", ncols=2)
    return _svg(figure)


def render_whales(date: str, whales: list[dict[str, Any]]) -> bytes:
    """Horizontal bars: downloads per whale, the biggest on top."""
    figure = _figure(6.0, 1.0 + 0.3 * max(len(whales), 3))
    axes = figure.add_subplot()
    labels = [_label(w) for w in whales]
    bars = axes.barh(range(len(whales)), [w["downloads"] for w in whales], color=_WHALE_COLOR)
    for i, bar in enumerate(bars.patches):
        bar.set_gid(f"whale-bar-{i}")
    axes.bar_label(bars, labels=[f"{w['downloads']:,}" for w in whales], padding=3, fontsize=8, color=_INK)
    axes.set_yticks(range(len(whales)), labels)
    axes.invert_yaxis()
    axes.set_xlabel("downloads")
    axes.set_title(f"Biggest whales, {date}", loc="left")
    axes.margins(x=0.12)
    return _svg(figure)


def render_hourly(date: str, whales: list[dict[str, Any]]) -> bytes:
    """Each whale's downloads per hour: small multiples up to 12 whales, a heatmap beyond."""
    if len(whales) > 12:
        return _render_heatmap(date, whales)
    columns = 3 if len(whales) <= 9 else 4
    rows = max(1, -(-len(whales) // columns))
    figure = _figure(13.0, 0.5 + 1.6 * rows)
    grid = figure.subplots(rows, columns, sharex=True, sharey=True, squeeze=False)
    for i, axes in enumerate(grid.flat):
        if i >= len(whales):
            axes.set_visible(False)
            continue
        axes.set_gid(f"whale-panel-{i}")
        axes.bar(range(HOURS), whales[i]["hourly"], color=_WHALE_COLOR, width=0.85)
        axes.set_title(_label(whales[i]), fontsize=9, loc="left")
        _hour_axis(axes)
    figure.suptitle(f"Whales by hour (UTC), {date}", x=0.01, ha="left")
    return _svg(figure)


def _render_heatmap(date: str, whales: list[dict[str, Any]]) -> bytes:
    figure = _figure(13.0, 1.0 + 0.2 * len(whales))
    axes = figure.add_subplot()
    image = axes.imshow([w["hourly"] for w in whales], aspect="auto", cmap="Oranges", interpolation="nearest")
    image.set_gid("whale-heatmap")
    axes.set_yticks(range(len(whales)), [_label(w) for w in whales], fontsize=7)
    axes.set_xticks(range(0, HOURS, 3))
    axes.set_xlabel("hour of day (UTC)")
    axes.set_title(f"Whales by hour (UTC), {date}", loc="left")
    figure.colorbar(image, ax=axes, label="downloads")
    return _svg(figure)


def _clock(start: int) -> pl.Expr:
    """Hours, minutes or seconds (at ``start``) of the HH:MM:SS time column, as integers."""
    import polars as pl

    return pl.col("time").str.slice(start, 2).cast(pl.Int64, strict=False)


def _time_axis(axes: Axes, first: float, last: float) -> None:
    """The detail chart's x axis: the span the whale was active in (hours of day), as HH:MM."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    pad = max((last - first) * 0.03, 1 / 60)
    axes.set_xlim(max(first - pad, 0), min(last + pad, HOURS))
    axes.xaxis.set_major_locator(MaxNLocator(nbins=8, steps=[1, 2, 2.5, 5, 10]))
    axes.xaxis.set_major_formatter(FuncFormatter(lambda h, _: f"{int(h):02d}:{round(h % 1 * 60) % 60:02d}"))


def render_detail(date: str, frame: pl.DataFrame, ip_id: int) -> bytes | None:
    """One ip_id's downloads: time of day x package (its most downloaded packages by name)."""
    import polars as pl

    mine = frame.filter(pl.col("ip_id") == ip_id).drop_nulls("hour")
    if mine.height == 0:
        return None
    packages = mine["package"].fill_null("NA")
    counts = packages.value_counts().sort(["count", "package"], descending=[True, False])
    named = counts["package"].head(_DETAIL_PACKAGES).to_list()
    more = counts.height - len(named)
    # bottom to top: "other" last in the list read from the top, then packages by name
    order = ([f"({more} other packages)"] if more else []) + sorted(named, key=str.lower, reverse=True)
    rows = {package: i for i, package in enumerate(order)}
    x = mine.select((_clock(0) * 3600 + _clock(3) * 60 + _clock(6)) / 3600).to_series().fill_null(0.0).to_list()
    y = [rows.get(p, 0) for p in packages.to_list()]
    figure = _figure(9.0, 1.2 + 0.2 * len(order))
    axes = figure.add_subplot()
    # rasterized: thousands of points stay one embedded image instead of an element each
    points = axes.scatter(x, y, s=40, marker="|", color=_WHALE_COLOR, alpha=0.7, linewidths=1.2, rasterized=True)
    points.set_gid("detail-points")
    axes.set_yticks(range(len(order)), order, fontsize=8)
    axes.set_ylim(-0.7, len(order) - 0.3)
    _time_axis(axes, min(x), max(x))
    axes.set_xlabel("time of day (UTC)")
    name = whale_name(date, ip_id)
    title = f"{name} (ip_id {ip_id}), {date}: {mine.height:,} downloads of {counts.height:,} packages"
    axes.set_title(title, loc="left")
    axes.grid(axis="y", color="#eeeeee")
    return _svg(figure)

"""Sink microbenchmark: blocking writes vs aiofiles vs a thread pool, in one process.

Usage:
    python bench/sink_bench.py [--quick] [--json bench/results/sink.json] [--clients 8]
                               [--appends 150] [--chunk-kib 120] [--work-us 300] [--repeats 3]

``clients`` coroutines stand for concurrent requests on one event loop: each burns
``work-us`` of CPU on the loop (the codec and HTTP work of a request), then appends one chunk
(``chunk-kib``, about the CSV of a 1,600-record request) to the same day file and waits until
it is written, ``appends`` times. Every strategy keeps the app's file semantics: an
``O_APPEND`` descriptor, an exclusive ``flock`` around one write of the chunk.

- ``blocking``: open, flock, write, close on the event loop (what the seed did).
- ``aiofiles``: ``aiofiles.open(path, "ab")`` and ``await f.write(...)``, flock through the
  same default executor, behind an asyncio.Lock per file (without it, a blocking flock on the
  loop, or more waiters than executor threads, deadlocks). Four thread hops per append.
- ``thread``: the blocking append as one ``run_in_executor`` call on a ThreadPoolExecutor(1).
- ``group-commit``: the app's own tiny.sink.DailyFileSink (ThreadPoolExecutor(1); appends
  that arrive during a flush go out together in the next one, one write per file).

Each runs with ``write`` and ``fsync`` durability (fsync of the file before the append
counts as done), ``repeats`` times interleaved; the medians are kept. Measured: appends/s,
MB/s, process CPU-seconds, append latency p50/p99, and the event loop's lag (how late a 1 ms
ticker wakes up: what every other request on the loop waits). A blocking append never lets
the loop run while it writes, so its own latency looks small while every other request
waits: read its loop lag. The day file is checked (size and line count) after every run.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiofiles

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tiny.commit.local import LocalCommit  # noqa: E402
from tiny.sink import DailyFileSink  # noqa: E402

Append = Callable[[bytes], Awaitable[None]]
STRATEGIES = ("blocking", "aiofiles", "thread", "group-commit")
_LINE = b'"2014-05-04","00:50:55",695181,"3.0.2","x86_64","linux-gnu","caret","6.0-24","MX",1\n'


def _locked_append(path: Path, data: bytes, fsync: bool) -> None:
    """One append with the app's semantics: O_APPEND, exclusive flock, one write, close."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)  # releases the flock


def _blocking(path: Path, fsync: bool) -> tuple[Append, Callable[[], Awaitable[None]]]:
    async def append(data: bytes) -> None:
        _locked_append(path, data, fsync)

    return append, _nothing


def _aiofiles(path: Path, fsync: bool) -> tuple[Append, Callable[[], Awaitable[None]]]:
    # The asyncio.Lock keeps the coroutines of this process from waiting for each other's
    # flock inside the executor: with more clients than executor threads, every thread would
    # block in flock while the holder waits for a thread to write (a deadlock we hit).
    # flock still excludes other processes.
    in_process = asyncio.Lock()

    async def append(data: bytes) -> None:
        loop = asyncio.get_running_loop()
        async with in_process, aiofiles.open(path, "ab", buffering=0) as handle:
            await loop.run_in_executor(None, fcntl.flock, handle.fileno(), fcntl.LOCK_EX)
            await handle.write(data)
            if fsync:
                await loop.run_in_executor(None, os.fsync, handle.fileno())

    return append, _nothing


def _thread(path: Path, fsync: bool) -> tuple[Append, Callable[[], Awaitable[None]]]:
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sink-bench")

    async def append(data: bytes) -> None:
        await asyncio.get_running_loop().run_in_executor(pool, _locked_append, path, data, fsync)

    async def close() -> None:
        pool.shutdown(wait=True)

    return append, close


def _group_commit(path: Path, fsync: bool) -> tuple[Append, Callable[[], Awaitable[None]]]:
    sink = DailyFileSink(LocalCommit(path.parent, fsync=fsync), max_backlog=2**40)

    async def append(data: bytes) -> None:
        await sink.append({path.name: data})

    return append, sink.close


async def _nothing() -> None:
    return None


_MAKERS = {"blocking": _blocking, "aiofiles": _aiofiles, "thread": _thread, "group-commit": _group_commit}


def _burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def _ticker(lags: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append(time.perf_counter() - started - 0.001)


async def run_once(
    strategy: str, directory: Path, *, fsync: bool, clients: int, appends: int, chunk: bytes, work: float
) -> dict[str, Any]:
    """One run of one strategy, in a folder of its own (a data dir whose files a run removes
    must not keep its journal for the next: the journal refuses files shorter than it left
    them); its figures."""
    folder = Path(tempfile.mkdtemp(prefix=f"{strategy}-", dir=directory))
    path = folder / f"{strategy}-{'fsync' if fsync else 'write'}.csv"
    append, close = _MAKERS[strategy](path, fsync)
    latencies: list[float] = []
    lags: list[float] = []
    stop = asyncio.Event()

    async def client() -> None:
        for _ in range(appends):
            _burn(work)
            started = time.perf_counter()
            await append(chunk)
            latencies.append(time.perf_counter() - started)
            await asyncio.sleep(0)  # the next request: a server goes back to the loop between requests

    ticker = asyncio.create_task(_ticker(lags, stop))
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    stop.set()
    await ticker
    await close()
    total = clients * appends
    assert path.stat().st_size == total * len(chunk), f"{strategy}: the file has the wrong size"
    assert path.read_bytes().count(b"\n") == total * chunk.count(b"\n"), f"{strategy}: lines lost"
    shutil.rmtree(folder)
    quantiles = statistics.quantiles(latencies, n=100, method="inclusive")
    lag_q = statistics.quantiles(lags, n=100, method="inclusive") if len(lags) > 1 else [0.0] * 99
    return {
        "strategy": strategy,
        "durability": "fsync" if fsync else "write",
        "appends": total,
        "seconds": wall,
        "appends_per_s": total / wall,
        "mb_per_s": total * len(chunk) / wall / 1e6,
        "cpu_s": cpu,
        "append_p50_ms": quantiles[49] * 1e3,
        "append_p99_ms": quantiles[98] * 1e3,
        "loop_lag_p99_ms": lag_q[98] * 1e3,
        "loop_lag_max_ms": max(lags, default=0.0) * 1e3,
    }


def _median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    row = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, float):
            row[key] = round(statistics.median(run[key] for run in runs), 3)
    row["runs"] = len(runs)
    return row


async def bench(
    directory: Path,
    *,
    clients: int,
    appends: int,
    chunk_bytes: int,
    work: float,
    repeats: int,
    durabilities: tuple[bool, ...] = (False, True),
) -> list[dict[str, Any]]:
    """Every strategy x durability, ``repeats`` times interleaved; median rows."""
    chunk = _LINE * max(1, chunk_bytes // len(_LINE))
    rows = []
    for fsync in durabilities:
        runs: dict[str, list[dict[str, Any]]] = {s: [] for s in STRATEGIES}
        for repeat in range(repeats):
            for strategy in STRATEGIES if repeat % 2 == 0 else tuple(reversed(STRATEGIES)):
                count = appends if not fsync else max(10, appends // 3)  # fsync runs are slow
                runs[strategy].append(
                    await run_once(
                        strategy, directory, fsync=fsync, clients=clients, appends=count, chunk=chunk, work=work
                    )
                )
        for strategy in STRATEGIES:
            row = _median_row(runs[strategy])
            rows.append(row)
            print(
                f"  {row['strategy']:<13} {row['durability']:<5} {row['appends_per_s']:9.0f} appends/s "
                f"{row['mb_per_s']:7.1f} MB/s cpu {row['cpu_s']:.3f}s append p99 {row['append_p99_ms']:7.2f} ms "
                f"loop lag p99 {row['loop_lag_p99_ms']:6.2f} max {row['loop_lag_max_ms']:6.2f} ms",
                flush=True,
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer appends, one repeat")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--appends", type=int, default=150, help="per client (a third of it with fsync)")
    parser.add_argument("--chunk-kib", type=int, default=120)
    parser.add_argument("--work-us", type=float, default=300.0, help="CPU per request on the loop")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--dir",
        type=Path,
        default=ROOT / "bench" / "results",
        help="where the scratch file goes (a real disk, for fsync)",
    )
    args = parser.parse_args(argv)
    appends, repeats = (30, 1) if args.quick else (args.appends, args.repeats)
    args.dir.mkdir(parents=True, exist_ok=True)
    params = {
        "clients": args.clients,
        "appends_per_client": appends,
        "chunk_bytes": args.chunk_kib * 1024,
        "work_us": args.work_us,
        "repeats": repeats,
    }
    print(f"sink bench: {params}", flush=True)
    with tempfile.TemporaryDirectory(prefix="sink-bench-", dir=args.dir) as scratch:
        rows = asyncio.run(
            bench(
                Path(scratch),
                clients=args.clients,
                appends=appends,
                chunk_bytes=args.chunk_kib * 1024,
                work=args.work_us / 1e6,
                repeats=repeats,
            )
        )
    result = {"params": params, "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

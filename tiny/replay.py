"""Replay a CRAN log file into a running server: CSV in, NDJSON batches posted, a summary out.

Usage:
    python -m tiny.replay FILE.csv[.gz] [--url http://127.0.0.1:8000/ingest] [--batch 1600]
                          [--concurrency 8] [--token T] [--gzip] [--retries 8] [--timeout 60]
                          [--no-progress] [--json]

Reads the file with :mod:`tiny.cranlog` (the public ``YYYY-MM-DD.csv.gz`` format) and posts
its records as NDJSON, ``--batch`` records per request, over ``--concurrency`` keep-alive
connections (one thread each; stdlib and orjson only). Each worker posts the batches it takes
in file order. With ``--concurrency 1`` every batch goes strictly after the previous one, so a
day replayed into an empty data dir reproduces the public file byte for byte; with more
workers the batches of different workers may land in any order (each batch stays whole).

Retries: a ``503`` (the server's backlog is full, the disk refused the write, or it is
draining: nothing of that batch was kept) is sent again after its ``Retry-After`` seconds.
A connection that cannot be made or is lost is retried with exponential backoff; if it was
lost after the batch was sent, the server may have written it, so that retry may duplicate
rows (counted as ``resent_unanswered`` in the summary; ``--no-resend`` fails such a batch
instead). At most ``--retries`` retries per batch; any other status fails the batch at once.

A progress line (records sent, records/s) goes to stderr when it is a terminal (or with
``--progress``); the summary (records sent, valid, invalid, batches, retries, failures,
seconds, records/s) goes to stdout, as JSON with ``--json``. Exit status: 0 when every batch
was acknowledged, 1 when any batch finally failed, 2 for bad usage or an unreadable or
malformed input file, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import itertools
import queue
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import orjson

from tiny.cranlog import ndjson_lines

_MAX_RETRY_AFTER = 60.0  # seconds; a longer Retry-After is capped
_BACKOFF_START = 0.1
_BACKOFF_MAX = 5.0
_PROGRESS_EVERY = 0.25  # seconds between progress line updates


@dataclass(frozen=True)
class Options:
    """What one replay does; see the module docstring."""

    path: Path
    url: str = "http://127.0.0.1:8000/ingest"
    batch: int = 1600
    concurrency: int = 8
    token: str | None = None
    gzip: bool = False
    retries: int = 8
    timeout: float = 60.0
    resend_unanswered: bool = True


@dataclass
class Summary:
    """Counts of one replay; ``failures`` is the number of batches never acknowledged."""

    records: int = 0
    valid: int = 0
    invalid: int = 0
    batches: int = 0
    retries: int = 0
    retries_503: int = 0
    resent_unanswered: int = 0
    failures: int = 0
    failed_records: int = 0
    seconds: float = 0.0
    interrupted: bool = False
    errors: list[str] = field(default_factory=list)

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "records_per_s": round(self.records_per_s)}


class BatchFailed(Exception):
    """A batch that will not be acknowledged (a final status, or retries used up)."""


class _Unanswered(Exception):
    """The connection broke after the request was (perhaps) sent."""


def batches(lines: Iterable[bytes], size: int) -> Iterator[tuple[int, bytes]]:
    """``(record count, body)`` of consecutive ``size``-record batches."""
    if size < 1:
        raise ValueError("batch size must be at least 1")
    it = iter(lines)
    while chunk := list(itertools.islice(it, size)):
        yield len(chunk), b"".join(chunk)


def retry_after(value: str | None, default: float = 1.0) -> float:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds; a date or junk -> default)."""
    try:
        seconds = float(value) if value is not None else default
    except ValueError:
        seconds = default
    return min(max(seconds, 0.0), _MAX_RETRY_AFTER)


class Poster:
    """One keep-alive connection to the server; posts batches with the retry rules."""

    def __init__(self, options: Options, summary: Summary, lock: threading.Lock) -> None:
        parts = urlsplit(options.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {options.url!r}")
        self.options = options
        self.summary = summary
        self.lock = lock
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.headers = {"Content-Type": "application/x-ndjson"}
        if options.gzip:
            self.headers["Content-Encoding"] = "gzip"
        if options.token:
            self.headers["Authorization"] = f"Bearer {options.token}"
        self.conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self.conn is None:
            kind = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self.conn = kind(self.host, self.port, timeout=self.options.timeout)
        return self.conn

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _exchange(self, body: bytes) -> tuple[int, str | None, bytes]:
        """One request; (status, Retry-After, body). Raises OSError before anything was sent,
        _Unanswered when the connection broke after sending started."""
        conn = self._connection()
        if conn.sock is None:
            try:
                conn.connect()
            except OSError:
                self.close()
                raise
        try:
            conn.request("POST", self.path, body, self.headers)
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise _Unanswered(f"{type(exc).__name__}: {exc}") from exc
        if response.will_close:
            self.close()
        return response.status, response.getheader("Retry-After"), data

    def post(self, body: bytes) -> Any:
        """Post one batch until it is acknowledged; the server's answer, or BatchFailed."""
        attempt = 0
        backoff = _BACKOFF_START
        while True:
            try:
                status, after, data = self._exchange(body)
            except (_Unanswered, OSError) as exc:
                unanswered = isinstance(exc, _Unanswered)
                if unanswered and not self.options.resend_unanswered:
                    raise BatchFailed(f"no answer ({exc}); not resent (--no-resend)") from None
                if attempt >= self.options.retries:
                    raise BatchFailed(f"no answer after {attempt + 1} attempts: {exc}") from None
                self._count(retries=1, resent_unanswered=int(unanswered))
                time.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX)
            else:
                if status == 200:
                    return orjson.loads(data)
                if status != 503 or attempt >= self.options.retries:
                    raise BatchFailed(f"HTTP {status}: {data[:300].decode('utf-8', 'replace').strip()}")
                self._count(retries=1, retries_503=1)
                time.sleep(retry_after(after))
            attempt += 1

    def _count(self, **increments: int) -> None:
        with self.lock:
            for name, value in increments.items():
                setattr(self.summary, name, getattr(self.summary, name) + value)


def _record_counts(answer: Any) -> tuple[int, int]:
    """(valid, invalid) from a 200 answer; (0, 0) if it has another shape (not tiny?)."""
    try:
        records = answer["result"]["stats"]["records"]
        return int(records["valid"]), int(records["invalid"])
    except (KeyError, TypeError, ValueError):
        return 0, 0


class Progress:
    """A ``\\r`` status line on a stream: records sent and records/s, at most 4 times a second."""

    def __init__(self, stream: IO[str] | None) -> None:
        self.stream = stream
        self.started = time.monotonic()
        self.shown = 0.0

    def show(self, summary: Summary, final: bool = False) -> None:
        if self.stream is None:
            return
        now = time.monotonic()
        if not final and now - self.shown < _PROGRESS_EVERY:
            return
        self.shown = now
        elapsed = max(now - self.started, 1e-9)
        self.stream.write(
            f"\r{summary.records:>12,} records  {summary.batches:>7,} batches  {summary.records / elapsed:>11,.0f} "
            f"records/s  {summary.retries} retries  {summary.failures} failed  {elapsed:6.1f} s"
        )
        if final:
            self.stream.write("\n")
        self.stream.flush()


def replay(options: Options, progress: IO[str] | None = None, lines: Iterable[bytes] | None = None) -> Summary:
    """Post every record of ``options.path`` (or ``lines``, NDJSON) to the server; the summary.

    Raises ValueError for bad options. Ctrl-C (KeyboardInterrupt) while reading stops the
    workers after their current batch and returns the summary so far with ``interrupted``
    set (a second Ctrl-C propagates).
    """
    if options.concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    summary = Summary()
    lock = threading.Lock()
    bar = Progress(progress)
    source = batches(lines if lines is not None else ndjson_lines(options.path), options.batch)
    work: queue.Queue[tuple[int, bytes] | None] = queue.Queue(maxsize=2 * options.concurrency)
    stop = threading.Event()
    posters = [Poster(options, summary, lock) for _ in range(options.concurrency)]
    started = time.monotonic()

    def worker(poster: Poster) -> None:
        while (item := work.get()) is not None:
            if stop.is_set():
                continue  # drain the queue so the producer never blocks
            count, body = item
            try:
                answer = poster.post(gzip.compress(body, 5) if options.gzip else body)
            except BatchFailed as exc:
                with lock:
                    summary.failures += 1
                    summary.failed_records += count
                    if len(summary.errors) < 10:
                        summary.errors.append(str(exc))
                    bar.show(summary)
            else:
                valid, invalid = _record_counts(answer)
                with lock:
                    summary.records += count
                    summary.batches += 1
                    summary.valid += valid
                    summary.invalid += invalid
                    bar.show(summary)
        poster.close()

    threads = [
        threading.Thread(target=worker, args=(p,), name=f"replay-{i}", daemon=True) for i, p in enumerate(posters)
    ]
    for thread in threads:
        thread.start()
    try:
        for item in source:
            work.put(item)
    except KeyboardInterrupt:
        stop.set()
        summary.interrupted = True
    except BaseException:
        stop.set()
        raise
    finally:
        for _ in threads:
            work.put(None)
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)  # a short join keeps Ctrl-C responsive
        summary.seconds = time.monotonic() - started
        bar.show(summary, final=True)
    return summary


def format_summary(summary: Summary) -> str:
    """The human-readable summary block."""
    lines = [
        f"records sent   {summary.records:,} ({summary.valid:,} valid, {summary.invalid:,} invalid)",
        f"batches        {summary.batches:,} acknowledged, {summary.failures:,} failed "
        f"({summary.failed_records:,} records not stored)",
        f"retries        {summary.retries:,} ({summary.retries_503:,} after 503, "
        f"{summary.resent_unanswered:,} resent without an answer)",
        f"time           {summary.seconds:.2f} s, {summary.records_per_s:,.0f} records/s",
    ]
    lines += [f"error          {error}" for error in summary.errors]
    if summary.interrupted:
        lines.append("interrupted    by Ctrl-C: the rest of the file was not sent")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> tuple[Options, argparse.Namespace]:
    """Options from the command line (argparse exits 2 on bad usage)."""
    parser = argparse.ArgumentParser(prog="python -m tiny.replay", description=__doc__.split("\n", 1)[0])
    parser.add_argument("file", type=Path, help="a CRAN log file, .csv or .csv.gz")
    parser.add_argument("--url", default=Options.url, help="the /ingest URL (default %(default)s)")
    parser.add_argument("--batch", type=int, default=Options.batch, help="records per request (default %(default)s)")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=Options.concurrency,
        help="connections posting at once (default %(default)s; 1 keeps the file order)",
    )
    parser.add_argument("--token", help="bearer token (the server's --token)")
    parser.add_argument("--gzip", action="store_true", help="send gzip-compressed bodies")
    parser.add_argument("--retries", type=int, default=Options.retries, help="per batch (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=Options.timeout, help="socket timeout, seconds")
    parser.add_argument(
        "--no-resend",
        action="store_true",
        help="fail a batch whose connection broke after it was sent, instead of resending it",
    )
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--progress", action="store_true", help="show the progress line even if stderr is no tty")
    shown.add_argument("--no-progress", action="store_true", help="no progress line")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args(argv)
    if args.batch < 1 or args.concurrency < 1 or args.retries < 0:
        parser.error("--batch and --concurrency must be at least 1, --retries at least 0")
    if not args.file.exists():
        parser.error(f"no such file: {args.file}")
    options = Options(
        args.file,
        args.url,
        args.batch,
        args.concurrency,
        args.token,
        args.gzip,
        args.retries,
        args.timeout,
        not args.no_resend,
    )
    return options, args


def main(argv: Sequence[str] | None = None) -> int:
    options, args = parse_args(argv)
    show = args.progress or (not args.no_progress and sys.stderr.isatty())
    try:
        summary = replay(options, sys.stderr if show else None)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError) as exc:  # a malformed or unreadable input file
        print(f"\nerror: {exc}", file=sys.stderr)
        return 2
    print(orjson.dumps(summary.as_dict()).decode() if args.json else format_summary(summary))
    if summary.interrupted:
        return 130
    return 1 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())

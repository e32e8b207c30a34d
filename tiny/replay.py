"""Replay a CRAN log file into a running server: CSV in, NDJSON batches posted, a summary out.

Usage (``tiny-replay`` once installed, or ``python -m tiny.replay`` from the source tree):
    tiny-replay FILE.csv[.gz] [--url http://127.0.0.1:8000/ingest] [--batch 1600]
                [--concurrency 8] [--token-file F] [--gzip] [--retries 8] [--timeout 60]
                [--start-line N] [--no-keys] [--no-progress] [--json]

Reads the file with :mod:`tiny.cranlog` (the public ``YYYY-MM-DD.csv.gz`` format) and posts
its records as NDJSON, ``--batch`` records per request, over ``--concurrency`` keep-alive
connections (one thread each; stdlib and orjson only). Each worker posts the batches it takes
in file order. With ``--concurrency 1`` every batch goes strictly after the previous one, so a
day replayed into an empty data dir reproduces the public file byte for byte; with more
workers the batches of different workers may land in any order (each batch stays whole).

Every batch ends as stored (a 200 with the server's answer, whose counts match the batch) or
as failed (counted, with its error): whatever the server or the network does, the summary
never reports a lost batch as stored, and the exit status says so.

Exactly once: each batch carries an ``Idempotency-Key`` made of its records (a digest of the
NDJSON built from the parsed rows) and its first and last line (:meth:`Batch.key`), so sending
it again, after a lost connection, a 502 or a 504 from a proxy, or in a second run of the
same rows with the same ``--batch`` (from the .csv.gz or the gunzipped .csv alike), writes
nothing twice: the server answers the stored answer, and the summary
counts those batches as ``replayed``. ``--no-keys`` sends none (then a batch resent after a
lost connection may duplicate rows).

Retries: a ``503`` (the server's backlog is full, the disk refused the write, or it is
draining: nothing of that batch was kept) is sent again after its ``Retry-After`` seconds;
so is a 502 or 504 when the batch has a key. A connection that cannot be made or is lost is
retried with exponential backoff (counted as ``resent_unanswered`` when the batch had been
sent; ``--no-resend`` fails such a batch instead). At most ``--retries`` retries per batch;
any other status fails the batch at once.

A progress line (records sent, records/s) goes to stderr when it is a terminal (or with
``--progress``); the summary (records sent, valid, invalid, batches, retries, failures,
seconds, records/s) goes to stdout, as JSON with ``--json``.

A malformed CSV row stops the run: the batches before it are still sent, and the summary
names the row's line number and the ``--start-line`` that resumes after fixing it.
``--start-line N`` skips the file's lines before line N (line 1 is the header).

Exit status: 0 when every batch was acknowledged, 1 when any batch finally failed or a
malformed row stopped the run, 2 for bad usage or an unreadable input file, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import math
import queue
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

import orjson

from tiny.config import seconds
from tiny.replay_batches import Batch, MalformedRow, file_lines, numbered_batches

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
    start_line: int = 2  # the first line of the file to send (line 1 is the header)
    keys: bool = True  # an Idempotency-Key per batch


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
    replayed: int = 0  # acknowledged with an answer the server had stored (Idempotent-Replayed)
    failures: int = 0
    failed_records: int = 0
    seconds: float = 0.0
    interrupted: bool = False
    stopped_at_line: int | None = None  # a malformed row stopped the run here
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


def retry_after(value: str | None, default: float = 1.0) -> float:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds; a date or junk -> default)."""
    try:
        seconds = float(value) if value is not None else default
    except ValueError:
        seconds = default
    if not math.isfinite(seconds):  # "nan", "inf": junk too
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

    def _exchange(self, body: bytes, headers: dict[str, str]) -> tuple[int, str | None, bool, bytes]:
        """One request; (status, Retry-After, replayed, body). Raises OSError before anything
        was sent, _Unanswered when the connection broke after sending started."""
        conn = self._connection()
        if conn.sock is None:
            try:
                conn.connect()
            except OSError:
                self.close()
                raise
        try:
            conn.request("POST", self.path, body, headers)
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise _Unanswered(f"{type(exc).__name__}: {exc}") from exc
        if response.will_close:
            self.close()
        replayed = response.getheader("Idempotent-Replayed") == "true"
        return response.status, response.getheader("Retry-After"), replayed, data

    def post(self, body: bytes, records: int, key: str | None = None) -> tuple[int, int]:
        """Post one batch until it is acknowledged: (valid, invalid) from the server's answer,
        which must count ``records`` lines; BatchFailed otherwise. With ``key`` (its
        Idempotency-Key), a 502 or 504 is retried too: the server writes it once."""
        headers = {**self.headers, "Idempotency-Key": key} if key else self.headers
        retryable = (502, 503, 504) if key else (503,)
        attempt = 0
        backoff = _BACKOFF_START
        while True:
            try:
                status, after, replayed, data = self._exchange(body, headers)
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
                    counts = _record_counts(data, records)
                    self._count(replayed=int(replayed))
                    return counts
                if status not in retryable or attempt >= self.options.retries:
                    raise BatchFailed(f"HTTP {status}: {data[:300].decode('utf-8', 'replace').strip()}")
                self._count(retries=1, retries_503=int(status == 503))
                time.sleep(retry_after(after) if status == 503 else backoff)
            attempt += 1

    def _count(self, **increments: int) -> None:
        with self.lock:
            for name, value in increments.items():
                setattr(self.summary, name, getattr(self.summary, name) + value)


def _record_counts(data: bytes, records: int) -> tuple[int, int]:
    """(valid, invalid) from a 200's body; BatchFailed unless it is a Tiny Data Server answer
    that counts exactly the ``records`` lines sent (an HTML page from a proxy is no ack)."""
    try:
        counts = orjson.loads(data)["result"]["stats"]["records"]
        valid, invalid = counts["valid"], counts["invalid"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise BatchFailed(f"HTTP 200 without an ingest answer: {data[:120]!r}") from None
    if type(valid) is not int or type(invalid) is not int or valid + invalid != records:
        raise BatchFailed(f"HTTP 200 counting {valid!r} + {invalid!r} records of the {records} sent")
    return valid, invalid


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


def replay(options: Options, progress: IO[str] | None = None) -> Summary:
    """Post every record of ``options.path`` to the server; the summary.

    Every batch taken from the file ends in the summary as acknowledged or failed, whatever
    happens to the thread posting it. A malformed row stops the reading (the batches before it
    are still posted) and sets ``stopped_at_line``. Raises ValueError for bad options, OSError
    for an unreadable file. Ctrl-C (KeyboardInterrupt) while reading stops the workers after
    their current batch and returns the summary so far with ``interrupted`` set (a second
    Ctrl-C propagates).
    """
    if options.concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    summary = Summary()
    lock = threading.Lock()
    bar = Progress(progress)
    source = numbered_batches(file_lines(options.path, options.start_line), options.batch)
    work: queue.Queue[Batch | None] = queue.Queue(maxsize=2 * options.concurrency)
    stop = threading.Event()
    posters = [Poster(options, summary, lock) for _ in range(options.concurrency)]
    started = time.monotonic()

    def fail(batch: Batch, error: str) -> None:
        with lock:
            summary.failures += 1
            summary.failed_records += batch.records
            if len(summary.errors) < 10:
                summary.errors.append(f"lines {batch.first_line}-{batch.last_line}: {error}")
            bar.show(summary)

    def worker(poster: Poster) -> None:
        while (batch := work.get()) is not None:
            if stop.is_set():
                fail(batch, "not sent: interrupted")
                continue
            try:
                body = gzip.compress(batch.body, 5) if options.gzip else batch.body
                key = batch.key() if options.keys else None
                valid, invalid = poster.post(body, batch.records, key)
            except BatchFailed as exc:
                fail(batch, str(exc))
            except Exception as exc:  # a batch never vanishes with its thread: it is a failure
                fail(batch, f"{type(exc).__name__}: {exc}")
            else:
                with lock:
                    summary.records += batch.records
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
        for batch in source:
            work.put(batch)
    except MalformedRow as exc:
        summary.stopped_at_line = exc.line
        summary.errors.append(f"{exc}; fix it, then resume with --start-line {exc.line}")
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
        f"replayed       {summary.replayed:,} batches the server had stored already (written once)",
        f"time           {summary.seconds:.2f} s, {summary.records_per_s:,.0f} records/s",
    ]
    lines += [f"error          {error}" for error in summary.errors]
    if summary.stopped_at_line is not None:
        lines.append(f"stopped        at line {summary.stopped_at_line}, a malformed row: nothing from it on was sent")
    if summary.interrupted:
        lines.append("interrupted    by Ctrl-C: the rest of the file was not sent")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> tuple[Options, argparse.Namespace]:
    """Options from the command line (argparse exits 2 on bad usage)."""
    parser = argparse.ArgumentParser(prog="tiny-replay", description=__doc__.split("\n", 1)[0])
    parser.add_argument("file", type=Path, help="a CRAN log file, .csv or .csv.gz")
    parser.add_argument("--url", default=Options.url, help="the /ingest URL (default %(default)s)")
    parser.add_argument("--batch", type=int, default=Options.batch, help="records per request (default %(default)s)")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=Options.concurrency,
        help="connections posting at once (default %(default)s; 1 keeps the file order)",
    )
    token = parser.add_mutually_exclusive_group()
    token.add_argument("--token", help="bearer token (the server's --token); visible in ps: prefer --token-file")
    token.add_argument("--token-file", type=Path, help="a file holding the bearer token")
    parser.add_argument(
        "--start-line",
        type=int,
        default=Options.start_line,
        help="the first line of the file to send (line 1 is the header; default %(default)s)",
    )
    parser.add_argument("--gzip", action="store_true", help="send gzip-compressed bodies")
    parser.add_argument("--retries", type=int, default=Options.retries, help="per batch (default %(default)s)")
    parser.add_argument("--timeout", type=seconds, default=Options.timeout, help="socket timeout, seconds")
    parser.add_argument(
        "--no-resend",
        action="store_true",
        help="fail a batch whose connection broke after it was sent, instead of resending it",
    )
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--progress", action="store_true", help="show the progress line even if stderr is no tty")
    shown.add_argument("--no-progress", action="store_true", help="no progress line")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument(
        "--no-keys", action="store_true", help="send no Idempotency-Key (a batch resent may then be written twice)"
    )
    args = parser.parse_args(argv)
    if args.batch < 1 or args.concurrency < 1 or args.retries < 0:
        parser.error("--batch and --concurrency must be at least 1, --retries at least 0")
    if not args.file.exists():
        parser.error(f"no such file: {args.file}")
    if args.start_line < 2:
        parser.error("--start-line must be at least 2 (line 1 is the header)")
    if args.token_file is not None:
        try:
            args.token = args.token_file.read_text().strip()
        except OSError as exc:
            parser.error(f"--token-file: {exc}")
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
        args.start_line,
        not args.no_keys,
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
    except (ValueError, OSError) as exc:  # an unreadable input file
        print(f"\nerror: {exc}", file=sys.stderr)
        return 2
    print(orjson.dumps(summary.as_dict()).decode() if args.json else format_summary(summary))
    if summary.interrupted:
        return 130
    return 1 if summary.failures or summary.stopped_at_line is not None else 0


if __name__ == "__main__":
    sys.exit(main())

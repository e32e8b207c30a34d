"""The seed's approach, rebuilt faithfully as the benchmark's baseline (not part of the product).

Usage:
    python bench/seed_server.py [--port 8000] [--address 127.0.0.1] [--processes 1]
                                [--data-dir DIR] [--writer final|old]

What the original Tiny Data Server write-up (../shared/seeds/004_*.txt) ran, and nothing more:

- Tornado; ``--processes N`` (N > 1, or 0 = one per core) binds ONE listening socket and calls
  ``tornado.process.fork_processes(N)``, so every child accepts from the same socket (with
  keep-alive clients, the kernel may hand every connection to one child). ``--processes 1``
  does not fork (the write-up's "single-thread mode").
- ``POST /ingest`` reads the whole body, then, blocking the event loop, opens the day file
  (``DATA_DIR/YYYY-MM-DD.csv``, the server's date of receipt) in append mode per request and
  runs the write-up's extracted ``write_csv``: ``json.loads`` per line and ``csv.DictWriter``
  (the 10 CRAN columns, ``extrasaction='ignore'``), counting valid and invalid lines with a
  bare ``try/except``. ``--writer final`` (default) is the write-up's final version (body
  decoded as UTF-8 at once, ``writerows`` per 100 rows); ``--writer old`` its first one
  (``io.BytesIO(body).readlines()``, ``writerow`` per line).
- The answer is a small JSON with the counts, always 200 unless an exception escapes (500).

What differs from the product (tiny/), on purpose, so that the baseline stays the seed's:

- No validation: any JSON value is written as it comes (a string for ``size``, a date that
  does not exist, a 10 MB string). Missing keys and ``null`` become ``""`` instead of ``NA``,
  strings are quoted only when needed, integers and strings are not told apart, and rows end
  with CRLF (the csv module's default). Read back as values, 10,178 of the sample day's 77,107
  rows differ from the public file (their NA); as bytes, every row does. No header line.
- Rows go to the day the request arrived, not to the record's ``date``.
- One bad line can lose the batch: with ``--writer final`` a body that is not UTF-8 fails
  whole (500) before any line is parsed, and a line that is JSON but not an object (``[1]``)
  stays in the pending rows, fails every later ``writerows`` of the request and finally
  escapes as a 500 after rows were written, many of them again and again (400 lines with
  ``[1]`` as line 151 wrote 10,250 rows). With ``--writer old`` each such line counts as one
  invalid record. Nothing is kept of an invalid line (no rejects file).
- No auth, no limits beyond Tornado's defaults (100 MB body), no gzip, no metrics, no
  graceful shutdown (SIGTERM kills it; a forked parent does not stop its children, so stop
  the process group), and a 200 means the rows reached Python's file buffer, closed with the
  file at the end of the request (write(2), no fsync).
- ``GET /healthz`` (``{"pid": ...}``) is an addition so that the harness can wait for it.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import io
import json
import os
import sys
from pathlib import Path

import tornado.ioloop
import tornado.netutil
import tornado.process
import tornado.web
from tornado.httpserver import HTTPServer

FIELDNAMES = ["date", "time", "size", "r_version", "r_arch", "r_os", "package", "version", "country", "ip_id"]


def write_csv(request_body: bytes, csv_name: str | Path) -> tuple[int, int]:
    """The write-up's final ``write_csv``: decode once, ``json.loads`` per line, buffered writerows."""
    records_valid = 0
    records_invalid = 0
    max_rows = 100
    with open(csv_name, "a") as fw:
        writer = csv.DictWriter(fw, FIELDNAMES, extrasaction="ignore")
        decoded_body = [line for line in request_body.decode("utf-8").split("\n") if line]
        rows = []
        for record in decoded_body:
            try:
                row = json.loads(record)
                rows.append(row)
                if len(rows) >= max_rows:
                    writer.writerows(rows)
                    records_valid += len(rows)
                    rows = []
            except Exception:
                records_invalid += 1
        if rows:
            writer.writerows(rows)
            records_valid += len(rows)
    return records_valid, records_invalid


def write_csv_old(request_body: bytes, csv_name: str | Path) -> tuple[int, int]:
    """The write-up's first ``write_csv_old``: ``writerow`` per line, one try per line."""
    records_valid = 0
    records_invalid = 0
    with open(csv_name, "a") as fw:
        writer = csv.DictWriter(fw, FIELDNAMES, extrasaction="ignore")
        fr = io.BytesIO(request_body)
        for record in fr.readlines():
            try:
                row = json.loads(record)
                writer.writerow(row)
                records_valid += 1
            except Exception:
                records_invalid += 1
    return records_valid, records_invalid


WRITERS = {"final": write_csv, "old": write_csv_old}


class IngestHandler(tornado.web.RequestHandler):
    """``POST /ingest``: the body's lines appended to today's CSV, on the event loop."""

    def initialize(self, data_dir: Path, writer: str) -> None:
        self.data_dir = data_dir
        self.write_csv = WRITERS[writer]

    def post(self) -> None:
        body = self.request.body
        csv_name = self.data_dir / f"{datetime.date.today().isoformat()}.csv"
        valid, invalid = self.write_csv(body, csv_name)
        self.write(
            {
                "result": {
                    "status": "ok",
                    "stats": {
                        "bytes": len(body),
                        "records": {"valid": valid, "invalid": invalid, "total": valid + invalid},
                    },
                }
            }
        )


class HealthHandler(tornado.web.RequestHandler):
    """``GET /healthz``: which process answered (not in the seed; the harness waits for it)."""

    def get(self) -> None:
        self.write({"status": "ok", "pid": os.getpid(), "codec": "seed"})


def make_app(data_dir: Path, writer: str) -> tornado.web.Application:
    """The seed's application: /ingest, plus /healthz for the harness."""
    deps = {"data_dir": data_dir, "writer": writer}
    return tornado.web.Application([(r"/ingest", IngestHandler, deps), (r"/healthz", HealthHandler)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, default=8000, help="0 = any free port (printed)")
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--processes", type=int, default=1, help="1 = no fork; 0 = one per core")
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    parser.add_argument("--writer", choices=sorted(WRITERS), default="final")
    args = parser.parse_args(argv)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    sockets = tornado.netutil.bind_sockets(args.port, args.address)
    host, port = sockets[0].getsockname()[:2]
    print(f"seed server listening on http://{host}:{port} with --processes {args.processes}", flush=True)
    if args.processes != 1:
        tornado.process.fork_processes(args.processes)  # children return; the parent never does
    server = HTTPServer(make_app(args.data_dir, args.writer))
    server.add_sockets(sockets)
    tornado.ioloop.IOLoop.current().start()
    return 0


if __name__ == "__main__":
    sys.exit(main())

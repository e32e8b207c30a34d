"""The HTTP floor: a Tornado handler that reads a POST body, discards it, answers a small JSON.

Usage:
    python bench/floor_server.py [--port 8000] [--address 127.0.0.1] [--processes 1]

No server built on Tornado can answer a request faster than this one: whatever /ingest costs
above it is the codec, the sink and the handler. ``--processes`` works like the seed server's
(bench/seed_server.py): 1 does not fork, N > 1 (or 0 = one per core) forks N children that
share one listening socket. Stop it by signalling its process group.
"""

from __future__ import annotations

import argparse
import os
import sys

import tornado.ioloop
import tornado.netutil
import tornado.process
import tornado.web
from tornado.httpserver import HTTPServer


class DiscardHandler(tornado.web.RequestHandler):
    """``POST /ingest``: the body is read by Tornado and dropped; 200 with its size."""

    def post(self) -> None:
        self.write({"result": {"status": "ok", "stats": {"bytes": len(self.request.body)}}})


class HealthHandler(tornado.web.RequestHandler):
    """``GET /healthz``: which process answered."""

    def get(self) -> None:
        self.write({"status": "ok", "pid": os.getpid(), "codec": "none"})


def make_app() -> tornado.web.Application:
    """The floor application: /ingest and /healthz."""
    return tornado.web.Application([(r"/ingest", DiscardHandler), (r"/healthz", HealthHandler)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, default=8000, help="0 = any free port (printed)")
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--processes", type=int, default=1, help="1 = no fork; 0 = one per core")
    args = parser.parse_args(argv)
    sockets = tornado.netutil.bind_sockets(args.port, args.address)
    host, port = sockets[0].getsockname()[:2]
    print(f"floor server listening on http://{host}:{port} with --processes {args.processes}", flush=True)
    if args.processes != 1:
        tornado.process.fork_processes(args.processes)
    server = HTTPServer(make_app())
    server.add_sockets(sockets)
    tornado.ioloop.IOLoop.current().start()
    return 0


if __name__ == "__main__":
    sys.exit(main())

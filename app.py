"""Tiny Data Server: POST NDJSON CRAN log records, get byte-exact daily CSV files.

Usage:
    python app.py [--port 8000] [--address 127.0.0.1] [--processes 0] [--data-dir ./data]
                  [--durability write|fsync] [--max-body 64MiB] [--token SECRET]
    python app.py --help        # every flag, and its TINY_<FLAG> environment variable

Profile the hot path: kernprof -l app.py --processes 1; python -m line_profiler app.py.lprof
"""

import logging
import signal
import sys

# Until the server installs its own handlers, SIGTERM means "exit 0 now": nothing has been
# accepted yet. (As PID 1 in a container, an unhandled SIGTERM would be ignored.)
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))

from tiny import config, prefork  # noqa: E402


def main() -> int:
    options = config.parse()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s[%(process)d] %(message)s")
    # 4xx are logged by tiny.handlers.base with their reason; an access line per request costs speed
    logging.getLogger("tornado.access").setLevel(logging.ERROR)
    return prefork.serve(options)


if __name__ == "__main__":
    sys.exit(main())

"""Tiny Data Server: POST NDJSON CRAN log records, get byte-exact daily CSV files.

Usage:
    python app.py [--port 8000] [--address 127.0.0.1] [--processes 0] [--data-dir ./data]
                  [--durability write|fsync] [--max-body 64MiB] [--token SECRET]
    python app.py --help        # every flag, and its TINY_<FLAG> environment variable

Installed (`pip install .`), the same is the command ``tiny-data-server``; this file only runs
:func:`tiny.main.main` from the source tree.

Profile the hot path: kernprof -l app.py --processes 1; python -m line_profiler app.py.lprof
"""

import sys

from tiny.main import main

if __name__ == "__main__":
    sys.exit(main())

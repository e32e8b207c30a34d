"""Tiny Data Server's entry point: parse the options, set up logging, serve.

``python app.py`` (the repo's shim, also under ``kernprof -l app.py``) and the installed
console script ``tiny-data-server`` both run :func:`main`.
"""

import logging
import signal
import sys


def main() -> int:
    # Imported here, not on import of this module: the analytics pool's processes, spawned,
    # import the __main__ script again (app.py, or the console script, which imports this
    # module), and the server's own modules would cost each of them 0.16-0.24 CPU-s.
    from tiny import config, prefork

    # Until the server installs its own handlers, SIGTERM means "exit 0 now": nothing has been
    # accepted yet. (As PID 1 in a container, an unhandled SIGTERM would be ignored.) Set here,
    # not on import: a process that only imports this module (the analytics pool's, spawned
    # with app.py as its __mp_main__) keeps the default, and dies of SIGTERM as it should.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    options = config.parse()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s[%(process)d] %(message)s")
    # 4xx are logged by tiny.handlers.base with their reason; an access line per request costs speed
    logging.getLogger("tornado.access").setLevel(logging.ERROR)
    return prefork.serve(options)


if __name__ == "__main__":
    sys.exit(main())

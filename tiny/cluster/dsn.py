"""The ``--cluster`` string's checks at start-up: libpq parses it, it holds no password, and the
password file it names is one libpq reads.

A refusal raises argparse.ArgumentTypeError (or returns the reason: :func:`passfile_problem`)
and never shows the string back: were a password in it, it would leak into the message.
psycopg is imported only when a string is checked (cluster mode).
"""

from __future__ import annotations

import argparse
import os
import re
import stat
from collections.abc import Mapping

_MAX_DSN = 4096  # characters of --cluster
# a password in a libpq key=value string, or in a URI's user info or query
_PASSWORD = re.compile(r"(?:^|\s)password\s*=|^postgres(?:ql)?://[^/@?]*:[^/@?]*@|[?&]password=", re.IGNORECASE)


def checked(text: str) -> str:
    """A libpq connection string (key=value or URI) without a password, or empty. The value is
    never shown back (tiny.config._naming): were a password in it, it would leak into the message."""
    if len(text) > _MAX_DSN or "\n" in text or "\0" in text:
        raise argparse.ArgumentTypeError(f"must be a libpq connection string of at most {_MAX_DSN} characters")
    if _PASSWORD.search(text.strip()):
        raise argparse.ArgumentTypeError(
            "must not hold a password (it would show in ps, the environment and logs): put it in a passfile "
            "named by passfile=PATH in the string, or by PGPASSFILE"
        )
    if text.strip():
        _parses(text.strip())
    return text.strip()


def _parses(dsn: str) -> None:
    """Refuse a string libpq cannot parse, at start-up rather than at the first connect (where
    it would end the server with a traceback echoing the string). Only an unknown option's
    name is shown back: libpq's other messages quote the string itself."""
    from psycopg import Error  # here: only cluster mode pays for importing psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        conninfo_to_dict(dsn)
    except Error as exc:
        unknown = re.match(r'invalid connection option "([a-z_]{1,40})"', str(exc))
        if unknown:
            raise argparse.ArgumentTypeError(f"names an option libpq does not know: {unknown.group(1)!r}") from None
        raise argparse.ArgumentTypeError(
            "must be a libpq connection string libpq can parse (key=value pairs, or a postgresql:// URI)"
        ) from None


def cluster_string(text: str) -> str:
    """The check of ``--cluster`` for the other commands (tiny-admin backup): a libpq string
    libpq parses, without a password, not empty."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must name the cluster (a libpq connection string)")
    return checked(text)


def passfile_problem(dsn: str, environ: Mapping[str, str]) -> str:
    """Why libpq would not read the password file ``dsn`` names (``passfile=``, else
    PGPASSFILE in the process's environment, which libpq reads), or "". libpq skips a file it
    cannot open, and one with any group or world permission, with no more than "no password
    supplied" at every connect: the server would start and answer 503 until it is stopped."""
    from psycopg.conninfo import conninfo_to_dict

    named = str(conninfo_to_dict(dsn).get("passfile") or "")
    where = "passfile=" if named else "PGPASSFILE"
    path = named or environ.get("PGPASSFILE", "")
    if not path:
        return ""
    try:
        mode = os.stat(path).st_mode
        with open(path, "rb"):
            pass
    except OSError as exc:
        return f"the password file ({where}) cannot be read: {exc.strerror}: {path}"
    if not stat.S_ISREG(mode):
        return f"the password file ({where}) is not a regular file: {path}"
    if mode & 0o077:
        return f"libpq ignores a password file with group or world permissions ({where}): chmod 600 {path}"
    return ""

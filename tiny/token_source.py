"""The bearer token of ``/ingest`` (and of the reads, unless public): where the start takes it
from, and what it refuses (tiny.config calls :func:`token_of` once its flags are parsed)."""

from __future__ import annotations

import argparse


def token_of(
    parser: argparse.ArgumentParser, args: argparse.Namespace, on_command_line: bool
) -> tuple[str | None, str]:
    """The token and where it came from: --token-file (read now, stripped), --token, or
    TINY_TOKEN. Stops the start for a token that is empty (an unset shell variable would
    otherwise turn authentication off without a word) or that holds whitespace or a control
    character (no Authorization header can carry it: every request would get 401)."""
    if args.token_file is not None:
        if args.token:
            parser.error("argument --token-file: give the token once, by --token-file or by --token / TINY_TOKEN")
        try:
            token = args.token_file.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            parser.error(f"argument --token-file: cannot read {args.token_file}: {exc}")
        if not token:
            parser.error(f"argument --token-file: {args.token_file} is empty")
        flag, source, where = "--token-file", "file", f"in {args.token_file}"
    elif args.token is None:
        return None, ""
    else:
        token, flag = args.token, "--token"
        source = "command line" if on_command_line else "environment"
        where = "on the command line" if on_command_line else "in TINY_TOKEN"
        if not token:
            parser.error(
                f"argument --token: the token given {where} is empty; to run without a token, "
                "leave out --token and unset TINY_TOKEN"
            )
    if not token.isascii():
        parser.error(
            f"argument {flag}: the token given {where} is not ASCII: clients send a header's bytes as they "
            "please (UTF-8, Latin-1), so it would match for some and not others; use ASCII letters, digits, -._~+/="
        )
    if any(char.isspace() or not char.isprintable() for char in token):
        parser.error(
            f"argument {flag}: the token given {where} holds whitespace or a control character, which "
            "no 'Authorization: Bearer' header can carry: every request would get 401 (a token file holds one line)"
        )
    return token, source

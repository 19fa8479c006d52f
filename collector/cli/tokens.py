"""``gpuwarden collector token``: a new bearer token and the tokens-file line holding its hash.

The token goes to its holder (an agent's ``collector.token_file``, Prometheus'
``authorization.credentials_file``, an operator's ``GPUWARDEN_API_TOKEN``); only the line, with
the token's SHA-256, goes in the collector's ``tokens_file``, so the file holds no secret. With
``--stdin`` the token is read instead of made (to move a token of the old two-column file to a
hashed line without handing out a new one).
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from gpuwarden.collector.credentials import (
    MIN_TOKEN_CHARS,
    CredentialsError,
    Role,
    new_token,
    parse_tokens,
    tokens_line,
)


def add_token_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``token`` action's options on the ``collector`` subcommand."""
    group = parser.add_argument_group("token options ('gpuwarden collector token')")
    group.add_argument("--role", choices=[role.value for role in Role], help="what it may do")
    group.add_argument("--subject", help="who holds it: a node, a person, a service")
    group.add_argument(
        "--nodes", help="agents: the host.name values or globs it may write (default: subject)"
    )
    group.add_argument(
        "--stdin", action="store_true", help="hash the token read from stdin instead of a new one"
    )


def run_token(args: argparse.Namespace, stdin: TextIO, out: TextIO, err: TextIO) -> int:
    """Print the token (line 1, unless ``--stdin``) and its tokens-file line; exit code."""
    if not args.role or not args.subject:
        print("gpuwarden collector token: needs --role and --subject", file=err)
        return 2
    role = Role(args.role)
    nodes = tuple(args.nodes.split(",")) if args.nodes else ()
    token = stdin.read().strip() if args.stdin else new_token()
    if len(token) < MIN_TOKEN_CHARS:
        print(f"gpuwarden collector token: a token needs {MIN_TOKEN_CHARS}+ characters", file=err)
        return 2
    line = tokens_line(role, args.subject, token, nodes)
    try:  # the line must load as written: the same checks as the collector's
        parse_tokens(line, "<line>")
    except CredentialsError as exc:
        print(f"gpuwarden collector token: {exc}", file=err)
        return 2
    if not args.stdin:
        print(token, file=out)
        print("# line 1: the token, for its holder only (shown once, never stored)", file=err)
    print(line, file=out)
    print("# the last line: append it to the collector's tokens_file", file=err)
    return 0


def main(args: argparse.Namespace) -> int:
    """The command on the process' standard streams."""
    return run_token(args, sys.stdin, sys.stdout, sys.stderr)

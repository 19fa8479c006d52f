"""``gpuwarden rules status``: each rule of a running collector, ready or warming up.

Reads the collector's ``/readyz`` (its ``rules`` list, ``detect.readiness``) with a bearer token
from ``--token-file`` or ``$GPUWARDEN_API_TOKEN`` (a reader's is enough; the probe route needs
none, but a token keeps the command working behind a proxy that wants one). Exit 0 when every
rule that runs is ready, 3 while some warm up, 1 when the collector cannot be read.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from gpuwarden.collector.cli.actions import MAX_ANSWER_BYTES, TOKEN_ENV, CliError
from gpuwarden.collector.extras import MissingExtraError, needs_extra

if TYPE_CHECKING:
    from gpuwarden.collector.clients.http import HttpClient

EXIT_READY, EXIT_ERROR, EXIT_WARMING = 0, 1, 3


def add_status_parser(kinds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``rules status`` to the ``rules`` subcommands."""
    status = kinds.add_parser(
        "status",
        help="each rule of a running collector: ready, warming up until, or skipped",
        description="Read the running collector's /readyz and print each rule's state: ready, "
        "warming up until <time> (its window or history reaches back before the oldest data "
        "the collector holds), or skipped: <reason>. Exit 0 when all running rules are ready, "
        "3 while some warm up, 1 when the collector cannot be read.",
    )
    status.add_argument("--url", required=True, help="the collector's URL, e.g. http://host:4318")
    status.add_argument(
        "--token-file", type=Path, help=f"file with a bearer token (or ${TOKEN_ENV})"
    )
    status.add_argument("--json", action="store_true", help="print the JSON list")


def _token(args: argparse.Namespace, environ: Mapping[str, str]) -> str:
    if args.token_file is None:
        return environ.get(TOKEN_ENV, "").strip()
    try:
        return str(args.token_file.read_text()).strip()
    except OSError as exc:
        raise CliError(f"{args.token_file}: cannot read the token: {exc.strerror}") from None


def fetch_rules(url: str, token: str, http: HttpClient) -> list[dict[str, Any]]:
    """The ``rules`` list of the collector's ``/readyz``."""
    if not url.startswith(("http://", "https://")):
        raise CliError(f"--url {url!r}: expected http:// or https://")
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    answer = http.request(
        "GET",
        url.rstrip("/") + "/readyz",
        headers=headers,
        timeout_seconds=30.0,
        max_body_bytes=MAX_ANSWER_BYTES,
    )
    if answer.status == 0:
        raise CliError(f"{url}: cannot reach the collector: {answer.detail}")
    if answer.status in (401, 403):
        raise CliError(f"{url}: {answer.status}: check the API token")
    try:
        body = json.loads(answer.body or b"{}")
    except ValueError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("rules"), list):
        raise CliError(f"{url}/readyz: {answer.status}: no rules listed (an older collector?)")
    return [r for r in body["rules"] if isinstance(r, dict)]


def render(rules: list[dict[str, Any]]) -> str:
    """One line per rule: id, detector, state text."""
    width = max((len(str(r.get("rule", ""))) for r in rules), default=4)
    lines = [f"{'rule':<{width}}  {'detector':<26}  state"]
    lines += [
        f"{r.get('rule', '?')!s:<{width}}  {r.get('detector', '?')!s:<26}  {r.get('text', '?')}"
        for r in rules
    ]
    return "\n".join(lines) + "\n"


def run_status(
    args: argparse.Namespace,
    out: TextIO,
    err: TextIO,
    environ: Mapping[str, str],
    http: HttpClient | None = None,
) -> int:
    """Run ``gpuwarden rules status``; return the exit code."""
    try:
        if http is None:
            with needs_extra("collector", "gpuwarden rules status"):
                from gpuwarden.collector.clients.http import HttpClient

            http = HttpClient()
        rules = fetch_rules(args.url, _token(args, environ), http)
    except MissingExtraError as exc:
        print(exc, file=err)
        return EXIT_ERROR
    except CliError as exc:
        print(f"gpuwarden rules status: {exc}", file=err)
        return EXIT_ERROR
    if args.json:
        out.write(json.dumps(rules, indent=2, sort_keys=True) + "\n")
    else:
        out.write(render(rules))
    warming = any(r.get("state") == "warming up" for r in rules)
    return EXIT_WARMING if warming else EXIT_READY

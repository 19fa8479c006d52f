"""The ``gpuwarden silence`` command: ``add``, ``list`` and ``expire`` operators' silences.

It talks to the collector's API (``--url``) with a bearer token from ``--token-file`` or
``$GPUWARDEN_API_TOKEN``, as an operator (``add``, ``expire``) or a reader (``list``); the
silence's creator is the token's subject, never something typed here. Light on purpose: the CLI
imports this module to build its parser.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from gpuwarden.collector.cli.actions import (
    EXIT_ERROR,
    EXIT_OK,
    MAX_ANSWER_BYTES,
    TOKEN_ENV,
    CliError,
)

if TYPE_CHECKING:
    from gpuwarden.collector.clients.http import HttpClient

MATCHER_OPTIONS = ("rule", "job", "node", "model", "team")


def add_silence_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``silence add|list|expire``."""
    silence = subparsers.add_parser(
        "silence", help="hold the notifications of matching incidents for a while"
    )
    sub = silence.add_subparsers(dest="silence_command", required=True, metavar="ACTION")
    add = sub.add_parser("add", help="create a silence (operator)")
    for name in MATCHER_OPTIONS:
        add.add_argument(f"--{name}", help=f"match the incident's {name} (a glob)")
    add.add_argument("--duration", help="how long, e.g. 4h, 90m, 2d (or --until)")
    add.add_argument("--until", type=float, help="end time, Unix seconds")
    add.add_argument("--comment", required=True, help="why (shown to everyone)")
    add.add_argument(
        "--actions", action="store_true", help="hold automated actions too (default: only alerts)"
    )
    add.add_argument(
        "--all", action="store_true", help="with no matcher: silence every incident (say so)"
    )
    _api_options(add)
    listing = sub.add_parser("list", help="list silences in force (reader)")
    listing.add_argument("--all", action="store_true", help="include ended silences")
    _api_options(listing)
    expire = sub.add_parser("expire", help="end a silence now (operator)")
    expire.add_argument("id", type=int)
    _api_options(expire)


def _api_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="the collector's URL, e.g. http://c:4318")
    parser.add_argument(
        "--token-file", type=Path, help=f"file with the API bearer token (or ${TOKEN_ENV})"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")


class SilenceApi:
    """The collector's ``/v1/silences`` with a bearer token."""

    def __init__(self, url: str, token: str, *, http: HttpClient | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise CliError(f"--url {url!r}: expected http:// or https://")
        self._url = url.rstrip("/")
        self._token = token
        if http is None:
            from gpuwarden.collector.clients.http import HttpClient

            http = HttpClient()
        self._http = http

    def __repr__(self) -> str:  # never show the token
        return f"SilenceApi({self._url!r})"

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        """One request; the answer's JSON, or :class:`CliError` with the collector's reason."""
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        answer = self._http.request(
            method,
            self._url + path,
            body=data,
            headers=headers,
            timeout_seconds=30.0,
            max_body_bytes=MAX_ANSWER_BYTES,
        )
        if answer.status == 0:
            raise CliError(f"{self._url}: cannot reach the collector: {answer.detail}")
        try:
            parsed = json.loads(answer.body or b"{}")
        except ValueError:
            parsed = {}
        if answer.status >= 400:
            reason = parsed.get("error") if isinstance(parsed, dict) else None
            raise CliError(f"{answer.status}: {reason or 'refused'}")
        return parsed


def _token(args: argparse.Namespace, environ: Mapping[str, str]) -> str:
    if args.token_file is not None:
        try:
            token = str(args.token_file.read_text()).strip()
        except OSError as exc:
            raise CliError(f"{args.token_file}: cannot read the token: {exc.strerror}") from None
    else:
        token = environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise CliError(f"needs a token: --token-file or ${TOKEN_ENV}")
    return token


def _request(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {
        "matchers": {name: getattr(args, name) for name in MATCHER_OPTIONS if getattr(args, name)},
        "comment": args.comment,
    }
    if args.duration is not None and args.until is not None:
        raise CliError("give --duration or --until, not both")
    if args.until is not None:
        body["ends_at"] = args.until
    else:
        body["duration"] = args.duration or "1h"
    if args.actions:
        body["actions"] = True
    if args.all:
        body["all"] = True
    return body


def silence_line(silence: Mapping[str, Any]) -> str:
    """One silence as a line: id, state, end, matchers, creator, comment."""
    matchers = ",".join(f"{k}={v}" for k, v in sorted(silence["matchers"].items())) or "(all)"
    ends = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(silence["ends_at"]))
    held = "alerts+actions" if silence.get("actions") else "alerts"
    return (
        f"{silence['silence_id']:>5}  {silence['state']:<7}  until {ends}  {held:<14}  "
        f"{matchers}  by {silence['created_by']}: {silence['comment']}"
    )


def run_silence(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    http: HttpClient | None = None,
) -> int:
    """Run ``gpuwarden silence ...``; return the exit code."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        api = SilenceApi(args.url, _token(args, environ), http=http)
        command = args.silence_command
        if command == "add":
            result: Any = api.call("POST", "/v1/silences", _request(args))
            rows = [result]
        elif command == "expire":
            result = api.call("DELETE", f"/v1/silences/{args.id}")
            rows = [result]
        else:
            result = api.call("GET", "/v1/silences" + ("?state=all" if args.all else ""))
            rows = list(result.get("silences", []))
    except CliError as exc:
        print(f"gpuwarden silence: {exc}", file=err)
        return EXIT_ERROR
    if args.json:
        out.write(json.dumps(result, indent=2, sort_keys=True) + "\n")
    else:
        out.writelines(silence_line(row) + "\n" for row in rows)
    return EXIT_OK

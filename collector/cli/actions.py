"""The ``gpuwarden incidents`` and ``gpuwarden actions`` commands.

``incidents list|show``; ``actions list|show|approve|reject|reset-breaker``.

Two backends behind one small protocol: the collector's SQLite file (``--db``; on the collector's
host) or the collector's API (``--url`` with a bearer token from ``--token-file`` or
``$GPUWARDEN_API_TOKEN``). Approving through the file only moves the action to ``approved``; the
running collector executes it at its next remediation pass, through the policy. Light on purpose:
the CLI imports this module to build its parser, so the heavy imports happen in the commands.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

if TYPE_CHECKING:
    from gpuwarden.collector.clients.http import HttpClient

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
MAX_ANSWER_BYTES = 16 * 1024 * 1024
"""The largest API answer read (a long incident list is a few megabytes)."""
TOKEN_ENV = "GPUWARDEN_API_TOKEN"  # noqa: S105 - a variable name, not a secret
Json = dict[str, Any]


class CliError(Exception):
    """A failure to report on stderr with exit code 1."""


class Backend(Protocol):
    """Where incidents and actions are read and changed."""

    def incidents(self, state: str | None) -> list[Json]:
        """Incidents, oldest first."""
        ...

    def incident(self, incident_id: int) -> Json | None:
        """One incident with its actions."""
        ...

    def actions(self, state: str | None, incident_id: int | None, limit: int) -> list[Json]:
        """Actions, newest first."""
        ...

    def action(self, action_id: int) -> Json | None:
        """One action."""
        ...

    def decide(self, action_id: int, verb: str) -> Json:
        """``approve`` or ``reject`` an action; the new record."""
        ...

    def reset_breaker(self) -> bool:
        """Close the breaker; ``False`` when it was not open."""
        ...

    def close(self) -> None:
        """Release the backend."""
        ...


class SqliteBackend:
    """Reads and changes the collector's SQLite file directly."""

    def __init__(self, path: Path, actor: str) -> None:
        from gpuwarden.collector.storage.sqlite import SqliteStorage

        if not path.is_file():
            raise CliError(f"{path}: no such database")
        self._storage = SqliteStorage(path)
        self._actor = actor

    def incidents(self, state: str | None) -> list[Json]:
        from gpuwarden.collector.storage.records import IncidentState
        from gpuwarden.collector.web.remediation import incident_json

        value = IncidentState(state) if state else None
        return [incident_json(i) for i in self._storage.incidents(state=value)]

    def incident(self, incident_id: int) -> Json | None:
        from gpuwarden.collector.web.remediation import action_json, incident_json

        found = self._storage.incident(incident_id)
        if found is None:
            return None
        out = incident_json(found)
        out["actions"] = [action_json(a) for a in self._storage.actions(incident_id=incident_id)]
        return out

    def actions(self, state: str | None, incident_id: int | None, limit: int) -> list[Json]:
        from gpuwarden.collector.web.remediation import action_json

        states = [state] if state else None
        rows = self._storage.actions(states=states, incident_id=incident_id, limit=limit)
        return [action_json(a) for a in rows]

    def action(self, action_id: int) -> Json | None:
        from gpuwarden.collector.web.remediation import action_json

        found = self._storage.action(action_id)
        return action_json(found) if found is not None else None

    def decide(self, action_id: int, verb: str) -> Json:
        from gpuwarden.collector.remediate.states import ActionStateError
        from gpuwarden.collector.remediate.transitions import approve_action, reject_action
        from gpuwarden.collector.web.remediation import action_json

        call = approve_action if verb == "approve" else reject_action
        try:
            row = call(self._storage, action_id, actor=self._actor, now=time.time())
        except ActionStateError as exc:
            raise CliError(str(exc)) from None
        return action_json(row)

    def reset_breaker(self) -> bool:
        from gpuwarden.collector.remediate.transitions import reset_breaker

        return reset_breaker(self._storage, actor=self._actor, now=time.time())

    def close(self) -> None:
        self._storage.close()


class ApiBackend:
    """Talks to the collector's ``/v1`` API with a bearer token."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout_seconds: float = 30.0,
        http: HttpClient | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise CliError(f"--url {url!r}: expected http:// or https://")
        self._url = url.rstrip("/")
        self._token = token
        self._timeout = timeout_seconds
        if http is None:
            from gpuwarden.collector.clients.http import HttpClient

            http = HttpClient()
        self._http = http

    def __repr__(self) -> str:  # never show the token
        return f"ApiBackend({self._url!r})"

    def _call(self, method: str, path: str) -> tuple[int, Json]:
        answer = self._http.request(
            method,
            self._url + path,
            headers={"Authorization": f"Bearer {self._token}", "Accept": "application/json"},
            timeout_seconds=self._timeout,
            max_body_bytes=MAX_ANSWER_BYTES,
        )
        if answer.status == 0:
            raise CliError(f"{self._url}: cannot reach the collector: {answer.detail}")
        if answer.status in (401, 403):
            raise CliError(f"{self._url}: {answer.status}: check the API token")
        try:
            body = json.loads(answer.body or b"{}")
        except ValueError:
            body = {}
        return answer.status, body if isinstance(body, dict) else {}

    def _get(self, path: str) -> Json | None:
        status, body = self._call("GET", path)
        if status == 404:
            return None
        if status >= 400:
            raise CliError(f"{path}: {status}: {body.get('error', 'failed')}")
        return body

    def incidents(self, state: str | None) -> list[Json]:
        body = self._get("/v1/incidents" + (f"?state={state}" if state else "")) or {}
        return list(body.get("incidents", []))

    def incident(self, incident_id: int) -> Json | None:
        return self._get(f"/v1/incidents/{incident_id}")

    def actions(self, state: str | None, incident_id: int | None, limit: int) -> list[Json]:
        query = [f"limit={limit}"]
        if state:
            query.append(f"state={state}")
        if incident_id is not None:
            query.append(f"incident={incident_id}")
        body = self._get("/v1/actions?" + "&".join(query)) or {}
        return list(body.get("actions", []))

    def action(self, action_id: int) -> Json | None:
        return self._get(f"/v1/actions/{action_id}")

    def decide(self, action_id: int, verb: str) -> Json:
        status, body = self._call("POST", f"/v1/actions/{action_id}/{verb}")
        if status >= 400:
            raise CliError(f"action {action_id}: {body.get('error', status)}")
        return body

    def reset_breaker(self) -> bool:
        status, body = self._call("POST", "/v1/breaker/reset")
        if status == 409:
            return False
        if status >= 400:
            raise CliError(f"breaker reset: {body.get('error', status)}")
        return True

    def close(self) -> None:
        """Nothing to release: one connection per call."""


def _backend_options(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--db", type=Path, help="the collector's SQLite file")
    where.add_argument("--url", help="the collector's URL, e.g. http://collector:4318")
    parser.add_argument(
        "--token-file", type=Path, help=f"file with the API bearer token (or ${TOKEN_ENV})"
    )
    parser.add_argument("--as", dest="actor", help="your name in the audit log (with --db)")
    parser.add_argument("--json", action="store_true", help="print JSON")


def add_incidents_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``incidents list|show``."""
    incidents = subparsers.add_parser("incidents", help="list and show incidents")
    sub = incidents.add_subparsers(dest="incidents_command", required=True, metavar="ACTION")
    listing = sub.add_parser("list", help="list incidents")
    listing.add_argument("--state", choices=["open", "resolved"])
    _backend_options(listing)
    show = sub.add_parser("show", help="show one incident and its actions")
    show.add_argument("id", type=int)
    _backend_options(show)


def add_actions_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``actions list|show|approve|reject|reset-breaker``."""
    actions = subparsers.add_parser("actions", help="list, approve and reject remediations")
    sub = actions.add_subparsers(dest="actions_command", required=True, metavar="ACTION")
    listing = sub.add_parser("list", help="list actions, newest first")
    listing.add_argument("--state", help="only actions in this state (e.g. awaiting_approval)")
    listing.add_argument("--incident", type=int, help="only this incident's actions")
    listing.add_argument("--limit", type=int, default=50)
    _backend_options(listing)
    for name, text in (
        ("show", "show one action"),
        ("approve", "approve an action (it runs through the policy)"),
        ("reject", "reject an action that has not run"),
    ):
        one = sub.add_parser(name, help=text)
        one.add_argument("id", type=int)
        _backend_options(one)
    reset = sub.add_parser(
        "reset-breaker", help="resume automation after the blast-radius breaker tripped"
    )
    _backend_options(reset)


def _open(args: argparse.Namespace, environ: Mapping[str, str]) -> Backend:
    if args.db is not None:
        return SqliteBackend(args.db, args.actor or getpass.getuser())
    if args.token_file is not None:
        try:
            token = args.token_file.read_text().strip()
        except OSError as exc:
            raise CliError(f"{args.token_file}: cannot read the token: {exc.strerror}") from None
    else:
        token = environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise CliError(f"--url needs a token: --token-file or ${TOKEN_ENV}")
    return ApiBackend(args.url, token)


def _incident_line(i: Json) -> str:
    summary = i.get("evidence", {}).get("summary", "")
    return (
        f"{i['incident_id']:>6}  {i['state']:<8}  {i['severity']:<8}  {i['rule_id']:<24}  {summary}"
    )


def _action_line(a: Json) -> str:
    mode = f"{a['mode']}{' (dry run)' * bool(a.get('dry_run'))}"
    return (
        f"{a['action_id']:>6}  {a['state']:<17}  {a['action']:<9}  {mode:<16}  "
        f"incident {a['incident_id']:<6}  {a['target']}"
    )


def _print(value: object, out: TextIO) -> None:
    out.write(json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")


def run_incidents(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run ``gpuwarden incidents ...``; return the exit code."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        backend = _open(args, environ)
    except CliError as exc:
        print(f"gpuwarden incidents: {exc}", file=err)
        return EXIT_ERROR
    try:
        if args.incidents_command == "show":
            found = backend.incident(args.id)
            if found is None:
                raise CliError(f"no incident {args.id}")
            _print(found, out)
            return EXIT_OK
        rows = backend.incidents(args.state)
    except CliError as exc:
        print(f"gpuwarden incidents: {exc}", file=err)
        return EXIT_ERROR
    finally:
        backend.close()
    if args.json:
        _print(rows, out)
    else:
        out.writelines(_incident_line(i) + "\n" for i in rows)
    return EXIT_OK


def run_actions(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run ``gpuwarden actions ...``; return the exit code."""
    out, err = out or sys.stdout, err or sys.stderr
    command = args.actions_command
    try:
        backend = _open(args, environ)
    except CliError as exc:
        print(f"gpuwarden actions: {exc}", file=err)
        return EXIT_ERROR
    try:
        if command == "list":
            rows = backend.actions(args.state, args.incident, max(1, args.limit))
            if args.json:
                _print(rows, out)
            else:
                out.writelines(_action_line(a) + "\n" for a in rows)
        elif command == "show":
            found = backend.action(args.id)
            if found is None:
                raise CliError(f"no action {args.id}")
            _print(found, out)
        elif command in ("approve", "reject"):
            row = backend.decide(args.id, command)
            out.write(_action_line(row) + "\n")
        elif backend.reset_breaker():
            out.write("breaker closed: automation resumes (halted actions stay halted)\n")
        else:
            raise CliError("the breaker is not open")
    except CliError as exc:
        print(f"gpuwarden actions: {exc}", file=err)
        return EXIT_ERROR
    finally:
        backend.close()
    return EXIT_OK

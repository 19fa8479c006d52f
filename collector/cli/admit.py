"""``gpuwarden policies admit``: ask the collector whether a Slurm job may be submitted.

Called by ``deploy/slurm/job_submit.lua`` inside ``slurmctld``: the job's fields arrive as JSON
on stdin (never on a command line), go to ``POST /admission/v1/slurm`` with an ``admission``
token, and the verdict comes back as one line on stdout, which the Lua script reads (Lua 5.1's
``io.popen`` gives no exit status)::

    ALLOW <why>      the job may be submitted
    DENY <message>   a limit policy refuses it: slurmctld shows the message to the user
    ERROR <why>      no verdict (collector unreachable, bad token, bad answer)

The exit code says the same (0 allow, 1 deny, 2 error). Standard library only, so the hook
starts fast and needs no collector extras on the controller.
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import TextIO

SLURM_PATH = "/admission/v1/slurm"
EXIT_ALLOW, EXIT_DENY, EXIT_ERROR = 0, 1, 2
MAX_INPUT_BYTES = 64 * 1024
MAX_ANSWER_BYTES = 64 * 1024


def add_admit_parser(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``policies admit`` to the ``policies`` actions."""
    admit = actions.add_parser(
        "admit",
        help="ask the collector whether a Slurm job (JSON on stdin) may be submitted",
        description="Send a Slurm job request (JSON on stdin, the fields job_submit.lua writes) "
        "to the collector's admission check and print ALLOW, DENY or ERROR and a message. "
        "Exit 0 allow, 1 deny, 2 error.",
    )
    admit.add_argument("--url", required=True, help="the collector, e.g. https://collector:4318")
    admit.add_argument(
        "--token-file", required=True, type=Path, help="file holding an admission token"
    )
    admit.add_argument(
        "--ca-file", type=Path, help="CA bundle that signs the collector's certificate"
    )
    admit.add_argument(
        "--timeout", type=float, default=5.0, help="seconds to wait for the answer (default 5)"
    )


_EXIT = {"ALLOW": EXIT_ALLOW, "DENY": EXIT_DENY, "ERROR": EXIT_ERROR}


def _ask(args: argparse.Namespace, body: bytes) -> tuple[str, str]:
    """The verdict word and its message."""
    url = args.url.rstrip("/") + SLURM_PATH
    if not url.startswith(("https://", "http://")):
        return "ERROR", f"--url must be http(s)://..., got {args.url!r}"
    try:
        token = args.token_file.read_text().strip()
        context = ssl.create_default_context(cafile=args.ca_file) if args.ca_file else None
    except (OSError, ssl.SSLError) as exc:
        return "ERROR", str(exc)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)  # noqa: S310 (scheme checked above)
    try:
        with urllib.request.urlopen(request, timeout=args.timeout, context=context) as answer:  # noqa: S310
            verdict = json.loads(answer.read(MAX_ANSWER_BYTES))
    except urllib.error.HTTPError as exc:
        detail = exc.read(500).decode(errors="replace")
        return "ERROR", f"collector answered {exc.code}: {detail}"
    except (OSError, ValueError) as exc:
        return "ERROR", f"no answer from the collector: {exc}"
    if not isinstance(verdict, dict) or not isinstance(verdict.get("allowed"), bool):
        return "ERROR", "the collector's answer has no 'allowed'"
    return ("ALLOW" if verdict["allowed"] else "DENY"), str(verdict.get("message", ""))


def run_admit(
    args: argparse.Namespace, stdin: TextIO | None = None, out: TextIO | None = None
) -> int:
    """Ask once and print the verdict line (one line: the message's whitespace folded)."""
    stdin = stdin if stdin is not None else sys.stdin
    out = out if out is not None else sys.stdout
    body = stdin.read(MAX_INPUT_BYTES + 1).encode()
    if len(body) > MAX_INPUT_BYTES:
        word, message = "ERROR", f"job request over {MAX_INPUT_BYTES} bytes"
    else:
        word, message = _ask(args, body)
    print(f"{word} {' '.join(message.split())}", file=out)
    return _EXIT[word]

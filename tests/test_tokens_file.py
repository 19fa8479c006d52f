"""The tokens file (role, subject, token or its SHA-256, bound nodes): what loads, every way it
does not, how a presented token is matched, and ``gpuwarden collector token``."""

from __future__ import annotations

import argparse
import hashlib
import io

import pytest

from gpuwarden.collector.cli.tokens import add_token_arguments, run_token
from gpuwarden.collector.credentials import (
    Credential,
    CredentialsError,
    Role,
    TokenTable,
    node_allowed,
    parse_tokens,
)

PLAIN = "plain-token-0123456789abcdef"
HASHED = "hashed-token-0123456789abcdef"
DIGEST = hashlib.sha256(HASHED.encode()).hexdigest()


def test_every_role_and_both_forms_load():
    table = parse_tokens(
        "# role subject token options\n"
        "\n"
        f"agent gpu-node-01 {PLAIN}   # bound to its subject\n"
        f"agent rack3 sha256:{DIGEST} nodes=gpu-rack3-*,spare-1\n"
        f"reader grafana sha256:{'ab' * 32}\n"
        f"operator alice sha256:{'cd' * 32}\n"
        f"admin root sha256:{'EF' * 32}\n"
        f"alert-source alertmanager sha256:{'01' * 32}\n",
        "tokens",
    )
    assert [(c.role, c.subject, c.nodes) for c in table.credentials] == [
        (Role.AGENT, "gpu-node-01", ("gpu-node-01",)),
        (Role.AGENT, "rack3", ("gpu-rack3-*", "spare-1")),
        (Role.READER, "grafana", ()),
        (Role.OPERATOR, "alice", ()),
        (Role.ADMIN, "root", ()),
        (Role.ALERT_SOURCE, "alertmanager", ()),
    ]
    plain, hashed = table.match(PLAIN), table.match(HASHED)
    assert plain is not None
    assert plain.subject == "gpu-node-01"
    assert hashed is not None
    assert hashed.subject == "rack3"
    assert table.match(PLAIN + "x") is None
    assert table.match("\udcff-not-text-0123456789") is None  # a non-UTF-8 header byte
    assert PLAIN not in repr(table)
    assert DIGEST not in repr(table.credentials[1])


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            f"node-a {PLAIN}",
            "t:2: two columns is the old '<name> <token>' format, which made every token an "
            "admin; write '<role> <subject> <token or sha256:hex> [nodes=a,b]' "
            "(roles: agent, reader, operator, admin, alert-source, admission)",
        ),
        ("agent", "t:2: expected '<role> <subject> <token or sha256:hex> [nodes=a,b]'"),
        (
            f"agnet node-a {PLAIN}",
            "t:2: unknown role 'agnet'; roles: agent, reader, operator, admin, alert-source, "
            "admission",
        ),
        # a long first column may be a token in the wrong place: not repeated
        (f"{PLAIN} node-a agent", "t:2: unknown role; roles: agent, reader,"),
        ("agent node-a short", "t:2: a token needs 16+ characters (or write sha256:<hex>)"),
        ("agent node-a sha256:abc", "t:2: sha256: needs 64 hex digits (a SHA-256)"),
        (f"agent node-a sha256:{'zz' * 32}", "t:2: sha256: needs 64 hex digits"),
        (f"agent node-a {PLAIN} node=a", "t:2: unknown option 'node'; the only one is nodes="),
        (f"agent node-a {PLAIN} nodes", "t:2: unknown option 'nodes'; the only one is nodes="),
        (f"reader bob {PLAIN} nodes=a", "t:2: nodes= binds agent tokens only, not reader"),
        (f"agent node-a {PLAIN} nodes=a nodes=b", "t:2: nodes= given twice"),
        (f"agent node-a {PLAIN} nodes=", "t:2: nodes= needs node names or globs"),
        (f"agent node-a {PLAIN} nodes=a,,b", "t:2: nodes= needs node names or globs"),
        (f"agent node-b {hashlib.sha256(b'x').hexdigest()}", None),  # 64 chars: a plain token
        (f"reader bob sha256:{hashlib.sha256(PLAIN.encode()).hexdigest()}", "the same token"),
        (f"reader bob {PLAIN}", "t:2: the same token as line 1 (each holder needs its own)"),
    ],
)
def test_each_error_names_file_and_line_and_never_the_token(line, message):
    text = f"agent node-a {PLAIN}\n{line}\n"
    if message is None:
        assert len(parse_tokens(text, "t")) == 2
        return
    with pytest.raises(CredentialsError) as info:
        parse_tokens(text, "t")
    assert message in str(info.value)
    assert PLAIN not in str(info.value)


@pytest.mark.parametrize(
    ("patterns", "node", "allowed"),
    [
        (("gpu-node-01",), "gpu-node-01", True),
        (("gpu-node-01",), "gpu-node-010", False),
        (("gpu-rack3-*",), "gpu-rack3-07", True),
        (("gpu-rack3-*",), "gpu-rack4-07", False),
        (("gpu-rack3-*",), "GPU-RACK3-07", False),  # case matters, like host names in the store
        (("*",), "", True),  # a gateway's token: any node, even none
        (("gpu-*",), "", False),  # a resource without host.name
        ((), "gpu-node-01", False),
    ],
)
def test_bound_nodes_are_names_or_globs(patterns, node, allowed):
    assert node_allowed(patterns, node) is allowed


def token_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_token_arguments(parser)
    return parser.parse_args(argv)


def test_the_token_command_prints_a_token_and_the_line_holding_its_hash():
    out, err = io.StringIO(), io.StringIO()
    args = token_args("--role", "agent", "--subject", "gpu-node-01", "--nodes", "gpu-rack3-*")
    assert run_token(args, io.StringIO(), out, err) == 0
    token, line = out.getvalue().splitlines()
    assert len(token) >= 43  # 32 random bytes
    assert token not in line
    assert line.startswith("agent gpu-node-01 sha256:")
    assert line.endswith(" nodes=gpu-rack3-*")
    found = parse_tokens(line, "tokens").match(token)
    assert found == Credential(
        Role.AGENT, "gpu-node-01", hashlib.sha256(token.encode()).digest(), ("gpu-rack3-*",)
    )
    again = io.StringIO()
    run_token(args, io.StringIO(), again, io.StringIO())
    assert again.getvalue().splitlines()[0] != token  # a new one every time


def test_the_token_command_hashes_a_token_from_stdin():
    out = io.StringIO()
    args = token_args("--role", "reader", "--subject", "grafana", "--stdin")
    assert run_token(args, io.StringIO(f"{PLAIN}\n"), out, io.StringIO()) == 0
    (line,) = out.getvalue().splitlines()
    table = parse_tokens(line, "tokens")
    found = table.match(PLAIN)
    assert found is not None
    assert (found.role, found.subject) == (Role.READER, "grafana")


@pytest.mark.parametrize(
    ("argv", "stdin", "message"),
    [
        (("--role", "reader"), "", "needs --role and --subject"),
        (("--role", "reader", "--subject", "x", "--stdin"), "short\n", "16+ characters"),
        (("--role", "reader", "--subject", "x", "--nodes", "a"), "", "nodes= binds agent"),
    ],
)
def test_the_token_command_refuses_what_would_not_load(argv, stdin, message):
    out, err = io.StringIO(), io.StringIO()
    assert run_token(token_args(*argv), io.StringIO(stdin), out, err) == 2
    assert message in err.getvalue()
    assert out.getvalue() == ""


def test_an_empty_table_matches_nothing():
    assert not TokenTable()
    assert TokenTable().match(PLAIN) is None

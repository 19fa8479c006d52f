"""The agent stays light: importing any agent module never imports the collector's stack."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("pandas", "statsmodels", "aiohttp", "numpy", "scipy")
AGENT_MODULES = (
    "gpuwarden.cli",
    "gpuwarden.agent",
    "gpuwarden.agent.build",
    "gpuwarden.agent.main",
    "gpuwarden.agent.daemon",
    "gpuwarden.agent.telemetry",
    "gpuwarden.agent.sources.nvml",
    "gpuwarden.agent.sources.simulated",
    "gpuwarden.agent.sources.replay",
    "gpuwarden.agent.attribution",
    "gpuwarden.agent.host",
    "gpuwarden.agent.spool",
    "gpuwarden.agent.sender",
    "gpuwarden.agent.install",
    "gpuwarden.agent.http",
)


def test_agent_imports_none_of_the_heavy_packages():
    code = (
        "import importlib, sys\n"
        f"for m in {AGENT_MODULES!r}: importlib.import_module(m)\n"
        "import opentelemetry.exporter.prometheus\n"
        f"print(','.join(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""


def test_the_agent_command_loads_no_module_of_the_collector():
    # every parser of the command line imported the collector's command modules (rules,
    # policies, budgets, silences, backtest): a node agent carried them, about 3 MiB of its RSS
    code = (
        "import sys\n"
        "from gpuwarden.cli import main\n"
        "code = main(['--log-level', 'ERROR', 'agent', '--source', 'simulated', '--once'])\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('gpuwarden.collector'))\n"
        "print('collector modules:', ','.join(loaded), file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip()  # the round it printed
    assert out.stderr.strip().splitlines()[-1] == "collector modules:"


def test_agent_help_works_without_the_collector():
    out = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "agent", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert "--nvml-library" in out.stdout
    assert "install" in out.stdout


def _closure(dist: str, extras: frozenset[str] = frozenset()) -> set[str]:
    """Names of every distribution ``dist`` pulls in, following installed metadata."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = [(dist, extras)]
    while todo:
        name, wanted = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        try:
            reqs = requires(name) or []
        except PackageNotFoundError:
            continue
        for raw in reqs:
            req = Requirement(raw)
            if req.marker is not None and not any(
                req.marker.evaluate({"extra": e}) for e in (wanted or {""})
            ):
                continue
            todo.append((req.name, frozenset(req.extras)))
    return seen


def test_agent_install_pulls_no_collector_dependencies():
    base = _closure("gpuwarden")
    assert "nvidia-ml-py" in base
    assert "pynvml" not in base, "the deprecated pynvml shim must not be a dependency"
    assert not base & {"pandas", "statsmodels", "aiohttp", "numpy", "scipy"}
    assert "aiohttp" in _closure("gpuwarden", frozenset({"collector"}))

"""``gpuwarden agent install``: write a systemd unit and a commented config, then verify."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

UNIT_NAME = "gpuwarden-agent.service"


def _template(name: str) -> str:
    return resources.files("gpuwarden.agent").joinpath("deploy", name).read_text(encoding="utf-8")


def render_unit(executable: str, config_path: Path) -> str:
    """The systemd unit text for this executable and config file."""
    if any(c.isspace() for c in executable) or any(c.isspace() for c in str(config_path)):
        raise ValueError("the executable and config paths must not contain whitespace")
    return _template(UNIT_NAME).format(executable=executable, config_path=config_path)


def default_config() -> str:
    """The commented default agent config."""
    return _template("agent.yaml")


def _write(path: Path, text: str, *, force: bool, mode: int) -> bool:
    if path.exists() and not force:
        print(f"kept existing {path} (use --force to overwrite)")
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)
    print(f"wrote {path}")
    return True


def verify_unit(unit_path: Path) -> tuple[bool, str]:
    """Run ``systemd-analyze verify`` on the unit when the tool exists; (ok, output)."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        return True, "systemd-analyze not found; unit not verified"
    proc = subprocess.run(
        [tool, "verify", str(unit_path)], capture_output=True, text=True, check=False, timeout=60
    )
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def install(args: argparse.Namespace, config_source: Path | None) -> int:
    """Write the unit and config; return the exit code."""
    beside_python = Path(sys.executable).parent / "gpuwarden"
    executable = args.executable or (
        str(beside_python) if beside_python.exists() else shutil.which("gpuwarden")
    )
    if not executable:
        print("gpuwarden agent install: pass --executable with the gpuwarden path", file=sys.stderr)
        return 2
    config_path: Path = args.config_path if config_source is None else config_source
    try:
        unit = render_unit(executable, config_path.absolute())
    except ValueError as exc:
        print(f"gpuwarden agent install: {exc}", file=sys.stderr)
        return 2
    unit_path = args.unit_dir / UNIT_NAME
    if config_source is None:
        _write(config_path, default_config(), force=args.force, mode=0o640)
    _write(unit_path, unit, force=args.force, mode=0o644)
    if not args.no_verify:
        ok, output = verify_unit(unit_path)
        if not ok:
            print(f"systemd-analyze verify failed:\n{output}", file=sys.stderr)
            return 1
        if output:
            print(output)
    print(f"next: systemctl daemon-reload && systemctl enable --now {UNIT_NAME}")
    return 0

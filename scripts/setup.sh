#!/usr/bin/env bash
# Shared set-up for the two README commands: a project virtualenv with gpuwarden installed.
# Usage: source scripts/setup.sh [extras]   (extras default: dev)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
extras="${1:-dev}"
py="${PYTHON:-python3}"
if [ ! -x "$root/.venv/bin/python" ]; then
  "$py" -m venv "$root/.venv"
fi
stamp="$root/.venv/.gpuwarden-installed-$extras"
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
  "$root/.venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip setuptools wheel
  "$root/.venv/bin/python" -m pip install -q --disable-pip-version-check -e "$root[$extras]"
  touch "$stamp"
fi

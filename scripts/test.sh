#!/usr/bin/env bash
# The whole test suite, from nothing: system packages, virtualenv, lint, types, layering, tests.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/system-packages.sh
source scripts/setup.sh dev
.venv/bin/ruff check .
.venv/bin/ruff format --check .
bash scripts/typecheck.sh
bash scripts/lint-imports.sh
set +e
.venv/bin/pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: treating as a failure" >&2
  exit 1
fi
exit "$rc"

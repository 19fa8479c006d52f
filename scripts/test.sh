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
# where protobuf-c and xxHash are installed (system-packages.sh installs them as root, as CI
# runs), the compiled remote-write reader must have been built: its tests fail instead of skip
if command -v protoc-c >/dev/null && [ -e /usr/include/protobuf-c/protobuf-c.h ] \
  && [ -e /usr/include/xxhash.h ]; then
  export GPUWARDEN_REQUIRE_NATIVE="${GPUWARDEN_REQUIRE_NATIVE:-1}"
fi
set +e
.venv/bin/pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: treating as a failure" >&2
  exit 1
fi
exit "$rc"

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
# the compiled remote-write reader (setup.py) is built again where it can be and is missing or
# older than its source (protobuf-c installed since, or native/ changed)
native_stale=0
if command -v protoc-c >/dev/null && [ -e /usr/include/protobuf-c/protobuf-c.h ] \
  && [ -e /usr/include/xxhash.h ]; then
  built=$(compgen -G "$root/collector/remote_write/_rwflat*.so" | head -n 1 || true)
  if [ -z "$built" ] || [ "$root/native/rwflat.c" -nt "$built" ] \
    || [ "$root/native/rwflat.proto" -nt "$built" ]; then
    native_stale=1
  fi
fi
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ] || [ "$native_stale" -eq 1 ]; then
  "$root/.venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip setuptools wheel
  "$root/.venv/bin/python" -m pip install -q --disable-pip-version-check -e "$root[$extras]"
  touch "$stamp"
fi

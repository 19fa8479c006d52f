#!/usr/bin/env bash
# The demo, from nothing: virtualenv, install, and a simulated fleet through the real pipeline.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup.sh" collector
exec "$root/.venv/bin/gpuwarden" demo "$@"

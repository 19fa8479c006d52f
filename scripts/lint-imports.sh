#!/usr/bin/env bash
# import-linter over the package as Python imports it (gpuwarden.agent from agent/, ...).
# Like scripts/typecheck.sh: setuptools' editable-install hook maps the folders, which grimp
# cannot follow, so we lay out a link tree that mirrors package-dir in pyproject.toml and put it
# first on the import path. The contracts are under [tool.importlinter] in pyproject.toml.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
base="$root/.tmp/lint-imports"
tree="$base/gpuwarden"
rm -rf "$base" && mkdir -p "$tree"
for f in "$root"/gpuwarden/*; do ln -s "$f" "$tree/$(basename "$f")"; done
for d in agent collector rules runbooks dashboards; do ln -s "$root/$d" "$tree/$d"; done
# lint-imports puts the working directory first on sys.path: run it from the link tree, not the
# repository root (whose gpuwarden/ folder alone holds neither agent nor collector).
cd "$base"
PYTHONPATH="$base" exec "$root/.venv/bin/lint-imports" "$root/pyproject.toml" --no-cache "$@"

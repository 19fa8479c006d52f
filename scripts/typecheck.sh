#!/usr/bin/env bash
# mypy --strict over the package as Python imports it (gpuwarden.agent from agent/, ...).
# mypy cannot follow setuptools' editable-install import hook, so we lay out a link tree that
# mirrors the package-dir mapping in pyproject.toml and check that.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tree="$root/.tmp/mypy/gpuwarden"
rm -rf "$root/.tmp/mypy" && mkdir -p "$tree"
for f in "$root"/gpuwarden/*; do ln -s "$f" "$tree/$(basename "$f")"; done
for d in agent collector rules runbooks dashboards; do ln -s "$root/$d" "$tree/$d"; done
cd "$root"
exec .venv/bin/mypy "$@"

"""Every Python package of the source tree is in ``pyproject.toml``'s package list.

The list is explicit (the tree's folders map onto ``gpuwarden.*`` through ``package-dir``), so a
new package left out of it still imports in an editable install and in this repository, and is
missing only from a built wheel: ``gpuwarden report`` once failed that way on an agent-only
install (``gpuwarden.collector.fairness``).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_of_the_tree_is_listed() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = set()
    for name, folder in setuptools["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *parts)))
    missing = sorted(found - listed)
    assert found, "no package found: the test reads the wrong folders"
    assert missing == [], f"add to [tool.setuptools] packages in pyproject.toml: {missing}"

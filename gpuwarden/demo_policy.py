"""The demo's policy: ``llama-70b`` may hold at most 8 GPUs, so the SLO burn's scale-up is refused.

The serving job already holds gpu-node-c's eight GPUs. When the slow deploy burns the SLO, the
``slo-burn-fast`` rule scales ``llama-70b`` up by one replica automatically; the limit below
refuses that before any actuator is called (the action row ``refused``, the audit naming the
policy) and opens a ``policy-breach`` incident, whose alert the console prints. Degrading to the
smaller model, which needs no GPU, goes on as before.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec

from gpuwarden.collector.config import CollectorConfig

POLICY_NAME = "llama-70b-ceiling"
POLICIES_YAML = f"""\
# gpuwarden demo: written by gpuwarden/demo_policy.py (docs/policies.md)
version: 1
policies:
  - name: {POLICY_NAME}
    kind: limit
    description: The 70B model serves from one 8-GPU node; it may not grow beyond it.
    selector: {{models: [llama-70b]}}
    max_gpus_per_model: 8
"""


def with_demo_policies(
    config: CollectorConfig, directory: Path, say: Callable[[str], None]
) -> CollectorConfig:
    """``config`` with ``policies_dir`` set to ``directory``, where the demo's policy is written."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "demo.yaml").write_text(POLICIES_YAML)
    say(f"policy: {POLICY_NAME}: llama-70b may hold at most 8 GPUs ({directory / 'demo.yaml'})")
    return msgspec.structs.replace(config, policies_dir=directory)

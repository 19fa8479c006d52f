"""The collector's ``fairness:`` section: each team's entitled share of the GPUs.

```yaml
fairness:
  targets: {nlp: 0.5, vision: 0.3}   # shares in (0, 1], summing to at most 1
```

A team without a target has none: its share used is shown, never judged against a target.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import msgspec

#: rounding slack when adding shares written with a few decimals (0.1 + 0.2 + 0.7)
SUM_TOLERANCE = 1e-9


class FairnessSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Entitled shares by team."""

    targets: Mapping[str, float] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        """Reject a share outside (0, 1], an empty team name, or shares adding up past 1."""
        for team, share in self.targets.items():
            if not team.strip():
                raise ValueError("targets: a team name is empty")
            if not (math.isfinite(share) and 0 < share <= 1):
                raise ValueError(f"targets.{team}: share {share:g} is not in (0, 1]")
        total = sum(self.targets.values())
        if total > 1 + SUM_TOLERANCE:
            raise ValueError(
                f"targets: the shares add up to {total:g}, more than the whole fleet (1)"
            )

    def target(self, team: str | None) -> float | None:
        """The team's entitled share, ``None`` when it has none."""
        return self.targets.get(team) if team is not None else None

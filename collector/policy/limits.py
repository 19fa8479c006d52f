"""The ``limit`` check: would a request for GPUs breach a limit policy? Pure: data in, breaches out.

The admission webhook and the remediation path both call :func:`check_limits`; it reads no clock,
store or scheduler. ``usage`` is what the fleet holds now (GPUs per team and per model, the
request not included); a team or model limit counts that plus the request.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gpuwarden.collector.policy.model import LimitPolicy, Policy, PolicyKind


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitRequest:
    """A job, pod or scale-up asking for ``gpus`` GPUs; unknown facts are ``None``."""

    gpus: int
    team: str | None = None
    job: str | None = None
    job_kind: str | None = None
    model: str | None = None
    cluster: str | None = None


def _empty() -> Mapping[str, int]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Usage:
    """GPUs held now, per team and per model (absent: none)."""

    gpus_by_team: Mapping[str, int] = field(default_factory=_empty)
    gpus_by_model: Mapping[str, int] = field(default_factory=_empty)


@dataclass(frozen=True, slots=True, kw_only=True)
class Breach:
    """One limit a request would exceed: ``gpus`` (would-be total) over ``limit``."""

    policy: str
    key: str
    """The policy key breached: ``max_gpus_per_job``, ``max_gpus_per_team`` or ``..._model``."""
    limit: int
    gpus: int
    reason: str
    kind: PolicyKind = PolicyKind.LIMIT


def _breaches(policy: LimitPolicy, request: LimitRequest, usage: Usage) -> Iterable[Breach]:
    checks = (
        ("max_gpus_per_job", policy.max_gpus_per_job, 0, f"job {request.job or '?'}"),
        (
            "max_gpus_per_team",
            policy.max_gpus_per_team,
            usage.gpus_by_team.get(request.team, 0) if request.team is not None else 0,
            f"team {request.team}",
        ),
        (
            "max_gpus_per_model",
            policy.max_gpus_per_model,
            usage.gpus_by_model.get(request.model, 0) if request.model is not None else 0,
            f"model {request.model}",
        ),
    )
    for key, limit, held, whom in checks:
        if limit is None:
            continue
        if key == "max_gpus_per_team" and request.team is None:
            continue  # a team limit cannot count a request of no known team
        if key == "max_gpus_per_model" and request.model is None:
            continue
        total = held + request.gpus
        if total > limit:
            counted = f"{held} held + {request.gpus} requested" if held else f"{request.gpus}"
            yield Breach(
                policy=policy.name,
                key=key,
                limit=limit,
                gpus=total,
                reason=f"{whom} would hold {total} GPUs ({counted}); policy {policy.name} "
                f"allows at most {limit} ({key})",
            )


def check_limits(
    policies: Iterable[Policy], request: LimitRequest, usage: Usage | None = None
) -> list[Breach]:
    """Every limit ``request`` would breach, in policy order (empty: allowed).

    Only ``limit`` policies whose selector matches the request count; other kinds are skipped,
    so the whole policy set may be passed.
    """
    held = usage if usage is not None else Usage()
    found: list[Breach] = []
    for policy in policies:
        if not isinstance(policy, LimitPolicy):
            continue
        if not policy.selector.matches(
            team=request.team,
            job=request.job,
            job_kind=request.job_kind,
            model=request.model,
            cluster=request.cluster,
        ):
            continue
        found.extend(_breaches(policy, request, held))
    return found

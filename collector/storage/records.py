"""Records the collector persists besides jobs: models, events, accounting, incidents, audit.

All are frozen dataclasses; times are Unix seconds (``float``), ``None`` means "not known" and is
never replaced by 0. JSON-valued fields (``labels``, ``attributes``, ``evidence``, ``inputs``) are
JSON objects: keys are strings, values are what ``json.dumps`` accepts except NaN and infinities
(which are not JSON: use ``None`` for a missing number). The ``*_json`` helpers here are the one
place that encodes them, so every backend stores the same text.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from gpuwarden.collector.jobs.model import GpuAllocation

JsonObject = Mapping[str, Any]
"""A JSON object as stored; read back as a read-only mapping."""


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


class EventKind(enum.StrEnum):
    """What happened: the events detectors correlate with (deploys, preemption notices...)."""

    DEPLOY = "deploy"
    ROLLBACK = "rollback"
    SCALE = "scale"
    PREEMPTION_NOTICE = "preemption_notice"
    NODE_DRAIN = "node_drain"
    GPU_LOST = "gpu_lost"


class IncidentState(enum.StrEnum):
    """An incident is open until its rule has stayed clear long enough (hysteresis)."""

    OPEN = "open"
    RESOLVED = "resolved"


@dataclass(frozen=True, slots=True)
class ModelDeployment:
    """The current deployment of a model; one per ``name`` (a deploy replaces the version)."""

    name: str
    version: str
    replicas: int
    slo_latency_p99_seconds: float | None = None
    slo_error_ratio: float | None = None
    fallback_model: str | None = None
    labels: Mapping[str, str] = field(default_factory=_empty)


@dataclass(frozen=True, slots=True)
class Event:
    """A point event; ``subject`` names what it is about (model name, job key, node, GPU UUID).

    Events are identified by ``(time, kind, subject)``: recording the same one twice is a no-op,
    so an adapter may re-report what it saw on every poll.
    """

    time: float
    kind: EventKind
    subject: str
    attributes: JsonObject = field(default_factory=_empty)


def deployed_version(event: Event) -> str | None:
    """The version a deploy or rollback event put in service (``to``, else ``version``)."""
    value = event.attributes.get("to", event.attributes.get("version"))
    return str(value) if value not in (None, "") else None


@dataclass(frozen=True, slots=True)
class AccountingRow:
    """One GPU's share of one period for one job (``job_key=None``: allocated to no job).

    Identified by ``(period_start, job_key, gpu_uuid)``. ``team``, ``model`` (the job's model
    deployment) and ``price_tier`` are the job's, copied so that totals survive job pruning.
    ``gpu_seconds_unknown`` is allocated time without a utilisation sample: it is neither busy
    nor idle, and never billed (only the no-job row has it). ``energy_joules``, ``cost`` and
    ``carbon_grams`` are ``None`` when their inputs were missing, never 0. ``cost`` is in
    ``currency`` (the price table's ISO 4217 code; None on rows written before it was kept).
    """

    period_start: float
    period_seconds: float
    job_key: str | None
    team: str | None
    model: str | None
    node: str
    gpu_uuid: str
    price_tier: str | None
    gpu_seconds_allocated: float
    gpu_seconds_busy: float
    gpu_seconds_idle: float
    energy_joules: float | None = None
    cost: float | None = None
    carbon_grams: float | None = None
    gpu_seconds_unknown: float = 0.0
    currency: str | None = None
    #: the job's ``project`` label (chargeback by project; None: the job names none)
    project: str | None = None
    #: the GPU's model (``hw.model``), for chargeback by GPU model (None on older rows)
    gpu_model: str | None = None

    def __post_init__(self) -> None:
        if not self.gpu_uuid:
            raise ValueError("AccountingRow.gpu_uuid must not be empty")
        if self.job_key == "":
            raise ValueError("AccountingRow.job_key: use None, not '', for 'no job'")
        if not (math.isfinite(self.period_seconds) and self.period_seconds > 0):
            raise ValueError(f"AccountingRow.period_seconds must be > 0, got {self.period_seconds}")
        for name in _MEASURES:
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"AccountingRow.{name} must be finite (None if missing): {value}")


_MEASURES = (
    "period_start",
    "gpu_seconds_allocated",
    "gpu_seconds_busy",
    "gpu_seconds_idle",
    "gpu_seconds_unknown",
    "energy_joules",
    "cost",
    "carbon_grams",
)

RollupDimension = Literal[
    "cluster", "job_key", "team", "model", "node", "gpu_uuid", "price_tier", "project", "gpu_model"
]
ROLLUP_DIMENSIONS: tuple[RollupDimension, ...] = (
    "cluster",  # the collector that wrote the row (organisation-wide reads)
    "job_key",
    "team",
    "model",
    "node",
    "gpu_uuid",
    "price_tier",
    "project",  # the job's project label (migration 10)
    "gpu_model",  # the GPU's hw.model (migration 10)
)


@dataclass(frozen=True, slots=True)
class RollupTotal:
    """Accounting rows summed over one group (the values of the ``by`` dimensions).

    ``energy_joules``, ``cost`` and ``carbon_grams`` sum the rows that have them (``None``
    when none has); ``rows_incomplete`` counts rows missing any of the three, so a caller can
    tell a partial total from a complete one. ``currency`` is the rows' currency; costs in
    several currencies do not add up: ``cost`` is then None and ``currency`` lists them
    (``"EUR,USD"``).
    """

    group: Mapping[str, str | None]
    rows: int
    rows_incomplete: int
    gpu_seconds_allocated: float
    gpu_seconds_busy: float
    gpu_seconds_idle: float
    gpu_seconds_unknown: float
    energy_joules: float | None
    cost: float | None
    carbon_grams: float | None
    currency: str | None = None


@dataclass(frozen=True, slots=True)
class Incident:
    """A deduplicated problem: at most one open incident per ``fingerprint``.

    ``consecutive_breaches`` / ``consecutive_clears`` are the hysteresis counters: detection cycles
    in a row in which the rule fired / did not. ``incident_id`` is assigned by the storage.
    """

    fingerprint: str
    rule_id: str
    severity: str
    first_seen: float
    last_seen: float
    state: IncidentState = IncidentState.OPEN
    evidence: JsonObject = field(default_factory=_empty)
    consecutive_breaches: int = 0
    consecutive_clears: int = 0
    resolved_time: float | None = None
    incident_id: int | None = None


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One line of the append-only remediation audit log: what was done, why, and how it went.

    ``verdict`` is the policy's decision (e.g. ``allowed``, ``denied``, ``needs_approval``),
    ``result`` the outcome (e.g. ``ok``, ``failed``, ``skipped``); their vocabularies belong to the
    remediator. ``entry_id`` is assigned by the storage, rising in append order.
    """

    time: float
    actor: str
    action: str
    target: str
    reason: str
    verdict: str
    dry_run: bool
    result: str
    inputs: JsonObject = field(default_factory=_empty)
    incident_fingerprint: str | None = None
    idempotency_key: str | None = None
    entry_id: int | None = None


def dump_json(value: JsonObject) -> str:
    """Canonical JSON text of an object: sorted keys, compact, NaN refused (``ValueError``)."""
    try:
        return json.dumps(dict(value), sort_keys=True, separators=(",", ":"), allow_nan=False)
    except ValueError as exc:
        raise ValueError(f"NaN and infinities are not JSON; use None for missing: {exc}") from exc


def load_json(text: str) -> JsonObject:
    """A stored JSON object, as a read-only mapping."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    return MappingProxyType(value)


def load_labels(text: str) -> Mapping[str, str]:
    """Stored string labels, as a read-only mapping."""
    return MappingProxyType({str(k): str(v) for k, v in load_json(text).items()})


def dump_allocations(allocations: Sequence[GpuAllocation]) -> str:
    """A job's GPU allocations as a JSON array of ``{node, indices, uuids}``."""
    return json.dumps(
        [{"node": a.node, "indices": list(a.indices), "uuids": list(a.uuids)} for a in allocations],
        sort_keys=True,
        separators=(",", ":"),
    )


def load_allocations(text: str) -> tuple[GpuAllocation, ...]:
    """The inverse of :func:`dump_allocations`."""
    return tuple(
        GpuAllocation(
            node=str(item["node"]),
            indices=tuple(int(i) for i in item["indices"]),
            uuids=tuple(str(u) for u in item["uuids"]),
        )
        for item in json.loads(text)
    )

"""Hardware faults per GPU: lost (status failed), XIDs of concern, uncorrected ECC, failed remaps.

Vectorised over the store's matrices for the window. A GPU with no status sample in the window is
UNKNOWN (a silent node is not a healthy one; the agent's own staleness is another rule's job).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gpuwarden.collector.detect.contract import DetectionContext, Detector, spec_of
from gpuwarden.collector.detect.findings import Facts, Finding, Verdict, new_finding
from gpuwarden.collector.rules.model import Rule, Subject
from gpuwarden.collector.rules.params import flag, integers

DEFAULT_XIDS = (48, 63, 64, 74, 79, 92, 94, 95)
#: how far back a fault counts (a fault is an event, not a level: the window only has to span a
#: few agent intervals, and an incident stays open while the fault keeps showing)
FAULT_WINDOW_SECONDS = 300.0


@dataclass(frozen=True, slots=True, kw_only=True)
class HardwareFaultParams:
    """Parameters of ``hardware_fault``."""

    xid_codes: tuple[int, ...] = integers(DEFAULT_XIDS, 1, 1000, "XID codes of concern.")
    uncorrected_ecc: bool = flag(True, "Any uncorrected ECC error.")
    remap_failure: bool = flag(True, "A failed row remapping.")
    gpu_lost: bool = flag(True, "The GPU fell off the bus or went missing.")


def _check(p: HardwareFaultParams) -> tuple[str, str] | None:
    if not p.xid_codes and not (p.uncorrected_ecc or p.remap_failure or p.gpu_lost):
        return "xid_codes", "the rule watches nothing: list XID codes or enable another fault"
    return None


def detect_hardware_faults(
    ctx: DetectionContext,
    rule: Rule,
    *,
    window_seconds: float,
    xids: tuple[int, ...] = DEFAULT_XIDS,
    gpu_lost: bool = True,
    uncorrected_ecc: bool = True,
    remap_failure: bool = True,
    now: float | None = None,
) -> list[Finding]:
    """One finding per GPU seen in the window, FIRING with the reasons when a fault shows."""
    step = ctx.store.step_seconds
    end = math.floor((ctx.now() if now is None else now) / step) * step + step
    start = end - window_seconds
    store = ctx.store
    status = store.matrix("hw.status", start=start, end=end)
    reasons: dict[str, list[str]] = {}
    seen: set[str] = set()
    for info, row in zip(status.series, status.values, strict=True):
        attrs = info.attributes
        subject = f"{attrs.get('host.name', '')}/{attrs.get('hw.id', '')}"
        if np.isnan(row).all():
            continue
        seen.add(subject)
        if gpu_lost and attrs.get("hw.state") == "failed" and np.nanmax(row) >= 1:
            reasons.setdefault(subject, []).append("GPU lost (status failed)")
        # The agent reports "degraded" for the round an XID of concern fired or a row remap
        # failed. It also catches a GPU's first XID of a code: that counter series is new, and
        # a new counter's first point has no increase to measure.
        if (xids or remap_failure) and attrs.get("hw.state") == "degraded" and np.nanmax(row) >= 1:
            reasons.setdefault(subject, []).append("GPU degraded (XID of concern or remap)")
    xid = store.increase_matrix("gpuwarden.gpu.xid.errors", start=start, end=end)
    for info, row in zip(xid.series, xid.values, strict=True):
        attrs = info.attributes
        code = int(str(attrs.get("gpuwarden.gpu.xid", "0")))
        if code in xids and np.nansum(row) > 0:
            subject = f"{attrs.get('host.name', '')}/{attrs.get('hw.id', '')}"
            reasons.setdefault(subject, []).append(f"XID {code} x{int(np.nansum(row))}")
    ecc = store.increase_matrix(
        "hw.errors", selector={"error.type": "uncorrected"}, start=start, end=end
    )
    for info, row in zip(ecc.series, ecc.values, strict=True):
        attrs = info.attributes
        if uncorrected_ecc and np.nansum(row) > 0:
            subject = f"{attrs.get('host.name', '')}/{attrs.get('hw.id', '')}"
            reasons.setdefault(subject, []).append(f"{int(np.nansum(row))} uncorrected ECC errors")
    remap = store.matrix("gpuwarden.gpu.memory.remap_failure", start=start, end=end)
    for info, row in zip(remap.series, remap.values, strict=True):
        attrs = info.attributes
        if remap_failure and not np.isnan(row).all() and np.nanmax(row) >= 1:
            subject = f"{attrs.get('host.name', '')}/{attrs.get('hw.id', '')}"
            reasons.setdefault(subject, []).append("row remapping failed")
    findings = []
    for subject in sorted(seen | set(reasons)):
        found = reasons.get(subject, [])
        verdict = Verdict.FIRING if found else Verdict.CLEAR
        node, _, gpu = subject.partition("/")
        findings.append(
            new_finding(
                rule,
                subject=subject,
                verdict=verdict,
                window=(start, end),
                summary=f"GPU {gpu} on {node}: {'; '.join(found)}" if found else "",
                evidence={"node": node, "gpu": gpu, "reasons": "; ".join(found) or None},
                facts=Facts(nodes=(node,)),
            )
        )
    return findings


def run_hardware_fault(
    ctx: DetectionContext, rule: Rule, p: HardwareFaultParams, now: float
) -> list[Finding]:
    """Engine runner for ``hardware_fault``."""
    return detect_hardware_faults(
        ctx,
        rule,
        window_seconds=FAULT_WINDOW_SECONDS,
        xids=p.xid_codes,
        gpu_lost=p.gpu_lost,
        uncorrected_ecc=p.uncorrected_ecc,
        remap_failure=p.remap_failure,
        now=now,
    )


DETECTOR = Detector(
    spec=spec_of(
        "hardware_fault",
        "A GPU reported a fault that needs the node drained or repaired.",
        subjects=(Subject.NODE, Subject.JOB),
        signals=(
            "gpuwarden.gpu.xid.errors",
            "hw.errors",
            "gpuwarden.gpu.memory.remap_failure",
            "hw.status",
        ),
        params=HardwareFaultParams,
        selector=("nodes",),
        check=_check,
    ),
    params=HardwareFaultParams,
    run=run_hardware_fault,
)

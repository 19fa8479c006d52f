"""Hardware faults per GPU: lost (status failed), XIDs of concern, uncorrected ECC, failed remaps.

Vectorised over the store's matrices for the window. A GPU with no status sample in the window is
UNKNOWN (a silent node is not a healthy one; the agent's own staleness is another rule's job).
"""

from __future__ import annotations

import math

import numpy as np

from gpuwarden.collector.detect.findings import Finding, Verdict
from gpuwarden.collector.service import CollectorService

DEFAULT_XIDS = (48, 63, 64, 74, 79, 92, 94, 95)


def detect_hardware_faults(
    service: CollectorService,
    *,
    rule_id: str,
    severity: str,
    window_seconds: float,
    xids: tuple[int, ...] = DEFAULT_XIDS,
    gpu_lost: bool = True,
    uncorrected_ecc: bool = True,
    remap_failure: bool = True,
    now: float | None = None,
) -> list[Finding]:
    """One finding per GPU seen in the window, FIRING with the reasons when a fault shows."""
    step = service.store.step_seconds
    end = math.floor((service.clock() if now is None else now) / step) * step + step
    start = end - window_seconds
    store = service.store
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
            Finding(
                rule_id=rule_id,
                detector="hardware_fault",
                subject=subject,
                verdict=verdict,
                severity=severity,
                window_start=start,
                window_end=end,
                summary=f"GPU {gpu} on {node}: {'; '.join(found)}" if found else "",
                evidence={"node": node, "gpu": gpu, "reasons": "; ".join(found) or None},
            )
        )
    return findings

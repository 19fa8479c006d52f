"""Hardware faults per GPU: lost (status failed), XIDs of concern, uncorrected ECC, failed remaps.

Vectorised over the store's matrices for the window. A GPU with no status sample in the window is
UNKNOWN (a silent node is not a healthy one; the agent's own staleness is another rule's job).
XIDs come from our agent's per-code counters, or, for a GPU without them (dcgm-exporter's
``DCGM_FI_DEV_XID_ERRORS`` through the remote-write receiver), from changes of the last-XID code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gpuwarden.collector.detect.contract import DetectionContext, Detector, spec_of
from gpuwarden.collector.detect.findings import Facts, Finding, Verdict, new_finding
from gpuwarden.collector.rules.model import Rule, Subject
from gpuwarden.collector.rules.params import flag, integers
from gpuwarden.collector.store.window import WindowStore

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
    counted: set[str] = set()
    for info, row in zip(xid.series, xid.values, strict=True):
        attrs = info.attributes
        subject = f"{attrs.get('host.name', '')}/{attrs.get('hw.id', '')}"
        counted.add(subject)
        code = int(str(attrs.get("gpuwarden.gpu.xid", "0")))
        if code in xids and np.nansum(row) > 0:
            reasons.setdefault(subject, []).append(f"XID {code} x{int(np.nansum(row))}")
    for subject, found in _last_xid_reasons(store, start, end, counted, xids).items():
        seen.add(subject)
        reasons.setdefault(subject, []).extend(found)
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


def _last_xid_reasons(
    store: WindowStore, start: float, end: float, counted: set[str], xids: tuple[int, ...]
) -> dict[str, list[str]]:
    """Reasons per GPU from last-XID gauges, for GPUs with data in the window and no counters.

    Sources without per-code counters (dcgm-exporter's DCGM_FI_DEV_XID_ERRORS) give only the
    last XID's code: a change of that code to one of concern is a new XID. One window before
    ``start`` is read too, so the code before the window is known; a code already there when the
    GPU's first sample came is not new (its time is unknown) and does not fire.
    """
    window = end - start
    last = store.matrix("gpuwarden.gpu.xid.last", start=start - window, end=end)
    first_in_window = round(window / store.step_seconds)
    out: dict[str, list[str]] = {}
    for info, row in zip(last.series, last.values, strict=True):
        attrs = info.attributes
        subject = f"{attrs.get('host.name', '')}/{attrs.get('hw.id', '')}"
        if subject in counted or np.isnan(row[first_in_window:]).all():
            continue  # the counters speak for this GPU (our agent sends both)
        found = out.setdefault(subject, [])
        for code, times in _new_last_codes(row, first_in_window).items():
            if code in xids:
                found.append(f"XID {code} x{times} (last-XID gauge)")
    return out


def _new_last_codes(row: np.ndarray, from_slot: int) -> dict[int, int]:
    """Code → how often a last-XID gauge changed to it at or after ``from_slot`` (0 is none)."""
    known = np.flatnonzero(~np.isnan(row))
    values = row[known]
    changed = np.flatnonzero(values[1:] != values[:-1]) + 1
    out: dict[int, int] = {}
    for at in changed[known[changed] >= from_slot].tolist():
        code = int(values[at])
        if code:
            out[code] = out.get(code, 0) + 1
    return out


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
            "gpuwarden.gpu.xid.last",
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

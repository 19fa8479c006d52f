"""Hardware-fault rule: lost GPUs, XIDs of concern, uncorrected ECC and remap failures fire."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.faults import detect_hardware_faults
from gpuwarden.collector.detect.findings import Verdict
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.store.types import AttrValue
from tests.detectors import make_rule

NOW = float(int(time.time()))
RES: dict[str, AttrValue] = {"host.name": "n1"}
HW = make_rule("hardware_fault", "hw", "critical")


def status(gpu: str, state: str, t: float) -> list[NumberPoint]:
    return [
        NumberPoint(
            RES,
            "hw.status",
            "1",
            "sum",
            False,
            {"hw.id": gpu, "hw.type": "gpu", "hw.state": s},
            int(t * 1e9),
            1.0 if s == state else 0.0,
        )
        for s in ("ok", "degraded", "failed")
    ]


def counter(
    metric: str, gpu: str, attrs: dict[str, AttrValue], values: list[float]
) -> list[NumberPoint]:
    return [
        NumberPoint(
            RES,
            metric,
            "{error}",
            "sum",
            True,
            {"hw.id": gpu, **attrs},
            int((NOW - 50 + 10 * i) * 1e9),
            v,
        )
        for i, v in enumerate(values)
    ]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[CollectorService]:
    svc = build_service(CollectorConfig(database=tmp_path / "c.db"), clock=lambda: NOW)
    points: list[NumberPoint] = []
    for t in (NOW - 40, NOW - 20):
        points += status("GPU-ok", "ok", t) + status("GPU-xid13", "ok", t)
        points += status("GPU-xid79", "ok", t) + status("GPU-ecc", "ok", t)
        points += status("GPU-remap", "ok", t)
    points += status("GPU-lost", "ok", NOW - 40) + status("GPU-lost", "failed", NOW - 20)
    points += counter("gpuwarden.gpu.xid.errors", "GPU-xid79", {"gpuwarden.gpu.xid": "79"}, [1, 2])
    points += counter("gpuwarden.gpu.xid.errors", "GPU-xid13", {"gpuwarden.gpu.xid": "13"}, [1, 5])
    points += counter(
        "hw.errors", "GPU-ecc", {"error.type": "uncorrected", "hw.type": "gpu"}, [0, 2]
    )
    points += counter("hw.errors", "GPU-ok", {"error.type": "corrected", "hw.type": "gpu"}, [0, 9])
    points.append(
        NumberPoint(
            RES,
            "gpuwarden.gpu.memory.remap_failure",
            "1",
            "gauge",
            False,
            {"hw.id": "GPU-remap"},
            int((NOW - 20) * 1e9),
            1.0,
        )
    )
    assert svc.accept(points, "t") == 0
    yield svc
    svc.storage.close()


def test_each_fault_kind_fires_and_healthy_gpus_clear(service):
    found = {
        f.subject: f
        for f in detect_hardware_faults(
            service.detection_view,
            HW,
            window_seconds=300,
            now=NOW,
        )
    }
    verdicts = {s.split("/")[1]: f.verdict for s, f in found.items()}
    assert verdicts == {
        "GPU-ok": Verdict.CLEAR,
        "GPU-xid13": Verdict.CLEAR,
        "GPU-lost": Verdict.FIRING,
        "GPU-xid79": Verdict.FIRING,
        "GPU-ecc": Verdict.FIRING,
        "GPU-remap": Verdict.FIRING,
    }
    assert found["n1/GPU-xid79"].evidence["reasons"] == "XID 79 x1"
    assert found["n1/GPU-ecc"].evidence["reasons"] == "2 uncorrected ECC errors"
    assert found["n1/GPU-lost"].evidence["reasons"] == "GPU lost (status failed)"


def test_gpus_without_data_in_the_window_are_not_judged(service):
    later = NOW + 3600  # nothing in this window
    assert (
        detect_hardware_faults(
            service.detection_view,
            HW,
            window_seconds=300,
            now=later,
        )
        == []
    )


def test_a_first_xid_shows_through_the_degraded_status(tmp_path):
    """A GPU's first XID of a code starts a new counter series, whose first point has no
    increase; the round's "degraded" status still fires the rule, and "ok" rounds do not."""
    svc = build_service(CollectorConfig(database=tmp_path / "c.db"), clock=lambda: NOW)
    points = status("GPU-new", "ok", NOW - 40) + status("GPU-new", "degraded", NOW - 20)
    points += status("GPU-calm", "ok", NOW - 40) + status("GPU-calm", "ok", NOW - 20)
    points += counter("gpuwarden.gpu.xid.errors", "GPU-new", {"gpuwarden.gpu.xid": "79"}, [1])
    assert svc.accept(points, "t") == 0
    found = {
        f.subject.split("/")[1]: f
        for f in detect_hardware_faults(
            svc.detection_view,
            HW,
            window_seconds=300,
            now=NOW,
        )
    }
    assert found["GPU-new"].verdict is Verdict.FIRING
    assert found["GPU-new"].evidence["reasons"] == "GPU degraded (XID of concern or remap)"
    assert found["GPU-calm"].verdict is Verdict.CLEAR
    no_xids = detect_hardware_faults(
        svc.detection_view, HW, window_seconds=300, now=NOW, xids=(), remap_failure=False
    )
    assert all(f.verdict is Verdict.CLEAR for f in no_xids)
    svc.storage.close()


def last_xid(gpu: str, codes: Sequence[float], every: float = 10.0) -> list[NumberPoint]:
    """A last-XID gauge (dcgm-exporter's DCGM_FI_DEV_XID_ERRORS, mapped), one point per round."""
    return [
        NumberPoint(
            RES,
            "gpuwarden.gpu.xid.last",
            "1",
            "gauge",
            False,
            {"hw.id": gpu},
            int((NOW - every * (len(codes) - i)) * 1e9),
            code,
        )
        for i, code in enumerate(codes)
    ]


def test_a_change_of_the_last_xid_code_fires_for_gpus_without_counters(tmp_path):
    """dcgm-exporter gives the last XID's code, not per-code counters: a change to a code of
    concern inside the window is a new XID; a code that was already there when the GPU's first
    sample came (time unknown), a code not of concern, or a change before the window is not."""
    svc = build_service(CollectorConfig(database=tmp_path / "c.db"), clock=lambda: NOW)
    points = last_xid("GPU-new79", [0, 0, 0, 79, 79])
    points += last_xid("GPU-twice", [0, 79, 0, 79, 79])
    points += last_xid("GPU-old79", [79, 79, 79, 79, 79])
    points += last_xid("GPU-xid13", [0, 0, 13, 13, 13])
    points += last_xid("GPU-calm", [0, 0, 0, 0, 0])
    points += last_xid("GPU-before", [0, 79] + [79] * 40)  # the change is ~7 min ago
    # our agent sends both: its counters speak, the gauge adds no second reason
    points += counter("gpuwarden.gpu.xid.errors", "GPU-agent", {"gpuwarden.gpu.xid": "79"}, [1, 2])
    points += last_xid("GPU-agent", [0, 0, 0, 79, 79])
    assert svc.accept(points, "t") == 0
    found = {
        f.subject.split("/")[1]: f
        for f in detect_hardware_faults(svc.detection_view, HW, window_seconds=120, now=NOW)
    }
    assert found["GPU-new79"].verdict is Verdict.FIRING
    assert found["GPU-new79"].evidence["reasons"] == "XID 79 x1 (last-XID gauge)"
    assert found["GPU-twice"].evidence["reasons"] == "XID 79 x2 (last-XID gauge)"
    assert found["GPU-agent"].evidence["reasons"] == "XID 79 x1"
    for calm in ("GPU-old79", "GPU-xid13", "GPU-calm", "GPU-before"):
        assert found[calm].verdict is Verdict.CLEAR, calm
    svc.storage.close()

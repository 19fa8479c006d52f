"""Self-test of ``tests/dcgm_exposition.py``: the served pages parse as Prometheus text, carry
dcgm-exporter's families and labels, follow the values a test sets, and translate to the fleet."""

from __future__ import annotations

import shutil
import subprocess

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.collector.ingest.prom_map import translate
from gpuwarden.collector.remote_write.wire import Series
from tests.dcgm_exposition import FIELDS, DcgmFleet, Pod, serve_fleet

GPU_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "DCGM_FI_DRIVER_VERSION"}


async def fetch(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as response:
        assert response.status == 200
        assert response.content_type == "text/plain"
        return await response.text()


def fleet_with_pods(**options: str | bool) -> DcgmFleet:
    fleet = DcgmFleet(("node-a", "node-b"), 4, **options)  # type: ignore[arg-type]
    fleet.assign("node-a", 0, Pod("trainer-0", "ml", uid="u-1"))
    fleet.assign("node-b", 3, Pod("infer-0", "serve"), Pod("infer-1", "serve"))
    return fleet


async def test_each_node_serves_the_default_families_with_help_type_and_labels():
    fleet = fleet_with_pods()
    async with serve_fleet(fleet) as exporters, aiohttp.ClientSession() as session:
        assert set(exporters.urls) == {"node-a", "node-b"}
        pages = {node: await fetch(session, url) for node, url in exporters.urls.items()}
    for node, page in pages.items():
        lines = page.splitlines()
        for name, kind, help_text, _ in FIELDS:
            assert lines.count(f"# HELP {name} {help_text}") == 1
            assert lines.count(f"# TYPE {name} {kind}") == 1
        families = {f.name: f for f in text_string_to_metric_families(page)}
        util = families["DCGM_FI_DEV_GPU_UTIL"]
        assert util.type == "gauge"
        gpus = {s.labels["gpu"] for s in util.samples}
        assert gpus == {"0", "1", "2", "3"}
        for sample in util.samples:
            assert set(sample.labels) >= GPU_LABELS
            assert sample.labels["Hostname"] == node
            assert sample.labels["device"] == f"nvidia{sample.labels['gpu']}"
    held = [sample.labels for family in text_string_to_metric_families(pages["node-a"])
            if family.name == "DCGM_FI_DEV_FB_USED" for sample in family.samples]  # fmt: skip
    assert [(h["gpu"], h.get("pod"), h.get("namespace")) for h in held] == [
        ("0", "trainer-0", "ml"),
        ("1", None, None),
        ("2", None, None),
        ("3", None, None),
    ]
    assert "pod_uid" not in held[0]  # only with --kubernetes-enable-pod-uid
    shared = [
        s for s in pages["node-b"].splitlines() if s.startswith('DCGM_FI_DEV_GPU_UTIL{gpu="3"')
    ]
    assert len(shared) == 2  # time-slicing: one sample per pod


async def test_values_set_over_http_show_on_the_next_scrape():
    fleet = fleet_with_pods()
    async with serve_fleet(fleet) as exporters, aiohttp.ClientSession() as session:
        url = exporters.urls["node-b"]
        base = url.removesuffix("/metrics")
        body = {"gpu": 1, "values": {"DCGM_FI_DEV_GPU_UTIL": 87, "DCGM_FI_DEV_POWER_USAGE": 500},
                "advance_seconds": 10}  # fmt: skip
        async with session.post(base + "/values", json=body) as response:
            assert response.status == 200
        async with session.post(base + "/values", json={"gpu": 1, "values": {"NOPE": 1}}) as bad:
            assert bad.status == 400
        page = await fetch(session, url)
    lines = page.splitlines()
    assert any(line.startswith('DCGM_FI_DEV_GPU_UTIL{gpu="1"') and line.endswith(" 87")
               for line in lines)  # fmt: skip
    assert any(line.startswith('DCGM_FI_DEV_POWER_USAGE{gpu="1"') and line.endswith(" 500.000000")
               for line in lines)  # fmt: skip
    energy = [
        line for line in lines if line.startswith('DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="1"')
    ]
    assert energy[0].endswith(" 5000000")  # 500 W for 10 s = 5 kJ, printed in mJ


def test_newer_exporters_spell_the_host_label_in_lower_case_and_may_add_pod_uid():
    page = fleet_with_pods(hostname_label="hostname", pod_uid=True).render("node-a")
    sample = next(s for f in text_string_to_metric_families(page) for s in f.samples
                  if s.name == "DCGM_FI_DEV_GPU_UTIL" and s.labels["gpu"] == "0")  # fmt: skip
    assert sample.labels["hostname"] == "node-a"
    assert "Hostname" not in sample.labels
    assert sample.labels["pod_uid"] == "u-1"


def test_the_pages_translate_to_the_fleet():
    fleet = fleet_with_pods()
    series = []
    for node in fleet.nodes:
        for family in text_string_to_metric_families(fleet.render(node)):
            if family.type != "gauge":  # the parser renames counters: gauges are enough here
                continue
            for s in family.samples:
                labels = tuple(sorted({**s.labels, "__name__": s.name}.items()))
                series.append(Series(labels, (1_767_225_600_000,), (s.value,)))
    out = translate(series)
    infos = {(p.resource["host.name"], p.attributes["hw.id"])
             for p in out.points if p.metric == "gpuwarden.gpu.info"}  # fmt: skip
    assert infos == {(node, gpu.uuid) for node, gpus in fleet.nodes.items() for gpu in gpus}
    jobs = {str(p.attributes["gpuwarden.job.id"]) for p in out.points
            if p.metric == "gpuwarden.gpu.process.memory.usage"}  # fmt: skip
    assert jobs == {"ml/trainer-0", "serve/infer-0", "serve/infer-1"}


def test_the_fleet_refuses_fields_dcgm_exporter_does_not_print_by_default():
    with pytest.raises(KeyError, match="DCGM_FI_PROF_SM_ACTIVE"):
        DcgmFleet().set("node-a", 0, {"DCGM_FI_PROF_SM_ACTIVE": 0.5})


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")
def test_promtool_parses_the_page_and_finds_only_dcgm_exporters_own_lint():
    page = fleet_with_pods().render("node-b")
    assert PROMTOOL is not None
    checked = subprocess.run([PROMTOOL, "check", "metrics"], input=page, capture_output=True,
                             text=True, timeout=60, check=False)  # fmt: skip
    output = checked.stdout + checked.stderr
    assert "parsing error" not in output
    # what promtool says of dcgm-exporter's real page too: camelCase labels (UUID, modelName,
    # Hostname), counters without _total, a counter named ..._COUNTER
    complaints = {line.split(" ", 1)[1] for line in output.splitlines() if line}
    assert complaints == {
        "label names should be written in 'snake_case' not 'camelCase'",
        'counter metrics should have "_total" suffix',
        "metric name should not include type 'counter'",
    }

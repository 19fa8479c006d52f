"""The catalog is consistent, documented, and matches what the instruments emit."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from gpuwarden.agent.catalog import (
    CATALOG,
    Scope,
    Shape,
    metric_names,
    render_markdown,
    rows_by_name,
)
from gpuwarden.agent.model import AgentStats, GpuSample, HostSample, ProcessSample

ROOT = Path(__file__).resolve().parents[1]
FIELDS = {
    Scope.GPU: {f.name for f in dataclasses.fields(GpuSample)},
    Scope.PROCESS: {f.name for f in dataclasses.fields(ProcessSample)},
    Scope.HOST: {f.name for f in dataclasses.fields(HostSample)},
    Scope.AGENT: {f.name for f in dataclasses.fields(AgentStats)},
}
OTEL_UNITS = {"1", "By", "By/s", "W", "J", "Cel", "Hz", "s"}


@pytest.mark.parametrize("row", CATALOG, ids=lambda r: f"{r.name}:{r.field}")
def test_row_is_well_formed(row):
    assert row.field in FIELDS[row.scope]
    assert re.fullmatch(r"(hw|system|gpuwarden)\.[a-z0-9_.]+", row.name), row.name
    assert row.unit in OTEL_UNITS or re.fullmatch(r"\{[a-z]+\}", row.unit), row.unit
    assert row.description.endswith("."), row.description
    assert row.source
    if row.shape is Shape.SCALAR:
        assert row.keys == ()
    elif row.shape is Shape.INFO:
        assert row.scope is Scope.GPU
        assert row.keys
    else:
        assert row.keys, "expanded rows name the attributes their keys become"


def test_rows_sharing_a_name_agree_and_differ_in_attributes():
    for name, rows in rows_by_name().items():
        assert len({(r.instrument, r.unit) for r in rows}) == 1, name
        distinct = {(r.scope, tuple(sorted(r.attributes.items())), r.keys) for r in rows}
        assert len(distinct) == len(rows), f"{name}: rows must differ in their attributes"


def test_every_gpu_field_is_exported_or_declared_internal():
    exported = {r.field for r in CATALOG if r.scope is Scope.GPU}
    identity = {"index", "name", "pci_bus_id", "parent_uuid", "mig_profile", "processes"}
    assert FIELDS[Scope.GPU] - exported == identity
    assert FIELDS[Scope.PROCESS] - {r.field for r in CATALOG if r.scope is Scope.PROCESS} == {
        "pid",
        "job",
    }
    assert FIELDS[Scope.HOST] == {r.field for r in CATALOG if r.scope is Scope.HOST}
    assert FIELDS[Scope.AGENT] == {r.field for r in CATALOG if r.scope is Scope.AGENT}


COLLECTOR_PART = "\n## The collector's `/metrics`"
"""Where the generated catalog ends: the collector's families follow, written by hand (checked by
``tests/test_exposition.py``)."""


def test_rendered_docs_are_current():
    docs = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    generated = docs.partition(COLLECTOR_PART)[0]
    hint = "run: gpuwarden catalog --format markdown, and keep the collector's part below it"
    assert generated == render_markdown(), hint


def test_docs_name_every_metric_and_nothing_else():
    docs = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8").partition(COLLECTOR_PART)[0]
    named = set(re.findall(r"^\| `([a-z0-9_.]+)` \|", docs, flags=re.M))
    assert named == metric_names()

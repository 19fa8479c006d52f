"""``gpuwarden agent --record``: a recorded trace replays as the rounds the agent took.

The real agent (simulated GPUs, built by ``build_agent`` as ``gpuwarden agent`` builds it) records
a few rounds; the file then goes through both readers: the backtest's (``load_dataset``, whose
readings become the points the replay feeds the collector) and the agent's ``--source replay``.
Each gives back, per round and GPU, every field the agent measured, and nothing it did not.
"""

from __future__ import annotations

import csv
import gzip
import itertools
from pathlib import Path

import pytest

from gpuwarden.agent.build import build_agent
from gpuwarden.agent.config import AgentConfig, CollectorConfig, HttpConfig, SpoolConfig
from gpuwarden.agent.model import GpuSample, Snapshot
from gpuwarden.agent.record import HEADER, RECORD_FIELDS, TraceRecorder
from gpuwarden.agent.sources.replay import ReplaySource
from gpuwarden.cli import main
from gpuwarden.collector.backtest.data import FIELD_METRICS, load_dataset
from gpuwarden.collector.backtest.replay import points_for

ROUNDS = 6


def measured(gpu: GpuSample) -> dict[str, float]:
    return {
        name: float(value) for name in RECORD_FIELDS if (value := getattr(gpu, name)) is not None
    }


def record(path: Path, tmp_path: Path) -> list[Snapshot]:
    config = AgentConfig(
        node_name="rec-node",
        source="simulated",
        collector=CollectorConfig(endpoint=None),  # recording needs no collector
        spool=SpoolConfig(directory=tmp_path / "spool", fsync=False),
        http=HttpConfig(enabled=False),
    )
    with TraceRecorder(path) as recorder:
        runtime = build_agent(
            config,
            with_host=False,
            machine_id_file=tmp_path / "machine-id",
            record=recorder.record,
        )
        try:
            snapshots = [runtime.agent.sample_once().snapshot for _ in range(ROUNDS)]
        finally:
            runtime.agent.shutdown(flush_timeout_seconds=0)
    return snapshots


@pytest.mark.parametrize("name", ["trace.csv", "trace.csv.gz"])
def test_recorded_rounds_come_back_from_the_backtest_reader(tmp_path, name):
    path = tmp_path / name
    snapshots = record(path, tmp_path)
    expected = {
        (s.time_unix_nano / 1e9, gpu.uuid): (gpu.name, measured(gpu))
        for s in snapshots
        for gpu in s.gpus
    }
    assert len(expected) == ROUNDS * len(snapshots[0].gpus) > 0
    assert any(values for _, values in expected.values())
    dataset = load_dataset(path)
    readings = list(dataset.readings())
    got = {(r.time_seconds, r.gpu_uuid): (r.model, dict(r.values)) for r in readings}
    assert got == expected
    # and as the points the replay hands the collector: one per measured field, plus the info
    for reading in readings:
        names = sorted(p.metric for p in points_for(reading))
        want = sorted(["gpuwarden.gpu.info", *(FIELD_METRICS[f].name for f in reading.values)])
        assert names == want


def test_recorded_rounds_come_back_from_the_agents_replay_source(tmp_path):
    path = tmp_path / "trace.csv"
    snapshots = record(path, tmp_path)
    times = [s.time_unix_nano / 1e9 for s in snapshots]
    half_gap = min(b - a for a, b in itertools.pairwise(times)) / 2
    now = [0.0]
    source = ReplaySource(path, clock=lambda: now[0], loop=False)
    for snapshot, t in zip(snapshots, times, strict=True):
        now[0] = t - times[0] + half_gap  # within this round, before the next
        replayed = {g.uuid: g for g in source.sample()}
        for gpu in snapshot.gpus:
            back = replayed[gpu.uuid]
            assert back.name == gpu.name
            assert measured(back) == measured(gpu), gpu.uuid


def test_the_cli_records_one_round_with_once(tmp_path, capsys):
    path = tmp_path / "once.csv.gz"
    code = main(["agent", "--source", "simulated", "--once", "--record", str(path)])
    assert code == 0
    printed = capsys.readouterr().out
    with gzip.open(path, "rt", newline="") as file:
        rows = list(csv.reader(file))
    assert tuple(rows[0]) == HEADER
    assert len(rows) - 1 == printed.count('"uuid"') > 0  # one row per GPU of the round

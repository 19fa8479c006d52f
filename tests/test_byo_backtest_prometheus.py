"""``backtest --prometheus`` against a real Prometheus holding a generated week, and the same week
replayed from our CSV: the same incidents.

One script (:func:`week`) writes both: dcgm-exporter's ``DCGM_FI_DEV_GPU_UTIL`` (integer
percent, the labels dcgm-exporter prints, pods as ``pod``/``namespace``/``container``) as
OpenMetrics, backfilled into Prometheus' data folder with ``promtool tsdb create-blocks-from
openmetrics`` before it starts, and the trace CSV (``utilization_ratio`` = percent x the
mapping's scale, ``job`` = the pod).
Both run through the real CLI (``gpuwarden backtest``) with the packaged rules.

A pod is a Kubernetes job in one (``k8s:<namespace>/<pod>``) and an API job in the other
(``api:<namespace>/<pod>``): the incidents are compared with that prefix removed, everything else
(rule, subject, opening, last firing cycle, resolution) exactly.
"""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.collector.backtest.cli import add_backtest_parser, run_backtest
from gpuwarden.collector.ingest.prom_catalog import BY_SOURCE
from tests.prometheus_server import PrometheusServer, prometheus_binary

pytestmark = pytest.mark.skipif(prometheus_binary() is None, reason="prometheus not installed")

T0 = 1_767_225_600  # 2026-01-01T00:00Z
STEP = 60
DAYS = 7
STEPS = DAYS * 86400 // STEP
SCALE = BY_SOURCE["DCGM_FI_DEV_GPU_UTIL"].scale
CYCLE = ("--cycle", "600")
"""Detection every 10 simulated minutes (not 1): a week's replay then takes seconds, not minutes,
and both replays run the same cycles."""
MODEL = "NVIDIA H100 80GB HBM3"
# (node, gpu index) -> the pod holding it (namespace, name) or None
GPUS: dict[tuple[str, int], tuple[str, str] | None] = {
    ("node-a", 0): ("ml", "trainer-0"),
    ("node-a", 1): ("ml", "trainer-0"),
    ("node-a", 2): ("research", "notebook-7"),
    ("node-b", 0): None,
    ("node-b", 1): ("serve", "infer-0"),
}


def uuid(node: str, index: int) -> str:
    return f"GPU-{node}-{index:04d}-0000-0000-000000000000"


def percent(node: str, index: int, k: int) -> int:
    """One GPU's utilisation (%) at step ``k``: busy, with idle spells the rules should find."""
    hour = k * STEP // 3600
    pod = GPUS[node, index]
    if pod is None:
        return 0
    if pod[1] == "trainer-0":
        return 0 if 50 <= hour < 53 else 85 + (k * 7 + index) % 10  # a 3 h stall on day 3
    if pod[1] == "notebook-7":
        return 0 if hour % 24 >= 18 else 40 + (k % 13)  # idle every evening from 18:00
    return 20 + (k * 11) % 60  # the inference pod: busy, jumpy


def week() -> Iterator[tuple[int, str, int, int]]:
    """(time, node, gpu index, percent) of every sample, in time order."""
    for k in range(STEPS):
        for node, index in GPUS:
            yield T0 + k * STEP, node, index, percent(node, index, k)


def write_openmetrics(path: Path) -> None:
    series: dict[tuple[str, int], list[str]] = {gpu: [] for gpu in GPUS}
    for t, node, index, value in week():
        series[node, index].append(f"{value} {t}")
    with path.open("w") as out:
        out.write("# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n")
        out.write("# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n")
        for (node, index), samples in series.items():
            labels = [("gpu", str(index)), ("UUID", uuid(node, index)),
                      ("device", f"nvidia{index}"), ("modelName", MODEL), ("Hostname", node),
                      ("instance", f"{node}:9400"), ("job", "dcgm-exporter")]  # fmt: skip
            pod = GPUS[node, index]
            if pod is not None:
                labels += [("container", "main"), ("namespace", pod[0]), ("pod", pod[1])]
            text = ",".join(f'{k}="{v}"' for k, v in labels)
            out.writelines(f"DCGM_FI_DEV_GPU_UTIL{{{text}}} {sample}\n" for sample in samples)
        out.write("# EOF\n")


def write_csv(path: Path) -> None:
    with path.open("w") as out:
        out.write("time_seconds,gpu_uuid,node,job,name,index,utilization_ratio\n")
        for t, node, index, value in week():
            pod = GPUS[node, index]
            job = "" if pod is None else f"{pod[0]}/{pod[1]}"
            out.write(f"{t},{uuid(node, index)},{node},{job},{MODEL},{index},{value * SCALE!r}\n")


def build_parser() -> argparse.ArgumentParser:
    """The CLI's ``backtest`` parser, as ``gpuwarden`` builds it."""
    parser = argparse.ArgumentParser()
    add_backtest_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def backtest(*argv: str) -> dict[str, object]:
    args = build_parser().parse_args(["backtest", *argv, "--format", "json", "--quiet"])
    out, err = io.StringIO(), io.StringIO()
    code = run_backtest(args, out=out, err=err)
    assert code == 0, err.getvalue()
    result: dict[str, object] = json.loads(out.getvalue())
    return result


def incidents(result: dict[str, object]) -> list[tuple[object, ...]]:
    found = result["incidents"]
    assert isinstance(found, list)
    return [
        (i["rule"], str(i["subject"]).split(":", 1)[-1], i["opened_seconds"],
         i["last_seen_seconds"], i["resolved_seconds"])
        for i in found
    ]  # fmt: skip


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    data = tmp_path_factory.mktemp("week") / "week.om"
    write_openmetrics(data)
    with PrometheusServer({}, backfill=data, retention="3650d") as server:
        yield server


def test_a_week_from_prometheus_finds_what_the_same_week_from_csv_finds(prometheus, tmp_path):
    trace = tmp_path / "week.csv"
    write_csv(trace)
    end = T0 + (STEPS - 1) * STEP  # the last sample: later, Prometheus' lookback repeats it
    # 2,000 points per query: a week at 60 s is 6 pages per series
    from_prom = backtest("--prometheus", prometheus.url, "--start", str(T0), "--end", str(end),
                         "--step", str(STEP), "--points-per-query", "2000", *CYCLE)  # fmt: skip
    from_csv = backtest("--data", str(trace), *CYCLE)
    assert from_prom["gpus"] == from_csv["gpus"] == len(GPUS)
    found = incidents(from_prom)
    assert found == incidents(from_csv)
    rules = {rule for rule, *_ in found}
    assert "idle-gpu" in rules, found
    idle = {subject for rule, subject, *_ in found if rule == "idle-gpu"}
    assert idle == {"ml/trainer-0", "research/notebook-7"}


def test_errors_are_one_line_and_exit_2(prometheus, tmp_path):
    parser = build_parser()
    cases = [
        (["--prometheus", prometheus.url, "--start", str(T0 - 86400), "--end", str(T0 - 3600)],
         "no dcgm-exporter series"),
        (["--prometheus", "http://127.0.0.1:9", "--start", str(T0), "--end", str(T0 + 3600)],
         "cannot reach"),
        (["--prometheus", prometheus.url, "--start", "yesterday"], "--start: 'yesterday'"),
        (["--prometheus", prometheus.url, "--start", str(T0), "--end", str(T0 + 3600),
          "--points-per-query", "20000"], "points per query"),
    ]  # fmt: skip
    token = tmp_path / "token"
    token.write_text("")
    cases.append(
        (
            ["--prometheus", prometheus.url, "--start", str(T0), "--bearer-token-file", str(token)],
            "is empty",
        )
    )
    for argv, message in cases:
        args = parser.parse_args(["backtest", *argv, "--quiet"])
        out, err = io.StringIO(), io.StringIO()
        assert run_backtest(args, out=out, err=err) == 2, argv
        assert message in err.getvalue(), (argv, err.getvalue())
        assert err.getvalue().count("\n") == 1, err.getvalue()

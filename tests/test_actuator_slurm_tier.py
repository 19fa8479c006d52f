"""The spot → on-demand fallback: a ``requeue`` with ``price_tier`` moves a Slurm job to the
partition ``slurm_partitions_by_tier`` names, against a real two-tier slurmctld; its settings
checks; and Kubernetes refusing a tier change it cannot make."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import cast

import pytest

from gpuwarden.agent.schema import ConfigError, convert
from gpuwarden.collector.jobs.slurm_cli import SlurmResult
from gpuwarden.collector.remediate.actuators.base import ActionRequest, Outcome
from gpuwarden.collector.remediate.actuators.build import build_actuators
from gpuwarden.collector.remediate.actuators.settings import ActuatorSettings
from gpuwarden.collector.remediate.actuators.slurm import SlurmActuator
from tests.slurm.cluster import SlurmCluster, missing_binaries

TIMEOUT_SECONDS = 60.0
SCRIPT = "#!/bin/sh\nsleep 600\n"
SPOT, ON_DEMAND = "gw-spot", "gw-od"


def request(target: str, *, dry_run: bool = False, **params: object) -> ActionRequest:
    return ActionRequest("requeue", target, f"key-{target}-{params}", dry_run, params)


class Answers:
    """A fake ``scontrol``: answers each call with the next scripted (rc, stdout, stderr)."""

    def __init__(self, *answers: tuple[int, str, str]) -> None:
        self.answers = list(answers)
        self.calls: list[list[str]] = []

    def __call__(self, args: Sequence[str]) -> SlurmResult:
        self.calls.append(list(args))
        rc, out, err = self.answers.pop(0)
        return SlurmResult.exited(args, rc, out, err)


RUNNING = (0, f"JobId=7 JobState=RUNNING Partition={SPOT} Reason=None Restarts=0\n", "")
OK = (0, "", "")


# --- settings -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"cheap": "gpu"}, "slurm_partitions_by_tier.cheap: expected one of on-demand, spot"),
        ({"on-demand": "gpu od"}, "by_tier.on-demand: expected a Slurm partition name"),
        ({"spot": "gpu,od"}, "by_tier.spot: expected a Slurm partition name"),
        ({"reserved": "-gpu"}, "by_tier.reserved: expected a Slurm partition name"),
    ],
)
def test_bad_partition_settings_are_one_clear_error(mapping: dict[str, str], message: str) -> None:
    raw = {"slurm_cluster": "gwtest", "slurm_partitions_by_tier": mapping}
    with pytest.raises(ConfigError, match=message):
        convert(raw, ActuatorSettings, "collector.yaml")


def test_partitions_need_a_slurm_cluster() -> None:
    raw = {"slurm_partitions_by_tier": {"on-demand": ON_DEMAND}}
    with pytest.raises(ConfigError, match="slurm_partitions_by_tier needs slurm_cluster"):
        convert(raw, ActuatorSettings, "collector.yaml")


def test_the_actuator_checks_its_mapping_too() -> None:
    with pytest.raises(ValueError, match="price tier 'same'"):
        SlurmActuator("gwtest", partitions_by_tier={"same": "gpu"}, runner=Answers())
    with pytest.raises(ValueError, match="not a partition name"):
        SlurmActuator("gwtest", partitions_by_tier={"spot": "a=b"}, runner=Answers())


def test_the_built_actuator_gets_the_mapping(tmp_path: Path) -> None:
    raw = {"slurm_cluster": "gwtest", "slurm_partitions_by_tier": {"reserved": "gw-res"}}
    settings = convert(raw, ActuatorSettings, "collector.yaml")
    (slurm,) = build_actuators(settings, {"PATH": str(tmp_path)})  # no scontrol on this PATH
    unmapped = slurm.execute(request("slurm:gwtest:7", price_tier="on-demand"))
    assert unmapped.outcome is Outcome.REFUSED
    assert "no Slurm partition for price tier on-demand" in unmapped.detail
    with pytest.raises(FileNotFoundError):  # mapped: it goes on to ask scontrol
        slurm.execute(request("slurm:gwtest:7", price_tier="reserved"))


# --- the calls, scripted --------------------------------------------------------------------


def test_requeuehold_update_release_in_that_order_as_argument_lists() -> None:
    moved = (0, f"JobId=7 JobState=PENDING Partition={ON_DEMAND} Reason=None Restarts=1\n", "")
    fake = Answers(RUNNING, OK, OK, OK, moved)
    actuator = SlurmActuator("gwtest", partitions_by_tier={"on-demand": ON_DEMAND}, runner=fake)
    result = actuator.execute(request("slurm:gwtest:7", price_tier="on-demand"))
    assert result.outcome is Outcome.DONE, result.detail
    assert [call[1:] for call in fake.calls] == [
        ["show", "job", "-o", "7"],
        ["requeuehold", "7"],
        ["update", "JobId=7", f"Partition={ON_DEMAND}"],
        ["release", "7"],
        ["show", "job", "-o", "7"],
    ]
    assert result.undo["partition"] == ON_DEMAND
    assert f"to partition {ON_DEMAND}" in result.detail


def test_hold_true_leaves_the_moved_job_held() -> None:
    fake = Answers(RUNNING, OK, OK, RUNNING)
    actuator = SlurmActuator("gwtest", partitions_by_tier={"on-demand": ON_DEMAND}, runner=fake)
    result = actuator.execute(request("slurm:gwtest:7", price_tier="on-demand", hold=True))
    assert result.outcome is Outcome.DONE, result.detail
    assert ["release", "7"] not in [call[1:] for call in fake.calls]


def test_a_job_left_held_by_an_interrupted_move_is_moved_and_released() -> None:
    held = "JobId=7 JobState=PENDING Partition={} Reason=job_requeued_in_held_state Restarts=1\n"
    fake = Answers((0, held.format(SPOT), ""), OK, OK, (0, held.format(ON_DEMAND), ""))
    actuator = SlurmActuator("gwtest", partitions_by_tier={"on-demand": ON_DEMAND}, runner=fake)
    result = actuator.execute(request("slurm:gwtest:7", price_tier="on-demand"))
    assert result.outcome is Outcome.DONE, result.detail
    assert [call[1:] for call in fake.calls][1:3] == [
        ["update", "JobId=7", f"Partition={ON_DEMAND}"],
        ["release", "7"],
    ]


def test_a_failed_release_after_the_move_is_failed_and_says_held() -> None:
    fake = Answers(RUNNING, OK, OK, (1, "", "scontrol: error: Access/permission denied"))
    actuator = SlurmActuator("gwtest", partitions_by_tier={"on-demand": ON_DEMAND}, runner=fake)
    result = actuator.execute(request("slurm:gwtest:7", price_tier="on-demand"))
    assert result.outcome is Outcome.FAILED
    assert "left held" in result.detail


# --- the real two-tier cluster ------------------------------------------------------------


@pytest.fixture(scope="module")
def tier_cluster() -> Iterator[SlurmCluster]:
    """A private Slurm with partitions ``debug`` (default), ``gw-spot`` and ``gw-od``."""
    missing = missing_binaries(accounting=False)
    if missing:
        pytest.skip(f"Slurm/munge programs not installed: {', '.join(missing)}")
    if os.geteuid() != 0:
        pytest.skip("the private Slurm cluster must run as root (daemons, mknod)")
    with SlurmCluster(partitions=(SPOT, ON_DEMAND)) as cluster:
        yield cluster


def _show(cluster: SlurmCluster, job_id: str) -> str:
    return cluster.run(["scontrol", "show", "job", "-o", job_id]).stdout


def _assert_not_held(shown: str) -> None:
    """Slurm holds with priority 0 (``requeuehold``: ``Reason=job_requeued_in_held_state``).

    A released requeued job waits ``Reason=BeginTime`` (Slurm 22.05 delays its restart).
    """
    fields = dict(field.split("=", 1) for field in shown.split() if "=" in field)
    assert fields["JobState"] in {"PENDING", "RUNNING"}, shown
    assert int(fields["Priority"]) > 0, shown
    assert "held" not in fields["Reason"].lower(), shown


@pytest.mark.slurm
def test_a_spot_job_falls_back_to_the_on_demand_partition(tier_cluster: SlurmCluster) -> None:
    moving = tier_cluster.sbatch(SCRIPT, f"--partition={SPOT}", "--job-name=gw-tier")
    stuck = tier_cluster.sbatch(SCRIPT, f"--partition={SPOT}", "--job-name=gw-tier-bad")
    env = tier_cluster.env()
    mapped = SlurmActuator("gwtest", environ=env, partitions_by_tier={"on-demand": ON_DEMAND})
    broken = SlurmActuator("gwtest", environ=env, partitions_by_tier={"spot": "gw-nosuch"})
    try:
        for job_id in (moving, stuck):
            tier_cluster.wait_for_state(job_id, {"RUNNING"}, TIMEOUT_SECONDS)
        target = f"slurm:gwtest:{moving}"
        # A tier without a partition: refused, the job untouched (no silent same-tier requeue).
        refused = mapped.execute(request(target, price_tier="reserved"))
        assert refused.outcome is Outcome.REFUSED
        assert refused.detail == (
            "no Slurm partition for price tier reserved (slurm_partitions_by_tier)"
        )
        dry = mapped.execute(request(target, dry_run=True, price_tier="on-demand"))
        assert dry.outcome is Outcome.DRY_RUN
        assert f"from partition {SPOT} to {ON_DEMAND}" in dry.detail
        shown = _show(tier_cluster, moving)
        assert "JobState=RUNNING" in shown
        assert f"Partition={SPOT} " in shown
        assert "Restarts=0" in shown
        # The mapped tier: requeued into the on-demand partition and released there.
        done = mapped.execute(request(target, price_tier="on-demand"))
        assert done.outcome is Outcome.DONE, done.detail
        assert done.undo["partition"] == ON_DEMAND
        tier_cluster.wait_for_state(moving, {"PENDING", "RUNNING"}, TIMEOUT_SECONDS)
        shown = _show(tier_cluster, moving)
        assert f"Partition={ON_DEMAND} " in shown
        assert "Restarts=1" in shown
        _assert_not_held(shown)
        again = mapped.execute(request(target, price_tier="on-demand"))
        assert again.outcome is Outcome.ALREADY_DONE, again.detail
        # A partition Slurm does not know: FAILED with scontrol's word, the job released.
        failed = broken.execute(request(f"slurm:gwtest:{stuck}", price_tier="spot"))
        assert failed.outcome is Outcome.FAILED
        assert "Invalid partition name" in failed.detail
        assert "released back" in failed.detail
        tier_cluster.wait_for_state(stuck, {"PENDING", "RUNNING"}, TIMEOUT_SECONDS)
        shown = _show(tier_cluster, stuck)
        assert f"Partition={SPOT} " in shown
        _assert_not_held(shown)
    finally:
        tier_cluster.run(["scancel", moving, stuck], check=False)


# --- Kubernetes -----------------------------------------------------------------------------


class NoCalls:
    """Fails the test if the actuator reaches the API server."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"called the API: {name}")


def test_kubernetes_refuses_a_tier_change_it_cannot_make() -> None:
    pytest.importorskip("kubernetes")
    from gpuwarden.collector.remediate.actuators.kubernetes import KubeCalls, KubernetesActuator

    actuator = KubernetesActuator(cast(KubeCalls, NoCalls()))
    result = actuator.execute(request("team-a/train-0", price_tier="on-demand"))
    assert result.outcome is Outcome.REFUSED
    assert "price tier on-demand is not supported on Kubernetes" in result.detail

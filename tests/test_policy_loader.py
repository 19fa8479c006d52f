"""Policy files: the shipped examples load, broken files give one line per mistake, the
``policies check`` command's exit codes, and the pure limit check ADMIT calls."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.cli import main
from gpuwarden.collector.policy.limits import LimitRequest, Usage, check_limits
from gpuwarden.collector.policy.loader import load_policies
from gpuwarden.collector.policy.model import (
    CapPeriod,
    CostCapPolicy,
    LimitPolicy,
    OnBreach,
    PolicyError,
    PolicyKind,
    PolicySelector,
    QuietHoursPolicy,
)

EXAMPLES = Path(__file__).resolve().parent.parent / "policies"

BROKEN = """\
version: 1
policies:
  - name: ok-limit
    kind: limit
    max_gpus_per_job: 8
  - name: typo-kind
    kind: limt
  - name: unknown-key
    kind: limit
    max_gpus_per_jobs: 8
  - name: empty-limit
    kind: limit
    selector: {teams: [ml]}
  - name: bad-quiet
    kind: quiet_hours
    timezone: Mars/Olympus
    days: [mon, funday]
    hours: "25:00-06:00"
    actions: [reboot]
  - name: ok-limit
    kind: cost_cap
    cap_dollars: -5
  - name: idle
    kind: idle_reclaim
    idle: soon
    action: delete
"""


def test_the_shipped_examples_load_with_every_kind() -> None:
    result = load_policies([EXAMPLES])
    assert result.problems == ()
    assert {p.kind for p in result.policies} == set(PolicyKind)
    quiet = result.get("weekend-nights")
    assert isinstance(quiet, QuietHoursPolicy)
    assert (quiet.days, quiet.start_minute, quiet.end_minute) == ((0, 1, 2, 3, 4), 1320, 420)
    cap = result.get("interns-daily-cap")
    assert isinstance(cap, CostCapPolicy)
    assert (cap.period, cap.on_breach) == (CapPeriod.DAY, OnBreach.BLOCK_SCALE_UP)


def test_a_broken_file_gives_one_line_per_mistake(tmp_path: Path) -> None:
    path = tmp_path / "team.yaml"
    path.write_text(BROKEN)
    result = load_policies([tmp_path], skip_bad=True)
    assert [p.name for p in result.policies] == ["ok-limit"]
    f = str(path)
    assert [str(p) for p in result.problems] == [
        f"{f}: policies[1] (typo-kind).kind: unknown policy kind 'limt'; did you mean 'limit'? "
        "(known: limit, approval, cost_cap, idle_reclaim, quiet_hours)",
        f"{f}: policies[2] (unknown-key).max_gpus_per_jobs: unknown key 'max_gpus_per_jobs'; "
        "did you mean 'max_gpus_per_job'?",
        f"{f}: policies[3] (empty-limit): a limit needs max_gpus_per_job, max_gpus_per_team or "
        "max_gpus_per_model",
        f"{f}: policies[4] (bad-quiet).timezone: unknown time zone 'Mars/Olympus'",
        f"{f}: policies[4] (bad-quiet).days[1]: unknown day 'funday' "
        "(known: mon, tue, wed, thu, fri, sat, sun)",
        f"{f}: policies[4] (bad-quiet).hours: expected a window HH:MM-HH:MM such as "
        "22:00-06:00, got '25:00-06:00'",
        f"{f}: policies[4] (bad-quiet).actions[0]: unknown action kind 'reboot'; did you mean "
        "'webhook'? (known: requeue, scale_up, degrade, drain, notify, webhook)",
        f"{f}: policies[5] (ok-limit).name: duplicate policy name, first defined in "
        f"{f} policies[0]",
        f"{f}: policies[5] (ok-limit).cap_dollars: expected a number > 0 (dollars), got -5",
        f"{f}: policies[6] (idle).idle: expected a duration such as 90s, 30m, 24h, 7d or "
        "seconds, got 'soon'",
        f"{f}: policies[6] (idle).action: unknown reclaim action 'delete' (known: requeue, notify)",
    ]


def test_without_skip_bad_the_first_mistake_raises(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(BROKEN)
    with pytest.raises(PolicyError, match=r"policies\[1\] \(typo-kind\)\.kind"):
        load_policies([tmp_path])


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("", "empty file: expected a mapping with a 'policies' list"),
        ("policies: []\nversion: 2\n", "version: unsupported version 2 (supported: 1)"),
        ("policies:\n  - a: 1\n    a: 2\n", "not valid YAML"),
        ("rules: []\n", "rules: unknown key 'rules'"),
    ],
)
def test_file_level_mistakes_name_the_file(tmp_path: Path, text: str, line: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    (problem,) = load_policies([path], skip_bad=True).problems
    assert str(problem).startswith(f"{path}: {line}")


def test_policies_check_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policies", "check", str(EXAMPLES)]) == 0
    assert capsys.readouterr().out.startswith("9 policies OK (3 limit, 2 approval, 2 cost_cap")
    (tmp_path / "bad.yaml").write_text(BROKEN)
    assert main(["policies", "check", str(tmp_path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 12
    assert err[-1] == "11 problems; 1 policy OK"
    assert main(["policies", "check", str(tmp_path / "nowhere")]) == 1
    assert capsys.readouterr().err.startswith(f"{tmp_path / 'nowhere'}: no such file or folder")


# --- the limit check -----------------------------------------------------------------------------

JOB = LimitPolicy(name="per-job", max_gpus_per_job=16)
TEAM = LimitPolicy(name="ml-team", selector=PolicySelector(teams=("ml-*",)), max_gpus_per_team=64)
MODEL = LimitPolicy(
    name="llama", selector=PolicySelector(models=("llama-*",)), max_gpus_per_model=8
)


@pytest.mark.parametrize(
    ("request_", "usage", "breached"),
    [
        (LimitRequest(gpus=16, team="ml-a", job="j"), Usage(), []),
        (LimitRequest(gpus=17, team="x", job="j"), Usage(), [("per-job", "max_gpus_per_job", 17)]),
        (LimitRequest(gpus=8, team="ml-a"), Usage({"ml-a": 56}), []),
        (
            LimitRequest(gpus=9, team="ml-a"),
            Usage({"ml-a": 56, "ml-b": 0}),
            [("ml-team", "max_gpus_per_team", 65)],
        ),
        (LimitRequest(gpus=9, team="research"), Usage({"research": 56}), []),  # not selected
        (LimitRequest(gpus=9, team=None), Usage({"ml-a": 100}), []),  # unknown team: no count
        (
            LimitRequest(gpus=4, model="llama-70b", team="ml-a"),
            Usage({"ml-a": 62}, {"llama-70b": 6}),
            [("ml-team", "max_gpus_per_team", 66), ("llama", "max_gpus_per_model", 10)],
        ),
    ],
)
def test_check_limits(
    request_: LimitRequest, usage: Usage, breached: list[tuple[str, str, int]]
) -> None:
    found = check_limits([JOB, TEAM, MODEL], request_, usage)
    assert [(b.policy, b.key, b.gpus) for b in found] == breached


def test_a_breach_explains_itself() -> None:
    (breach,) = check_limits([TEAM], LimitRequest(gpus=9, team="ml-a"), Usage({"ml-a": 56}))
    assert breach.reason == (
        "team ml-a would hold 65 GPUs (56 held + 9 requested); policy ml-team allows at most 64 "
        "(max_gpus_per_team)"
    )

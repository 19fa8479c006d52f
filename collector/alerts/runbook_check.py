"""Runbooks checked the way incidents will render them (``gpuwarden rules check``).

A rule's runbook is rendered, with ``StrictUndefined`` as always, once with placeholder facts
(the ``/runbooks/<rule>`` page) and once with a sample incident for each subject its detector
finds (a job with its allocation, a node, a model deployment), the rule's actions proposed.
The context has one shape for every rule (:func:`~.runbooks.runbook_context`), so a misspelt
name (``{{ job.kee }}``) fails whatever the sample; the samples also reach what a template only
shows for an incident. Evidence keys are the exception: they differ per detector and render
``unknown`` when absent, so a misspelt evidence key is not caught here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from gpuwarden.collector.alerts.runbooks import Links, RunbookError, RunbookRenderer
from gpuwarden.collector.alerts.runbooks import runbook_context as _context
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from gpuwarden.collector.rules.model import Rule, Subject
from gpuwarden.collector.storage.base import ActionRecord
from gpuwarden.collector.storage.records import Incident, ModelDeployment

SAMPLE_TIME: Final = 1_800_000_000.0
_NODE, _GPU = "node-1", "GPU-0"


def sample_context(rule: Rule, subject: Subject, links: Links) -> dict[str, Any]:
    """The runbook context of a made-up open incident of ``rule`` about a ``subject``."""
    evidence: dict[str, object] = {
        "summary": f"{rule.id} fired (sample)",
        "node": _NODE,
        "gpu": _GPU,
    }
    job = model = None
    target = _NODE
    if subject is Subject.JOB:
        job = Job(
            key="slurm:cluster:1234",
            scheduler="slurm",
            job_id="1234",
            state=JobState.RUNNING,
            name="train",
            owner="owner",
            team="team",
            gpus=2,
            allocations=(GpuAllocation(_NODE, (0, 1)),),
            price_tier="on-demand",
        )
        evidence |= {"job": job.key, "team": "team"}
        target = job.key
    elif subject is Subject.DEPLOYMENT:
        model = ModelDeployment("model", "v2", 2, fallback_model="model-small")
        evidence |= {"model": model.name, "version": model.version}
        target = model.name
    incident = Incident(
        fingerprint=f"{rule.id}/sample",
        rule_id=rule.id,
        severity=str(rule.severity),
        first_seen=SAMPLE_TIME,
        last_seen=SAMPLE_TIME + 600,
        evidence={"subject": target, **evidence},
        incident_id=1,
    )
    actions = [
        ActionRecord(1, f"sample-{i}", a.kind, target, str(a.mode), True, "proposed", 0.0, 0.0)
        for i, a in enumerate(rule.actions)
    ]
    return _context(rule, links, incident=incident, job=job, model=model, actions=actions)


def runbook_problems(
    renderer: RunbookRenderer, rule: Rule, subjects: Iterable[Subject], links: Links
) -> list[str]:
    """What keeps ``rule``'s runbook from rendering, one line each (``<file>:<line>: ...``)."""
    contexts = [_context(rule, links), *(sample_context(rule, s, links) for s in subjects)]
    problems: list[str] = []
    for context in contexts:
        try:
            renderer.markdown(rule.runbook, context)
        except RunbookError as exc:
            if str(exc) not in problems:
                problems.append(str(exc))
    return problems

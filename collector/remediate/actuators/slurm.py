"""Slurm actuator: requeue (or requeue and hold) a job, drain and resume a node, via ``scontrol``.

Argument lists only (never a shell), a timeout on every call, and targets checked before anything
runs: a job key ``slurm:<cluster>:<id>`` of this actuator's cluster with a numeric id (an array
task ``<id>_<n>`` too), a node name that is one plain hostname (no lists, ranges or globs).
``scontrol``'s answers map to outcomes as measured on Slurm 22.05 (see the reference notes):
a job already pending after a requeue is the wanted state (ALREADY_DONE), an unknown id is
NOT_FOUND, a job that cannot be requeued (not a batch job, ``--no-requeue``, or one that has
COMPLETED or was CANCELLED: a requeue would run a finished job again) is REFUSED, and anything
else, including a timeout or an unreachable controller, is FAILED (the remediator may retry).
``requeue`` with parameter ``hold: true`` (or an actuator built with ``hold=True``) runs
``scontrol requeuehold``: the job waits for ``scontrol release``.

A ``requeue`` whose ``price_tier`` is not ``same`` (the spot → on-demand fallback) moves the job
to the Slurm partition ``partitions_by_tier`` maps that tier to: ``scontrol requeuehold``, then
``scontrol update JobId=<id> Partition=<p>``, then (unless ``hold``) ``scontrol release``; a job
already pending is only updated. A failed update releases the job (it runs again where it was:
never held by accident) and reports FAILED. A tier without a partition is REFUSED, never a
silent requeue at the job's old tier.

Dry runs read ``scontrol show`` and say what would happen; nothing changes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpuwarden.collector.jobs.slurm_cli import RunStatus, SlurmCli, SlurmResult, SlurmRunner
from gpuwarden.collector.remediate.actuators.base import ActionRequest, ActionResult, Outcome

_JOB_ID = re.compile(r"\d{1,10}(_\d{1,10})?")
_HOSTNAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_FIELD = re.compile(r"(\w+)=(\S*)")
_REASON = re.compile(r"[^\x00-\x1f\"'`\\]{1,200}")
_PARTITION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
PRICE_TIERS = frozenset({"on-demand", "spot", "reserved"})
"""The tiers a requeue may move a job to (``price_tier: same``, the default, keeps its own)."""
REQUEUE_KINDS = frozenset({"requeue"})
NODE_KINDS = frozenset({"drain", "resume"})
DEFAULT_DRAIN_REASON = "gpuwarden: GPU hardware fault"
_REQUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
"""States a requeued job passes through (REQUEUED briefly, then PENDING)."""
_REQUEUE_HELD = "job_requeued_in_held_state"
"""The ``Reason`` of a job ``scontrol requeuehold`` holds (an admin's hold reads otherwise)."""
_FINISHED_STATES = frozenset({"COMPLETED", "CANCELLED"})
"""States a requeue must not touch: the job is done, or a person stopped it."""
_MISSING = ("invalid job id", "not found")
"""``scontrol show``'s answer (rc 1) for an unknown job (stderr ``Invalid job id specified``) or
node (stdout ``Node <name> not found``), as Slurm 22.05 prints them."""


@dataclass(frozen=True, slots=True)
class _Target:
    kind: str  # "job" | "node"
    name: str  # job id or node name


class SlurmActuator:
    """Requeue jobs and drain/resume nodes of one Slurm cluster.

    Args:
        cluster: the cluster name in job keys (``slurm:<cluster>:<id>``).
        environ: environment of ``scontrol`` (``SLURM_CONF``, ``PATH``); ``None`` inherits ours.
        scontrol: the program to run.
        hold: requeue with ``requeuehold`` (the job waits for ``scontrol release``).
        partitions_by_tier: price tier → Slurm partition, for a ``requeue`` whose
            ``price_tier`` is not ``same``.
        timeout_seconds: per ``scontrol`` call.
        runner: runs an argument list (tests inject one; default a
            :class:`~gpuwarden.collector.jobs.slurm_cli.SlurmCli` with ``environ`` and
            ``timeout_seconds``).
    """

    kinds = REQUEUE_KINDS | NODE_KINDS

    def __init__(
        self,
        cluster: str,
        *,
        environ: Mapping[str, str] | None = None,
        scontrol: str = "scontrol",
        hold: bool = False,
        partitions_by_tier: Mapping[str, str] | None = None,
        timeout_seconds: float = 30.0,
        runner: SlurmRunner | None = None,
    ) -> None:
        if not _HOSTNAME.fullmatch(cluster):
            raise ValueError(f"cluster name {cluster!r} is not a plain name")
        partitions = dict(partitions_by_tier or {})
        for tier, partition in partitions.items():
            if tier not in PRICE_TIERS:
                raise ValueError(f"price tier {tier!r} is not one of {sorted(PRICE_TIERS)}")
            if not _PARTITION.fullmatch(partition):
                raise ValueError(f"partition {partition!r} (tier {tier}) is not a partition name")
        self._partitions = partitions
        self.cluster = cluster
        self._scontrol = scontrol
        self._hold = hold
        self._runner = runner or SlurmCli(env=environ, timeout_seconds=timeout_seconds)

    # --- targets ----------------------------------------------------------------------------

    def accepts(self, target: str) -> bool:
        """Job keys of this cluster, and plain node names."""
        return self._target(target) is not None

    def _target(self, target: str) -> _Target | None:
        prefix = f"slurm:{self.cluster}:"
        if target.startswith(prefix):
            job_id = target.removeprefix(prefix)
            return _Target("job", job_id) if _JOB_ID.fullmatch(job_id) else None
        if _HOSTNAME.fullmatch(target) and target.lower() not in {"all", "none"}:
            return _Target("node", target)
        return None

    # --- the protocol -----------------------------------------------------------------------

    def execute(self, request: ActionRequest) -> ActionResult:
        """Requeue, drain or resume; with ``dry_run`` only read and say what would happen."""
        target = self._target(request.target)
        wanted = "job" if request.kind in REQUEUE_KINDS else "node"
        if request.kind not in self.kinds:
            return ActionResult(Outcome.REFUSED, f"slurm does not do {request.kind!r}")
        if target is None or target.kind != wanted:
            return ActionResult(
                Outcome.REFUSED, f"{request.target!r} is not a {wanted} of cluster {self.cluster}"
            )
        if request.kind in REQUEUE_KINDS:
            return self._requeue_request(target.name, request)
        reason = str(request.parameters.get("reason", DEFAULT_DRAIN_REASON))
        if not _REASON.fullmatch(reason):
            return ActionResult(Outcome.REFUSED, "drain reason must be 1-200 printable characters")
        return self._node(target.name, request.kind, reason, dry_run=request.dry_run)

    def rollback(self, request: ActionRequest, result: ActionResult) -> ActionResult:
        """Resume a drained node; a requeue has nothing to undo (the job restarts)."""
        del result
        if request.kind == "drain":
            undo = ActionRequest("resume", request.target, request.idempotency_key, request.dry_run)
            return self.execute(undo)
        return ActionResult(Outcome.REFUSED, f"nothing to undo for {request.kind}")

    def probe(self, request: ActionRequest) -> ActionResult | None:
        """After a crash, whether the requeue or drain is already in place (None: not known).

        ``FAILED`` means "surely not done": a running job with no restart was never requeued.
        """
        target = self._target(request.target)
        fields = self._show(target.kind, target.name) if target is not None else None
        wanted = "job" if request.kind in REQUEUE_KINDS else "node"
        if target is None or target.kind != wanted or not isinstance(fields, dict):
            return None
        if target.kind == "node":
            draining = "DRAIN" in fields.get("State", "")
            state = fields.get("State", "?")
            if draining == (request.kind == "drain"):
                return ActionResult(Outcome.ALREADY_DONE, f"node {target.name} is {state}")
            return ActionResult(Outcome.FAILED, f"node {target.name} is still {state}")
        state = fields.get("JobState", "?")
        restarts = int(fields.get("Restarts", "0") or 0)
        if state in _REQUEUED_STATES and restarts > 0:
            return ActionResult(Outcome.ALREADY_DONE, f"job {target.name} already requeued")
        if state == "RUNNING" and restarts == 0:  # every requeue counts a restart
            return ActionResult(Outcome.FAILED, f"job {target.name} was never requeued")
        return None

    # --- calls ------------------------------------------------------------------------------

    def _requeue_answer(self, job_id: str, verb: str, *, dry_run: bool) -> ActionResult | None:
        """The answer without acting (not found, dry run, already pending), else None."""
        fields = self._show("job", job_id)
        if isinstance(fields, ActionResult):
            return fields
        state = fields.get("JobState", "?")
        if state in _FINISHED_STATES:
            return ActionResult(Outcome.REFUSED, f"job {job_id} is {state}: not requeued")
        if dry_run:
            pending = state in _REQUEUED_STATES
            would = f"is already {state}" if pending else f"would be {verb}d ({state})"
            return ActionResult(Outcome.DRY_RUN, f"would {verb}: job {job_id} {would}")
        if state in _REQUEUED_STATES:
            return ActionResult(Outcome.ALREADY_DONE, f"job {job_id} is already {state}")
        return None

    def _requeue(self, job_id: str, *, hold: bool, dry_run: bool) -> ActionResult:
        verb = "requeuehold" if hold else "requeue"
        answer = self._requeue_answer(job_id, verb, dry_run=dry_run)
        if answer is not None:
            return answer
        result = self._call([verb, job_id])
        if result.status is RunStatus.TIMED_OUT:
            return ActionResult(Outcome.FAILED, f"scontrol {verb} {job_id} timed out")
        if result.returncode == 0:
            shown = self._show("job", job_id)
            after = shown if isinstance(shown, dict) else {}
            restarts = after.get("Restarts", "?")
            return ActionResult(
                Outcome.DONE,
                f"{verb} job {job_id}: {after.get('JobState', '?')} "
                f"({after.get('Reason', '?')}), restarts={restarts}",
                {"job_id": job_id, "restarts": restarts},
            )
        return _requeue_failure(job_id, verb, result.stderr)

    def _requeue_request(self, job_id: str, request: ActionRequest) -> ActionResult:
        """A requeue at the job's own tier, or into the partition of its ``price_tier``."""
        hold = request.parameters.get("hold", self._hold)
        if not isinstance(hold, bool):
            return ActionResult(Outcome.REFUSED, "parameter hold must be true or false")
        tier = str(request.parameters.get("price_tier", "same"))
        if tier == "same":
            return self._requeue(job_id, hold=hold, dry_run=request.dry_run)
        partition = self._partitions.get(tier)
        if partition is None or not _PARTITION.fullmatch(partition):
            return ActionResult(
                Outcome.REFUSED,
                f"no Slurm partition for price tier {tier} (slurm_partitions_by_tier)",
            )
        return self._move(job_id, partition, tier, hold=hold, dry_run=request.dry_run)

    def _move(
        self, job_id: str, partition: str, tier: str, *, hold: bool, dry_run: bool
    ) -> ActionResult:
        """Requeue ``job_id`` into ``partition`` (held while it moves), or move it if pending."""
        fields = self._show("job", job_id)
        if isinstance(fields, ActionResult):
            return fields
        answer = _move_answer(job_id, fields, partition, tier, dry_run=dry_run)
        if answer is not None:
            return answer
        state, was = fields.get("JobState", "?"), fields.get("Partition", "?")
        pending = state in _REQUEUED_STATES
        # Held by a requeuehold whose move never ran (a crash between the calls): release it too.
        release = not hold and (not pending or fields.get("Reason") == _REQUEUE_HELD)
        if not pending:
            held = self._call(["requeuehold", job_id])
            if held.status is RunStatus.TIMED_OUT or held.returncode != 0:
                return _requeue_failure(job_id, "requeuehold", held.stderr or "timed out")
        moved = self._call(["update", f"JobId={job_id}", f"Partition={partition}"])
        if moved.status is RunStatus.TIMED_OUT or moved.returncode != 0:
            said = "timed out" if moved.status is RunStatus.TIMED_OUT else _tail(moved.stderr)
            if release:
                back = self._release(job_id) or f"; job released back to {was}"
            else:
                back = f"; job stays {'held' if hold and not pending else state} in {was}"
            return ActionResult(
                Outcome.FAILED,
                f"scontrol update JobId={job_id} Partition={partition}: {said}{back}",
            )
        released = self._release(job_id) if release else ""
        if released:
            return ActionResult(Outcome.FAILED, f"job {job_id} moved to {partition} but{released}")
        shown = self._show("job", job_id)
        after = shown if isinstance(shown, dict) else {}
        restarts = after.get("Restarts", "?")
        return ActionResult(
            Outcome.DONE,
            f"requeue job {job_id} to partition {after.get('Partition', partition)} "
            f"(price tier {tier}, was {was}): {after.get('JobState', '?')} "
            f"({after.get('Reason', '?')}), restarts={restarts}",
            {"job_id": job_id, "partition": partition, "price_tier": tier, "restarts": restarts},
        )

    def _release(self, job_id: str) -> str:
        """``scontrol release``; ``""`` when done, else what went wrong (to append)."""
        released = self._call(["release", job_id])
        if released.status is RunStatus.TIMED_OUT:
            return f"; left held: scontrol release {job_id} timed out"
        if released.returncode != 0:
            return f"; left held: scontrol release {job_id}: {_tail(released.stderr)}"
        return ""

    def _node_answer(self, node: str, kind: str, *, dry_run: bool) -> ActionResult | None:
        """The answer without acting (not found, already so, dry run), else None."""
        fields = self._show("node", node)
        if isinstance(fields, ActionResult):
            return fields
        state = fields.get("State", "?")
        draining = "DRAIN" in state
        if (kind == "drain") == draining:
            return ActionResult(Outcome.ALREADY_DONE, f"node {node} is {state}")
        if dry_run:
            return ActionResult(Outcome.DRY_RUN, f"would {kind} node {node} (now {state})")
        return None

    def _node(self, node: str, kind: str, reason: str, *, dry_run: bool) -> ActionResult:
        answer = self._node_answer(node, kind, dry_run=dry_run)
        if answer is not None:
            return answer
        args = ["update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"]
        if kind == "resume":
            args = ["update", f"NodeName={node}", "State=RESUME"]
        result = self._call(args)
        if result.status is RunStatus.TIMED_OUT:
            return ActionResult(Outcome.FAILED, f"scontrol {kind} {node} timed out")
        if result.returncode != 0:
            return ActionResult(Outcome.FAILED, f"scontrol {kind} {node}: {_tail(result.stderr)}")
        shown = self._show("node", node)
        after = shown.get("State", "?") if isinstance(shown, dict) else "?"
        return ActionResult(Outcome.DONE, f"{kind} node {node}: now {after}", {"node": node})

    def _show(self, what: str, name: str) -> dict[str, str] | ActionResult:
        """The ``Key=Value`` fields of ``scontrol show``; NOT_FOUND or FAILED otherwise."""
        result = self._call(["show", what, "-o", name])
        if result.status is RunStatus.TIMED_OUT:
            return ActionResult(Outcome.FAILED, f"scontrol show {what} {name} timed out")
        if result.returncode == 0 and result.stdout.strip():
            return dict(_FIELD.findall(result.stdout))
        said = f"{result.stdout}\n{result.stderr}".lower()  # "Node x not found" is on stdout
        if any(text in said for text in _MISSING):
            return ActionResult(Outcome.NOT_FOUND, f"no {what} {name} in cluster {self.cluster}")
        return ActionResult(Outcome.FAILED, f"scontrol show {what} {name}: {_tail(result.stderr)}")

    def _call(self, args: list[str]) -> SlurmResult:
        """Run ``scontrol`` with ``args``; a program that cannot start raises its ``OSError``."""
        result = self._runner([self._scontrol, *args])
        if result.status is RunStatus.NOT_STARTED:
            # As before the shared runner: the remediator records "actuator raised ..." (FAILED).
            raise result.os_error or OSError(result.error)
        return result


def _tail(stderr: str) -> str:
    return " ".join(stderr.split())[-300:] or "no message"


def _move_answer(
    job_id: str, fields: Mapping[str, str], partition: str, tier: str, *, dry_run: bool
) -> ActionResult | None:
    """The answer to a move without acting (finished, already there, dry run), else None."""
    state, was = fields.get("JobState", "?"), fields.get("Partition", "?")
    pending = state in _REQUEUED_STATES
    if state in _FINISHED_STATES:
        return ActionResult(Outcome.REFUSED, f"job {job_id} is {state}: not requeued")
    if pending and was == partition:
        return ActionResult(Outcome.ALREADY_DONE, f"job {job_id} is {state} in {partition}")
    if dry_run:
        how = "move pending" if pending else "requeue"
        return ActionResult(
            Outcome.DRY_RUN,
            f"would {how} job {job_id} from partition {was} to {partition} "
            f"(price tier {tier}, {state})",
        )
    return None


def _requeue_failure(job_id: str, verb: str, stderr: str) -> ActionResult:
    """Map ``scontrol requeue``'s refusals (Slurm 22.05) to outcomes."""
    text = stderr.lower()
    detail = f"scontrol {verb} {job_id}: {_tail(stderr)}"
    if "job is pending execution" in text:
        return ActionResult(Outcome.ALREADY_DONE, detail)
    if "invalid job id" in text:
        return ActionResult(Outcome.NOT_FOUND, detail)
    if "presently disabled" in text or "only batch jobs" in text or "access/permission" in text:
        return ActionResult(Outcome.REFUSED, detail)
    return ActionResult(Outcome.FAILED, detail)

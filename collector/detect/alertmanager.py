"""``alertmanager``: alerts from the user's own Prometheus rules, pushed by Alertmanager's webhook
(``POST /v1/alertmanager``, parsed in :mod:`gpuwarden.collector.ingest.alertmanager`). Nothing is
computed here: the spec makes such rules loadable and says which alerts they take (``labels``)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwarden.collector.detect.contract import Detector, spec_of
from gpuwarden.collector.rules.model import Subject
from gpuwarden.collector.rules.params import text


@dataclass(frozen=True, slots=True, kw_only=True)
class AlertmanagerParams:
    """Parameters of ``alertmanager``."""

    job_label: str = text(
        "job_key", "Alert label holding the gpuwarden job key (slurm:..., k8s:...)."
    )
    node_label: str = text("node", "Alert label holding the node name.")
    deployment_label: str = text("model", "Alert label holding the model deployment.")


DETECTOR = Detector(
    spec=spec_of(
        "alertmanager",
        "An alert from the user's own Prometheus rules, received from Alertmanager's webhook "
        "(POST /v1/alertmanager); selector.labels pick the alerts.",
        subjects=(Subject.JOB, Subject.NODE, Subject.DEPLOYMENT),
        signals=(),
        params=AlertmanagerParams,
        selector=("labels",),
        requires=("labels",),
    ),
    params=AlertmanagerParams,
    run=None,
)

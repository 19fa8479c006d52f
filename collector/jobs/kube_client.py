"""The one place that configures the official Kubernetes client and hands out its API objects.

:func:`load_client` reads a kubeconfig file (and context) or the pod's service account;
:class:`KubeApis` gives the typed API objects the collector uses (core, apps, autoscaling/v2,
custom objects), all over one ``ApiClient``. The ``kubernetes`` package is imported on first use,
so importing this module costs nothing for a collector without Kubernetes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gpuwarden.collector.jobs import JobSourceError

if TYPE_CHECKING:
    from kubernetes.client import (
        ApiClient,
        AppsV1Api,
        AutoscalingV2Api,
        CoreV1Api,
        CustomObjectsApi,
    )


def load_client(
    *, kubeconfig: Path | None = None, context: str | None = None, in_cluster: bool = False
) -> ApiClient:
    """An ``ApiClient`` from a kubeconfig file (and context) or the pod's service account.

    Raises ``JobSourceError`` naming what is wrong with the configuration (missing file, unknown
    context, no service account mounted); credentials are never part of the message.
    """
    from kubernetes.client import ApiClient, Configuration
    from kubernetes.config import (
        ConfigException,
        load_incluster_config,
        new_client_from_config,
    )

    try:
        if in_cluster:
            configuration = Configuration()
            load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return ApiClient(configuration)
        if kubeconfig is not None and not kubeconfig.is_file():
            raise JobSourceError(f"kubeconfig {kubeconfig} does not exist")
        client: ApiClient = new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig) if kubeconfig else None,
            context=context,
            persist_config=False,
        )
    except ConfigException as exc:
        raise JobSourceError(f"cannot configure the Kubernetes client: {exc}") from None
    return client


class KubeApis:
    """The API objects the collector calls, over one configured ``ApiClient``."""

    def __init__(self, client: ApiClient) -> None:
        self.client = client

    def core(self) -> CoreV1Api:
        """Pods and nodes."""
        from kubernetes.client import CoreV1Api

        return CoreV1Api(self.client)

    def apps(self) -> AppsV1Api:
        """Deployments and their scale subresource."""
        from kubernetes.client import AppsV1Api

        return AppsV1Api(self.client)

    def autoscaling(self) -> AutoscalingV2Api:
        """autoscaling/v2 HorizontalPodAutoscalers."""
        from kubernetes.client import AutoscalingV2Api

        return AutoscalingV2Api(self.client)

    def custom_objects(self) -> CustomObjectsApi:
        """Custom resources (HTTPRoute, InferenceService, Kueue Workload)."""
        from kubernetes.client import CustomObjectsApi

        return CustomObjectsApi(self.client)

"""Assemble a running agent from its configuration (the composition root)."""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from gpuwarden import __version__
from gpuwarden.agent.config import AgentConfig, ConfigError
from gpuwarden.agent.daemon import Agent, Attribution, EventProbe, HostProbe
from gpuwarden.agent.http import AgentHttpServer
from gpuwarden.agent.model import GpuEvent, GpuSource, JobRef, ProcessSample, Snapshot
from gpuwarden.agent.sender import OtlpHttpSender, otlp_points
from gpuwarden.agent.spool import Spool
from gpuwarden.agent.telemetry import SampleCache, Telemetry
from gpuwarden.agent.tls import client_context

log = logging.getLogger(__name__)


def host_id(machine_id_file: Path = Path("/etc/machine-id")) -> str | None:
    """The OS machine id (OTel ``host.id`` on Linux), if readable."""
    try:
        value = machine_id_file.read_text(encoding="ascii").strip()
    except OSError:
        return None
    return value or None


def resource_attributes(config: AgentConfig, machine_id: str | None) -> dict[str, str]:
    """OTLP resource attributes describing this node and agent."""
    attrs = {
        "service.name": "gpuwarden-agent",
        "service.version": __version__,
        "host.name": config.node_name,
        "gpuwarden.agent.version": __version__,
        "gpuwarden.price_tier": config.resource.price_tier,
    }
    optional = {
        "host.id": machine_id,
        "host.type": config.resource.instance_type,
        "cloud.region": config.resource.region,
        "gpuwarden.cluster": config.resource.cluster,
    }
    attrs.update({k: v for k, v in optional.items() if v})
    return attrs


def job_hints(jobs: Callable[[], Mapping[int, JobRef]]) -> Attribution:
    """Attribution from a simulated scenario's own pid → job table."""

    def attribute(processes: Sequence[ProcessSample]) -> tuple[ProcessSample, ...]:
        table = jobs()
        return tuple(replace(p, job=table.get(p.pid)) for p in processes)

    return attribute


@dataclass
class AgentRuntime:
    """A built agent and the optional HTTP server beside it."""

    agent: Agent
    http: AgentHttpServer | None


def build_source(
    config: AgentConfig, clock: Callable[[], float] = time.time
) -> tuple[GpuSource, Attribution | None, EventProbe | None]:
    """The GPU source the config asks for, with its attribution and XID event probe.

    Raises ``NvmlUnavailableError`` (with the fix in its message) when NVML is asked for but
    cannot be loaded.
    """
    if config.source == "nvml":
        from gpuwarden.agent.attribution import Attributor
        from gpuwarden.agent.sources.nvml import NvmlSource

        nvml = NvmlSource(
            library_path=str(config.nvml_library_path) if config.nvml_library_path else None
        )
        return nvml, Attributor(config.proc_root).attribute, nvml.events
    if config.source == "simulated":
        from gpuwarden.agent.sources.simulated import SimulatedSource, load_scenario

        try:
            scenario = load_scenario(config.scenario, node_name=config.node_name)
        except ValueError as exc:
            raise ConfigError(
                f"{exc}; give --scenario (or scenario:) a preset name or a scenario YAML file"
            ) from None
        sim = SimulatedSource(scenario, clock=clock)
        return sim, job_hints(sim.jobs), sim.events
    from gpuwarden.agent.sources.replay import ReplaySource

    if config.replay_path is None:  # AgentConfig checks this; keep mypy and -O honest
        raise ConfigError("source 'replay' needs replay_path")
    try:
        replay = ReplaySource(config.replay_path, clock=clock)
        replay.duration_seconds  # noqa: B018 - loads and checks every row now, not mid-run
    except OSError as exc:
        raise ConfigError(
            f"replay_path: cannot read {config.replay_path}: {exc.strerror or exc}; "
            "give --replay (or replay_path:) an existing trace file"
        ) from None
    except ValueError as exc:
        raise ConfigError(f"replay_path: {exc}") from None
    return replay, None, _no_events


def _open_spool(config: AgentConfig) -> Spool:
    """The spool, or a ConfigError naming ``spool.directory`` when it cannot be written."""
    directory = config.spool.directory
    try:
        spool = Spool(
            directory,
            max_bytes=config.spool.max_bytes,
            fsync=config.spool.fsync,
            count_points=otlp_points,
        )
        if not os.access(directory, os.W_OK | os.X_OK):  # root passes; a read-only mount not
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    except OSError as exc:
        raise ConfigError(
            f"spool.directory: cannot write {directory}: {exc.strerror or exc}; set "
            "spool.directory (--spool-dir, GPUWARDEN_SPOOL_DIR) to a writable directory"
        ) from None
    return spool


def _no_events() -> list[GpuEvent]:
    return []


def build_agent(
    config: AgentConfig,
    *,
    source: tuple[GpuSource, Attribution | None, EventProbe | None] | None = None,
    clock: Callable[[], float] = time.time,
    with_host: bool = True,
    machine_id_file: Path = Path("/etc/machine-id"),
    host: HostProbe | None = None,
    record: Callable[[Snapshot], None] | None = None,
) -> AgentRuntime:
    """Build every part of the agent; nothing starts until ``Agent.run``/``http.start``.

    ``host`` replaces the ``/proc`` reader (the demo's simulated hosts); ``with_host=False``
    drops host data altogether; ``record`` is called with every round (``--record``).
    """
    gpu_source, attribution, events = source if source is not None else build_source(config, clock)
    cache = SampleCache()
    readers = []
    registry = None
    if config.http.enabled and config.http.prometheus:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import CollectorRegistry

        registry = CollectorRegistry(auto_describe=True)
        readers.append(PrometheusMetricReader(registry=registry))
    telemetry = Telemetry(
        cache,
        resource_attributes(config, host_id(machine_id_file)),
        version=__version__,
        extra_readers=readers,
    )
    host_probe = host
    if with_host and host_probe is None:
        from gpuwarden.agent.host import HostReader

        host_probe = HostReader(config.proc_root, config.sys_root).sample
    spool = sender = None
    if config.collector.urls:
        ssl_context = client_context(config.collector)  # before the spool: a bad file stops here
        spool = _open_spool(config)
        headers = {}
        token = config.token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        sender = OtlpHttpSender(
            spool,
            config.collector.urls,
            headers=headers,
            timeout_seconds=config.collector.timeout_seconds,
            gzip_level=config.collector.gzip_level,
            ssl_context=ssl_context,
        )
    agent = Agent(
        source=gpu_source,
        telemetry=telemetry,
        cache=cache,
        interval_seconds=config.interval_seconds,
        attribution=attribution,
        host=host_probe,
        events=events,
        spool=spool,
        sender=sender,
        record=record,
    )
    http = None
    if config.http.enabled:
        http = AgentHttpServer(
            config.http.host, config.http.port, healthy=agent.healthy, registry=registry
        )
    return AgentRuntime(agent, http)

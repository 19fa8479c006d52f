"""``gpuwarden agent``: start-up checks, signal handling, graceful shutdown that flushes."""

from __future__ import annotations

import errno
import json
import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import msgspec

from gpuwarden.agent.config import AgentConfig, ConfigError
from gpuwarden.agent.model import Snapshot

if TYPE_CHECKING:
    from gpuwarden.agent.record import TraceRecorder

log = logging.getLogger(__name__)


def snapshot_summary(snapshot: Snapshot) -> dict[str, object]:
    """A compact JSON-able view of one round (for ``--once``)."""
    return {
        "time_unix_nano": snapshot.time_unix_nano,
        "gpus": [
            {
                "uuid": g.uuid,
                "index": g.index,
                "name": g.name,
                "status": str(g.status),
                "utilization_ratio": g.utilization_ratio,
                "memory_used_bytes": g.memory_used_bytes,
                "power_watts": g.power_watts,
                "processes": [
                    {"pid": p.pid, "job": None if p.job is None else p.job.job_id or p.job.pod_uid}
                    for p in g.processes
                ],
            }
            for g in snapshot.gpus
        ],
    }


def run_agent(
    config: AgentConfig, *, once: bool = False, push: bool = False, record: Path | None = None
) -> int:
    """Run the agent until SIGTERM/SIGINT; return the process exit code.

    Args:
        config: the loaded configuration.
        once: take one round, print it and return instead of running.
        push: with ``once``, also push the round (spooling it if the collector is away);
            without it a single round touches neither the collector nor the spool.
        record: also write every round to this trace file (``agent/record.py``).
    """
    if record is None:
        return _run(config, once=once, push=push, recorder=None)
    from gpuwarden.agent.record import TraceRecorder

    try:
        recorder = TraceRecorder(record)
    except OSError as exc:
        print(f"gpuwarden agent: --record: {exc}", file=sys.stderr)
        return 2
    with recorder:
        return _run(config, once=once, push=push, recorder=recorder)


def _run(config: AgentConfig, *, once: bool, push: bool, recorder: TraceRecorder | None) -> int:
    if once and not push:
        config = msgspec.structs.replace(
            config,
            collector=msgspec.structs.replace(config.collector, endpoint=None, endpoints=()),
        )
    from gpuwarden.agent.build import build_agent
    from gpuwarden.agent.sources.nvml import NvmlUnavailableError

    try:
        runtime = build_agent(config, record=None if recorder is None else recorder.record)
        if runtime.http is not None and not once:
            runtime.http.start()
    except NvmlUnavailableError as exc:
        print(f"gpuwarden agent: {exc}", file=sys.stderr)
        return 1
    except ConfigError as exc:
        print(f"gpuwarden agent: configuration error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            print(
                f"gpuwarden agent: port {config.http.port} on {config.http.host} is in use; "
                "set http.port in the config or stop the other process",
                file=sys.stderr,
            )
            return 1
        raise
    agent = runtime.agent
    if once:
        try:
            result = agent.sample_once()
            print(json.dumps(snapshot_summary(result.snapshot), indent=2), flush=True)
        finally:  # a reader gone (``| head``) must not skip the push of the round
            agent.shutdown(flush_timeout_seconds=config.collector.timeout_seconds)
        return 0
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s; flushing and stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if runtime.http is not None:
        log.info("serving /healthz and /metrics on %s:%d", config.http.host, runtime.http.port)
    log.info(
        "agent started: node %s, source %s, every %.3g s, pushing to %s",
        config.node_name,
        config.source,
        config.interval_seconds,
        ", ".join(config.collector.urls) or "(nowhere: push disabled)",
    )
    try:
        agent.run(stop)
    finally:
        flushed = agent.shutdown(flush_timeout_seconds=config.collector.timeout_seconds)
        if runtime.http is not None:
            runtime.http.stop()
        log.info("agent stopped (spool %s)", "empty" if flushed else "kept for the next start")
    return 0

"""The agent's main loop: sample on a deadline, publish to the cache, spool, let the sender push.

One sample round = one OTLP request. The round's request is appended to the crash-safe spool
before anything is sent, so a sample that was taken is never lost to a collector outage or an
agent restart; the sender thread drains the spool in order.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import islice

from gpuwarden.agent.model import (
    AgentStats,
    GpuEvent,
    GpuEventKind,
    GpuSample,
    GpuSource,
    HostSample,
    ProcessSample,
    Snapshot,
)
from gpuwarden.agent.sender import OtlpHttpSender
from gpuwarden.agent.spool import Spool
from gpuwarden.agent.telemetry import SampleCache, Telemetry

log = logging.getLogger(__name__)

Attribution = Callable[[Sequence[ProcessSample]], tuple[ProcessSample, ...]]
HostProbe = Callable[[], HostSample]
EventProbe = Callable[[], list[GpuEvent]]


@dataclass(frozen=True, slots=True)
class RoundResult:
    """What one sample round produced (for tests, the demo and the benchmark)."""

    snapshot: Snapshot
    request_bytes: int
    spool_sequence: int | None


class Agent:
    """Ties a GPU source, attribution, host probe, telemetry, spool and sender together."""

    def __init__(
        self,
        *,
        source: GpuSource,
        telemetry: Telemetry,
        cache: SampleCache,
        interval_seconds: float,
        attribution: Attribution | None = None,
        host: HostProbe | None = None,
        events: EventProbe | None = None,
        spool: Spool | None = None,
        sender: OtlpHttpSender | None = None,
        wall_clock_ns: Callable[[], int] = time.time_ns,
        monotonic: Callable[[], float] = time.monotonic,
        record: Callable[[Snapshot], None] | None = None,
    ) -> None:
        self.source = source
        self.telemetry = telemetry
        self.cache = cache
        self.interval_seconds = interval_seconds
        self._attribution = attribution
        self._host = host
        self._events = events
        self.spool = spool
        self.sender = sender
        self._wall_clock_ns = wall_clock_ns
        self._monotonic = monotonic
        self._record = record
        self._rounds = 0
        self._last_seconds: float | None = None
        self.last_round_monotonic: float | None = None
        self._sender_thread: threading.Thread | None = None
        self._sender_stop = threading.Event()

    def _attributed(self, gpus: list[GpuSample]) -> tuple[GpuSample, ...]:
        """The GPUs with their processes' jobs, attributed in one call for the whole round.

        One call, not one per GPU: the attribution keeps its per-process cache for the pids of
        the call, so per-GPU calls would evict the other GPUs' processes and re-read their
        ``/proc`` files every round; and a process on several GPUs is looked up once.
        """
        flat = [process for gpu in gpus for process in gpu.processes]
        if self._attribution is None or not flat:
            return tuple(gpus)
        attributed = iter(self._attribution(flat))
        return tuple(
            replace(gpu, processes=tuple(islice(attributed, len(gpu.processes))))
            if gpu.processes
            else gpu
            for gpu in gpus
        )

    def _stats(self) -> AgentStats:
        return AgentStats(
            sample_rounds=self._rounds,
            last_sample_seconds=self._last_seconds,
            spool_bytes=self.spool.bytes_used if self.spool is not None else 0,
            spool_evicted=self.spool.evicted_records if self.spool is not None else 0,
            export_rejected=self.sender.rejected_records if self.sender is not None else 0,
        )

    def sample_once(self) -> RoundResult:
        """Take one sample round, publish it, and spool its OTLP request."""
        started = self._monotonic()
        gpus = self.source.sample()
        host = self._host() if self._host is not None else None
        events = tuple(self._events()) if self._events is not None else ()
        self._rounds += 1
        self._last_seconds = self._monotonic() - started
        snapshot = Snapshot(
            time_unix_nano=self._wall_clock_ns(),
            gpus=self._attributed(gpus),
            host=host,
            events=events,
            agent=self._stats(),
        )
        for event in events:
            if event.kind is GpuEventKind.XID:
                log.warning("XID %s on GPU %s", event.xid, event.gpu_uuid)
        self.cache.put(snapshot)
        if self._record is not None:  # ``--record``: the round as a replayable trace
            self._record(snapshot)
        payload = self.telemetry.collect_otlp()
        sequence = None
        if payload is not None and self.spool is not None:
            sequence = self.spool.append(payload)
            if self.sender is not None:
                self.sender.wake.set()
        self.last_round_monotonic = self._monotonic()
        return RoundResult(snapshot, len(payload or b""), sequence)

    def start_sender(self) -> None:
        """Start the background thread that drains the spool to the collector."""
        if self.sender is None or self._sender_thread is not None:
            return
        self._sender_thread = threading.Thread(
            target=self.sender.run, args=(self._sender_stop,), name="gpuwarden-sender", daemon=True
        )
        self._sender_thread.start()

    def run(self, stop: threading.Event) -> None:
        """Sample on a fixed deadline until ``stop`` is set; one failure never ends the loop."""
        self.start_sender()
        deadline = self._monotonic()
        while not stop.is_set():
            try:
                self.sample_once()
            except Exception:  # one broad except per loop iteration, by design
                log.exception("sample round failed; the agent keeps running")
            deadline += self.interval_seconds
            now = self._monotonic()
            if deadline < now:  # we fell behind (suspend, overload): skip, don't burst
                missed = int((now - deadline) // self.interval_seconds) + 1
                deadline += missed * self.interval_seconds
                log.warning("sampling fell behind; skipped %d round(s)", missed)
            stop.wait(max(0.0, deadline - now))

    def healthy(self, now: float | None = None) -> bool:
        """True while the loop has completed a round within three intervals."""
        if self.last_round_monotonic is None:
            return False
        current = self._monotonic() if now is None else now
        return current - self.last_round_monotonic <= 3 * self.interval_seconds + 1

    def shutdown(self, flush_timeout_seconds: float = 5.0) -> bool:
        """Stop the sender after trying to flush the spool; return True if nothing is left."""
        flushed = True
        if self.sender is not None:
            self._sender_stop.set()
            self.sender.wake.set()
            if self._sender_thread is not None:
                self._sender_thread.join(timeout=flush_timeout_seconds + 1)
            flushed = self.sender.flush(flush_timeout_seconds)
            if not flushed and self.spool is not None:
                log.warning(
                    "%d unsent request(s) stay in the spool and will be sent after restart",
                    len(self.spool),
                )
        self.source.close()
        self.telemetry.shutdown()
        return flushed

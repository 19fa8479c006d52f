"""The collector's history writer: points in as the intake stores them, the TSDB out.

:class:`HistoryWriter` is the intake's tap (``ingest.intake.IngestTap``): it turns each stored
request's gauge and sum points into Prometheus series (``naming``), buffers them, and on
``flush`` (every ``flush_seconds``, and whenever ``batch_samples`` are buffered) encodes them
into requests of at most ``batch_samples`` samples that it appends to the durable
:class:`~.queue.DiskQueue`. ``tick`` flushes and lets the :class:`~.sender.RemoteWriteSender`
drain the queue; the web layer runs it as a background loop and flushes once more on shutdown,
so a restart ships what was buffered.

Each series' samples go out in strictly increasing time: a point at or before the newest one
already taken for its series (a resend, a late point) is left out and counted as
``out_of_order``, because Prometheus refuses a whole request for one such sample.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.ingest.otlp_columns import NumberColumns, number_columns
from gpuwarden.collector.ingest.otlp_limits import DEFAULT_LIMITS, IngestLimits
from gpuwarden.collector.ingest.otlp_transport import parse_request
from gpuwarden.collector.remote_write.naming import labels, metric_name
from gpuwarden.collector.remote_write.queue import DiskQueue
from gpuwarden.collector.remote_write.sender import RemoteWriteSender, SendStats
from gpuwarden.collector.remote_write.wire import Labels, Series, encode

log = logging.getLogger(__name__)

HOST_NAME = "host.name"
MAX_TRACKED_SERIES = 2_000_000
"""Series whose newest timestamp is remembered (the map is cleared beyond: a bound on memory)."""
_NS_PER_MS = 1_000_000


class HistoryWriter:
    """Tap of the intake, buffer, and owner of the queue and its sender.

    Args:
        queue: the durable queue the batches go to.
        sender: drains ``queue`` to the TSDB.
        batch_samples: samples per request at most; a full buffer is flushed at once.
        limits: the label limits the intake decodes OTLP bodies with.
        flush_seconds: how often the web layer runs ``tick``.
    """

    def __init__(
        self,
        queue: DiskQueue,
        sender: RemoteWriteSender,
        *,
        batch_samples: int = 5_000,
        limits: IngestLimits = DEFAULT_LIMITS,
        flush_seconds: float = 1.0,
    ) -> None:
        self.queue = queue
        self.flush_seconds = flush_seconds
        self.sender = sender
        self.batch_samples = batch_samples
        self.limits = limits
        self._buffer: dict[Labels, list[tuple[int, float]]] = {}
        self._buffered = 0
        self._newest: dict[Labels, int] = {}
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()

    @property
    def stats(self) -> SendStats:
        """The sender's counters, plus the queue's and this writer's drops."""
        return self.sender.stats

    # --- the intake's tap ---------------------------------------------------------------------

    def payload(self, payload: bytes, kind: str) -> None:
        """The points of an OTLP body the intake stored (decoded again here: the store's fast
        path keeps no points)."""
        self.columns(number_columns(parse_request(payload, kind), self.limits))

    def columns(self, columns: NumberColumns) -> None:
        """Take a decoded request's gauges and sums."""
        hosts = [resource.get(HOST_NAME) for resource in columns.resources]
        taken: list[tuple[Labels, int, float]] = []
        for metric in columns.metrics:
            name = metric_name(metric.name, metric.unit, counter=metric.counter)
            host = hosts[metric.resource]
            cache: dict[object, Labels] = {}
            for items, t, value in zip(metric.items, metric.times, metric.values, strict=True):
                series = cache.get(items)
                if series is None:
                    attrs = [*items] if host is None else [(HOST_NAME, host), *items]
                    series = cache[items] = labels(name, attrs)
                taken.append((series, t // _NS_PER_MS, value))
        self._take(taken)

    def points(self, points: Sequence[NumberPoint]) -> None:
        """Take decoded points (the intake's ``accept`` path: scrapes, tests)."""
        taken: list[tuple[Labels, int, float]] = []
        for p in points:
            counter = p.kind == "sum" and p.monotonic
            name = metric_name(p.metric, p.unit, counter=counter)
            host = p.resource.get(HOST_NAME)
            attrs = [*p.attributes.items()]
            if host is not None and HOST_NAME not in p.attributes:
                attrs.insert(0, (HOST_NAME, host))
            taken.append((labels(name, attrs), p.time_unix_nano // _NS_PER_MS, p.value))
        self._take(taken)

    def _take(self, taken: list[tuple[Labels, int, float]]) -> None:
        late = 0
        with self._lock:
            newest = self._newest
            if len(newest) > MAX_TRACKED_SERIES:
                newest.clear()
            for series, t_ms, value in taken:
                if t_ms <= newest.get(series, -1):
                    late += 1
                    continue
                newest[series] = t_ms
                self._buffer.setdefault(series, []).append((t_ms, value))
            self._buffered += len(taken) - late
            self.stats.drop("out_of_order", late)
            full = self._buffered >= self.batch_samples
        if full:
            self.flush()

    # --- to the queue and out -----------------------------------------------------------------

    def flush(self) -> int:
        """Append what is buffered to the queue, in requests of at most ``batch_samples``;
        return the samples queued."""
        with self._flush_lock:
            with self._lock:
                buffer, self._buffer, self._buffered = self._buffer, {}, 0
            queued = 0
            batch: list[Series] = []
            size = 0
            for series, samples in buffer.items():
                for start in range(0, len(samples), self.batch_samples):
                    chunk = samples[start : start + self.batch_samples]
                    if size + len(chunk) > self.batch_samples:
                        queued += self._append(batch, size)
                        batch, size = [], 0
                    batch.append(
                        Series(series, tuple(t for t, _ in chunk), tuple(v for _, v in chunk))
                    )
                    size += len(chunk)
            if batch:
                queued += self._append(batch, size)
            return queued

    def _append(self, batch: list[Series], samples: int) -> int:
        try:
            dropped = self.queue.append(encode(batch), samples)
        except OSError as exc:  # a full or failing disk must not fail the ingest that flushed
            self.stats.drop("disk_error", samples)
            log.error(
                "remote-write: cannot queue %d samples in %s: %s",
                samples,
                self.queue.directory,
                exc,
            )
            return 0
        if dropped:
            self.stats.drop("queue_full", dropped)
            log.error(
                "remote-write: queue over %d bytes, dropped its oldest %d samples",
                self.queue.max_bytes,
                dropped,
            )
        return samples

    def tick(self) -> int:
        """Flush the buffer and drain the queue (unless a backoff runs); return requests done."""
        self.flush()
        return self.sender.drain()

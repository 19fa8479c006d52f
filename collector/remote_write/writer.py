"""The collector's history writer: points in as the intake stores them, the TSDB out.

:class:`HistoryWriter` is the intake's tap (``ingest.intake.IngestTap``): it turns each stored
request's gauge and sum points into Prometheus series (``naming``) and encodes them into
requests of at most ``batch_samples`` samples that it appends to the durable
:class:`~.queue.DiskQueue`. The receiver's request only hands over its body: decoding, naming
and encoding happen in ``flush`` (every ``flush_seconds``, in the background loop's thread),
so remote-write does not slow the answer to an agent. ``tick`` flushes and lets the
:class:`~.sender.RemoteWriteSender` drain the queue; the web layer runs it as a background loop
and flushes once more on shutdown, so a restart ships what was held.

Each series' samples go out in strictly increasing time: a point at or before the newest one
already taken for its series (a resend, a late point) is left out and counted as
``out_of_order``, because Prometheus refuses a whole request for one such sample.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any, cast

from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.ingest.otlp_columns import NumberColumns, number_columns
from gpuwarden.collector.ingest.otlp_limits import DEFAULT_LIMITS, IngestLimits
from gpuwarden.collector.ingest.otlp_transport import OtlpError, parse_request
from gpuwarden.collector.remote_write.intake_log import IntakeLog
from gpuwarden.collector.remote_write.naming import labels, metric_name, with_cluster
from gpuwarden.collector.remote_write.queue import DiskQueue
from gpuwarden.collector.remote_write.sender import RemoteWriteSender, SendStats
from gpuwarden.collector.remote_write.wire import Labels, Series, WireError, decode, encode

log = logging.getLogger(__name__)

HOST_NAME = "host.name"
MAX_TRACKED_SERIES = 2_000_000
"""Series whose newest timestamp is remembered (the map is cleared beyond: a bound on memory)."""
MAX_PENDING_PAYLOAD_BYTES = 64 << 20
"""OTLP bodies kept for the next flush at most; beyond, the request that adds one flushes."""
_NS_PER_MS = 1_000_000


class HistoryWriter:
    """Tap of the intake, buffer, and owner of the queue and its sender.

    Args:
        queue: the durable queue the batches go to.
        sender: drains ``queue`` to the TSDB.
        batch_samples: samples per request at most; a full buffer is flushed at once.
        limits: the label limits the intake decodes OTLP bodies with.
        flush_seconds: how often the web layer runs ``tick``.
        log: where bodies wait for the flush on disk (``intake_log``); what a stopped
            collector left there is taken back now.
        cluster: the collector's cluster, the ``cluster`` label of every series it writes
            (``naming``); ``None`` writes none.
    """

    def __init__(
        self,
        queue: DiskQueue,
        sender: RemoteWriteSender,
        *,
        batch_samples: int = 5_000,
        limits: IngestLimits = DEFAULT_LIMITS,
        flush_seconds: float = 1.0,
        log: IntakeLog | None = None,
        cluster: str | None = None,
    ) -> None:
        self.queue = queue
        self.cluster = cluster
        self.intake_log = log
        self.flush_seconds = flush_seconds
        self.sender = sender
        self.batch_samples = batch_samples
        self.limits = limits
        # Series are numbered: a point costs one dict lookup of its key as sent, not a label
        # set built and hashed. Keys that name the same labels (attributes in another order)
        # share the number, so one series' samples stay in one ordered list.
        self._ids: dict[object, int] = {}
        self._id_of_labels: dict[Labels, int] = {}
        self._labels: list[Labels] = []
        self._newest: list[int] = []
        self._buffer: dict[int, list[tuple[int, float]]] = {}
        self._buffered = 0
        self._payloads: list[tuple[bytes | list[Any], str]] = []
        self._payload_bytes = 0
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        # What a stopped collector queued is not queued again: each series' newest sample in
        # the queue's files is where it goes on (a resend after a restart is left out).
        for body in queue.kept_payloads():
            try:
                decoded = decode(body)
            except WireError:
                continue
            self.seed_newest(
                {one.labels: one.timestamps_ms[-1] for one in decoded if one.timestamps_ms}
            )
        if log is not None:  # what a stopped collector took but had not queued yet
            self._payloads.extend(log.recover())
            self._payload_bytes = sum(len(body) for body, _ in self._payloads)

    def seed_newest(self, newest_ms: Mapping[Labels, int]) -> None:
        """Take these series' newest samples as written already (the TSDB or the queue holds
        them): a point at or before is left out as ``out_of_order``, so a resend after a
        restart reaches the TSDB once."""
        with self._lock:
            for series, t_ms in newest_ms.items():
                sid = self._id_of_labels.get(series)
                if sid is None:
                    sid = self._number(series, series)
                self._newest[sid] = max(self._newest[sid], t_ms)

    @property
    def stats(self) -> SendStats:
        """The sender's counters, plus the queue's and this writer's drops."""
        return self.sender.stats

    # --- the intake's tap ---------------------------------------------------------------------

    def payload(self, payload: bytes, kind: str) -> None:
        """An OTLP body the intake stored: kept as it is and decoded at the next ``flush``
        (the store's fast path keeps no points, and decoding here would slow the receiver)."""
        with self._lock:
            if self.intake_log is not None:
                self.intake_log.append(payload, kind)
            self._payloads.append((payload, kind))
            self._payload_bytes += len(payload)
            full = self._payload_bytes >= MAX_PENDING_PAYLOAD_BYTES
        if full:  # the loop is behind: this request pays for the flush (back-pressure)
            self.flush()

    def _columns(self, columns: NumberColumns) -> bool:
        """Buffer a decoded request's gauges and sums; whether the buffer is full."""
        hosts = [resource.get(HOST_NAME) for resource in columns.resources]
        late = taken = 0
        with self._lock:
            ids, newest, buffer = self._ids, self._newest, self._buffer
            for metric in columns.metrics:
                name = metric_name(metric.name, metric.unit, counter=metric.counter)
                host = hosts[metric.resource]
                for items, t, value in zip(metric.items, metric.times, metric.values, strict=True):
                    key = (name, host, items)
                    sid = ids.get(key)
                    if sid is None:
                        attrs = [*items] if host is None else [(HOST_NAME, host), *items]
                        sid = self._number(key, labels(name, attrs, cluster=self.cluster))
                    t_ms = t // _NS_PER_MS
                    if t_ms <= newest[sid]:
                        late += 1
                        continue
                    newest[sid] = t_ms
                    samples = buffer.get(sid)
                    if samples is None:
                        buffer[sid] = [(t_ms, value)]
                    else:
                        samples.append((t_ms, value))
                    taken += 1
            return self._taken(taken, late)

    def points(self, points: Sequence[NumberPoint]) -> None:
        """Decoded points the intake stored (its ``accept`` path: scrapes, tests), kept for the
        next ``flush`` in their turn with the bodies."""
        with self._lock:
            self._payloads.append((list(points), ""))
            self._payload_bytes += 64 * len(points)
            full = self._payload_bytes >= MAX_PENDING_PAYLOAD_BYTES
        if full:
            self.flush()

    def _points(self, points: Sequence[NumberPoint]) -> bool:
        """Buffer decoded points; whether the buffer is full."""
        late = taken = 0
        with self._lock:
            for p in points:
                counter = p.kind == "sum" and p.monotonic
                name = metric_name(p.metric, p.unit, counter=counter)
                host = p.resource.get(HOST_NAME)
                attrs = [*p.attributes.items()]
                if host is not None and HOST_NAME not in p.attributes:
                    attrs.insert(0, (HOST_NAME, host))
                series = labels(name, attrs, cluster=self.cluster)
                sid = self._id_of_labels.get(series)
                if sid is None:
                    sid = self._number(series, series)
                t_ms = p.time_unix_nano // _NS_PER_MS
                if t_ms <= self._newest[sid]:
                    late += 1
                    continue
                self._newest[sid] = t_ms
                self._buffer.setdefault(sid, []).append((t_ms, p.value))
                taken += 1
            return self._taken(taken, late)

    def add(self, samples: Sequence[tuple[Labels, int, float]]) -> None:
        """Take series the collector derives (``derived``): (labels, milliseconds, value)."""
        with self._lock:
            self._payloads.append((list(samples), "derived"))
            self._payload_bytes += 64 * len(samples)

    def _derived(self, samples: Sequence[tuple[Labels, int, float]]) -> None:
        late = taken = 0
        with self._lock:
            for derived, t_ms, value in samples:
                series = with_cluster(derived, self.cluster)
                sid = self._id_of_labels.get(series)
                if sid is None:
                    sid = self._number(series, series)
                if t_ms <= self._newest[sid]:
                    late += 1
                    continue
                self._newest[sid] = t_ms
                self._buffer.setdefault(sid, []).append((t_ms, value))
                taken += 1
            self._taken(taken, late)

    def _number(self, key: object, series: Labels) -> int:
        """The number of the series ``series`` (new if unseen), remembered for ``key``."""
        sid = self._id_of_labels.get(series)
        if sid is None:
            sid = len(self._labels)
            self._labels.append(series)
            self._newest.append(-1)
            self._id_of_labels[series] = sid
        self._ids[key] = sid
        return sid

    def _taken(self, taken: int, late: int) -> bool:
        """Count a request's points; whether the buffer is full."""
        self._buffered += taken
        self.stats.drop("out_of_order", late)
        return self._buffered >= self.batch_samples

    # --- to the queue and out -----------------------------------------------------------------

    def flush(self) -> int:
        """Append what is buffered to the queue, in requests of at most ``batch_samples``;
        return the samples queued."""
        with self._flush_lock:
            with self._lock:
                payloads, self._payloads, self._payload_bytes = self._payloads, [], 0
                logged = self.intake_log.rotate() if self.intake_log is not None else 0
            for payload, kind in payloads:  # in the order the store took them
                if isinstance(payload, bytes):
                    try:
                        columns = number_columns(parse_request(payload, kind), self.limits)
                    except OtlpError as exc:  # stored, so it parsed then: a damaged intake log
                        log.error("remote-write: a body does not decode (%s), left out", exc)
                        continue
                    self._columns(columns)
                elif kind == "derived":
                    self._derived(cast("list[tuple[Labels, int, float]]", payload))
                else:
                    self._points(cast("list[NumberPoint]", payload))
            with self._lock:
                taken = [(self._labels[sid], samples) for sid, samples in self._buffer.items()]
                self._buffer, self._buffered = {}, 0
                if len(self._labels) > MAX_TRACKED_SERIES:  # a bound on memory; see the docs
                    self._ids.clear()
                    self._id_of_labels.clear()
                    self._labels.clear()
                    self._newest.clear()
            queued = 0
            batch: list[Series] = []
            size = 0
            for series, samples in taken:
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
            if self.intake_log is not None:
                self.intake_log.release(logged)  # those bodies are in the queue now
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

"""OTLP intake: points into the WindowStore, per-sender series budgets, node facts, announcements.

The receiver's work behind ``CollectorService.accept``, ``accept_payload`` and
``accept_histograms``: each request's points go to the store under the label limits and the
sender's budget of new series (refilling by the hour), the resources they came with leave their
node's facts and announce the workload's job and model, and the running totals say what the
store did with them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from gpuwarden.collector.ingest.creation_pace import CreationPace
from gpuwarden.collector.ingest.otlp import HistogramPoint, NumberPoint, histogram_points
from gpuwarden.collector.ingest.otlp_hosts import claimed_hosts
from gpuwarden.collector.ingest.otlp_limits import DEFAULT_LIMITS, IngestLimits
from gpuwarden.collector.ingest.otlp_transport import PROTOBUF, OtlpError
from gpuwarden.collector.ingest.rounds_seen import AgentRounds, RoundsLedger
from gpuwarden.collector.ingest.workloads import announcement
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.storage.base import Storage
from gpuwarden.collector.storage.records import Event, EventKind, deployed_version
from gpuwarden.collector.store.types import AttrValue, IngestCounts
from gpuwarden.collector.store.window import WindowStore
from gpuwarden.collector.store.window_rows import RowBatch, RowsIngested

log = logging.getLogger(__name__)

#: Resource attributes of an agent that the collector keeps per node.
NODE_FACTS = (
    "host.id",
    "host.type",
    "cloud.region",
    "gpuwarden.cluster",
    "gpuwarden.price_tier",
    "gpuwarden.agent.version",
)


class IngestTap(Protocol):
    """Sees every request's gauge and sum points after the store took them (remote-write)."""

    def payload(self, payload: bytes, kind: str) -> None:
        """An OTLP/HTTP body the store ingested (``kind``: its media type)."""

    def points(self, points: Sequence[NumberPoint]) -> None:
        """Decoded points the store ingested."""


@dataclass
class IngestTotals:
    """Running totals of what the store did with incoming points."""

    accepted: int = 0
    rejected: int = 0
    new_series: int = 0
    counter_resets: int = 0
    last_point_unix: float = 0.0
    duplicate_rounds: int = 0
    """Agent rounds acknowledged without storing: they were stored before (``rounds_seen``)."""


@dataclass(frozen=True, slots=True)
class Accepted:
    """What became of one OTLP request: the receiver's answer and counters."""

    points: int
    """Gauge and sum points decoded (the length of ``number_points``' list)."""
    rejected: int
    """Points to report to the sender as rejected (OTLP partial success), histograms included."""
    stored_rejected: int
    """Of ``points``, those the store refused."""
    over_limits: int = 0
    """Of ``rejected``, the points over the label limits (``otlp_limits``)."""
    duplicate_rounds: int = 0
    """Agent rounds of the request that were stored before, so not stored again."""

    def __add__(self, other: Accepted) -> Accepted:
        return Accepted(
            self.points + other.points,
            self.rejected + other.rejected,
            self.stored_rejected + other.stored_rejected,
            self.over_limits + other.over_limits,
            self.duplicate_rounds + other.duplicate_rounds,
        )


@dataclass
class Intake:
    """Takes what senders push into the store (an ``ingest.sink.MetricsSink``)."""

    store: WindowStore
    storage: Storage
    registry: JobRegistry
    clock: Callable[[], float] = time.time
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)
    totals: IngestTotals = field(default_factory=IngestTotals)
    #: new series one sender (token) may create per hour: a runaway label cannot flood the store.
    #: A token bucket: it refills continuously (this many per hour), so a flood that spent it
    #: delays a node's next new series by minutes, not for the rest of the hour; series the
    #: store holds (or held: evicted ones that come back) are never refused by it.
    max_new_series_per_source_hour: int = 100_000
    #: what a point, its resource and its metric name may carry (``otlp_limits``)
    limits: IngestLimits = DEFAULT_LIMITS
    #: sees what was stored (the remote-write history writer), if any
    tap: IngestTap | None = None
    #: the pace of series creation for the whole collector (``creation_pace``): while it is
    #: behind, a node with no series yet is answered 503 (None: never paced)
    pace: CreationPace | None = None
    _budgets: dict[str, tuple[float, float]] = field(default_factory=dict)
    _source_locks: dict[str, threading.Lock] = field(default_factory=dict)
    _announced: set[tuple[tuple[str, str | int | float | bool], ...]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    #: which agent rounds were stored (``rounds_seen``): each resent round acknowledged, not stored
    rounds_ledger: RoundsLedger = field(default_factory=RoundsLedger)

    def accept(self, points: Iterable[NumberPoint], source: str, *, history: bool = True) -> int:
        """Store one request's points; remember node facts; return the rejected count.

        ``history=False`` keeps them from the tap (the remote-write history writer): points that
        came from a TSDB's own feed (the Prometheus remote-write receiver) would otherwise be
        written back to it.
        """
        points = list(points)
        seen: set[int] = set()
        resources = []
        for point in points:
            if id(point.resource) not in seen:
                seen.add(id(point.resource))
                resources.append(point.resource)
        self._remember_resources(resources, source)
        with self._source_lock(source):  # the budget read, spent and written back as one
            counts = self.store.ingest(points, new_series_budget=self._budget(source))
            newest = max((p.time_unix_nano for p in points), default=None)
            self._count(source, counts, newest)
        if self.tap is not None and history:
            self.tap.points(points)
        return counts.rejected

    def accept_rows(
        self, batch: RowBatch, resources: Iterable[Mapping[str, AttrValue]], source: str
    ) -> RowsIngested:
        """Store a batch of columns (``WindowStore.ingest_rows``) under ``source``'s budget,
        as :meth:`accept` stores points (``resources``: theirs, for the node facts). Nothing
        goes to the tap: only the remote-write receiver sends these, and not for history."""
        self._remember_resources(resources, source)
        with self._source_lock(source):
            done = self.store.ingest_rows(batch, self._budget(source))
            newest = int(batch.times_ns.max()) if batch.times_ns.size else None
            self._count(source, done.counts, newest)
        return done

    def end_series(self, points: Iterable[NumberPoint]) -> int:
        """End the presence of the series ``points`` name at their times (Prometheus' stale
        markers, ``WindowStore.end_series``); return how many were ended. Nothing goes to the
        tap: a marker is no value."""
        return self.store.end_series(points)

    def accept_payload(
        self, payload: bytes, kind: str, source: str, rounds: AgentRounds | None = None
    ) -> Accepted:
        """Decode and store one OTLP/HTTP body: the receiver's fast path.

        With ``rounds`` (an agent's ``Gpuwarden-Agent-*`` headers, protobuf only) the body is cut
        into its rounds and each round ``source``'s agent instance sent before is acknowledged
        and not stored again (:mod:`~gpuwarden.collector.ingest.rounds_seen`). Raises
        ``OtlpError``: 400 when the rounds do not add up to the body, 503 while another request
        of the same instance is being stored.

        The same series, counts, budget, node facts and announcements as ``number_points`` +
        ``accept`` + ``accept_histograms``, without a ``NumberPoint`` per point (and, for an
        agent's steady state, without parsing: ``WindowStore.ingest_payload``). Raises
        ``OtlpError`` (400) for a body that does not parse.
        """
        if rounds is not None and kind == PROTOBUF:
            return self._accept_rounds(payload, source, rounds)
        return self._accept_one(payload, kind, source)

    def _accept_rounds(self, payload: bytes, source: str, rounds: AgentRounds) -> Accepted:
        """Store each round of ``payload`` not stored before, in order; remember which were.

        A round that fails (``OtlpError``) stops the request: the rounds before it stay stored
        and remembered, so the agent's one-by-one resend finds them done.
        """
        if rounds.nbytes != len(payload):
            raise OtlpError(400, f"rounds of {rounds.nbytes} bytes in a body of {len(payload)}")
        ledger, instance = self.rounds_ledger, rounds.instance
        with ledger.claim(source, instance):
            window = start = ledger.window(self.storage, source, instance)
            total = Accepted(points=0, rejected=0, stored_rejected=0)
            offset = 0
            try:
                for one in rounds.rounds:
                    part = payload[offset : offset + one.nbytes]
                    offset += one.nbytes
                    if window.seen(one.seq):
                        total += Accepted(0, 0, 0, duplicate_rounds=1)
                        continue
                    total += self._accept_one(part, PROTOBUF, source)
                    window = window.add(one.seq)
            finally:
                if window != start:  # stored, then remembered: a crash between resends, never loses
                    ledger.save(self.storage, source, instance, window, now=self.clock())
                if total.duplicate_rounds:
                    with self._lock:
                        self.totals.duplicate_rounds += total.duplicate_rounds
        return total

    def _accept_one(self, payload: bytes, kind: str, source: str) -> Accepted:
        """Decode and store one body (or one round of it); raises ``CreationPacedError`` for a
        new node's body while series are created at the pace's limit."""
        pace = self.pace
        if pace is not None and pace.behind() and self._new_node(payload, kind):
            raise pace.refuse()
        with self._source_lock(source):  # concurrent requests of one sender: one budget
            result = self.store.ingest_payload(
                payload, kind, new_series_budget=self._budget(source), limits=self.limits
            )
            self._count(source, result.counts, result.newest_ns)
        if pace is not None:
            pace.spend(result.counts.new_series)
        if self.tap is not None:
            self.tap.payload(payload, kind)
        self._remember_resources(result.resources, source)
        if result.over_limits:
            log.warning(
                "source %s: %d point(s) over the label limits refused (%s)",
                source,
                result.over_limits,
                self.limits.describe(),
            )
        rejected = result.rejected + result.counts.rejected
        if result.histogram_request is not None:
            histograms = histogram_points(result.histogram_request, self.limits)
            # counted as rejected by the decoder; the store says which it kept
            rejected -= len(histograms) - self.accept_histograms(histograms, source)
        return Accepted(
            points=result.points,
            rejected=rejected,
            stored_rejected=result.counts.rejected,
            over_limits=result.over_limits,
        )

    def _new_node(self, payload: bytes, kind: str) -> bool:
        """Whether ``payload`` writes a node the store has no series of (a resource without a
        ``host.name`` is no node: never paced)."""
        hosts = [host for host in claimed_hosts(payload, kind) if host]
        return bool(hosts) and not self.store.knows_nodes(hosts)

    def record_events(self, events: Iterable[Event]) -> int:
        """Store events (a repeat is a no-op); return how many were new.

        A deploy or rollback that is its model's newest change names the version now serving, so
        the model's deployment record follows it: detectors that judge "the version actually
        serving" (``deploy_regression``) read the record, and an event posted by a CD pipeline
        must not leave it naming the version the deploy replaced.
        """
        recorded = 0
        for event in events:
            recorded += self.storage.record_event(event)
            if event.kind in (EventKind.DEPLOY, EventKind.ROLLBACK):
                self._follow_deploy(event)
        return recorded

    def _follow_deploy(self, event: Event) -> None:
        version, current = deployed_version(event), self.storage.model(event.subject)
        if version is None or current is None or current.version == version:
            return
        changes = self.storage.events(
            since=event.time, kinds=(EventKind.DEPLOY, EventKind.ROLLBACK), subject=event.subject
        )
        if any(change.time > event.time for change in changes):
            return  # a later deploy or rollback already says what serves
        self.storage.upsert_model(replace(current, version=version))

    def accept_histograms(self, points: Sequence[HistogramPoint], source: str) -> int:
        """Store cumulative histogram points (bucket counts); return the rejected count."""
        rejected = 0
        for point in points:
            attrs = dict(point.attributes)
            host = point.resource.get("host.name")
            if host is not None and "host.name" not in attrs:
                attrs["host.name"] = host
            try:
                counts = self.store.ingest_histogram(
                    point.metric,
                    attrs,
                    time_unix_nano=point.time_unix_nano,
                    bounds=point.bounds,
                    bucket_counts=point.bucket_counts,
                    sum_value=point.sum_value,
                    unit=point.unit,
                )
            except ValueError as exc:  # e.g. bounds changed for an existing series
                log.warning("source %s: histogram %s refused: %s", source, point.metric, exc)
                rejected += 1
                continue
            rejected += counts.rejected
        return rejected

    def _remember_resources(
        self, resources: Iterable[Mapping[str, str | int | float | bool]], source: str
    ) -> None:
        """Announce each resource's workload and keep its node's facts."""
        for resource in resources:
            self._announce(resource)
            host = resource.get("host.name")
            if isinstance(host, str) and host:
                facts = {k: str(v) for k, v in resource.items() if k in NODE_FACTS}
                with self._lock:  # merge: other senders (scrapes) must not erase agent facts
                    self.nodes[host] = {**self.nodes.get(host, {}), **facts, "source": source}

    def _source_lock(self, source: str) -> threading.Lock:
        """The lock that makes one sender's requests spend its budget one after the other."""
        with self._lock:
            return self._source_locks.setdefault(source, threading.Lock())

    def _budget(self, source: str) -> int:
        """The new series ``source`` may create now: its bucket, refilled since last asked."""
        now = self.clock()
        capacity = self.max_new_series_per_source_hour
        with self._lock:
            tokens, then = self._budgets.get(source, (float(capacity), now))
            tokens = min(float(capacity), tokens + max(0.0, now - then) * capacity / 3600)
            self._budgets[source] = (tokens, now)
            return int(tokens)

    def _count(self, source: str, counts: IngestCounts, newest_ns: int | None) -> None:
        with self._lock:
            tokens, then = self._budgets.get(source, (0.0, self.clock()))
            self._budgets[source] = (max(0.0, tokens - counts.new_series), then)
            if counts.rejected_limit:
                log.warning(
                    "source %s: %d point(s) of new series refused (series limit)",
                    source,
                    counts.rejected_limit,
                )
            self.totals.accepted += counts.accepted
            self.totals.rejected += counts.rejected
            self.totals.new_series += counts.new_series
            self.totals.counter_resets += counts.counter_resets
            if newest_ns is not None:
                self.totals.last_point_unix = max(self.totals.last_point_unix, newest_ns / 1e9)

    def _announce(self, resource: Mapping[str, str | int | float | bool]) -> None:
        """Register the job and model a workload's resource declares, once per resource."""
        items = tuple(sorted(resource.items()))
        with self._lock:
            if items in self._announced:
                return
            if len(self._announced) >= 100_000:
                self._announced.clear()  # a cache, not a record
            self._announced.add(items)
        found = announcement(resource, self.clock())
        if found is None:
            return
        if found.job is not None:
            known = self.registry.get(found.job.key)
            job = found.job
            if known is not None:  # keep what the scheduler or API said; fill in the rest
                job = replace(
                    known,
                    model=known.model or job.model,
                    team=known.team or job.team,
                    name=known.name or job.name,
                )
            self.registry.put([job])
        if found.model is not None:
            current = self.storage.model(found.model.name)
            if current is None:
                self.storage.upsert_model(found.model)
            elif current.version != found.model.version:
                self.storage.upsert_model(replace(current, version=found.model.version))
                self.storage.record_event(
                    Event(
                        time=self.clock(),
                        kind=EventKind.DEPLOY,
                        subject=found.model.name,
                        attributes={"from": current.version, "to": found.model.version},
                    )
                )

"""OpenTelemetry SDK instruments built from the catalog, reading the sample cache.

The agent samples on its own timer and puts the result in a :class:`SampleCache`. Every
observable instrument's callback reads that cache and never touches NVML: every reader runs every
callback on each collection, so sampling inside callbacks would multiply the NVML load by the
number of readers (each Prometheus scrape).

The OTLP push does not go through the SDK: :class:`Telemetry` encodes it straight from the
catalog (``agent.otlp``), with the SDK ``Resource``'s attributes, so the request is what the SDK
would send at a fraction of the CPU. The SDK's meter provider exists (and its module is imported)
only when a pull reader (Prometheus) asks for it.

This is the one module of the agent that talks to the OpenTelemetry SDK.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.resources import Resource

from gpuwarden.agent.catalog import CATALOG, Instrument, MetricDef, rows_by_name
from gpuwarden.agent.otlp import OtlpEncoder
from gpuwarden.agent.points import Prepared, SampleCache, points, prepared_points

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader

METER_NAME = "gpuwarden.agent"


class _PreparedCache:
    """Prepares each new snapshot once, however many instruments and readers read it."""

    def __init__(self, cache: SampleCache) -> None:
        self._cache = cache
        self._prepared: Prepared | None = None
        self._lock = threading.Lock()

    def get(self) -> Prepared | None:
        snapshot = self._cache.get()
        if snapshot is None:
            return None
        with self._lock:
            if self._prepared is None or self._prepared.snapshot is not snapshot:
                self._prepared = Prepared(snapshot)
            return self._prepared


def _callback(
    rows: tuple[MetricDef, ...], prepared: _PreparedCache
) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def observe(_options: CallbackOptions) -> Iterable[Observation]:
        current = prepared.get()
        if current is None:
            return []
        return [
            Observation(value, attrs)
            for row in rows
            for value, attrs in prepared_points(row, current)
        ]

    return observe


def register_instruments(meter: Meter, cache: SampleCache) -> list[str]:
    """Create one observable instrument per catalog metric name; return the names."""
    created = []
    prepared = _PreparedCache(cache)
    for name, rows in rows_by_name().items():
        first = rows[0]
        factory = {
            Instrument.GAUGE: meter.create_observable_gauge,
            Instrument.COUNTER: meter.create_observable_counter,
            Instrument.UPDOWNCOUNTER: meter.create_observable_up_down_counter,
        }[first.instrument]
        factory(
            name,
            callbacks=[_callback(rows, prepared)],
            unit=first.unit,
            description=first.description,
        )
        created.append(name)
    return created


def sdk_resource(resource_attributes: Mapping[str, str]) -> Resource:
    """The SDK's resource for these attributes (its detectors add ``telemetry.sdk.*``)."""
    return Resource.create(dict(resource_attributes))


class Telemetry:
    """The OTLP push encoder, plus an SDK meter provider for pull readers (Prometheus).

    ``collect_otlp()`` is called by the agent right after each sample round; extra readers
    collect on their own schedule from the same cache, through the SDK.
    """

    def __init__(
        self,
        cache: SampleCache,
        resource_attributes: Mapping[str, str],
        *,
        version: str,
        extra_readers: Iterable[MetricReader] = (),
    ) -> None:
        resource = sdk_resource(resource_attributes)
        self._cache = cache
        self._encoder = OtlpEncoder(resource.attributes, METER_NAME, version)
        self.instrument_names = list(rows_by_name())
        readers = list(extra_readers)
        self._provider: MeterProvider | None = None
        if readers:
            # imported here: an agent that only pushes never loads the SDK's metrics machinery
            from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider

            self._provider = MeterProvider(
                metric_readers=readers,
                resource=resource,
                # observations of a cache carry no trace context: exemplars would be pure cost
                exemplar_filter=AlwaysOffExemplarFilter(),
            )
            register_instruments(self._provider.get_meter(METER_NAME, version), cache)

    def collect_otlp(self) -> bytes | None:
        """The OTLP ``ExportMetricsServiceRequest`` of the latest snapshot (None before one)."""
        snapshot = self._cache.get()
        return None if snapshot is None else self._encoder.encode(snapshot)

    def shutdown(self) -> None:
        """Shut the SDK provider down (its readers included), if there is one."""
        if self._provider is not None:
            self._provider.shutdown()


__all__ = ["CATALOG", "SampleCache", "Telemetry", "points", "register_instruments"]

"""Which nodes an OTLP request writes: every ``host.name`` its points would be stored under.

The receiver checks them against an agent credential's bound nodes before anything is stored
(all or nothing). A point is stored under its resource's ``host.name`` unless the point sets
``host.name`` itself (the store prefers the point's), so both count; a resource without one
claims "" (no node).

An agent's request is read without a full parse: its resources' attributes are walked in the
protobuf wire format (a few fields per resource, however many points), and the bytes
``host.name`` are counted in the whole body. Any ``host.name`` key, however its tag and length
are encoded, holds those bytes, so when the count equals the resource keys found, no point sets
one. Anything else (a point's ``host.name``, those bytes inside a value, a non-string host name,
a body the walk cannot read, JSON) takes the full parse.
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from gpuwarden.collector.ingest.otlp import any_value
from gpuwarden.collector.ingest.otlp_shape import _fields
from gpuwarden.collector.ingest.otlp_transport import PROTOBUF, parse_request

HOST_NAME = "host.name"
_HOST_BYTES = HOST_NAME.encode()
_POINT_KINDS = ("gauge", "sum", "histogram", "exponential_histogram", "summary")


def claimed_hosts(payload: bytes, kind: str) -> frozenset[str]:
    """Every ``host.name`` the request writes ("" for a resource without one).

    Raises:
        OtlpError: 400 for a body that does not parse.
    """
    if kind == PROTOBUF:
        quick = _resource_hosts(payload)
        if quick is not None:
            return quick
    return _all_hosts(parse_request(payload, kind))


def _resource_hosts(payload: bytes) -> frozenset[str] | None:
    """The resources' host names from the wire format, or None when the full parse must decide."""
    hosts: set[str] = set()
    keys = 0
    try:
        for number, wire, start, end in _fields(payload, 0, len(payload)):
            if number != 1 or wire != 2:  # resource_metrics
                continue
            found = [
                host
                for n, w, s, e in _fields(payload, start, end)
                if n == 1 and w == 2  # ResourceMetrics.resource
                for host in _hosts_of_resource(payload, s, e)
            ]
            if None in found:
                return None
            keys += len(found)
            hosts.update(host for host in found if host is not None)
            if not found:
                hosts.add("")
    except (ValueError, IndexError, UnicodeDecodeError):
        return None
    if payload.count(_HOST_BYTES) != keys:
        return None
    return frozenset(hosts)


def _hosts_of_resource(payload: bytes, start: int, end: int) -> list[str | None]:
    """The ``host.name`` values of one Resource (None: not a string, the full parse decides)."""
    out: list[str | None] = []
    for number, wire, s, e in _fields(payload, start, end):
        if number != 1 or wire != 2:  # Resource.attributes
            continue
        key, value = b"", None
        for n, w, vs, ve in _fields(payload, s, e):
            if n == 1 and w == 2:  # KeyValue.key
                key = payload[vs:ve]
            elif n == 2 and w == 2:  # KeyValue.value (AnyValue)
                value = (vs, ve)
        if key != _HOST_BYTES:
            continue
        text = None
        if value is not None:
            for n, w, vs, ve in _fields(payload, *value):
                text = payload[vs:ve].decode("utf-8") if n == 1 and w == 2 else None
        out.append(text)
    return out


def _all_hosts(request: ExportMetricsServiceRequest) -> frozenset[str]:
    """Every resource's and every point's ``host.name`` from the parsed request."""
    hosts: set[str] = set()
    for rm in request.resource_metrics:
        named = _host_values(rm.resource.attributes)
        hosts.update(named or [""])
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                if kind not in _POINT_KINDS:
                    continue
                for point in getattr(metric, kind).data_points:
                    hosts.update(_host_values(point.attributes))
    return frozenset(hosts)


def _host_values(kvs: Iterable[KeyValue]) -> list[str]:
    return [str(any_value(kv.value)) for kv in kvs if kv.key == HOST_NAME]

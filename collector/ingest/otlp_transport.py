"""OTLP/HTTP transport: the media types we take, ``Content-Encoding`` (gzip with a size cap),
parsing a body (protobuf or JSON) into an ``ExportMetricsServiceRequest`` and encoding the
answer in the request's media type. Every failure is an :class:`OtlpError` carrying the HTTP
status to answer.
"""

from __future__ import annotations

import zlib

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

PROTOBUF = "application/x-protobuf"
JSON = "application/json"


class OtlpError(Exception):
    """A request we refuse, with the HTTP status that says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def media_type(content_type: str | None) -> str:
    """The bare media type of a Content-Type header, or raise 415."""
    bare = (content_type or "").split(";", 1)[0].strip().lower()
    if bare not in (PROTOBUF, JSON):
        shown = bare or "(none)"
        raise OtlpError(415, f"unsupported content type {shown!r}; use {PROTOBUF} or {JSON}")
    return bare


def decompress(body: bytes, encoding: str | None, max_bytes: int) -> bytes:
    """Undo ``Content-Encoding``; refuse anything that inflates past ``max_bytes`` (gzip bombs).

    A gzip body of several members (``cat a.gz b.gz``, as RFC 1952 allows) is read whole, every
    member, under the one cap; anything after a member that is not another whole member is a
    400, never silently dropped.
    """
    enc = (encoding or "identity").strip().lower()
    if enc == "identity":
        return body
    if enc != "gzip":
        raise OtlpError(415, f"unsupported content encoding {enc!r}; use gzip or identity")
    members: list[bytes] = []
    size = 0
    rest = body
    while True:
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        try:
            out = inflater.decompress(rest, max_bytes + 1 - size)  # >= 1: 0 means no limit
        except zlib.error as exc:
            raise OtlpError(400, f"invalid gzip body: {exc}") from None
        size += len(out)
        if size > max_bytes or inflater.unconsumed_tail:
            raise OtlpError(413, f"decompressed body exceeds {max_bytes} bytes")
        if not inflater.eof:
            raise OtlpError(400, "truncated gzip body")
        members.append(out)
        rest = inflater.unused_data
        if not rest:
            return members[0] if len(members) == 1 else b"".join(members)


def parse_request(payload: bytes, kind: str) -> ExportMetricsServiceRequest:
    """Parse an ``ExportMetricsServiceRequest`` in the given media type, or raise 400."""
    request = ExportMetricsServiceRequest()
    try:
        if kind == PROTOBUF:
            request.ParseFromString(payload)
        else:
            json_format.Parse(payload.decode("utf-8"), request, ignore_unknown_fields=True)
    except (DecodeError, json_format.ParseError, UnicodeDecodeError, RecursionError) as exc:
        raise OtlpError(400, f"malformed OTLP {kind} body: {exc}") from None
    return request


def encode_response(response: ExportMetricsServiceResponse, kind: str) -> bytes:
    """Serialise the response in the same media type as the request."""
    if kind == PROTOBUF:
        return response.SerializeToString()
    return json_format.MessageToJson(response).encode("utf-8")

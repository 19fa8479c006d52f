"""Model metrics scraped from model servers' Prometheus endpoints (vLLM, Triton).

``ModelServerScraper.scrape_once()`` fetches each target's text exposition and maps the families in
``MODEL_METRICS`` to ``gpuwarden.model.*`` points (``docs/model-metrics.md`` is the table; a test
keeps the two in step); other families are counted, not ingested. A Prometheus histogram
(cumulative over ``le``) becomes a :class:`HistogramPoint` with per-bucket counts, cumulative over
time as OTLP sends them; counters become monotonic sums, gauges gauges; all carry the scrape time.

Attributes: ``model`` (vLLM ``model_name``, Triton ``model``, else the target's ``model``),
``model.version`` (Triton ``version``), ``service.instance.id`` (the URL's host:port), ``host.name``
(the target's node), the row's own (``outcome``/``reason``, ``direction``, ``state``), the target's
``labels``, and any other label of the sample (vLLM ``engine``) so that series never collapse.
``host.name`` rides on the point, not the resource: the service keeps node facts per resource
``host.name`` and a scrape must not overwrite what the node's agent reported.

The scraper does not ingest: ``ScrapeResult.accept_into(service)`` hands the points to any
:class:`MetricSink` (``CollectorService`` is one), so scraping is testable without a store and the
caller names the source. ``scrape_once`` blocks (the collector's pooled HTTP client, targets in
turn, each bounded by ``timeout_seconds``): run it in a worker thread.
"""

from __future__ import annotations

import functools
import http.client
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, Protocol
from urllib.parse import urljoin, urlsplit

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.collector.clients.http import HttpClient
from gpuwarden.collector.ingest.otlp import HistogramPoint, NumberPoint

log = logging.getLogger(__name__)

Server = Literal["vllm", "triton", "tgi", "prometheus"]
SERVERS: tuple[Server, ...] = ("vllm", "triton", "tgi", "prometheus")
MAX_RESPONSE_BYTES = 8 * 1024 * 1024
ACCEPT = "text/plain; version=0.0.4"  # servers answer OpenMetrics only when asked for it
MAX_REDIRECTS = 10
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
Attrs = dict[str, str | int | float | bool]

#: Attribute names the scraper sets.
MODEL, MODEL_VERSION = "model", "model.version"
INSTANCE, HOST = "service.instance.id", "host.name"
OUTCOME, REASON = "outcome", "reason"


@dataclass(frozen=True, slots=True)
class ModelMetric:
    """One source family and what it becomes (a row of ``docs/model-metrics.md``)."""

    server: Literal["vllm", "triton", "tgi"]
    source: str
    """Family name as the text parser reports it: counters without ``_total``."""
    source_type: Literal["counter", "gauge", "histogram"]
    name: str
    unit: str
    divisor: float = 1.0
    """Source units per our unit (µs → s: 1e6): values, bounds and sums are divided by it."""
    attributes: tuple[tuple[str, str], ...] = ()
    reason_label: str | None = None
    """Source label copied to ``reason``; ``outcomes`` maps it to ``outcome`` (else ``outcome``)."""
    outcome: str | None = None
    outcomes: tuple[tuple[str, str], ...] = ()
    superseded_by: str | None = None
    """A newer family measuring the same thing: when it is on the page, this one is skipped."""


NS = "gpuwarden.model."
_VLLM_REASONS = (("abort", "cancelled"), ("error", "failure"))

# fmt: off
MODEL_METRICS: tuple[ModelMetric, ...] = (
    # server, source family (as parsed), source type, our name, unit, then the row's extras
    ModelMetric("vllm", "vllm:e2e_request_latency_seconds", "histogram",
                NS + "request.latency", "s"),
    ModelMetric("vllm", "vllm:time_to_first_token_seconds", "histogram",
                NS + "time_to_first_token", "s"),
    ModelMetric("vllm", "vllm:inter_token_latency_seconds", "histogram",
                NS + "time_per_output_token", "s"),
    ModelMetric("vllm", "vllm:time_per_output_token_seconds", "histogram",
                NS + "time_per_output_token", "s",
                superseded_by="vllm:inter_token_latency_seconds"),
    ModelMetric("vllm", "vllm:request_queue_time_seconds", "histogram", NS + "queue.duration", "s"),
    ModelMetric("vllm", "vllm:request_success", "counter", NS + "requests", "{request}",
                reason_label="finished_reason", outcome="success", outcomes=_VLLM_REASONS),
    ModelMetric("vllm", "vllm:prompt_tokens", "counter", NS + "tokens", "{token}",
                attributes=(("direction", "prompt"),)),
    ModelMetric("vllm", "vllm:generation_tokens", "counter", NS + "tokens", "{token}",
                attributes=(("direction", "generation"),)),
    ModelMetric("vllm", "vllm:num_requests_waiting", "gauge", NS + "queue.size", "{request}",
                attributes=(("state", "waiting"),)),
    ModelMetric("vllm", "vllm:num_requests_running", "gauge", NS + "queue.size", "{request}",
                attributes=(("state", "running"),)),
    ModelMetric("vllm", "vllm:kv_cache_usage_perc", "gauge", NS + "kv_cache.utilization", "1"),
    ModelMetric("vllm", "vllm:gpu_cache_usage_perc", "gauge", NS + "kv_cache.utilization", "1",
                superseded_by="vllm:kv_cache_usage_perc"),
    ModelMetric("vllm", "vllm:num_preemptions", "counter", NS + "preemptions", "{preemption}"),
    ModelMetric("triton", "nv_inference_request_success", "counter", NS + "requests", "{request}",
                outcome="success"),
    ModelMetric("triton", "nv_inference_request_failure", "counter", NS + "requests", "{request}",
                reason_label="reason", outcome="failure", outcomes=(("CANCELED", "cancelled"),)),
    ModelMetric("triton", "nv_inference_count", "counter", NS + "inferences", "{inference}"),
    ModelMetric("triton", "nv_inference_exec_count", "counter", NS + "executions", "{execution}"),
    ModelMetric("triton", "nv_inference_pending_request_count", "gauge", NS + "queue.size",
                "{request}", attributes=(("state", "waiting"),)),
    ModelMetric("triton", "nv_inference_request_duration_us", "counter", NS + "request.time", "s",
                divisor=1e6),
    ModelMetric("triton", "nv_inference_queue_duration_us", "counter", NS + "queue.time", "s",
                divisor=1e6),
    ModelMetric("triton", "nv_inference_compute_infer_duration_us", "counter", NS + "compute.time",
                "s", divisor=1e6),
    ModelMetric("triton", "nv_inference_first_response_histogram_ms", "histogram",
                NS + "time_to_first_token", "s", divisor=1e3),
    # TGI (metrics-exporter-prometheus: counters without ``_total``; its latency "histograms"
    # are summaries unless buckets are configured, so they are not mapped)
    ModelMetric("tgi", "tgi_request_success", "counter", NS + "requests", "{request}",
                outcome="success"),
    ModelMetric("tgi", "tgi_request_failure", "counter", NS + "requests", "{request}",
                reason_label="err", outcome="failure"),
    ModelMetric("tgi", "tgi_queue_size", "gauge", NS + "queue.size", "{request}",
                attributes=(("state", "waiting"),)),
    ModelMetric("tgi", "tgi_batch_current_size", "gauge", NS + "queue.size", "{request}",
                attributes=(("state", "running"),)),
)
# fmt: on

#: Source labels renamed on the way in; other labels keep their names.
LABEL_RENAMES: Mapping[str, Mapping[str, str]] = {
    "vllm": {"model_name": MODEL},
    "triton": {"model": MODEL, "version": MODEL_VERSION, "gpu_uuid": "hw.id"},
    "tgi": {},
}
#: The rows each server type reads, by source family; a plain Prometheus endpoint gets them all.
TABLES: Mapping[Server, Mapping[str, ModelMetric]] = {
    s: {m.source: m for m in MODEL_METRICS if s in (m.server, "prometheus")} for s in SERVERS
}


@dataclass(frozen=True, slots=True)
class ScrapeTarget:
    """One model server's metrics endpoint: an ``http``/``https`` URL without credentials."""

    url: str
    model: str | None = None
    server: Server = "prometheus"
    node: str | None = None
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"scrape target {self.url!r}: only http:// or https:// URLs")
        if parts.username is not None or parts.password is not None:
            raise ValueError(f"scrape target {parts.hostname}: no credentials in the URL")
        try:
            _ = parts.port  # a port that is not a number in range raises ValueError
        except ValueError as exc:
            raise ValueError(f"scrape target {self.url!r}: {exc}") from None
        if self.server not in SERVERS:
            raise ValueError(f"scrape target {self.url!r}: server must be one of {SERVERS}")
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))

    @property
    def instance(self) -> str:
        """``host:port`` of the URL (the scheme's default port when it has none)."""
        parts = urlsplit(self.url)
        host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True, slots=True)
class TargetResult:
    """What one target's scrape gave."""

    url: str
    ok: bool
    error: str | None = None
    points: int = 0
    mapped_families: int = 0
    unmapped_families: int = 0
    invalid_histograms: int = 0


class MetricSink(Protocol):
    """Where scraped points go (``CollectorService`` is one)."""

    def accept(self, points: Iterable[NumberPoint], source: str) -> int:
        """Store gauge and sum points; return how many were rejected."""
        ...

    def accept_histograms(self, points: Sequence[HistogramPoint], source: str) -> int:
        """Store cumulative histogram points; return how many were rejected."""
        ...


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    """One scrape of every target: each target's outcome and the points of those that answered."""

    targets: tuple[TargetResult, ...]
    points: tuple[NumberPoint, ...]
    histograms: tuple[HistogramPoint, ...]

    @property
    def failed(self) -> tuple[TargetResult, ...]:
        """The targets that gave no page."""
        return tuple(t for t in self.targets if not t.ok)

    def accept_into(self, sink: MetricSink, source: str = "scrape") -> int:
        """Store the points under ``source`` (the series budget's sender); the rejected count."""
        rejected = sink.accept(self.points, source) if self.points else 0
        return rejected + (
            sink.accept_histograms(self.histograms, source) if self.histograms else 0
        )


class ScrapeError(Exception):
    """A target that answered with something we refuse (an HTTP error, an oversized page)."""


def fetch_metrics(
    url: str,
    timeout_seconds: float,
    max_bytes: int = MAX_RESPONSE_BYTES,
    *,
    http: HttpClient | None = None,
) -> bytes:
    """GET one metrics page: HTTP(S) only (redirects too), no proxy, at most ``max_bytes``.

    The client follows no redirect itself; this follows up to ``MAX_REDIRECTS`` of them, each to
    an HTTP(S) URL only.
    """
    client = http or HttpClient()
    headers = {"Accept": ACCEPT, "User-Agent": "gpuwarden"}
    if urlsplit(url).scheme not in ("http", "https"):
        raise ScrapeError(f"not an HTTP URL: {url}")
    for _ in range(MAX_REDIRECTS + 1):
        answer = client.request(
            "GET", url, headers=headers, timeout_seconds=timeout_seconds, max_body_bytes=max_bytes
        )
        if answer.status == 0:
            raise ScrapeError(answer.detail)
        location = answer.header("Location")
        if answer.status in _REDIRECTS and location:
            url = urljoin(url, location)
            if urlsplit(url).scheme not in ("http", "https"):
                raise ScrapeError(f"redirect to a non-HTTP URL refused: {url}")
            continue
        if not answer.ok:
            raise ScrapeError(f"HTTP {answer.status} {answer.detail}")
        length = answer.header("Content-Length") or ""
        if length.isdigit() and int(length) > max_bytes:
            raise ScrapeError(f"response of {length} bytes exceeds {max_bytes} bytes")
        if answer.truncated:
            raise ScrapeError(f"response exceeds {max_bytes} bytes")
        return answer.body
    raise ScrapeError(f"more than {MAX_REDIRECTS} redirects")


class ModelServerScraper:
    """Scrapes model servers' metrics pages into ``gpuwarden.model.*`` points.

    Args:
        targets: the endpoints.
        fetch: ``(url, timeout_seconds) -> body``; default :func:`fetch_metrics` through ``http``.
        clock: Unix seconds, for the points' timestamps.
        timeout_seconds: each target's connect and read timeout.
        max_response_bytes: larger pages are refused (an injected ``fetch``'s too).
        http: the shared HTTP client (default: one of its own).
    """

    def __init__(
        self,
        targets: Sequence[ScrapeTarget],
        *,
        fetch: Callable[[str, float], bytes] | None = None,
        clock: Callable[[], float] = time.time,
        timeout_seconds: float = 5.0,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        http: HttpClient | None = None,
    ) -> None:
        self.targets = tuple(targets)
        self._fetch = fetch or functools.partial(
            fetch_metrics, max_bytes=max_response_bytes, http=http or HttpClient()
        )
        self._clock = clock
        self._timeout_seconds = timeout_seconds
        self._max_bytes = max_response_bytes
        self._failing: set[str] = set()  # targets in a failure streak, each logged once

    def scrape_once(self) -> ScrapeResult:
        """Scrape every target; a failing one is recorded and the others are still scraped."""
        results: list[TargetResult] = []
        numbers: list[NumberPoint] = []
        histograms: list[HistogramPoint] = []
        for target in self.targets:
            try:
                body = self._fetch(target.url, self._timeout_seconds)
                if len(body) > self._max_bytes:
                    raise ScrapeError(f"response exceeds {self._max_bytes} bytes")
                now_ns = int(self._clock() * 1e9)
                nums, hists, result = convert(target, body.decode("utf-8"), now_ns)
            except (ScrapeError, OSError, http.client.HTTPException, ValueError) as exc:
                results.append(self._failed(target, exc, unexpected=False))
                continue
            except Exception as exc:  # noqa: BLE001 (a bug on one page must not stop the rest)
                results.append(self._failed(target, exc, unexpected=True))
                continue
            if target.url in self._failing:
                self._failing.discard(target.url)
                log.info("scrape target %s recovered", target.url)
            numbers.extend(nums)
            histograms.extend(hists)
            results.append(result)
        return ScrapeResult(tuple(results), tuple(numbers), tuple(histograms))

    def _failed(self, target: ScrapeTarget, exc: Exception, *, unexpected: bool) -> TargetResult:
        error = str(exc) or type(exc).__name__
        if target.url not in self._failing:  # once per failure streak; a bug with its traceback
            self._failing.add(target.url)
            trace = exc if unexpected else None
            log.warning("scrape target %s failed: %s", target.url, error, exc_info=trace)
        return TargetResult(url=target.url, ok=False, error=error)


def convert(
    target: ScrapeTarget, text: str, time_unix_nano: int
) -> tuple[list[NumberPoint], list[HistogramPoint], TargetResult]:
    """Map one exposition's known families to points; ValueError for a malformed page."""
    families = list(text_string_to_metric_families(text))
    present = {f.name for f in families}
    resource: Attrs = {INSTANCE: target.instance}
    numbers: list[NumberPoint] = []
    histograms: list[HistogramPoint] = []
    mapped = invalid = 0
    for family in families:
        spec = TABLES[target.server].get(family.name)
        if spec is None or spec.source_type != family.type or spec.superseded_by in present:
            continue
        mapped += 1
        if spec.source_type == "histogram":
            for labels, hist in _histograms(family, spec.divisor):
                if hist is None:
                    invalid += 1
                    continue
                attrs = _attributes(target, spec, labels)
                histograms.append(
                    HistogramPoint(resource, spec.name, spec.unit, attrs, time_unix_nano, *hist)
                )
            continue
        counter = spec.source_type == "counter"
        kind = "sum" if counter else "gauge"
        for sample in family.samples:
            if sample.name == family.name + ("_total" if counter else ""):
                attrs = _attributes(target, spec, sample.labels)
                value = sample.value / spec.divisor
                numbers.append(
                    NumberPoint(resource, spec.name, spec.unit, kind, counter, attrs,
                                time_unix_nano, value)
                )  # fmt: skip
    result = TargetResult(
        url=target.url,
        ok=True,
        points=len(numbers) + len(histograms),
        mapped_families=mapped,
        unmapped_families=len(families) - mapped,
        invalid_histograms=invalid,
    )
    return numbers, histograms, result


def _attributes(target: ScrapeTarget, spec: ModelMetric, labels: Mapping[str, str]) -> Attrs:
    attrs: Attrs = dict(target.labels)
    if target.model:
        attrs[MODEL] = target.model
    renames = LABEL_RENAMES[spec.server]
    for key, value in labels.items():
        if key not in ("le", spec.reason_label):
            attrs[renames.get(key, key)] = value
    outcome = spec.outcome
    reason = labels.get(spec.reason_label) if spec.reason_label is not None else None
    if reason is not None:
        attrs[REASON] = reason
        outcome = dict(spec.outcomes).get(reason, outcome)
    if outcome is not None:
        attrs[OUTCOME] = outcome
    attrs.update(spec.attributes)
    attrs[INSTANCE] = target.instance
    if target.node:
        attrs[HOST] = target.node
    return attrs


_Histogram = tuple[tuple[float, ...], tuple[int, ...], float]
_Key = tuple[tuple[str, str], ...]


def _histograms(family: Metric, divisor: float) -> list[tuple[dict[str, str], _Histogram | None]]:
    """Each label set's (bounds, per-bucket counts, sum); None for a malformed one.

    Prometheus buckets are cumulative over ``le``: bucket ``i`` holds ``count(le=b_i) -
    count(le=b_{i-1})`` and the last, OTLP's overflow bucket, ``count(+Inf)`` minus the last
    finite count (``_count`` stands in for a missing ``+Inf`` bucket).
    """
    labels_of: dict[_Key, dict[str, str]] = {}
    buckets: dict[_Key, list[tuple[float, float]]] = {}
    other: dict[tuple[_Key, str], float] = {}  # (key, "_sum" | "_count") -> value
    for sample in family.samples:
        labels = {k: v for k, v in sample.labels.items() if k != "le"}
        key = tuple(sorted(labels.items()))
        labels_of.setdefault(key, labels)
        suffix = sample.name[len(family.name) :]
        if suffix == "_bucket":
            le = sample.labels.get("le", "")
            try:
                bound = float(le)
            except ValueError:
                bound = math.nan
            buckets.setdefault(key, []).append((bound, sample.value))
        else:
            other[key, suffix] = sample.value
    out: list[tuple[dict[str, str], _Histogram | None]] = []
    for key, labels in labels_of.items():
        pairs = buckets.get(key, [])
        finite = sorted((b, c) for b, c in pairs if math.isfinite(b))
        inf = [c for b, c in pairs if b == math.inf]
        total = inf[0] if len(inf) == 1 else other.get((key, "_count"))
        cumulative = [c for _, c in finite] + [total if total is not None else math.nan]
        bounds = [b / divisor for b, _ in finite]
        if (
            not finite
            or len(finite) + len(inf) != len(pairs)  # a NaN or unparsable le
            or not all(math.isfinite(c) and c >= 0 for c in cumulative)
            or any(nxt <= prev for prev, nxt in itertools.pairwise(bounds))
            or any(nxt < prev for prev, nxt in itertools.pairwise(cumulative))
        ):
            out.append((labels, None))
            continue
        counts = [round(cumulative[0])] + [round(b - a) for a, b in itertools.pairwise(cumulative)]
        total_sum = other.get((key, "_sum"), 0.0) / divisor
        out.append((labels, (tuple(bounds), tuple(counts), total_sum)))
    return out

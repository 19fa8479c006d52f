"""Reading back what the collector wrote: raw samples from a Prometheus-compatible TSDB.

Two APIs, both returning each series' raw samples with their exact timestamps (a warm start
and the writer's "newest sample" must see what was written, not values interpolated on a grid):

- VictoriaMetrics ``/api/v1/export`` (JSON lines, one series per line);
- Prometheus ``/api/v1/query`` of a range selector (``{__name__=~"…"}[<page>]`` at the page's
  end), which returns raw samples; ``query_range`` would return values resampled on its step.

Reads are paged by time (``page_seconds`` per request) and bounded: at most ``max_samples``
samples in all and ``max_page_bytes`` per answer; past either, :class:`ReadError` says so,
and the caller starts with what it has. Every failure is a :class:`ReadError` with the URL's
answer, never a network exception.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import msgspec
import numpy as np
import numpy.typing as npt

from gpuwarden.collector.clients.http import HttpClient
from gpuwarden.collector.remote_write.naming import CLUSTER_LABEL
from gpuwarden.collector.remote_write.wire import Labels

ReadApi = Literal["victoriametrics", "prometheus"]
MAX_PAGE_BYTES = 256 << 20
MAX_RANGE_POINTS = 10_000
"""Steps per ``query_range`` request (Prometheus refuses more than 11,000)."""


class ReadError(Exception):
    """The TSDB could not be read (unreachable, an error answer, an answer over a bound)."""


@dataclass(frozen=True, slots=True, eq=False)
class RawSeries:
    """One series' raw samples in one page: labels (sorted), milliseconds and values in order."""

    labels: Labels
    timestamps_ms: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]


class TsdbReader(Protocol):
    """What the collector wrote, read back from the TSDB."""

    def pages(
        self, names: Sequence[str], start_ms: int, end_ms: int, *, newest_first: bool = False
    ) -> Iterator[list[RawSeries]]:
        """Raw samples of the named metrics over ``[start_ms, end_ms]``, page by page, oldest
        first (or newest first)."""
        ...

    def means(
        self, name: str, counter: bool, start_ms: int, end_ms: int, step_seconds: int
    ) -> Iterator[list[RawSeries]]:
        """One metric's per-``step_seconds`` means (a counter's per-second rate) over
        ``[start_ms, end_ms)``, each stamped with its step's start, page by page."""
        ...


@dataclass(frozen=True, slots=True)
class _Paging:
    page_seconds: float
    max_samples: int
    max_page_bytes: int

    def windows(
        self, start_ms: int, end_ms: int, *, newest_first: bool = False
    ) -> Iterator[tuple[int, int]]:
        """``[lo, hi]`` millisecond windows covering ``[start_ms, end_ms]``, oldest first (or
        newest first)."""
        step = max(1, int(self.page_seconds * 1000))
        if newest_first:
            hi = end_ms
            while hi >= start_ms:
                lo = max(start_ms, hi - step + 1)
                yield lo, hi
                hi = lo - 1
            return
        lo = start_ms
        while lo <= end_ms:
            hi = min(end_ms, lo + step - 1)
            yield lo, hi
            lo = hi + 1


def name_regex(names: Sequence[str], cluster: str | None = None) -> str:
    """A selector matching exactly these metric names (regex metacharacters escaped) and, with
    ``cluster``, only that cluster's series (one TSDB may hold several clusters')."""
    escaped = sorted(n.replace("\\", "\\\\").replace(".", "\\.") for n in names)
    matchers = ["__name__=~" + json.dumps("|".join(escaped))]
    if cluster is not None:
        matchers.append(f"{CLUSTER_LABEL}={json.dumps(cluster)}")
    return "{" + ",".join(matchers) + "}"


class _HttpReader:
    def __init__(
        self,
        http: HttpClient,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_seconds: float = 30.0,
        page_seconds: float = 3600.0,
        max_samples: int = 50_000_000,
        max_page_bytes: int = MAX_PAGE_BYTES,
        cluster: str | None = None,
    ) -> None:
        self._http = http
        self.cluster = cluster
        """Only this cluster's series are read (``None``: every series of the names)."""
        self.url = url.rstrip("/")
        self._headers = dict(headers or {})
        self._timeout = timeout_seconds
        self._paging = _Paging(page_seconds, max_samples, max_page_bytes)

    def _get(self, path: str, params: Mapping[str, str]) -> bytes:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        result = self._http.request(
            "GET",
            url,
            headers=self._headers,
            timeout_seconds=self._timeout,
            max_body_bytes=self._paging.max_page_bytes,
        )
        if result.status == 0:
            raise ReadError(f"{self.url}{path}: no answer ({result.detail})")
        if not result.ok:
            text = result.body[:200].decode("utf-8", "replace")
            raise ReadError(f"{self.url}{path}: HTTP {result.status} {text}")
        if result.truncated:
            raise ReadError(
                f"{self.url}{path}: an answer over {self._paging.max_page_bytes} bytes "
                "(lower page_seconds)"
            )
        return result.body

    def pages(
        self, names: Sequence[str], start_ms: int, end_ms: int, *, newest_first: bool = False
    ) -> Iterator[list[RawSeries]]:
        """Each page's series, oldest page first (or newest first); raises :class:`ReadError`
        past the bounds."""
        if not names:
            return
        taken = 0
        selector = name_regex(names, self.cluster)
        for lo, hi in self._paging.windows(start_ms, end_ms, newest_first=newest_first):
            page = self._page(selector, lo, hi)
            taken += sum(s.timestamps_ms.size for s in page)
            if taken > self._paging.max_samples:
                raise ReadError(f"more than {self._paging.max_samples} samples (max_samples)")
            yield page

    def _page(self, selector: str, lo: int, hi: int) -> list[RawSeries]:
        raise NotImplementedError

    def means(
        self, name: str, counter: bool, start_ms: int, end_ms: int, step_seconds: int
    ) -> Iterator[list[RawSeries]]:
        """``/api/v1/query_range`` of ``avg_over_time`` (a counter: ``rate``) over each step,
        which both VictoriaMetrics and Prometheus answer; at most ``MAX_RANGE_POINTS`` steps
        per request. Evaluated at multiples of the step (VictoriaMetrics aligns them so anyway)
        with ``offset 1ms``, the value at ``t`` covers ``[t - step, t)``, as the store's slot
        that starts at ``t - step``, where it is stamped."""
        step_ms = step_seconds * 1000
        function = "rate" if counter else "avg_over_time"
        query = f"{function}({name_regex([name])}[{step_seconds}s] offset 1ms)"
        taken = 0
        first = start_ms // step_ms
        last = (end_ms - 1) // step_ms
        while first <= last:
            upto = min(last, first + MAX_RANGE_POINTS - 1)
            body = self._get(
                "/api/v1/query_range",
                {
                    "query": query,
                    "start": str((first + 1) * step_seconds),
                    "end": str((upto + 1) * step_seconds),
                    "step": f"{step_seconds}s",
                },
            )
            page = self._matrix(body, name, step_ms)
            taken += sum(s.timestamps_ms.size for s in page)
            if taken > self._paging.max_samples:
                raise ReadError(f"more than {self._paging.max_samples} samples (max_samples)")
            yield page
            first = upto + 1

    def _matrix(self, body: bytes, name: str, step_ms: int) -> list[RawSeries]:
        try:
            answer = json.loads(body)
            if answer.get("status") != "success":
                raise ReadError(f"{self.url}/api/v1/query_range: {answer.get('error', answer)}")
            out = []
            for item in answer["data"]["result"]:
                metric = {str(k): str(v) for k, v in item["metric"].items()}
                metric["__name__"] = name  # functions drop the name
                points = [(round(float(t) * 1000) - step_ms, float(v)) for t, v in item["values"]]
                if points:
                    out.append(_series(tuple(sorted(metric.items())), points))
        except (ValueError, KeyError, TypeError) as exc:
            raise ReadError(
                f"{self.url}/api/v1/query_range: the answer does not parse: {exc}"
            ) from None
        return out


class _ExportLine(msgspec.Struct):
    """One line of ``/api/v1/export`` (msgspec: several times faster than ``json`` here)."""

    metric: dict[str, str]
    values: list[float]
    timestamps: list[int]


_EXPORT_LINE = msgspec.json.Decoder(_ExportLine)


class VictoriaMetricsReader(_HttpReader):
    """VictoriaMetrics' ``/api/v1/export``: JSON lines ``{"metric", "values", "timestamps"}``."""

    def _page(self, selector: str, lo: int, hi: int) -> list[RawSeries]:
        body = self._get(
            "/api/v1/export",
            {"match[]": selector, "start": str(lo / 1000), "end": str(hi / 1000)},
        )
        parts: dict[Labels, list[tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]]] = {}
        for line in body.splitlines():
            if not line.strip():
                continue
            try:
                row = _EXPORT_LINE.decode(line)
            except msgspec.DecodeError as exc:
                raise ReadError(f"{self.url}/api/v1/export: a line does not parse: {exc}") from None
            if len(row.timestamps) != len(row.values):
                raise ReadError(f"{self.url}/api/v1/export: timestamps and values differ")
            labels = tuple(sorted(row.metric.items()))
            times = np.asarray(row.timestamps, dtype=np.int64)
            values = np.asarray(row.values, dtype=np.float64)
            inside = (times >= lo) & (times <= hi)
            parts.setdefault(labels, []).append((times[inside], values[inside]))
        out = []
        for labels, chunks in parts.items():
            times = np.concatenate([t for t, _ in chunks])
            if not times.size:
                continue
            values = np.concatenate([v for _, v in chunks])
            order = np.argsort(times, kind="stable")
            out.append(RawSeries(labels, times[order], values[order]))
        return out


class PrometheusReader(_HttpReader):
    """Prometheus' ``/api/v1/query`` of a range selector: the raw samples in ``(lo, hi]``."""

    def _page(self, selector: str, lo: int, hi: int) -> list[RawSeries]:
        # A range selector covers (time - range, time]: with range hi - lo + 1, that is [lo, hi].
        span_ms = hi - lo + 1
        body = self._get(
            "/api/v1/query", {"query": f"{selector}[{span_ms}ms]", "time": str(hi / 1000)}
        )
        try:
            answer = json.loads(body)
            if answer.get("status") != "success":
                raise ReadError(f"{self.url}/api/v1/query: {answer.get('error', answer)}")
            out = []
            for item in answer["data"]["result"]:
                labels = tuple(sorted((str(k), str(v)) for k, v in item["metric"].items()))
                points = [(round(float(t) * 1000), float(v)) for t, v in item["values"]]
                if points:
                    out.append(_series(labels, points))
        except (ValueError, KeyError, TypeError) as exc:
            raise ReadError(f"{self.url}/api/v1/query: the answer does not parse: {exc}") from None
        return out


def _series(labels: Labels, points: list[tuple[int, float]]) -> RawSeries:
    points.sort()
    return RawSeries(
        labels,
        np.fromiter((t for t, _ in points), dtype=np.int64, count=len(points)),
        np.fromiter((v for _, v in points), dtype=np.float64, count=len(points)),
    )


def reader_for(
    api: ReadApi,
    http: HttpClient,
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    timeout_seconds: float = 30.0,
    page_seconds: float = 3600.0,
    max_samples: int = 50_000_000,
    cluster: str | None = None,
) -> TsdbReader:
    """The reader of ``api`` at ``url`` (the TSDB's base URL, without ``/api/v1/...``), of
    ``cluster``'s series only when given."""
    cls = VictoriaMetricsReader if api == "victoriametrics" else PrometheusReader
    return cls(
        http,
        url,
        headers=headers,
        timeout_seconds=timeout_seconds,
        page_seconds=page_seconds,
        max_samples=max_samples,
        cluster=cluster,
    )

"""A window of a team's own Prometheus as a backtest dataset (``backtest --prometheus URL``).

The dcgm-exporter series the mapping table knows (:mod:`gpuwarden.collector.ingest.prom_map`)
are read with PromQL ``query_range`` over ``[start, end]`` at ``step_seconds``, paged by time so
that no query asks for more than ``points_per_query`` points per series (Prometheus refuses more
than 11,000), and each step's samples go through :func:`prom_map.translate` — the code the
remote-write receiver runs — into the same replay as our CSV (:mod:`.replay`). Pods and Slurm
jobs come from the series' labels as per-process points, so no job list is needed.

Memory is bounded by one page (every series' points of one query), never the whole window.
Any server speaking the Prometheus HTTP API works (Prometheus, VictoriaMetrics, Mimir, Thanos).
"""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from gpuwarden.collector.backtest.data import DataError, Dataset, Reading
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.ingest.prom_catalog import BY_SOURCE, HOST_LABELS, UUID_LABELS
from gpuwarden.collector.ingest.prom_map import translate

MAX_POINTS_PER_SERIES = 11_000
"""Prometheus' limit on the points of one series in one ``query_range`` answer."""
DEFAULT_POINTS_PER_QUERY = 10_000
DEFAULT_TIMEOUT_SECONDS = 60.0


def selector() -> str:
    """The PromQL selector of every dcgm-exporter series the mapping table knows."""
    names = "|".join(sorted(BY_SOURCE))
    return f'{{__name__=~"{names}"}}'


@dataclass(frozen=True, slots=True)
class PromQuery:
    """Where and what to read: a Prometheus HTTP API, a time window, a step."""

    url: str
    start_seconds: float
    end_seconds: float
    step_seconds: int
    bearer_token_file: Path | None = None
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    points_per_query: int = DEFAULT_POINTS_PER_QUERY

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise DataError(f"--prometheus: {self.url!r} is not an http(s) URL")
        if not self.end_seconds > self.start_seconds:
            raise DataError("--end must be after --start")
        if self.step_seconds <= 0:
            raise DataError(f"--step: must be positive, got {self.step_seconds}")
        if not 0 < self.points_per_query <= MAX_POINTS_PER_SERIES:
            raise DataError(
                f"points per query must be in 1..{MAX_POINTS_PER_SERIES}, "
                f"got {self.points_per_query}"
            )

    def pages(self) -> Iterator[tuple[float, float]]:
        """``[start, end]`` in inclusive pages of at most ``points_per_query`` steps each."""
        step = self.step_seconds
        first = math.ceil(self.start_seconds / step) * step
        span = (self.points_per_query - 1) * step
        t = float(first)
        while t <= self.end_seconds:
            stop = min(t + span, self.end_seconds)
            yield t, stop
            t = stop + step


_RELATIVE = re.compile(r"^now(?:-(\d+)([smhdw]))?$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(text: str, *, now: float, option: str) -> float:
    """Unix seconds, RFC 3339 (``2026-05-01T00:00:00Z``), or ``now`` / ``now-7d``."""
    relative = _RELATIVE.match(text)
    if relative:
        count, unit = relative.groups()
        return now - (int(count) * _UNIT_SECONDS[unit] if count else 0)
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise DataError(
            f"{option}: {text!r} is neither Unix seconds, RFC 3339 nor now-<N><s|m|h|d|w>"
        ) from None
    if parsed.tzinfo is None:
        raise DataError(f"{option}: {text!r} has no time zone (add Z or +00:00)")
    return parsed.timestamp()


@dataclass(frozen=True, slots=True)
class _Series:
    """One series at one time, shaped as :class:`prom_map.Series` wants it."""

    labels: tuple[tuple[str, str], ...]
    timestamps_ms: tuple[int, ...]
    values: tuple[float, ...]

    @property
    def name(self) -> str:
        return dict(self.labels).get("__name__", "")


Fetch = Callable[[str, Mapping[str, str], float], bytes]
"""``(url, headers, timeout) -> body``; raises ``urllib.error`` errors (a seam for tests)."""


def _urlopen(url: str, headers: Mapping[str, str], timeout: float) -> bytes:
    request = urllib.request.Request(url, headers=dict(headers))  # noqa: S310 (http(s) checked)
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
        body: bytes = response.read()
    return body


class PromClient:
    """The Prometheus HTTP API calls a backtest makes, errors turned into :class:`DataError`."""

    def __init__(self, query: PromQuery, fetch: Fetch = _urlopen) -> None:
        self.query = query
        self._fetch = fetch
        self._headers = {"Accept": "application/json"}
        if query.bearer_token_file is not None:
            try:
                token = query.bearer_token_file.read_text().strip()
            except OSError as exc:
                raise DataError(f"--bearer-token-file: {exc}") from None
            if not token:
                raise DataError(f"--bearer-token-file: {query.bearer_token_file} is empty")
            self._headers["Authorization"] = f"Bearer {token}"

    def get(self, path: str, params: Sequence[tuple[str, str]]) -> object:
        """``GET <url>/api/v1/<path>`` and its ``data``."""
        base = self.query.url.rstrip("/")
        url = f"{base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            body = self._fetch(url, self._headers, self.query.timeout_seconds)
        except urllib.error.HTTPError as exc:
            detail = _error_text(exc.read())
            raise DataError(
                f"{base}: {path} answered HTTP {exc.code}"
                + (" (check --bearer-token-file)" if exc.code in (401, 403) else "")
                + (f": {detail}" if detail else "")
            ) from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise DataError(f"{base}: cannot reach the Prometheus API: {reason}") from None
        try:
            answer = json.loads(body)
        except ValueError:
            raise DataError(f"{base}: {path} did not answer JSON (is this a Prometheus?)") from None
        if not isinstance(answer, dict) or answer.get("status") != "success":
            raise DataError(f"{base}: {path} failed: {_error_text(body)}")
        return answer.get("data")

    def series_labels(self) -> list[dict[str, str]]:
        """The label sets of the mapped series present in the window."""
        q = self.query
        data = self.get(
            "series",
            [("match[]", selector()), ("start", f"{q.start_seconds:.3f}"),
             ("end", f"{q.end_seconds:.3f}")],
        )  # fmt: skip
        return [dict(s) for s in data] if isinstance(data, list) else []

    def page(self, start: float, end: float) -> list[dict[str, object]]:
        """One ``query_range`` page: the matrix's series (``metric``, ``values``)."""
        data = self.get(
            "query_range",
            [("query", selector()), ("start", f"{start:.3f}"), ("end", f"{end:.3f}"),
             ("step", f"{self.query.step_seconds}s")],
        )  # fmt: skip
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            raise DataError(f"{self.query.url}: query_range did not answer a matrix")
        result = data.get("result")
        return list(result) if isinstance(result, list) else []


def _error_text(body: bytes) -> str:
    try:
        answer = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace").strip()
    if isinstance(answer, dict):
        return str(answer.get("error") or answer.get("errorType") or "")[:200]
    return ""


def _gpu_of(labels: Mapping[str, str]) -> tuple[str, str] | None:
    host = next((labels[k] for k in HOST_LABELS if labels.get(k)), None)
    uuid = next((labels[k] for k in UUID_LABELS if labels.get(k)), None)
    return None if host is None or uuid is None else (host, uuid)


def _by_time(page: Sequence[Mapping[str, object]]) -> dict[int, list[_Series]]:
    """A page's samples regrouped by time: what one scrape of every target would remote-write."""
    out: dict[int, list[_Series]] = {}
    for entry in page:
        metric, values = entry.get("metric"), entry.get("values")
        if not isinstance(metric, dict) or not isinstance(values, list):
            continue
        labels = tuple(sorted((str(k), str(v)) for k, v in metric.items()))
        for t, v in values:
            ms = round(float(t) * 1000)
            out.setdefault(ms, []).append(_Series(labels, (ms,), (float(v),)))
    return out


def load_prometheus(query: PromQuery, *, fetch: Fetch = _urlopen) -> Dataset:
    """The window as a :class:`Dataset` whose batches are translated points.

    Raises:
        DataError: unreachable server, an error status, or no mapped series in the window.

    """
    client = PromClient(query, fetch)
    found = client.series_labels()
    gpus = {gpu for labels in found if (gpu := _gpu_of(labels)) is not None}
    if not gpus:
        raise DataError(
            f"{query.url}: no dcgm-exporter series (DCGM_FI_*, with Hostname and UUID labels) "
            f"between {query.start_seconds:.0f} and {query.end_seconds:.0f}"
        )

    def batches() -> Iterator[tuple[float, list[NumberPoint]]]:
        for start, end in query.pages():
            for ms, series in sorted(_by_time(client.page(start, end)).items()):
                yield ms / 1000, translate(series).points

    def no_readings() -> Iterator[Reading]:
        return iter(())

    return Dataset(
        path=query.url,
        kind="prometheus",
        jobs=(),
        gpus=len(gpus),
        start_seconds=query.start_seconds,
        end_seconds=query.end_seconds + query.step_seconds,  # the last sample holds one step
        cadence_seconds=float(query.step_seconds),
        offset_seconds=0.0,
        readings=no_readings,
        batches=batches,
    )

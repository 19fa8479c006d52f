"""Model metrics read out of the store as additive per-bin parts, and statistics over windows.

Every statistic a model rule compares is a function of sums over a window: a quantile or the
mean of a histogram (bucket counts, sum of observations), a rate (a counter's increase), an
error ratio (failed over all requests), the mean of a gauge (sum and number of samples). So each
subject (one model's metric) is read once as a ``bins × parts`` array of those sums per bin, and
any window statistic follows from cumulative sums, vectorised over time. A bin without data is
NaN in every part: missing data stays missing, it never reads as 0.

Series of one model are merged (histograms with the same bounds, counters by outcome), so the
subject is the model, not the replica.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.store.types import Kind, SeriesInfo, label_text
from gpuwarden.collector.store.window import WindowStore

FloatArray = npt.NDArray[np.float64]

QUANTILES: Mapping[str, float] = {"p50": 0.50, "p95": 0.95, "p99": 0.99}
STATISTICS = ("mean", "p50", "p95", "p99", "rate", "error_ratio")
FAILED_OUTCOMES = frozenset({"failure"})
"""``outcome`` values of ``gpuwarden.model.requests`` that count as errors."""
MODEL_ATTRIBUTES = ("model", "service.name", "service.instance.id", "host.name")
"""Where a series' model name is read from, first present wins."""
UNNAMED = "<unnamed>"


@dataclass(frozen=True, slots=True, eq=False)
class Binned:
    """One subject's additive parts per bin; NaN rows are bins without data.

    ``kind`` decides the columns of ``parts``: histogram → bucket counts then the sum of
    observations; counter → increase then failed increase; gauge → sum of samples then their
    number. ``times`` are bin starts (Unix s), each bin ``bin_seconds`` long.
    """

    model: str
    metric: str
    kind: Kind
    times: FloatArray
    parts: FloatArray
    bin_seconds: float
    bounds: tuple[float, ...] = ()
    series: int = 1


def model_of(info: SeriesInfo) -> str:
    """The model a series belongs to (see ``MODEL_ATTRIBUTES``)."""
    attrs = dict(info.key[1])
    for name in MODEL_ATTRIBUTES:
        if name in attrs:
            return label_text(attrs[name])
    return UNNAMED


def histogram_series(
    store: WindowStore, metric: str, selector: Mapping[str, str] | None = None
) -> list[tuple[SeriesInfo, tuple[float, ...]]]:
    """The histogram series of ``metric`` matching ``selector``, with their bucket bounds.

    The store has no public listing of its histogram series yet, so this reads its table under
    its lock (``WindowStore.histogram_series`` is the proposed replacement).
    """
    with store._lock:  # private until the store exposes its histogram series
        held = list(store._histograms.items())
    out = [
        (series.info, series.bounds)
        for key, series in held
        if key[0] == metric and series.info.matches(selector)
    ]
    return sorted(out, key=lambda item: item[0].key)


def bin_edges(start: float, end: float, bin_seconds: float) -> FloatArray:
    """Starts of the bins ``[k·bin, (k+1)·bin)`` that lie wholly inside ``[start, end)``."""
    first = math.ceil(start / bin_seconds)
    stop = math.floor(end / bin_seconds)
    return np.arange(first, max(first, stop), dtype=np.float64) * bin_seconds


def read_histograms(
    store: WindowStore,
    metric: str,
    *,
    selector: Mapping[str, str] | None,
    start: float,
    end: float,
    bin_seconds: float,
) -> list[Binned]:
    """One ``Binned`` per (model, bounds) of ``metric``'s histograms over ``[start, end)``."""
    times = bin_edges(start, end, bin_seconds)
    groups: dict[tuple[str, tuple[float, ...]], list[SeriesInfo]] = {}
    for info, bounds in histogram_series(store, metric, selector):
        groups.setdefault((model_of(info), bounds), []).append(info)
    out = []
    for (model, bounds), infos in groups.items():
        parts = np.full((times.size, len(bounds) + 2), np.nan)
        for info in infos:
            if not times.size:
                break
            rows = store.bucket_bins(info.key, float(times[0]), bin_seconds, times.size)
            parts = np.where(np.isnan(parts), rows, np.where(np.isnan(rows), parts, parts + rows))
        out.append(
            Binned(model, metric, Kind.HISTOGRAM, times, parts, bin_seconds, bounds, len(infos))
        )
    return out


def read_numbers(
    store: WindowStore,
    metric: str,
    *,
    selector: Mapping[str, str] | None,
    start: float,
    end: float,
    bin_seconds: float,
) -> list[Binned]:
    """One ``Binned`` per model of ``metric``'s counters (or gauges) over ``[start, end)``.

    Counters give (increase, failed increase) per bin, gauges (sum, count). A model whose series
    are of both kinds keeps the counters.
    """
    times = bin_edges(start, end, bin_seconds)
    if times.size == 0:
        return []
    lo, hi = float(times[0]), float(times[-1] + bin_seconds)
    counters = store.increase_matrix(metric, selector=selector, start=lo, end=hi)
    gauges = store.matrix(metric, selector=selector, start=lo, end=hi)
    out: dict[str, Binned] = {}
    if counters.series:
        inc = _rebin(counters.values, counters.times, times, bin_seconds)
        by_model: dict[str, list[int]] = {}
        for i, info in enumerate(counters.series):
            by_model.setdefault(model_of(info), []).append(i)
        for model, rows in by_model.items():
            failed = [r for r in rows if _outcome(counters.series[r]) in FAILED_OUTCOMES]
            parts = np.column_stack([_sum_rows(inc, rows), _sum_rows(inc, failed, like=rows)])
            out[model] = Binned(
                model, metric, Kind.COUNTER, times, parts, bin_seconds, (), len(rows)
            )
    gauge_rows: dict[str, list[int]] = {}
    for i, info in enumerate(gauges.series):
        if info.kind is Kind.GAUGE and model_of(info) not in out:
            gauge_rows.setdefault(model_of(info), []).append(i)
    if gauge_rows:
        total = _rebin(gauges.values, gauges.times, times, bin_seconds)
        known = (~np.isnan(gauges.values)).astype(np.float64)
        known[known == 0] = np.nan
        count = _rebin(known, gauges.times, times, bin_seconds)
        for model, rows in gauge_rows.items():
            parts = np.column_stack([_sum_rows(total, rows), _sum_rows(count, rows)])
            out[model] = Binned(model, metric, Kind.GAUGE, times, parts, bin_seconds, (), len(rows))
    return list(out.values())


def read_model_metric(
    store: WindowStore,
    metric: str,
    *,
    selector: Mapping[str, str] | None,
    start: float,
    end: float,
    bin_seconds: float,
) -> list[Binned]:
    """Histograms of ``metric`` when it has any, else its counters or gauges."""
    found = read_histograms(
        store, metric, selector=selector, start=start, end=end, bin_seconds=bin_seconds
    )
    if found:
        return found
    return read_numbers(
        store, metric, selector=selector, start=start, end=end, bin_seconds=bin_seconds
    )


def supports(kind: Kind, statistic: str) -> bool:
    """Whether ``statistic`` can be computed from a series of this kind."""
    if kind is Kind.HISTOGRAM:
        return statistic == "mean" or statistic in QUANTILES
    if kind is Kind.COUNTER:
        return statistic in ("rate", "error_ratio")
    return statistic == "mean"


def window_sums(parts: FloatArray, window_bins: int) -> tuple[FloatArray, FloatArray]:
    """Sums of ``parts`` over the ``window_bins`` bins ending at each bin, and bins with data.

    Row ``i`` covers bins ``i - window_bins + 1 .. i``; rows before a full window are NaN.
    """
    known = ~np.isnan(parts).all(axis=1)
    filled = np.where(np.isnan(parts), 0.0, parts)
    csum = np.vstack([np.zeros((1, parts.shape[1])), np.cumsum(filled, axis=0)])
    ccount = np.concatenate([[0.0], np.cumsum(known.astype(np.float64))])
    n = parts.shape[0]
    sums = np.full(parts.shape, np.nan)
    counts = np.zeros(n)
    if window_bins <= n:
        sums[window_bins - 1 :] = csum[window_bins:] - csum[: n - window_bins + 1]
        counts[window_bins - 1 :] = ccount[window_bins:] - ccount[: n - window_bins + 1]
    return sums, counts


def statistic_of(
    binned: Binned, sums: FloatArray, statistic: str, window_seconds: float
) -> FloatArray:
    """``statistic`` of each row of window sums (see ``Binned`` for the columns); NaN if none."""
    with np.errstate(invalid="ignore", divide="ignore"):
        if binned.kind is Kind.HISTOGRAM:
            counts, total = sums[:, :-1], sums[:, -1]
            n = counts.sum(axis=1)
            if statistic == "mean":
                return np.where(n > 0, total / n, np.nan)
            return quantiles(QUANTILES[statistic], binned.bounds, counts)
        if binned.kind is Kind.COUNTER:
            if statistic == "rate":
                return sums[:, 0] / window_seconds
            return np.where(sums[:, 0] > 0, sums[:, 1] / sums[:, 0], np.nan)
        return np.where(sums[:, 1] > 0, sums[:, 0] / sums[:, 1], np.nan)


def quantiles(q: float, bounds: Sequence[float], counts: FloatArray) -> FloatArray:
    """Row-wise ``histogram_quantile`` (Prometheus' interpolation) of ``rows × buckets`` counts."""
    rows = counts.shape[0]
    out = np.full(rows, np.nan)
    if not bounds or rows == 0:
        return out
    upper = np.asarray(bounds, dtype=np.float64)
    lower = np.concatenate([[0.0 if upper[0] > 0 else upper[0]], upper[:-1]])
    total = counts.sum(axis=1)
    cumulative = np.cumsum(counts, axis=1)
    rank = q * total
    # first finite bucket whose cumulative count reaches the rank (len(bounds): the +Inf one)
    b = np.sum(cumulative[:, :-1] < rank[:, np.newaxis], axis=1)
    ok = total > 0
    inf = ok & (b == len(bounds))
    out[inf] = upper[-1]
    fin = ok & ~inf
    idx = np.flatnonzero(fin)
    bb = b[idx]
    below = np.where(bb > 0, cumulative[idx, np.maximum(bb - 1, 0)], 0.0)
    in_bucket = counts[idx, bb]
    start = lower[bb]
    width = upper[bb] - start
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(in_bucket > 0, (rank[idx] - below) / in_bucket, 0.0)
    value = start + width * frac
    value = np.where((bb == 0) & (upper[0] <= 0), upper[0], value)
    out[idx] = value
    return out


def _outcome(info: SeriesInfo) -> str | None:
    value = dict(info.key[1]).get("outcome")
    return None if value is None else label_text(value)


def _sum_rows(values: FloatArray, rows: list[int], like: list[int] | None = None) -> FloatArray:
    """Sum of ``rows`` per column; NaN where none of ``like`` (default ``rows``) has data."""
    ref = values[like if like is not None else rows]
    missing = np.isnan(ref).all(axis=0)
    total = np.nansum(values[rows], axis=0) if rows else np.zeros(values.shape[1])
    return np.where(missing, np.nan, total)


def _rebin(
    values: npt.NDArray[np.floating],
    times: FloatArray,
    bins: FloatArray,
    bin_seconds: float,
) -> FloatArray:
    """Sum store slots into bins (rows kept); a bin with no known slot is NaN."""
    src = np.asarray(values, dtype=np.float64)
    out = np.full((src.shape[0], bins.size), np.nan)
    if bins.size == 0 or times.size == 0:
        return out
    index = np.floor((times - bins[0]) / bin_seconds).astype(np.int64)
    inside = (index >= 0) & (index < bins.size)
    for b in np.unique(index[inside]).tolist():
        cols = src[:, index == b]
        known = ~np.isnan(cols).all(axis=1)
        out[known, b] = np.nansum(cols[known], axis=1)
    return out

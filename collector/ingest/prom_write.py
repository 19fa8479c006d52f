"""Prometheus remote-write requests under per-request limits, before their series are translated.

A decoded ``WriteRequest`` (``remote_write.wire.decode``: series of labels, timestamps and values)
is screened here, with no web framework and no wire format in it:

- a request of more series, or more samples, than ``max_points_per_request`` is refused whole
  (:class:`RequestTooLargeError`, 413) before anything is translated; so is one with a series
  that is no Prometheus series (no ``__name__``, an empty label name or one with a control
  character, a label given twice: :class:`MalformedRequestError`, 400), which is what another
  protobuf message parsed as a ``WriteRequest`` looks like;
- a series over the label limits (more than ``max_attributes`` labels, a label name over
  ``max_label_key_bytes`` or a value over ``max_label_value_bytes``, a name over
  ``max_metric_name_bytes``) is rejected with its samples, and counted;
- a Prometheus *stale marker* (the NaN whose bits are :data:`STALE_NAN_BITS`: Prometheus writes
  one when a target or a series disappears) is not a value: it is taken out and kept apart, so
  the caller ends the series' presence (``WindowStore.end_series``) instead of storing a number;
- any other NaN or an infinity is rejected per sample and counted; the series' other samples
  stay.

Out-of-order samples pass through: the store puts a late sample in its slot (the last write wins)
and drops one older than its window, as it does for OTLP.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, Self, TypeVar

from gpuwarden.collector.ingest.otlp_limits import IngestLimits

STALE_NAN_BITS = 0x7FF0000000000002
"""Prometheus' stale marker: a NaN with this bit pattern (``value.StaleNaN``)."""
_STALE_BYTES = struct.pack("<Q", STALE_NAN_BITS)
_pack_double = struct.Struct("<d").pack


def is_stale_marker(value: float) -> bool:
    """Whether ``value`` is Prometheus' stale marker (not just any NaN)."""
    return value != value and _pack_double(value) == _STALE_BYTES  # noqa: PLR0124 (NaN test)


class RemoteSeries(Protocol):
    """What a decoded series offers (``remote_write.wire.Series``): a named tuple."""

    @property
    def labels(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def timestamps_ms(self) -> tuple[int, ...]: ...
    @property
    def values(self) -> tuple[float, ...]: ...
    def _replace(self, *, timestamps_ms: tuple[int, ...], values: tuple[float, ...]) -> Self: ...


S = TypeVar("S", bound=RemoteSeries)


class RequestTooLargeError(ValueError):
    """A request over a whole-request limit: refused whole (413), nothing stored."""


class MalformedRequestError(ValueError):
    """A request with a series that is no Prometheus series: refused whole (400)."""


@dataclass(frozen=True, slots=True)
class Screened(Generic[S]):
    """One request after the limits: what may be translated and what became of the rest.

    ``series`` keep only finite samples (a series left without any is dropped); ``stale`` are
    the series whose stale markers ended them, each with the markers' timestamps (values 0.0).
    """

    series: list[S] = field(default_factory=list)
    stale: list[S] = field(default_factory=list)
    samples: int = 0
    """Samples in ``series``."""
    nonfinite: int = 0
    """NaN (other than stale markers) and infinite samples, rejected."""
    over_limits: int = 0
    """Samples of series over the label limits, rejected."""
    stale_markers: int = 0

    @property
    def rejected(self) -> int:
        """Samples rejected by the screen."""
        return self.nonfinite + self.over_limits


def _too_long(text: str, limit: int) -> bool:
    if len(text) > limit:
        return True
    return not text.isascii() and len(text.encode("utf-8", "surrogatepass")) > limit


def labels_ok(labels: Sequence[tuple[str, str]], limits: IngestLimits) -> bool:
    """Whether a series' labels are within ``limits`` (``__name__`` counts as a label and is
    held to ``max_metric_name_bytes``)."""
    if len(labels) > limits.max_attributes:
        return False
    key_limit, value_limit = limits.max_label_key_bytes, limits.max_label_value_bytes
    for name, value in labels:
        if _too_long(name, key_limit):
            return False
        limit = limits.max_metric_name_bytes if name == "__name__" else value_limit
        if _too_long(value, limit):
            return False
    return True


def malformed(labels: Sequence[tuple[str, str]]) -> str | None:
    """Why a series' labels are not a Prometheus series' (None: they are): no metric name, an
    empty label name or one with a control character, a name given twice. Such a series
    comes from a broken sender or another message parsed as a ``WriteRequest``."""
    named = False
    names = set()
    for name, value in labels:
        if not name or not name.isprintable():
            return f"label name {name!r} is empty or holds a control character"
        if name in names:
            return f"label {name!r} given twice"
        names.add(name)
        if name == "__name__":
            named = bool(value)
    return None if named else "a series without a metric name (__name__)"


OK = ""
OVER = "over"


class LabelVerdicts:
    """What the label checks said of each label set seen (bounded; cleared when full).

    A remote-write sender sends the same series every scrape: checking each label set once
    instead of every time is most of what screening costs.
    """

    def __init__(self, limits: IngestLimits, max_entries: int = 1_000_000) -> None:
        self.limits = limits
        self.max_entries = max_entries
        self._known: dict[tuple[tuple[str, str], ...], str] = {}

    def __call__(self, labels: tuple[tuple[str, str], ...]) -> str:
        """:data:`OK`, :data:`OVER` (over the label limits) or why the series is malformed."""
        verdict = self._known.get(labels)
        if verdict is None:
            why = malformed(labels)
            verdict = why if why is not None else OK if labels_ok(labels, self.limits) else OVER
            if len(self._known) >= self.max_entries:
                self._known.clear()
            self._known[labels] = verdict
        return verdict


def screen(
    series: Sequence[S], limits: IngestLimits, verdicts: LabelVerdicts | None = None
) -> Screened[S]:
    """Apply the per-request and per-series limits (module docstring).

    Raises :class:`RequestTooLargeError` for a request over ``max_points_per_request`` series
    or samples.
    """
    cap = limits.max_points_per_request
    if len(series) > cap:
        raise RequestTooLargeError(f"request holds more than {cap} series")
    total = sum(len(one.values) for one in series)
    if total > cap:
        raise RequestTooLargeError(f"request holds more than {cap} samples")
    kept: list[S] = []
    stale: list[S] = []
    samples = nonfinite = over = markers = 0
    isfinite = math.isfinite
    check = verdicts if verdicts is not None else LabelVerdicts(limits)
    for one in series:
        values = one.values
        verdict = check(one.labels)
        if verdict == OVER:
            over += len(values)
            continue
        if verdict:
            raise MalformedRequestError(verdict)
        if isfinite(sum(values)):  # the common case: every sample finite (one C loop)
            if values:
                kept.append(one)
                samples += len(values)
            continue
        finite, ended, bad = _split(one)
        nonfinite += bad
        if finite is not None:
            kept.append(finite)
            samples += len(finite.values)
        if ended is not None:
            stale.append(ended)
            markers += len(ended.values)
    return Screened(kept, stale, samples, nonfinite, over, markers)


def _split(one: S) -> tuple[S | None, S | None, int]:
    """A series with a non-finite sample: (its finite samples, its stale markers, how many
    other non-finite samples); None for a part without samples."""
    finite_t: list[int] = []
    finite_v: list[float] = []
    stale_t: list[int] = []
    bad = 0
    for t, v in zip(one.timestamps_ms, one.values, strict=True):
        if math.isfinite(v):
            finite_t.append(t)
            finite_v.append(v)
        elif is_stale_marker(v):
            stale_t.append(t)
        else:
            bad += 1
    finite = _with(one, finite_t, finite_v) if finite_t else None
    ended = _with(one, stale_t, [0.0] * len(stale_t)) if stale_t else None
    return finite, ended, bad


def _with(one: S, times: list[int], values: list[float]) -> S:
    """``one`` with other samples (a named tuple, as ``remote_write.wire.Series`` is)."""
    return one._replace(timestamps_ms=tuple(times), values=tuple(values))

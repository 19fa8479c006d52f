"""Server-rendered SVG charts for the status page: no JavaScript, no build step.

A chart has a time axis in UTC dates, a value axis with its unit, a legend naming every line and
threshold, and draws each threshold against the axis of its own unit: a threshold in the plotted
series' unit shares the left axis; one in another unit (a p-value beside a latency in seconds)
gets a right-hand axis of its own instead of being drawn on a scale it does not belong to.

Every number and label is formatted here and escaped (``html.escape``) before it is placed in
the markup, so a chart is safe to embed in a page whatever the series names contain.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

WIDTH = 560
LEFT, RIGHT, RIGHT_AXIS, TOP = 56, 12, 60, 18
PLOT_BOTTOM = 150
"""The plot spans ``TOP..PLOT_BOTTOM``; the date ticks sit below it, the legend below them."""
LEGEND_TOP, LEGEND_LINE = PLOT_BOTTOM + 34, 15
THRESHOLD_COLOR = "#cf222e"


@dataclass(frozen=True, slots=True)
class Axis:
    """A value axis: the unit shown beside it and the factor from stored values to shown ones
    (ratios are stored 0..1 and shown in % with ``scale=100``)."""

    unit: str = ""
    scale: float = 1.0


RATIO_PERCENT = Axis("%", 100.0)
"""A ratio (0..1) shown in per cent."""


@dataclass(frozen=True, slots=True)
class Series:
    """One line: ``(unix_seconds, value)`` points; NaN values break the line (a gap)."""

    label: str
    points: Sequence[tuple[float, float]]
    color: str = "#2f6fb0"


@dataclass(frozen=True, slots=True)
class Threshold:
    """A horizontal line at ``value`` (stored units of ``axis``), named ``label`` in the legend."""

    value: float
    label: str
    axis: Axis


def _number(value: float) -> str:
    magnitude = abs(value)
    if magnitude >= 1e9:
        return f"{value / 1e9:.1f}G"
    if magnitude >= 1e6:
        return f"{value / 1e6:.1f}M"
    if magnitude >= 1e3:
        return f"{value / 1e3:.1f}k"
    if magnitude >= 10 or value == 0:
        return f"{value:.0f}"
    return f"{value:.2g}"


def shown(value: float, axis: Axis) -> str:
    """``value`` (stored units) as the axis shows it, with its unit: ``12 %``, ``0.35 s``."""
    text = _number(value * axis.scale)
    return f"{text} {axis.unit}" if axis.unit else text


def date(unix_seconds: float) -> str:
    """A time as the charts show it: a UTC date and minute."""
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(unix_seconds))


@dataclass(frozen=True, slots=True)
class _Scale:
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float], low: float | None, high: float | None) -> _Scale:
        bottom = min(values) if low is None else low
        top = max(values) if high is None else high
        if top - bottom < 1e-12:
            top = bottom + (abs(bottom) or 1.0)
        return cls(bottom, top)

    def y(self, value: float) -> float:
        plot_h = PLOT_BOTTOM - TOP
        return TOP + (1 - (value - self.low) / (self.high - self.low)) * plot_h


def _empty(label: str) -> str:
    return (
        f'<svg class="chart" role="img" aria-label="{label}" width="{WIDTH}" height="40" '
        f'xmlns="http://www.w3.org/2000/svg"><text x="4" y="24" class="empty">'
        f"{label}: no data in this window</text></svg>"
    )


def _value_ticks(scale: _Scale, axis: Axis, x: float, anchor: str) -> list[str]:
    parts = []
    for fraction in (0.0, 0.5, 1.0):
        value = scale.low + fraction * (scale.high - scale.low)
        parts.append(
            f'<text x="{x:.1f}" y="{scale.y(value) + 4:.1f}" text-anchor="{anchor}" '
            f'class="tick">{html.escape(_number(value * axis.scale))}</text>'
        )
    if axis.unit:
        parts.append(
            f'<text x="{x:.1f}" y="{TOP - 6}" text-anchor="{anchor}" class="unit">'
            f"{html.escape(axis.unit)}</text>"
        )
    return parts


def _line(series: Series, fx: Callable[[float], float], fy: Callable[[float], float]) -> list[str]:
    segments: list[list[str]] = [[]]
    for t, v in series.points:
        if math.isfinite(v) and math.isfinite(t):
            segments[-1].append(f"{fx(t):.1f},{fy(v):.1f}")
        elif segments[-1]:
            segments.append([])
    color, label = html.escape(series.color), html.escape(series.label)
    parts = []
    for segment in segments:
        if len(segment) == 1:
            cx, cy = segment[0].split(",")
            parts.append(
                f'<circle cx="{cx}" cy="{cy}" r="2" fill="{color}"><title>{label}</title></circle>'
            )
        elif segment:
            parts.append(
                f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                f'points="{" ".join(segment)}"><title>{label}</title></polyline>'
            )
    return parts


def _legend(entries: Sequence[tuple[str, str, bool]]) -> tuple[list[str], float]:
    """Swatch and text per entry (label, colour, dashed), wrapped over lines; and the height
    the chart needs to show them all."""
    parts = ['<g class="legend">']
    x, row = float(LEFT), 0
    for label, color, dashed in entries:
        width = 26 + 6.2 * len(label)
        if x + width > WIDTH - RIGHT and x > LEFT:
            x, row = float(LEFT), row + 1
        y = LEGEND_TOP + row * LEGEND_LINE
        dash = ' stroke-dasharray="4 3"' if dashed else ""
        parts.append(
            f'<line x1="{x:.1f}" x2="{x + 16:.1f}" y1="{y - 4}" y2="{y - 4}" '
            f'stroke="{html.escape(color)}" stroke-width="2"{dash}/>'
            f'<text x="{x + 20:.1f}" y="{y}" class="tick">{html.escape(label)}</text>'
        )
        x += width
    parts.append("</g>")
    return parts, LEGEND_TOP + row * LEGEND_LINE + 6


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    axis: Axis = Axis(),
    thresholds: Sequence[Threshold] = (),
    y_min: float | None = None,
    y_max: float | None = None,
) -> str:
    """A line chart of ``series`` (values in ``axis``'s stored units) as an ``<svg>`` element.

    Thresholds in ``axis``'s unit share the left axis; those in one other unit get a right
    axis; a threshold in a third unit is named in the legend but not drawn. Without any finite
    point the chart says so instead of drawing empty axes.
    """
    finite = [(t, v) for s in series for t, v in s.points if math.isfinite(t) and math.isfinite(v)]
    label = html.escape(title)
    if not finite:
        return _empty(label)
    usable = [th for th in thresholds if math.isfinite(th.value)]
    left_marks = [th for th in usable if th.axis == axis]
    other_axes = [th.axis for th in usable if th.axis != axis]
    right_axis = other_axes[0] if other_axes else None
    right_marks = [th for th in usable if right_axis is not None and th.axis == right_axis]
    unplaced = [th for th in usable if th not in left_marks and th not in right_marks]
    left = _Scale.of([v for _, v in finite] + [th.value for th in left_marks], y_min, y_max)
    right = None
    if right_marks:
        values = [th.value for th in right_marks]
        right = _Scale.of([min(0.0, *values), max(values) * 1.5], None, None)
    t0 = min(t for t, _ in finite)
    span_t = max(max(t for t, _ in finite) - t0, 1e-9)
    right_edge = WIDTH - (RIGHT_AXIS if right is not None else RIGHT)
    plot_w, plot_h = right_edge - LEFT, PLOT_BOTTOM - TOP

    def x(t: float) -> float:
        return LEFT + (t - t0) / span_t * plot_w

    parts = [
        f"<title>{label}</title>",
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" class="plot"/>',
        *_value_ticks(left, axis, LEFT - 6, "end"),
    ]
    if right is not None and right_axis is not None:
        parts += _value_ticks(right, right_axis, right_edge + 6, "start")
    for fraction, anchor, zone in ((0.0, "start", " UTC"), (0.5, "middle", ""), (1.0, "end", "")):
        t = t0 + fraction * span_t
        parts.append(
            f'<text x="{x(t):.1f}" y="{PLOT_BOTTOM + 14}" text-anchor="{anchor}" '
            f'class="tick">{date(t)}{zone}</text>'
        )
    entries: list[tuple[str, str, bool]] = []
    placed = [(mark, left, "") for mark in left_marks]
    if right is not None:
        placed += [(mark, right, " (right axis)") for mark in right_marks]
    for mark, scale, side in placed:
        ty = scale.y(mark.value)
        text = f"{mark.label}: {shown(mark.value, mark.axis)}{side}"
        parts.append(
            f'<line x1="{LEFT}" x2="{right_edge}" y1="{ty:.1f}" y2="{ty:.1f}" '
            f'class="threshold"><title>{html.escape(text)}</title></line>'
        )
        entries.append((text, THRESHOLD_COLOR, True))
    entries += [
        (f"{mark.label}: {shown(mark.value, mark.axis)} (not drawn)", THRESHOLD_COLOR, True)
        for mark in unplaced
    ]
    for s in series:
        parts += _line(s, x, left.y)
    legend, height = _legend([(s.label, s.color, False) for s in series] + entries)
    head = (
        f'<svg class="chart" role="img" aria-label="{label}" width="{WIDTH}" height="{height:.0f}" '
        f'viewBox="0 0 {WIDTH} {height:.0f}" xmlns="http://www.w3.org/2000/svg">'
    )
    return "".join([head, *parts, *legend, "</svg>"])

"""Server-rendered SVG charts for the status page: no JavaScript, no build step.

Every number and label is formatted here and escaped (``html.escape``) before it is placed in
the markup, so a chart is safe to embed in a page whatever the series names contain.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

WIDTH, HEIGHT = 560, 170
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 12, 28


@dataclass(frozen=True, slots=True)
class Series:
    """One line: ``(unix_seconds, value)`` points; NaN values break the line (a gap)."""

    label: str
    points: Sequence[tuple[float, float]]
    color: str = "#2f6fb0"


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


def _clock(unix_seconds: float) -> str:
    return time.strftime("%H:%M", time.gmtime(unix_seconds))


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    threshold: float | None = None,
    threshold_label: str = "threshold",
    y_min: float | None = None,
    y_max: float | None = None,
) -> str:
    """A line chart of ``series`` with time and value axes, as an ``<svg>`` element.

    Without any finite point it says so instead of drawing empty axes.
    """
    finite = [(t, v) for s in series for t, v in s.points if math.isfinite(t) and math.isfinite(v)]
    label = html.escape(title)
    if not finite:
        return (
            f'<svg class="chart" role="img" aria-label="{label}" width="{WIDTH}" height="40" '
            f'xmlns="http://www.w3.org/2000/svg"><text x="4" y="24" class="empty">'
            f"{label}: no data in this window</text></svg>"
        )
    t0 = min(t for t, _ in finite)
    t1 = max(t for t, _ in finite)
    values = [v for _, v in finite] + ([threshold] if threshold is not None else [])
    low = min(values) if y_min is None else y_min
    high = max(values) if y_max is None else y_max
    if high - low < 1e-12:
        high = low + 1.0
    span_t = max(t1 - t0, 1e-9)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t: float) -> float:
        return LEFT + (t - t0) / span_t * plot_w

    def y(v: float) -> float:
        return TOP + (1 - (v - low) / (high - low)) * plot_h

    parts = [
        f'<svg class="chart" role="img" aria-label="{label}" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{label}</title>",
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" class="plot"/>',
    ]
    for fraction in (0.0, 0.5, 1.0):
        value = low + fraction * (high - low)
        parts.append(
            f'<text x="{LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end" class="tick">'
            f"{html.escape(_number(value))}</text>"
        )
    for fraction in (0.0, 0.5, 1.0):
        t = t0 + fraction * span_t
        parts.append(
            f'<text x="{x(t):.1f}" y="{HEIGHT - 8}" text-anchor="middle" class="tick">'
            f"{_clock(t)}</text>"
        )
    if threshold is not None:
        ty = y(threshold)
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{ty:.1f}" y2="{ty:.1f}" '
            f'class="threshold"><title>{html.escape(threshold_label)}</title></line>'
        )
    for s in series:
        segments: list[list[str]] = [[]]
        for t, v in s.points:
            if math.isfinite(v) and math.isfinite(t):
                segments[-1].append(f"{x(t):.1f},{y(v):.1f}")
            elif segments[-1]:
                segments.append([])
        for segment in segments:
            if len(segment) == 1:
                cx, cy = segment[0].split(",")
                parts.append(
                    f'<circle cx="{cx}" cy="{cy}" r="2" fill="{html.escape(s.color)}">'
                    f"<title>{html.escape(s.label)}</title></circle>"
                )
            elif segment:
                parts.append(
                    f'<polyline fill="none" stroke="{html.escape(s.color)}" stroke-width="1.5" '
                    f'points="{" ".join(segment)}"><title>{html.escape(s.label)}</title>'
                    "</polyline>"
                )
    parts.append("</svg>")
    return "".join(parts)

"""Calendar months in UTC: where a budget's month starts and ends."""

from __future__ import annotations

from datetime import UTC, datetime

DAY_SECONDS = 86400.0


def month_bounds(now: float) -> tuple[float, float]:
    """Start and end (Unix seconds) of the UTC calendar month holding ``now``."""
    day = datetime.fromtimestamp(now, UTC)
    start = datetime(day.year, day.month, 1, tzinfo=UTC)
    end = datetime(day.year + day.month // 12, day.month % 12 + 1, 1, tzinfo=UTC)
    return start.timestamp(), end.timestamp()

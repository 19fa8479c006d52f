"""Quiet-hours windows: is a moment inside one, and when does that window end? Pure."""

from __future__ import annotations

import datetime as dt
import zoneinfo

from gpuwarden.collector.policy.model import QuietHoursPolicy

_DAY_MINUTES = 24 * 60


def window_end(policy: QuietHoursPolicy, now: float) -> float | None:
    """Unix seconds at which the window holding ``now`` ends; ``None`` when ``now`` is outside.

    A window that crosses midnight (``22:00-06:00``) belongs to the day it starts on: on a
    Friday-only policy it runs from Friday 22:00 to Saturday 06:00.
    """
    zone = zoneinfo.ZoneInfo(policy.timezone)
    local = dt.datetime.fromtimestamp(now, zone)
    minute = local.hour * 60 + local.minute
    start, end = policy.start_minute, policy.end_minute
    today, yesterday = local.weekday(), (local.weekday() - 1) % 7
    ends_on: dt.date | None = None
    if start < end:
        if today in policy.days and start <= minute < end:
            ends_on = local.date()
    elif today in policy.days and minute >= start:
        ends_on = local.date() + dt.timedelta(days=1)
    elif yesterday in policy.days and minute < end:
        ends_on = local.date()
    if ends_on is None:
        return None
    days, minutes = divmod(end, _DAY_MINUTES)
    naive = dt.datetime.combine(
        ends_on + dt.timedelta(days=days), dt.time(minutes // 60, minutes % 60)
    )
    return naive.replace(tzinfo=zone).timestamp()

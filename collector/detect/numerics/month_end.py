"""Month-end spend forecast with a prediction interval: a linear trend on daily spend (OLS).

The month's complete days give daily spend ``y_i`` at day midpoints ``t_i``; ordinary least
squares fits ``y = a + b t`` (statsmodels). What is still to be spent is the model's spend over
the rest of the day in progress (its remaining fraction ``f``) and every day left:
``R = c · β`` with ``c = f x_today + Σ x_j``. Its prediction variance adds the fit's uncertainty
and the days' own noise: ``c' Cov(β) c + σ² (f + days left)`` (days independent, a partial day's
noise in proportion to its length). The forecast is month-to-date + R; the interval
month-to-date + R ± t_{(1+level)/2, n-2} · sd, never below what is already spent.

A day without any accounting (the collector was not running: before it was installed, during
an outage) is unknown, not zero spend: it is left out of the fit. With fewer than
:data:`MIN_DAYS` known complete days there is no trend to fit: the forecast is the run rate of
the known time (month-to-date / the known days, the day in progress included) over the rest of
the month, and the interval is unknown (None), never a made-up width.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats
from statsmodels.regression.linear_model import OLS

MIN_DAYS = 3
"""Complete days needed for a trend with an interval (a line and a residual variance)."""
LINEAR = "linear trend on daily spend (OLS)"
RUN_RATE = "run rate so far (too few complete days for an interval)"


@dataclass(frozen=True, slots=True)
class MonthEnd:
    """A month-end forecast: the point, the interval (None when unknown) and the method."""

    forecast: float
    low: float | None
    high: float | None
    level: float
    method: str


def forecast_month_end(
    daily: Sequence[float | None],
    today: float,
    today_seconds: float,
    days_in_month: int,
    level: float,
) -> MonthEnd:
    """The month-end total from complete days' spend ``daily`` (None: a day without any
    accounting), the day in progress's spend ``today`` over its first ``today_seconds``, and
    the month's length in days."""
    n = len(daily)
    known = np.array([i for i, v in enumerate(daily) if v is not None], dtype=np.int64)
    y = np.array([v for v in daily if v is not None], dtype=np.float64)
    mtd = float(y.sum()) + today
    fraction_left = max(0.0, 1.0 - today_seconds / 86400.0)
    days_left = days_in_month - n - 1
    if len(y) < MIN_DAYS:
        known_days = len(y) + today_seconds / 86400.0
        rate = mtd / known_days if known_days > 0 else 0.0
        rest = rate * (days_left + fraction_left)
        return MonthEnd(mtd + rest, None, None, level, RUN_RATE)
    x = np.column_stack([np.ones(len(y)), known + 0.5])
    fit = OLS(y, x).fit()
    future = np.arange(n + 1, days_in_month) + 0.5
    c = fraction_left * np.array([1.0, n + 0.5]) + np.array([len(future), future.sum()])
    rest = float(c @ fit.params)
    sigma2 = float(fit.scale)
    var = float(c @ fit.cov_params() @ c) + sigma2 * (fraction_left + days_left)
    half = float(stats.t.ppf((1.0 + level) / 2.0, len(y) - 2)) * math.sqrt(max(var, 0.0))
    point = mtd + max(rest, 0.0)
    return MonthEnd(point, max(mtd, mtd + rest - half), max(mtd, mtd + rest + half), level, LINEAR)

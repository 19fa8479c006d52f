"""Budget burn: the SLO burn-rate arithmetic applied to money (or GPU-hours).

A budget is spent evenly when its month ends as it runs out: a rate of ``amount / month``. A
window's burn rate is the window's spend rate over that even rate,
``(spend(W) / W) / (amount / month_seconds)``: burn 1 spends exactly the budget by month end,
burn 14.4 over an hour spends 2 % of it in that hour. As in :mod:`.slo`, a pair (long, short,
rate) fires when both windows burn faster than the rate: the long window proves the spend is
significant, the short one that it is still going on.

Spend comes from the accounting rollups (``DetectionContext.spend``, the rows ``gpuwarden report
costs`` sums); windows end at the cycle's time, cut at the end of the last period the accounting
wrote (it writes a period once the period ends), and the rate is the spend over the part of the
window written, so a short window is not read low by the period in progress. A window the
accounting covers less than half of, or with no accounting row at all (the collector was down or
not accounting), is unknown, never zero spend.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuwarden.collector.budgets.calendar import month_bounds
from gpuwarden.collector.budgets.config import Budget, Scope
from gpuwarden.collector.budgets.spend import WindowSpend
from gpuwarden.collector.detect.contract import DetectionContext, Detector, spec_of
from gpuwarden.collector.detect.findings import Facts, Finding, JsonScalar, Verdict, new_finding
from gpuwarden.collector.detect.slo import PairVerdict, judge_pairs
from gpuwarden.collector.rules.durations import format_duration
from gpuwarden.collector.rules.model import Rule, Subject
from gpuwarden.collector.rules.params import durations, numbers

MIN_COVERAGE = 0.5
"""Share of a window the accounting must have written for the window to have a burn rate."""


def budget_burn_rate(
    spend: float, window_seconds: float, amount: float, month_seconds: float
) -> float:
    """The window's spend rate over the budget's even rate (``amount`` per month)."""
    return (spend / window_seconds) / (amount / month_seconds)


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetBurnParams:
    """Parameters of ``budget_burn``."""

    long_windows_seconds: tuple[float, ...] = durations(
        ("1h", "6h"), "5m", "31d", "Long window of each pair."
    )
    short_windows_seconds: tuple[float, ...] = durations(
        ("5m", "30m"), "1m", "31d", "Short window of each pair (about 1/12)."
    )
    burn_rates: tuple[float, ...] = numbers(
        (14.4, 6.0),
        0.1,
        1000.0,
        "Fires when both windows of a pair spend faster than this many times the even rate.",
    )

    def spend_windows_seconds(self) -> tuple[float, ...]:
        """Every window read (``contract.ReadsSpend``)."""
        return (*self.long_windows_seconds, *self.short_windows_seconds)


def _check(p: BudgetBurnParams) -> tuple[str, str] | None:
    longs, shorts, rates = p.long_windows_seconds, p.short_windows_seconds, p.burn_rates
    if not longs or len(longs) != len(shorts) or len(longs) != len(rates):
        return "burn_rates", (
            "long_windows_seconds, short_windows_seconds and burn_rates must be non-empty lists "
            f"of one length (got {len(longs)}, {len(shorts)}, {len(rates)})"
        )
    for i, (long, short) in enumerate(zip(longs, shorts, strict=True)):
        if short >= long:
            return f"short_windows_seconds[{i}]", (
                f"must be shorter than its long window ({format_duration(long)})"
            )
    return None


def run_budget_burn(
    ctx: DetectionContext, rule: Rule, p: BudgetBurnParams, now: float
) -> list[Finding]:
    """One finding per configured budget."""
    budgets = ctx.budgets()
    if not budgets.items:
        return []
    start, end = month_bounds(now)
    month_seconds = end - start
    windows = sorted(set(p.spend_windows_seconds()))
    spends = {w: ctx.spend(since=now - w, until=now) for w in windows}
    mtd = ctx.spend(since=start, until=now)
    return [
        _finding(rule, p, budget, spends, mtd, now, month_seconds, budgets.currency)
        for budget in budgets.items
    ]


def _finding(
    rule: Rule,
    p: BudgetBurnParams,
    budget: Budget,
    spends: dict[float, WindowSpend],
    mtd: WindowSpend,
    now: float,
    month_seconds: float,
    currency: str,
) -> Finding:
    burns: dict[float, float | None] = {
        w: (
            budget_burn_rate(s.of(budget), s.seconds, budget.amount, month_seconds)
            if s.accounted and s.seconds >= MIN_COVERAGE * w
            else None
        )
        for w, s in spends.items()
    }
    pairs = [
        PairVerdict(lw, sw, r, burns[lw], burns[sw])
        for lw, sw, r in zip(
            p.long_windows_seconds, p.short_windows_seconds, p.burn_rates, strict=True
        )
    ]
    verdict = judge_pairs(pairs)
    unit = currency if budget.unit.value == "cost" else "GPU-h"
    spent = mtd.of(budget)
    evidence: dict[str, JsonScalar] = {
        "budget": budget.key,
        budget.scope.value: budget.name,
        "unit": unit,
        "budget_amount": budget.amount,
        "month_to_date": spent,
        "budget_used_ratio": spent / budget.amount,
    }
    for w, b in sorted(burns.items()):
        evidence[f"burn_rate_{format_duration(w)}"] = b
    for q in pairs:
        name = f"pair_{format_duration(q.long_seconds)}_{format_duration(q.short_seconds)}"
        evidence[f"{name}_threshold"] = q.threshold
    fired = [q for q in pairs if q.verdict is Verdict.FIRING]
    if fired:
        top = max(fired, key=lambda q: q.threshold)
        summary = (
            f"budget {budget.key}: spending {top.long_burn:.1f}x the even rate over "
            f"{format_duration(top.long_seconds)} and {top.short_burn:.1f}x over "
            f"{format_duration(top.short_seconds)} (threshold {top.threshold:g}x); "
            f"{spent:.2f} of {budget.amount:g} {unit} spent this month"
        )
    elif verdict is Verdict.UNKNOWN:
        summary = f"budget {budget.key}: burn unknown (no accounting in a window)"
    else:
        summary = f"budget {budget.key}: spending within its burn rates"
    return new_finding(
        rule,
        subject=budget.key,
        verdict=verdict,
        window=(now - max(p.long_windows_seconds), now),
        facts=Facts(team=budget.name if budget.scope is Scope.TEAM else None),
        summary=summary,
        evidence=evidence,
    )


DETECTOR = Detector(
    spec=spec_of(
        "budget_burn",
        "Multi-window, multi-burn-rate alert on a team's or project's monthly budget.",
        subjects=(Subject.BUDGET,),
        signals=(),
        params=BudgetBurnParams,
        selector=("teams",),
        check=_check,
    ),
    params=BudgetBurnParams,
    run=run_budget_burn,
)

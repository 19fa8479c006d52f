"""The demo fleet's own parts: what makes every run tell the same story."""

from __future__ import annotations

import pytest

from gpuwarden.demo_fleet import HOST_CPU_BUSY, SimulatedHost, peak_hour
from gpuwarden.demo_serving import ServingProfile, SimulatedModelServer


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("node", sorted(HOST_CPU_BUSY))
def test_a_simulated_host_reads_as_its_load_whatever_the_sampling(node):
    """CPU utilisation from counter deltas (what the collector computes) is the node's load."""
    clock = _Clock(1_764_000_000.0)
    host = SimulatedHost(HOST_CPU_BUSY[node], clock=clock)
    before = host.sample().cpu_time_seconds
    for step in (0.7, 2.9, 1.0):  # irregular rounds, as on a loaded machine
        clock.now += step
    after = host.sample().cpu_time_seconds
    delta = {mode: after[mode] - before[mode] for mode in after}
    busy = 1 - (delta["idle"] + delta["iowait"]) / sum(delta.values())
    assert busy == pytest.approx(HOST_CPU_BUSY[node])


@pytest.mark.parametrize("start_hour", [0.0, 5.5, 13.25, 22.0, 23.9])
def test_the_serving_peak_is_mid_run_whatever_the_hour(start_hour):
    """The daily curve has the same shape relative to the run, at any time of day."""
    simulated = 2 * 3600.0
    start = 1_764_000_000.0 - (1_764_000_000.0 % 86400) + start_hour * 3600
    peak = peak_hour(start, simulated)
    server = SimulatedModelServer(ServingProfile(peak_hour_utc=peak), clock=lambda: start)
    rates = [server.rate(start + simulated * k / 20) for k in range(21)]
    assert max(range(21), key=rates.__getitem__) == 10  # the middle of the run
    assert rates[0] == pytest.approx(rates[-1])  # symmetric: neither rising nor falling

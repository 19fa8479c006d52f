"""Fairness: each team's and queue's share of GPU time against its target, queue waits and
preemptions, from the schedulers' own timings (:mod:`gpuwarden.collector.jobs.runs`)."""

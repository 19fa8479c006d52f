"""Labelled evaluation of every detector against planted truth (``python -m bench.truth``).

Generated fleets carry episodes the generator planted (start, end, subject, detector's rule);
their telemetry goes through the collector's real path (``CollectorService.accept`` →
WindowStore → the shipped ``rules/default.yaml`` → ``DetectionEngine.run_cycle`` with SQLite
storage and the real ``IncidentTracker``) on a simulated clock, and the incidents it opens are
scored against the labels, never against the detector's own rule. See docs/evaluation.md.
"""

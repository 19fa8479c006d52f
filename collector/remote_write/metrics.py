"""The remote-write families of the collector's ``/metrics``: queue, sent, failed, dropped."""

from __future__ import annotations

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuwarden.collector.remote_write.writer import HistoryWriter

DROP_REASONS = ("rejected", "queue_full", "out_of_order", "disk_error")


def remote_write_families(history: HistoryWriter | None) -> list[Metric]:
    """The ``gpuwarden_remote_write_*`` families (none when remote-write is off)."""
    if history is None:
        return []
    stats = history.stats
    queued = GaugeMetricFamily(
        "gpuwarden_remote_write_queue_bytes",
        "Bytes of remote-write requests in the durable queue, not yet accepted by the TSDB.",
        value=float(history.queue.pending_bytes()),
    )
    sent = CounterMetricFamily(
        "gpuwarden_remote_write_samples_sent",
        "Samples the TSDB accepted (2xx).",
        value=float(stats.sent_samples),
    )
    requests = CounterMetricFamily(
        "gpuwarden_remote_write_requests_sent",
        "Remote-write requests the TSDB accepted (2xx).",
        value=float(stats.sent_requests),
    )
    failed = CounterMetricFamily(
        "gpuwarden_remote_write_requests_failed",
        "Remote-write requests that failed and stay queued for a retry, by kind "
        "(5xx, 429, unreachable: no answer or a timeout).",
        labels=["kind"],
    )
    for kind, count in sorted(stats.failed_requests.items()):
        failed.add_metric([kind], float(count))
    dropped = CounterMetricFamily(
        "gpuwarden_remote_write_samples_dropped",
        "Samples given up, by reason: rejected (the TSDB answered a 4xx other than 429), "
        "queue_full (the queue's oldest segment went past max_queue_bytes), out_of_order (at "
        "or before the newest sample already written for the series), disk_error.",
        labels=["reason"],
    )
    for reason in DROP_REASONS:
        dropped.add_metric([reason], float(stats.dropped_samples.get(reason, 0)))
    return [queued, sent, requests, failed, dropped]

"""History in a Prometheus-compatible TSDB: the collector's points, written by remote-write 1.0.

``wire`` is the protobuf + snappy encoding (shared with a future remote-write receiver),
``naming`` the OpenTelemetry → Prometheus names, ``queue`` the durable on-disk queue, ``sender``
the HTTP side with its retry rules, and ``writer`` the part the collector holds: it takes the
points the intake stores, batches them into the queue and drains the queue to the TSDB.
"""

"""The ``remote_write:`` section of the collector's configuration (off when absent)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec

DEFAULT_QUEUE_DIR = Path("/var/lib/gpuwarden/remote-write")


class RemoteWriteSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where and how the collector writes its series by Prometheus remote-write 1.0.

    Attributes:
        url: the receiver's endpoint (VictoriaMetrics ``/api/v1/write``, Prometheus
            ``/api/v1/write`` with ``--web.enable-remote-write-receiver``, Mimir, Thanos Receive).
        headers: extra request headers (a tenant header such as ``X-Scope-OrgID``).
        bearer_token_file: a file holding the bearer token sent as ``Authorization``.
        queue_dir: the durable queue's folder (segment files and the read cursor).
        max_queue_bytes: beyond this the oldest segment is dropped (counted, logged).
        batch_samples: samples per remote-write request at most.
        timeout_seconds: connect and read timeout of one request.
        flush_seconds: how often buffered points go to the queue and the queue is drained.
        max_backoff_seconds: the longest wait between retries of a failing request.
        forward_received: also write the points that arrived by Prometheus remote-write
            (``POST /api/v1/write``). Off by default: they usually come from the same TSDB's
            scrapes, and writing them back would loop; turn it on only when ``url`` is
            another TSDB than the one that feeds the collector.
    """

    url: str
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    bearer_token_file: Path | None = None
    queue_dir: Path = DEFAULT_QUEUE_DIR
    max_queue_bytes: Annotated[int, msgspec.Meta(ge=1 << 20)] = 1 << 30
    batch_samples: Annotated[int, msgspec.Meta(gt=0, le=1_000_000)] = 5_000
    timeout_seconds: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    flush_seconds: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    max_backoff_seconds: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    forward_received: bool = False

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError("url: an http:// or https:// URL")

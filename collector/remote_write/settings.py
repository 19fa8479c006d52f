"""The ``remote_write:`` section of the collector's configuration (off when absent)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

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
        read_url: the TSDB's base URL to read back from at start (warm start; None: no
            read-back), e.g. ``http://victoria:8428`` or ``http://prometheus:9090``.
        read_api: ``victoriametrics`` (``/api/v1/export``) or ``prometheus`` (raw samples of a
            range selector through ``/api/v1/query``).
        warm_start_lookback_seconds: how far back a start without a snapshot reads (capped at
            the store's recent window); with a snapshot, only the time since it was written.
        warm_start_long_lookback_seconds: without a snapshot, how far back the long window
            (per-minute means) is filled from the TSDB (capped at the store's long window;
            0: not at all).
        read_page_seconds: the span of one read request.
        read_max_samples: samples read at most (the start goes on with what it has, logged).
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
    read_url: str | None = None
    read_api: Literal["victoriametrics", "prometheus"] = "victoriametrics"
    warm_start_lookback_seconds: Annotated[float, msgspec.Meta(ge=0)] = 6 * 3600.0
    warm_start_long_lookback_seconds: Annotated[float, msgspec.Meta(ge=0)] = 14 * 86400.0
    read_page_seconds: Annotated[float, msgspec.Meta(gt=0)] = 3600.0
    read_max_samples: Annotated[int, msgspec.Meta(gt=0)] = 50_000_000

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError("url: an http:// or https:// URL")
        if self.read_url is not None and not self.read_url.startswith(("http://", "https://")):
            raise ValueError("read_url: an http:// or https:// URL (the TSDB's base URL)")
        if self.read_url is not None and "/api/" in self.read_url:
            raise ValueError("read_url: the TSDB's base URL, without /api/v1/...")

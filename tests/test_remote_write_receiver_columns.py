"""The receiver's column path (``ingest.prom_columns``, taken for requests read flat when the
translator maps series one by one) answers, counts and stores exactly what its series path
does: the same requests go to two real apps, one with each path, and are compared.
"""

from __future__ import annotations

import math
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.ingest.prom_write import STALE_NAN_BITS
from gpuwarden.collector.remote_write.wire import Series, encode
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.keys import AUTH_STATS, STATS
from gpuwarden.collector.web.remote_write_receiver import RW_STATE
from tests.prom_translate import FIELDS, SeriesTranslator, translate
from tests.test_remote_write_receiver import TABLE, dcgm, headers

STALE = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]
NAMES = (*FIELDS, "DCGM_FI_DEV_SM_CLOCK")  # the last has no mapping


def fleet(t_ms: int, values: list[float], host: str = "node-a") -> list[Series]:
    series = [dcgm(name, host, gpu, [(t_ms, 0.0)]) for gpu in range(4) for name in NAMES]
    return [
        Series(s.labels, s.timestamps_ms, (values[i % len(values)],)) for i, s in enumerate(series)
    ]


@pytest.fixture
def services(tmp_path: Path) -> Iterator[tuple[CollectorService, CollectorService]]:
    pair = (
        build_service(CollectorConfig(database=tmp_path / "a.db")),
        build_service(CollectorConfig(database=tmp_path / "b.db")),
    )
    yield pair
    for one in pair:
        one.storage.close()


def store_state(service: CollectorService, end_s: float) -> dict[str, object]:
    out: dict[str, object] = {"series": service.store.series_count()}
    for metric in ("hw.gpu.utilization", "hw.gpu.memory.usage", "hw.energy"):
        found = service.store.matrix(metric, start=end_s - 600, end=end_s + 600)
        order = np.argsort([str(info.attributes) for info in found.series])
        newest = service.store.latest(metric, {}, max_age_seconds=math.inf)
        out[metric] = (
            [str(found.series[i].attributes) for i in order],
            np.nan_to_num(found.values[order], nan=-1.0).round(9).tolist(),
            sorted(
                zip(
                    map(str, newest.series),
                    np.nan_to_num(newest.values, nan=-1.0).tolist(),
                    strict=True,
                )
            ),
        )
    totals = service.totals
    out["totals"] = (totals.accepted, totals.rejected, totals.new_series)
    return out


async def test_the_column_path_does_what_the_series_path_does(aiohttp_client, services):
    by_series, by_columns = services
    mapper = SeriesTranslator()
    clients = [
        await aiohttp_client(
            create_app(
                CollectorConfig(tokens=TABLE), service=svc, background=False, prom_translate=tr
            )
        )
        for svc, tr in ((by_series, translate), (by_columns, mapper))
    ]
    t = int(time.time() * 1000) - 120_000
    huge = dict(fleet(t, [1.0])[0].labels) | {"pod": "x" * 5000}
    over = Series(tuple(sorted(huge.items())), (t,), (1.0,))
    nameless = Series((("Hostname", "node-a"), ("UUID", "GPU-x")), (t,), (1.0,))
    requests: list[tuple[str, list[Series]]] = [
        ("prometheus", fleet(t, [50.0, 0.0, 7.5])),
        ("prometheus", fleet(t + 15_000, [60.0, 2.0, 9.5])),  # read flat from here on
        ("prometheus", fleet(t + 30_000, [0.0, math.nan, math.inf, STALE, -math.inf, 3.0])),
        ("prometheus", [*fleet(t + 45_000, [70.0, 4.0]), over]),
        ("prometheus", [*fleet(t + 60_000, [71.0, 5.0]), over]),  # over the limits, known
        ("prometheus", fleet(t + 3_600_000, [1.0])),  # an hour ahead: in the future
        ("prometheus", [*fleet(t + 75_000, [72.0]), nameless]),  # 400
        ("prometheus", [*fleet(t + 75_000, [72.0]), nameless]),  # 400, known
        ("prometheus", fleet(t + 75_000, [72.0], host="node-b")),
        ("agent-a", fleet(t + 90_000, [73.0], host="node-b")),  # 403
        ("agent-a", fleet(t + 90_000, [74.0])),
        ("prometheus", [*fleet(t + 105_000, [75.0]), *fleet(t + 106_000, [76.0])]),  # twice
    ]
    for who, series in requests:
        body = encode(series)
        answers = []
        for client in clients:
            resp = await client.post("/api/v1/write", data=body, headers=headers(who))
            answers.append((resp.status, await resp.text()))
        assert answers[0] == answers[1], (who, series[-1])
        end_s = (t + 120_000) / 1000
        assert store_state(by_series, end_s) == store_state(by_columns, end_s), series[-1]
    stats = [client.server.app[STATS] for client in clients]
    assert stats[0].remote_write_samples == stats[1].remote_write_samples
    assert stats[1].remote_write_samples["stale_markers"] == 3
    assert stats[1].remote_write_samples["over_label_limits"] == 2
    assert (stats[0].points_accepted, stats[0].points_rejected) == (
        stats[1].points_accepted,
        stats[1].points_rejected,
    )
    assert stats[0].responses == stats[1].responses
    auth = [client.server.app[AUTH_STATS].refusals for client in clients]
    assert auth[0] == auth[1]
    decoders = [client.server.app[RW_STATE].decoder for client in clients]
    assert decoders[1].flat_reads >= 8  # the columns were taken
    assert client.server.app[RW_STATE].columns is not None
    assert clients[0].server.app[RW_STATE].columns is None

"""The level-shift fits on disk, next to the window's snapshot: kept across a restart.

``level_shift`` fits a seasonal profile and an AR(1) model per candidate series and reuses them
for ``REFIT_EVERY`` cycles, but fits at most ``max_fits`` new series per cycle (each fit costs
about 70 ms). After a restart with an empty cache, a fleet with more candidates than that would
judge some of them UNKNOWN for several cycles though its window came back whole. So the fits are
written with every snapshot (``<snapshot>.fits.npz``) and read back at start: a rule ready before
the restart judges every candidate in its first cycle.

The other detectors' in-memory state is rebuilt from the restored window within one cycle
(``model_drift``'s and ``demand_forecast``'s fits: a miss fits at once, without a budget;
``metric_anomaly`` keeps none), or is rebuilt from the recent window and said so by readiness
(``distribution_drift``'s reference). Format: ``.npz`` of plain arrays (no pickles), keys as
JSON text; written to a temporary name and renamed. A file that does not read is logged and
ignored: the fits are made again, as after a first start.
"""

from __future__ import annotations

import json
import logging
import os
import zipfile
from pathlib import Path

import numpy as np

from gpuwarden.collector.detect.numerics.confirm import FitCache, HistoryFit

log = logging.getLogger(__name__)

FORMAT = 1


def fits_path(snapshot: Path) -> Path:
    """Where the fits of the snapshot ``snapshot`` are kept."""
    return snapshot.with_name(f"{snapshot.name}.fits.npz")


def write_fits(cache: FitCache, path: Path) -> int:
    """Write the cache's fits whose key is a pair of strings (rule, series); return how many."""
    keys, periods, uses, params, profiles, lengths = [], [], [], [], [], []
    for key, fit in cache.entries():
        if not (isinstance(key, tuple) and len(key) == 2 and all(isinstance(k, str) for k in key)):
            continue
        keys.append(list(key))
        periods.append(-1 if fit.period is None else fit.period)
        uses.append(fit.uses)
        params.append(np.asarray(fit.params, dtype=np.float64))
        profile = np.zeros(0) if fit.profile is None else np.asarray(fit.profile, np.float64)
        profiles.append(profile)
        lengths.append(-1 if fit.profile is None else profile.size)
    temporary = path.with_name(f".{path.name}.tmp")
    with temporary.open("wb") as file:
        np.savez(
            file,
            format=np.array([FORMAT]),
            keys=np.frombuffer(json.dumps(keys).encode(), dtype=np.uint8),
            periods=np.array(periods, dtype=np.int64),
            uses=np.array(uses, dtype=np.int64),
            params=np.stack(params) if params else np.zeros((0, 3)),
            lengths=np.array(lengths, dtype=np.int64),
            profiles=np.concatenate(profiles) if profiles else np.zeros(0),
        )
        file.flush()
        os.fsync(file.fileno())
    os.chmod(temporary, 0o600)
    temporary.replace(path)
    return len(keys)


def read_fits(cache: FitCache, path: Path) -> int:
    """Put the fits of ``path`` into ``cache``; return how many (0: none, or unusable, logged)."""
    if not path.exists():
        return 0
    try:
        with np.load(path, allow_pickle=False) as data:
            if int(data["format"][0]) != FORMAT:
                raise ValueError(f"format {int(data['format'][0])}, this collector reads {FORMAT}")
            keys = json.loads(data["keys"].tobytes().decode())
            periods, uses, params = data["periods"], data["uses"], data["params"]
            lengths, profiles = data["lengths"], data["profiles"]
            at = 0
            for i, (rule, series) in enumerate(keys):
                length = int(lengths[i])
                profile = None if length < 0 else np.array(profiles[at : at + length])
                at += max(length, 0)
                period = int(periods[i])
                fit = HistoryFit(
                    period=None if period < 0 else period,
                    profile=profile,
                    params=np.array(params[i]),
                    uses=int(uses[i]),
                )
                cache.restore((str(rule), str(series)), fit)
            return len(keys)
    except (OSError, ValueError, KeyError, TypeError, IndexError, zipfile.BadZipFile) as exc:
        log.warning("fits %s ignored: cannot read them: %s", path, exc)
        return 0

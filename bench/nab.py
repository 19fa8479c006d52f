"""Our own scorer for the Numenta Anomaly Benchmark (NAB v1.1), written from the documented method.

No NAB code is used; the method (Lavin & Ahmad 2015, Ahmad et al. 2017, NAB's README/wiki) is:

* **Windows.** Each labelled anomaly has a window (``labels/combined_windows.json``, already merged
  and with probationary windows dropped). A window spans the rows ``lo..hi`` of its file whose
  timestamps fall inside ``[start, end]``; its width is ``hi - lo + 1`` rows.
* **Probation.** The first ``min(floor(0.15 * n), 0.15 * 5000)`` rows of an ``n``-row file are not
  scored: a detection there is neither a true nor a false positive. Windows still count.
* **Scaled sigmoid.** ``sigma(y) = 2 / (1 + exp(5 y)) - 1`` (that is ``2 * sigmoid(-5 y) - 1``),
  and -1 for ``y > 3``.
* **Inside a window**, row ``i`` sits at ``y = -(hi - i + 1) / width``: -1 for the first row of the
  window, just below 0 for the last. A detection there earns ``A_TP * sigma(y) / sigma(-1)``: the
  sigmoid is rescaled so that the first row earns exactly ``A_TP`` (``sigma(-1)`` is 0.9866); the
  last row earns 0.126 * A_TP in a 20-row window, 0.013 * A_TP in a 200-row one. Only the best,
  i.e. the earliest, detection in a window counts; the later ones in the same window are ignored.
* **Outside the windows**, a detection is a false positive worth ``A_FP * sigma(y)`` (negative).
  Before the first window ``y`` is taken as far away (``sigma = -1``); after a window,
  ``y = (i - hi) / (width - 1)``, the distance from that window's last row in units of its width,
  so an alarm just after a window costs almost nothing and one a window width or more later costs
  almost ``A_FP``. Every such alarm costs: there is no hold-off.
* **Missed windows** cost ``-A_FN`` each.
* **Totals.** A detector's raw score is the sum over files for one profile and one threshold
  (a row is a detection when ``anomaly_score >= threshold``). The reported score is
  ``100 * (raw - null) / (perfect - null)`` where ``null = -A_FN * windows`` (the detector that
  never fires) and ``perfect = A_TP * windows`` (one detection on the first row of every window,
  nothing else).

``score_detector`` reproduces NAB's published numbers from the stored detector outputs in
``../shared/data/nab/reference_detector_scores/`` (``tests/test_nab.py``): HTM 70.10, windowed
Gaussian 39.65 on the standard profile. ``sweep_thresholds`` computes the raw score of every
distinct threshold at once, as NAB's optimiser does (tuned on the benchmark itself: in-sample).
"""

from __future__ import annotations

import csv
import gzip
import itertools
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

Timestamps = npt.NDArray[np.datetime64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

PROBATION_FRACTION = 0.15
PROBATION_CAP_ROWS = 5000  # probation is at most PROBATION_FRACTION of this many rows (750)
FAR_AFTER_WINDOW = 3.0  # past this relative position the sigmoid is taken as -1 exactly
PROFILE_NAMES = ("standard", "reward_low_FP_rate", "reward_low_FN_rate")
_TIME_UNIT = "datetime64[us]"


@dataclass(frozen=True)
class Profile:
    """An application profile: the weights of a true positive, a false positive and a miss."""

    name: str
    tp_weight: float
    fp_weight: float
    fn_weight: float


@dataclass(frozen=True)
class Window:
    """An anomaly window, both ends inclusive."""

    start: np.datetime64
    end: np.datetime64


@dataclass(frozen=True)
class DetectorOutput:
    """One detector's per-row anomaly scores for one data file, rows in file order."""

    timestamps: Timestamps
    scores: FloatArray


@dataclass(frozen=True)
class FileScore:
    """The raw score of one file and what it is made of."""

    raw: float
    tp: int  # windows detected
    fp: int  # scored detections outside every window
    fn: int  # windows missed
    tp_score: float  # sum of the A_TP-weighted rewards (>= 0 when every hit is in a window)
    fp_score: float  # sum of the A_FP-weighted costs (<= 0)


@dataclass(frozen=True)
class DetectorScore:
    """A detector's score on a set of files for one profile and one threshold."""

    profile: str
    threshold: float
    raw: float
    normalized: float
    null_raw: float
    perfect_raw: float
    tp: int
    fp: int
    fn: int
    per_file: Mapping[str, FileScore] = field(repr=False)


@dataclass(frozen=True)
class ThresholdSweep:
    """Raw score at every distinct threshold, descending (NAB's ``--optimize``, but exhaustive).

    The first threshold is ``inf`` (no detection: the null score); each later one is a distinct
    anomaly score ``t`` with the raw score of flagging every row whose score is ``>= t``.
    """

    thresholds: FloatArray
    raw: FloatArray
    null_raw: float
    perfect_raw: float

    def best(self) -> tuple[float, float]:
        """The (threshold, raw score) with the highest raw score; the highest threshold on ties."""
        k = int(np.argmax(self.raw))
        return float(self.thresholds[k]), float(self.raw[k])


# --------------------------------------------------------------------------------------- loading


def parse_timestamps(texts: Sequence[str]) -> Timestamps:
    """NAB timestamps (``"2014-04-01 00:05:00"``, fractional seconds allowed) as datetime64."""
    return np.array([t.strip().replace(" ", "T", 1) for t in texts], dtype=_TIME_UNIT)


def load_windows(path: Path | str) -> dict[str, tuple[Window, ...]]:
    """``combined_windows.json``: ``"category/file.csv"`` -> its windows, sorted and disjoint."""
    raw: dict[str, list[list[str]]] = json.loads(Path(path).read_text())
    windows: dict[str, tuple[Window, ...]] = {}
    for name, pairs in raw.items():
        ends = parse_timestamps([t for pair in pairs for t in pair]).reshape(-1, 2)
        parsed = sorted((Window(start=s, end=e) for s, e in ends), key=lambda w: w.start)
        for before, after in itertools.pairwise(parsed):
            if after.start <= before.end:
                raise ValueError(f"{name}: windows overlap ({before} and {after})")
        if any(w.end < w.start for w in parsed):
            raise ValueError(f"{name}: a window ends before it starts")
        windows[name] = tuple(parsed)
    return windows


def load_profiles(path: Path | str) -> dict[str, Profile]:
    """``config/profiles.json``: profile name -> weights (``CostMatrix`` tp/fp/fn)."""
    raw: dict[str, dict[str, dict[str, float]]] = json.loads(Path(path).read_text())
    return {
        name: Profile(
            name=name,
            tp_weight=float(body["CostMatrix"]["tpWeight"]),
            fp_weight=float(body["CostMatrix"]["fpWeight"]),
            fn_weight=float(body["CostMatrix"]["fnWeight"]),
        )
        for name, body in raw.items()
    }


def load_thresholds(path: Path | str) -> dict[str, dict[str, float]]:
    """``config/thresholds.json``: detector -> profile -> threshold, at full precision."""
    raw: dict[str, dict[str, dict[str, float]]] = json.loads(Path(path).read_text())
    return {
        detector: {profile: float(body["threshold"]) for profile, body in profiles.items()}
        for detector, profiles in raw.items()
    }


def _open_text(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", newline="")
    return path.open(newline="")


def load_data_file(path: Path | str) -> tuple[Timestamps, FloatArray]:
    """A NAB data file (``timestamp,value``): its timestamps and values."""
    with _open_text(Path(path)) as handle:
        rows = list(csv.DictReader(handle))
    return (
        parse_timestamps([r["timestamp"] for r in rows]),
        np.array([float(r["value"]) for r in rows], dtype=np.float64),
    )


def _output(stamps: list[str], scores: list[float]) -> DetectorOutput:
    return DetectorOutput(
        timestamps=parse_timestamps(stamps), scores=np.array(scores, dtype=np.float64)
    )


def _read_combined(path: Path) -> dict[str, DetectorOutput]:
    stamps: dict[str, list[str]] = {}
    scores: dict[str, list[float]] = {}
    with _open_text(path) as handle:
        for row in csv.DictReader(handle):
            name = row["file"]
            stamps.setdefault(name, []).append(row["timestamp"])
            scores.setdefault(name, []).append(float(row["anomaly_score"]))
    return {name: _output(stamps[name], scores[name]) for name in stamps}


def _read_results_tree(root: Path) -> dict[str, DetectorOutput]:
    prefix = root.name + "_"
    outputs: dict[str, DetectorOutput] = {}
    for path in sorted(root.glob("*/*.csv")):
        base = path.name.removeprefix(prefix)
        name = f"{path.parent.name}/{base}"
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        outputs[name] = _output(
            [r["timestamp"] for r in rows], [float(r["anomaly_score"]) for r in rows]
        )
    return outputs


def load_detector_results(path: Path | str) -> dict[str, DetectorOutput]:
    """A detector's outputs, keyed ``"category/file.csv"`` as in ``combined_windows.json``.

    ``path`` is either one CSV (optionally gzipped) with ``file,timestamp,anomaly_score`` columns
    (the layout of ``reference_detector_scores/``), or a NAB results folder for one detector
    (``results/<detector>/<category>/<detector>_<file>.csv`` with ``timestamp,value,anomaly_score,
    label,...``); the detector name prefix is taken from the folder name.
    """
    path = Path(path)
    outputs = _read_results_tree(path) if path.is_dir() else _read_combined(path)
    if not outputs:
        raise ValueError(f"{path}: no detector results found")
    return outputs


# --------------------------------------------------------------------------------------- scoring


def probationary_length(rows: int, fraction: float = PROBATION_FRACTION) -> int:
    """Rows at the start of a file that are not scored: ``min(floor(f * n), f * 5000)``."""
    return int(min(math.floor(fraction * rows), fraction * PROBATION_CAP_ROWS))


def scaled_sigmoid(position: npt.ArrayLike) -> FloatArray:
    """``2 * sigmoid(-5 y) - 1`` (+0.987 at y = -1, 0 at y = 0, -1 as y grows); -1 beyond y = 3."""
    y = np.asarray(position, dtype=np.float64)
    with np.errstate(over="ignore"):  # exp overflows to inf for large y: 2 / inf - 1 = -1
        value = 2.0 / (1.0 + np.exp(5.0 * y)) - 1.0
    return np.where(y > FAR_AFTER_WINDOW, -1.0, value)


def window_rows(timestamps: Timestamps, windows: Sequence[Window]) -> list[tuple[int, int]]:
    """Each window as the (first, last) row index of the timestamps inside it, both inclusive.

    Rows are matched by timestamp, not by searching a sorted array: a few NAB files repeat a
    timestamp or step back an hour (daylight saving), outside their windows. The rows inside a
    window must be contiguous, and a window must hold at least one row (NAB builds windows from
    the data rows); anything else is an error.
    """
    rows: list[tuple[int, int]] = []
    for window in windows:
        (inside,) = np.nonzero((timestamps >= window.start) & (timestamps <= window.end))
        if inside.size == 0:
            raise ValueError(f"window {window.start}..{window.end} holds no row")
        lo, hi = int(inside[0]), int(inside[-1])
        if inside.size != hi - lo + 1:
            raise ValueError(f"window {window.start}..{window.end}: its rows are not contiguous")
        if rows and lo <= rows[-1][1]:
            raise ValueError(f"window {window.start}..{window.end} overlaps the one before")
        rows.append((lo, hi))
    return rows


def row_weights(
    rows: int, spans: Sequence[tuple[int, int]]
) -> tuple[FloatArray, npt.NDArray[np.intp]]:
    """Unweighted reward of a detection at every row, and the window index of every row (-1: none).

    Inside a window the reward runs from +1 (first row) down towards 0 (last row); outside, it is
    the (negative) cost of a false alarm, from about 0 just after a window to -1 far from one.
    ``spans`` are the windows as (first, last) rows, ascending and disjoint.
    """
    reward = np.full(rows, -1.0)
    window_of = np.full(rows, -1, dtype=np.intp)
    earliest = float(scaled_sigmoid(-1.0))
    for k, (lo, hi) in enumerate(spans):
        width = hi - lo + 1
        inside = np.arange(lo, hi + 1)
        reward[lo : hi + 1] = scaled_sigmoid(-(hi - inside + 1) / width) / earliest
        window_of[lo : hi + 1] = k
        stop = spans[k + 1][0] if k + 1 < len(spans) else rows
        after = np.arange(hi + 1, stop)
        # A one-row window has no width to measure by; treat it as two rows wide.
        reward[hi + 1 : stop] = scaled_sigmoid((after - hi) / max(width - 1, 1))
    return reward, window_of


def score_file_detail(
    timestamps: Timestamps,
    detections: BoolArray,
    windows: Sequence[Window],
    profile: Profile,
    *,
    probation_fraction: float = PROBATION_FRACTION,
) -> FileScore:
    """Score one file's detections (one bool per row) against its windows for a profile."""
    rows = len(timestamps)
    detected = np.asarray(detections, dtype=np.bool_)
    if detected.shape != (rows,):
        raise ValueError(f"{detected.shape[0]} detections for {rows} rows")
    spans = window_rows(timestamps, windows)
    reward, window_of = row_weights(rows, spans)
    scored = detected.copy()
    scored[: probationary_length(rows, probation_fraction)] = False

    false_alarms = scored & (window_of < 0)
    fp_score = profile.fp_weight * float(reward[false_alarms].sum())
    hits = scored & (window_of >= 0)
    best = np.full(len(spans), -np.inf)
    np.maximum.at(best, window_of[hits], reward[hits])  # the earliest hit has the highest reward
    found = np.isfinite(best)
    tp_score = profile.tp_weight * float(best[found].sum())
    tp, fn = int(found.sum()), int((~found).sum())
    return FileScore(
        raw=tp_score + fp_score - profile.fn_weight * fn,
        tp=tp,
        fp=int(false_alarms.sum()),
        fn=fn,
        tp_score=tp_score,
        fp_score=fp_score,
    )


def score_file(
    timestamps: Timestamps,
    detections: BoolArray,
    windows: Sequence[Window],
    profile: Profile,
    *,
    probation_fraction: float = PROBATION_FRACTION,
) -> float:
    """The raw NAB score of one file: rewards of detected windows + false-alarm costs - misses."""
    return score_file_detail(
        timestamps, detections, windows, profile, probation_fraction=probation_fraction
    ).raw


def normalized_score(raw: float, null_raw: float, perfect_raw: float) -> float:
    """``100 * (raw - null) / (perfect - null)``: 0 for the silent detector, 100 for "perfect"."""
    if perfect_raw <= null_raw:
        raise ValueError("the perfect score must be above the null score")
    return 100.0 * (raw - null_raw) / (perfect_raw - null_raw)


def baseline_scores(
    windows: Mapping[str, Sequence[Window]], profile: Profile, files: Iterable[str]
) -> tuple[float, float]:
    """(null, perfect) raw scores over ``files``: ``-A_FN`` and ``+A_TP`` per window."""
    count = sum(len(windows[name]) for name in files)
    return -profile.fn_weight * count, profile.tp_weight * count


def _select(
    results: Mapping[str, DetectorOutput],
    windows: Mapping[str, Sequence[Window]],
    files: Iterable[str] | None,
) -> list[str]:
    names = sorted(windows) if files is None else sorted(set(files))
    missing = [n for n in names if n not in results]
    unknown = [n for n in names if n not in windows]
    if unknown:
        raise KeyError(f"no windows for {len(unknown)} file(s), e.g. {unknown[0]}")
    if missing:
        raise KeyError(f"no detector results for {len(missing)} file(s), e.g. {missing[0]}")
    return names


def score_detector(
    results: Path | str | Mapping[str, DetectorOutput],
    *,
    windows: Mapping[str, Sequence[Window]],
    profile: Profile,
    threshold: float,
    files: Iterable[str] | None = None,
    probation_fraction: float = PROBATION_FRACTION,
) -> DetectorScore:
    """Score a detector on ``files`` (default: every labelled file) for one profile and threshold.

    ``results`` is a path for :func:`load_detector_results` or its already-loaded outputs. A row is
    a detection when its ``anomaly_score >= threshold``. The normalised score uses the null and
    perfect scores of the same files, so a category subset is normalised against itself.
    """
    outputs = load_detector_results(results) if isinstance(results, Path | str) else results
    names = _select(outputs, windows, files)
    per_file = {
        name: score_file_detail(
            outputs[name].timestamps,
            outputs[name].scores >= threshold,
            windows[name],
            profile,
            probation_fraction=probation_fraction,
        )
        for name in names
    }
    raw = math.fsum(s.raw for s in per_file.values())
    null_raw, perfect_raw = baseline_scores(windows, profile, names)
    return DetectorScore(
        profile=profile.name,
        threshold=threshold,
        raw=raw,
        normalized=normalized_score(raw, null_raw, perfect_raw),
        null_raw=null_raw,
        perfect_raw=perfect_raw,
        tp=sum(s.tp for s in per_file.values()),
        fp=sum(s.fp for s in per_file.values()),
        fn=sum(s.fn for s in per_file.values()),
        per_file=per_file,
    )


def _score_changes(
    output: DetectorOutput, windows: Sequence[Window], profile: Profile, probation_fraction: float
) -> Iterator[tuple[FloatArray, FloatArray]]:
    """(anomaly score, change of the raw score when the threshold drops to it) for one file."""
    rows = len(output.timestamps)
    spans = window_rows(output.timestamps, windows)
    reward, window_of = row_weights(rows, spans)
    start = probationary_length(rows, probation_fraction)
    scores, reward, window_of = output.scores[start:], reward[start:], window_of[start:]
    outside = window_of < 0
    yield scores[outside], profile.fp_weight * reward[outside]
    for k in range(len(spans)):
        inside = window_of == k
        if not inside.any():
            continue
        order = np.argsort(-scores[inside], kind="stable")
        s, r = scores[inside][order], reward[inside][order]
        # The window is worth -A_FN until its first hit, then A_TP times its best hit so far.
        value = np.concatenate(([-profile.fn_weight], profile.tp_weight * np.maximum.accumulate(r)))
        yield s, np.diff(value)


def sweep_thresholds(
    results: Path | str | Mapping[str, DetectorOutput],
    *,
    windows: Mapping[str, Sequence[Window]],
    profile: Profile,
    files: Iterable[str] | None = None,
    probation_fraction: float = PROBATION_FRACTION,
) -> ThresholdSweep:
    """The raw score at every distinct anomaly score used as the threshold, in one pass.

    This is how a single corpus-wide threshold is tuned (NAB's ``--optimize``): on the benchmark
    itself, so a score at the swept best threshold is in-sample.
    """
    outputs = load_detector_results(results) if isinstance(results, Path | str) else results
    names = _select(outputs, windows, files)
    null_raw, perfect_raw = baseline_scores(windows, profile, names)
    parts = [
        p
        for n in names
        for p in _score_changes(outputs[n], windows[n], profile, probation_fraction)
    ]
    scores = np.concatenate([s for s, _ in parts]) if parts else np.empty(0)
    changes = np.concatenate([c for _, c in parts]) if parts else np.empty(0)
    order = np.argsort(-scores, kind="stable")
    scores, changes = scores[order], changes[order]
    running = null_raw + np.cumsum(changes)
    # Rows with equal scores switch on together: keep the total after the last of each group.
    last = np.append(scores[1:] != scores[:-1], True) if scores.size else np.zeros(0, np.bool_)
    # A threshold above every score detects nothing: that is the null detector's score.
    return ThresholdSweep(
        thresholds=np.concatenate(([np.inf], scores[last])),
        raw=np.concatenate(([null_raw], running[last])),
        null_raw=null_raw,
        perfect_raw=perfect_raw,
    )


def category_files(windows: Mapping[str, Any], category: str) -> list[str]:
    """The labelled files of one NAB category (``"realKnownCause"``), sorted."""
    return sorted(name for name in windows if name.split("/", 1)[0] == category)

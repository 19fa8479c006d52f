"""Which NAB files chose our constants (split A) and which were never looked at (split B).

The split is a pure function of the file names in ``labels/combined_windows.json``, so anyone
can recompute it: sort the 58 names; split A is the 11 artificial files plus every other real
file (the 1st, 3rd, ... of the 47 real names), 35 files; split B is the other 23 real files.

What was tuned on split A, and only there (standard profile):

* ``anomaly.DEFAULT_THRESHOLD`` = 0.5328 and the rule parameter ``score_above`` of
  ``model-traffic-anomaly`` (same value): the threshold with the best split-A score, rounded down;
* the stream settings of ``anomaly.AnomalyParams`` (context levels and orders, half-lives,
  floors), chosen by their split-A score (see the comment above ``DEFAULT_THRESHOLD``).

What was *not* tuned on NAB at all: the rule's ``history_seconds`` (12 h) and ``recent_seconds``
(3 min), the engine's 60 s cycle and the incident tracker's open/resolve hysteresis. They are
production choices, and ``bench/nab_cycle.py`` measures what they do to the score.

Split B is the held-out split: it is the headline of ``bench/nab_score.py`` and
``bench/nab_cycle.py``. Its files were not used to choose any constant above. The whole-corpus
score at a threshold swept on all 58 files is NAB's leaderboard protocol (in-sample threshold)
and is printed only under that label.
"""

from __future__ import annotations

from collections.abc import Iterable

SPLIT_A = "A"
SPLIT_B = "B"
SPLIT_TITLES = {
    SPLIT_A: "split A (chose the threshold and stream settings)",
    SPLIT_B: "split B (held out: chose nothing)",
}


def split_files(names: Iterable[str]) -> tuple[list[str], list[str]]:
    """(split A, split B): artificial + every other real file by sorted name, and the rest."""
    ordered = sorted(names)
    real = [n for n in ordered if not n.startswith("artificial")]
    artificial = [n for n in ordered if n.startswith("artificial")]
    return artificial + real[0::2], real[1::2]


def split_of(name: str, names: Iterable[str]) -> str:
    """``"A"`` or ``"B"``: the split of one file among ``names``."""
    split_a, split_b = split_files(names)
    if name in split_a:
        return SPLIT_A
    if name in split_b:
        return SPLIT_B
    raise KeyError(f"{name} is not among the given files")

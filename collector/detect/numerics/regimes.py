"""Busy and stalled regimes of a GPU's utilisation: a two-regime Markov switching model.

The input-bound screen (:func:`.waste.input_bound_verdicts`) calls a starving training job
"cycling" when its utilisation moves a lot from slot to slot (the sawtooth of a data loader that
cannot keep up, stalls of a few seconds) or falls from busy to stalled several times in the
window (stalls of 40 s to minutes, :func:`.waste.stall_episodes`). Noise moves a lot too.
The confirm fits statsmodels' ``MarkovRegression`` (two regimes,
each with its own mean and variance, and a Markov chain between them) to the job's utilisation
and asks whether the two regimes are really apart: Ashman's D,
``sqrt(2)·|mu_busy − mu_stall| / sqrt(s_busy² + s_stall²)``, which is above 2 only for a clean
separation of two components. Measured on 180 slots (``tests/test_regimes.py``): a GPU that
stalls to ~0 between busy stretches gives D ≈ 30; unimodal noise, clipped at 0 or not, and a
uniform spread give D ≈ 2-3. ``MIN_SEPARATION`` = 4 sits between. The fit also says how much of
the time the GPU stalled and how long a stall lasts on average (the chain's expected duration):
on 90 slots of 10 s with stalls of 40 s, 60 s, 2 min and 3 min (``tests/test_detect_waste.py``)
it reports 40, 67, 137 and 180 s.

A series that switches at every sample puts the chain's transition probabilities on their bound
and the model cannot be fitted (statsmodels raises): :func:`busy_stall_regimes` returns None
and the caller keeps the screen's word, as it does for too few samples (``MIN_POINTS``).
Missing slots are dropped (the chain then runs over known samples only). A fit costs about
70 ms for 180 points (up to ~600 ms when the optimiser struggles); only the screen's candidates
pay it.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from statsmodels.tsa.regime_switching.markov_regression import MarkovRegression

MIN_POINTS = 30
MIN_SEPARATION = 4.0


@dataclass(frozen=True, slots=True)
class Regimes:
    """The two regimes of a utilisation series, stalled (the lower mean) and busy."""

    stall_level: float
    busy_level: float
    stall_share: float
    """Mean smoothed probability of the stalled regime: the share of the time spent stalled."""
    stall_slots: float
    """Expected duration of a stall, in samples."""
    separation: float
    """Ashman's D between the regimes."""

    @property
    def distinct(self) -> bool:
        """Two regimes clearly apart, each holding some of the time."""
        return self.separation >= MIN_SEPARATION and 0.02 <= self.stall_share <= 0.98


def busy_stall_regimes(values: npt.ArrayLike) -> Regimes | None:
    """Fit the two-regime model on the known values; None when it cannot be fitted."""
    x = np.asarray(values, dtype=np.float64).ravel()
    x = x[np.isfinite(x)]
    if x.size < MIN_POINTS or float(np.ptp(x)) == 0.0:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence chatter; a failed fit raises below
        model = MarkovRegression(x, k_regimes=2, switching_variance=True)
        try:
            result = model.fit(disp=False)
        except (RuntimeError, np.linalg.LinAlgError, ValueError):
            return None  # a chain on its bounds (switches at every sample), or a singular fit
    params = dict(zip(model.param_names, np.asarray(result.params, dtype=np.float64), strict=True))
    means = [float(params[f"const[{i}]"]) for i in range(2)]
    variances = [float(params[f"sigma2[{i}]"]) for i in range(2)]
    if not all(math.isfinite(v) for v in (*means, *variances)):
        return None
    stall = int(np.argmin(means))
    busy = 1 - stall
    spread = math.sqrt(max(variances[0] + variances[1], 1e-12))
    probabilities = np.asarray(result.smoothed_marginal_probabilities, dtype=np.float64)
    durations = np.asarray(result.expected_durations, dtype=np.float64).ravel()
    return Regimes(
        stall_level=float(means[stall]),
        busy_level=float(means[busy]),
        stall_share=float(np.mean(probabilities[:, stall])),
        stall_slots=float(durations[stall]),
        separation=float(math.sqrt(2) * abs(means[busy] - means[stall]) / spread),
    )

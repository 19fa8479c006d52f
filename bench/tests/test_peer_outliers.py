"""The bench's peer screen (``bench.peer_outliers``): members of a group outside the
peers' MAD band too often, with gaps (NaN) that never count as normal nor anomalous."""

from __future__ import annotations

import numpy as np
import pytest

from bench.peer_outliers import peer_outliers

N = np.nan
PEERS = [[1.0, 1.0], [1.1, 1.1], [1.2, 1.2], [1.3, 1.3], [1.4, 1.4]]


def test_peer_outliers_one_member_unlike_its_peers():
    rng = np.random.default_rng(2)
    group = 0.8 + 0.02 * rng.normal(size=(8, 60))
    group[3, 20:] = 0.1  # one worker stalls for two thirds of the window
    group[5, ::7] = N  # another has gaps: not an outlier for that
    result = peer_outliers(group, tolerance=3.0, outside_fraction=0.3)
    assert np.flatnonzero(result.outlier).tolist() == [3]
    assert result.fraction_outside[3] == pytest.approx(40 / 60, abs=0.05)


@pytest.mark.parametrize(
    ("rows", "min_peers", "outlier", "fraction"),
    [
        # Members 1.0..1.4 around a median of 1.2 (MAD 0.1): 9.0 is far outside the band.
        pytest.param([*PEERS, [9.0, 9.0]], 3, [0] * 5 + [1], [0] * 5 + [1], id="basic"),
        pytest.param([*PEERS, [9.0, N]], 3, [0] * 5 + [1], [0] * 5 + [1], id="gap-not-normal"),
        pytest.param(
            [*PEERS[:2], [N, N], [N, N], [N, N], [9.0, 9.0]],
            4,
            [0] * 6,
            [N] * 6,
            id="thin-group-unjudged",
        ),
        pytest.param([[1.0, N], [1.0, N], [N, N]], 2, [0, 0, 0], [0, 0, N], id="absent-member"),
        pytest.param([[1.0], [9.0]], 3, [0, 0], [N, N], id="too-few-peers-unjudged"),
        # The odd member is missing half the time: judged on its known slots only (2 of 4).
        pytest.param(
            [*[[1.0 + i / 10] * 4 for i in range(5)], [9.0, N, 9.0, N]],
            3,
            [0] * 5 + [1],
            [0] * 5 + [1],
            id="outlier-with-gaps",
        ),
        # Missing exactly where it would be far off: the gaps are not "outside" either.
        pytest.param(
            [*[[1.0 + i / 10] * 4 for i in range(5)], [1.2, N, N, 9.0]],
            3,
            [0] * 6,
            [0] * 5 + [1 / 2],
            id="gaps-not-outside",
        ),
        # Slot 1 has only two known members (< min_peers): nobody is judged there, so the
        # far member's fraction is 1 of 1 judged slots, not 1 of 2.
        pytest.param(
            [[1.0, 1.0], [1.1, N], [1.2, N], [9.0, 9.0]],
            3,
            [0, 0, 0, 1],
            [0, 0, 0, 1],
            id="thin-slot-unjudged",
        ),
    ],
)
def test_peer_outliers_table(rows, min_peers, outlier, fraction):
    result = peer_outliers(np.array(rows), 3.0, 0.5, min_peers=min_peers)
    assert result.outlier.astype(int).tolist() == outlier
    np.testing.assert_allclose(result.fraction_outside, np.array(fraction, dtype=float))


def test_peer_outliers_many_groups_match_one_at_a_time():
    rng = np.random.default_rng(3)
    groups = rng.normal(size=(5, 8, 30))
    groups[2, 6] += 10.0
    batched = peer_outliers(groups, 3.0, 0.2)
    for g in range(5):
        single = peer_outliers(groups[g], 3.0, 0.2)
        np.testing.assert_array_equal(batched.outlier[g], single.outlier)
    assert batched.outlier[2, 6]
    assert batched.outlier.sum() == 1

"""A series that had not started yet: its leading zeros are not training windows.

m-large chunk-116 is idle for its first 3.8 days (of a 7-day training half); calibrated over
those all-zero windows, the bound was anchored on the level (reserving only a small offset
while idle), and lent 0.36x the best baseline at 60 min / 1 % (0.67x without them;
``benchmarks.predictor_pool_sweep``'s ``now`` column)."""

from __future__ import annotations

import numpy as np
import pytest

from predictor import risk as rk
from predictor.generator import generate

STEP = 300
T0 = 1_700_000_000 - 1_700_000_000 % 86400


@pytest.mark.parametrize("h", [1, 6])
def test_leading_zeros_leave_the_fitted_model_unchanged(h: int) -> None:
    y = generate(days=4, step=STEP, seed=21).values
    idle = 400  # about 1.4 days before the series starts
    padded = np.concatenate([np.zeros(idle), y])
    upto = 600
    fitted = rk.fit_risk(y, h, 0.05, STEP, upto, T0)
    with_idle = rk.fit_risk(padded, h, 0.05, STEP, idle + upto, T0 - idle * STEP)
    assert with_idle == fitted
    q = rk.track_q(fitted, y, upto + 1, len(y), T0)
    q2 = rk.track_q(with_idle, padded, idle + upto + 1, len(padded), T0 - idle * STEP)
    np.testing.assert_array_equal(q[upto + 1 :], q2[idle + upto + 1 :])


def test_a_series_that_started_too_late_says_so() -> None:
    y = np.concatenate([np.zeros(500), generate(days=1, step=STEP, seed=21).values[:40]])
    with pytest.raises(rk.NotEnoughWindows, match="after its first 500 steps of zero demand"):
        rk.fit_risk(y, 6, 0.01, STEP, len(y) - 1, T0)


def test_an_all_zero_history_is_not_trimmed_away() -> None:
    assert rk._idle_start(np.zeros(10)) == 0
    assert rk._idle_start(np.array([np.nan, 0.0, 0.0, 3.0, 0.0])) == 3

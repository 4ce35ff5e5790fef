"""The shared width model (one learnt width over several series' training parts): how it is
learnt, when it competes, and the errors it gives (measured in benchmarks.predictor_pool_sweep;
the leak test is in test_predictor_leak.py)."""

from __future__ import annotations

import numpy as np
import pytest

from predictor import risk as rk
from predictor.generator import generate

T0 = 1_700_000_000 - 1_700_000_000 % 86400


@pytest.fixture(scope="module")
def shared() -> rk.SharedWidth:
    hists = [(generate(days=4, step=300, seed=s).values[:576], T0) for s in (12, 13)]
    return rk.fit_shared_width(hists, 6, 300)


def test_learnt_on_every_series_and_on_their_older_part(shared: rk.SharedWidth) -> None:
    assert shared.series == 2 and shared.older is not None and shared.full is not None
    assert (shared.horizon, shared.step) == (6, 300)


def test_a_shared_width_for_another_horizon_is_refused(shared: rk.SharedWidth) -> None:
    y = generate(days=4, step=300, seed=14).values
    with pytest.raises(ValueError, match="shared width model is for 6 steps of 300s, not 12 steps"):
        rk.fit_risk(y, 12, 0.05, 300, 575, T0, shared)


def test_it_competes_in_the_validation_and_is_refitted_when_chosen(
    shared: rk.SharedWidth, monkeypatch: pytest.MonkeyPatch
) -> None:
    y = generate(days=4, step=300, seed=14).values
    assert not rk.fit_risk(y, 6, 0.05, 300, 575, T0).shared
    monkeypatch.setattr(rk, "SHARED_MARGIN", -0.9)  # made to win: the wiring, not the figures
    p = rk.fit_risk(y, 6, 0.05, 300, 575, T0, shared)
    assert p.shared and p.width_model is shared.full
    assert p.to_json()["width"] == f"gbm-quantile-{rk.GBM_LEVEL}-shared" and p.to_json()["shared_width"]
    assert p.level_ref == pytest.approx(np.log((1 + rk.GBM_OFFSET) * np.mean(y[:576])))
    q = rk.track_q(p, y, 576, len(y), T0)
    assert np.all(np.isfinite(rk.bound(p, y, q, 0.0, T0)[576:]))


def test_a_series_too_short_for_its_features_does_not_use_it(
    shared: rk.SharedWidth, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fewer trailing windows than the shared model was learnt with: it does not compete."""
    monkeypatch.setattr(rk, "SHARED_MARGIN", -0.9)
    y = generate(days=4, step=300, seed=14).values[:150]  # 12.5 h: the 6-hour features exist, barely
    short = rk.fit_shared_width([(y[:60], T0)], 6, 300)
    assert short.full is None  # fewer than GBM_MIN_ROWS windows
    assert not rk.fit_risk(y, 6, 0.05, 300, 59, T0, shared).shared  # 60 points: no 6-hour window


def test_width_features_have_the_same_columns_at_any_length() -> None:
    """A width model fitted while the history is shorter than its longest trailing window (6 h)
    predicts on the longer history of a later refresh: the columns must not depend on the length."""
    z = np.log(1.0 + np.abs(np.sin(np.arange(1000) / 50.0)))
    short, full = rk.width_features(z[:100], 60, 0), rk.width_features(z, 60, 0)
    assert short.shape[1] == full.shape[1]
    assert np.isnan(short[:, -2]).all(), "the 6 h volatility column is unknown on 100 minutes"
    np.testing.assert_array_equal(short[:, 0], full[:100, 0])


def test_a_history_shorter_than_the_longest_feature_window_still_fits_and_then_predicts_longer() -> None:
    """Fitted on 5 hours of 1-minute data (the 6 h features unknown on every row), the width model
    predicts on the 8 hours a later refresh holds: no error from the fit or the prediction."""
    rng = np.random.default_rng(3)
    z = np.log(10.0 + np.abs(np.cumsum(rng.normal(size=480))))
    zmax = np.log(rk.window_max(np.exp(z), 30))
    short = rk.width_features(z[:300], 60, 0)
    model = rk._fit_width_model(z[:300], zmax[:300], short, 270)
    assert model is not None
    pred = model.predict(rk.width_features(z, 60, 0))
    assert pred.shape == (480,) and np.isfinite(pred).all()

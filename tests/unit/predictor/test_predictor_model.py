"""Features, baselines, the model and the generator: pure logic on small series."""

from __future__ import annotations

import numpy as np
import pytest

from predictor import baselines
from predictor.features import FeatureSpec, Transform, build_features, rolling_mean_std, shift, targets
from predictor.generator import generate
from predictor.model import QuantileForecaster, conformal_correction
from predictor.series import Series
from tests.support.predictor_fixtures import small_config


def test_shift_and_targets() -> None:
    z = np.arange(5, dtype=np.float64)
    assert np.array_equal(shift(z, 2)[2:], [0, 1, 2])
    assert np.isnan(shift(z, 2)[:2]).all()
    assert np.array_equal(shift(z, -1)[:4], [1, 2, 3, 4])
    t = targets(z, 2)
    assert np.array_equal(t[:3], [2, 2, 2])
    assert np.isnan(t[3:]).all()


def test_rolling_ignores_gaps() -> None:
    z = np.array([1.0, np.nan, 3.0, 5.0])
    mean, std = rolling_mean_std(z, 3)
    assert mean[3] == pytest.approx(4.0)
    assert std[3] == pytest.approx(1.0)


def test_features_never_read_the_future() -> None:
    s = generate(days=8, step=600, seed=1)
    spec = FeatureSpec(step=600)
    z = Transform.fit(s.values).forward(s.values)
    t = s.times.astype(np.float64)
    x = build_features(z, t, 6, spec)
    i = 1000
    z2 = z.copy()
    z2[i + 1 :] = 123.0  # change everything after the origin
    x2 = build_features(z2, t, 6, spec)
    np.testing.assert_array_equal(x[: i + 1], x2[: i + 1])


def test_model_fit_and_predict_have_no_look_ahead() -> None:
    s = generate(days=6, step=600, seed=2)
    m = QuantileForecaster(small_config()).fit(s, upto=700)
    p1 = m.predict(s, np.array([700]))[1800]
    v = s.values.copy()
    v[701:] *= 3.0
    s2 = Series(start=s.start, step=s.step, values=v)
    m2 = QuantileForecaster(small_config()).fit(s2, upto=700)
    p2 = m2.predict(s2, np.array([700]))[1800]
    np.testing.assert_allclose(p1, p2)


def test_quantiles_are_ordered_and_scale_with_the_level() -> None:
    s = generate(days=5, step=600, seed=3)
    m = QuantileForecaster(small_config()).fit(s)
    origins = np.arange(600, 700)
    p = m.predict(s, origins)[1800]
    assert p.shape == (100, 2)
    assert np.all(p[:, 0] <= p[:, 1])  # median <= q0.9
    big = Series(start=s.start, step=s.step, values=s.values * 10)
    pb = QuantileForecaster(small_config()).fit(big).predict(big, origins)[1800]
    # predicting relative change in log space: a 10x series gets ~10x forecasts
    ratio = np.median(pb[:, 0] / p[:, 0])
    assert 8.0 < ratio < 12.5


def test_gap_at_the_origin_gives_no_forecast() -> None:
    s = generate(days=4, step=600, seed=4)
    v = s.values.copy()
    v[500] = np.nan
    s = Series(start=s.start, step=s.step, values=v)
    p = QuantileForecaster(small_config()).fit(s, upto=450).predict(s, np.array([499, 500]))[1800]
    assert not np.isnan(p[0]).any()
    assert np.isnan(p[1]).all()


def test_conformal_correction_reaches_the_nominal_level() -> None:
    rng = np.random.default_rng(0)
    scores = rng.normal(size=2000)
    c = conformal_correction(scores, 0.9)
    fresh = rng.normal(size=20000)
    assert abs(np.mean(fresh <= c) - 0.9) < 0.02
    assert conformal_correction(scores, 0.1) < 0 < c


def test_negative_values_are_refused() -> None:
    s = Series(start=0, step=600, values=np.linspace(-1, 1, 500))
    with pytest.raises(ValueError, match=">= 0"):
        QuantileForecaster(small_config()).fit(s)


def test_baselines() -> None:
    y = np.arange(20, dtype=np.float64)
    o = np.array([10, 12])
    assert baselines.persistence(y, o).tolist() == [10, 12]
    assert baselines.seasonal_naive(y, o, 2, 5).tolist() == [7, 9]  # y[i + h - P]
    assert np.isnan(baselines.seasonal_naive(y, o, 6, 5)).all()  # period shorter than horizon
    y2 = y.copy()
    y2[7] = np.nan
    assert baselines.seasonal_naive(y2, o, 2, 5).tolist() == [10, 9]  # gap → persistence
    e = baselines.ewma(np.array([0.0, 10.0, np.nan, 10.0]), np.array([1, 2, 3]), 0.5)
    assert e.tolist() == [5.0, 5.0, 7.5]
    assert baselines.tune_ewma_alpha(np.ones(50), 2, 49) in baselines.EWMA_ALPHAS


def test_generator_is_deterministic_and_shaped_like_serving() -> None:
    a = generate(days=14, step=600, seed=7)
    b = generate(days=14, step=600, seed=7)
    c = generate(days=14, step=600, seed=8)
    np.testing.assert_array_equal(a.values, b.values)
    assert not np.array_equal(a.values, c.values)
    assert len(a) == 2016
    assert np.all(a.values >= 0)
    hours = (a.times % 86400) // 3600
    day = np.mean(a.values[(hours >= 12) & (hours < 18)])
    night = np.mean(a.values[(hours >= 0) & (hours < 6)])
    assert day > 1.4 * night  # diurnal cycle
    dow = ((a.times // 86400) + 3) % 7
    assert np.mean(a.values[dow >= 5]) < 0.9 * np.mean(a.values[dow < 5])  # quieter weekends
    g = generate(days=2, step=60, seed=1, gap_fraction=0.1)
    assert 0.05 < np.mean(np.isnan(g.values)) <= 0.1

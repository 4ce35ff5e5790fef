"""No forecast reads past its origin: change only future values, every forecast stays bit-identical.

The horizons include one equal to a seasonal period (the case where a seasonal feature once
read ``z[i + 1]``) and one longer than it; the series uses compressed seasons (a one-hour
"day") so the case arises on a small series.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from predictor import risk as rk
from predictor.features import FeatureSpec, Transform, build_features
from predictor.generator import generate
from predictor.model import QuantileForecaster
from predictor.series import Series
from tests.support.predictor_fixtures import small_config

STEP = 60
DAY = 3600  # compressed: a day of 60 steps, a week of 420
WEEK = 7 * DAY


def _future_changed(s: Series, origin: int, seed: int) -> Series:
    v = s.values.copy()
    rng = np.random.default_rng(seed)
    v[origin + 1 :] = rng.uniform(0.0, 5.0 * float(np.nanmax(v)), len(v) - origin - 1)
    v[origin + 5 : origin + 9] = np.nan  # and new gaps after the origin
    return Series(start=s.start, step=s.step, values=v, name=s.name)


@pytest.fixture(scope="module")
def series() -> Series:
    return generate(days=1.5, step=STEP, seed=11)  # 2160 points: three weeks of compressed time


@pytest.mark.parametrize("horizon_steps", [1, 59, 60, 61, 420])
def test_features_at_a_seasonal_horizon_read_nothing_after_the_origin(series: Series, horizon_steps: int) -> None:
    spec = FeatureSpec(step=STEP, day=DAY, week=WEEK)
    assert horizon_steps not in (60, 420) or horizon_steps in spec.periods()
    z = Transform.fit(series.values).forward(series.values)
    t = series.times.astype(np.float64)
    x = build_features(z, t, horizon_steps, spec)
    for origin in (900, 1500):
        z2 = Transform.fit(series.values).forward(_future_changed(series, origin, origin).values)
        x2 = build_features(z2, t, horizon_steps, spec)
        np.testing.assert_array_equal(x[: origin + 1], x2[: origin + 1])


def test_quantile_forecasts_are_bit_identical_when_only_the_future_changes(series: Series) -> None:
    cfg = small_config(horizons=(DAY, DAY + STEP, 600), day=DAY, week=WEEK)
    origin = 1500
    # the later origin makes predict() read the series beyond ``origin``: the forecasts at and
    # before ``origin`` must not see it
    origins = np.array([*range(origin - 50, origin + 1), origin + 300])
    m = QuantileForecaster(cfg).fit(series, upto=origin)
    p1 = m.predict(series, origins)
    changed = _future_changed(series, origin, 3)
    m2 = QuantileForecaster(cfg).fit(changed, upto=origin)
    p2 = m2.predict(changed, origins)
    for h in cfg.horizons:
        np.testing.assert_array_equal(p1[h][:-1], p2[h][:-1])


@pytest.mark.parametrize("h", [1, 10, 60])
def test_window_max_bounds_are_bit_identical_when_only_the_future_changes(h: int) -> None:
    series = generate(days=4, step=300, seed=12)  # long enough for the time-of-day widths
    t0, train, origin = series.start, 600, 900
    fitted = rk.fit_risk(series.values, h, 0.05, 300, train - 1, t0)
    p = fitted if fitted.tod else replace(fitted, tod=tuple(1.0 + 0.5 * np.sin(np.arange(24) / 4.0)))
    q = rk.track_q(p, series.values, train, len(series), t0)
    b = rk.bound(p, series.values, q, 0.0, t0)
    changed = _future_changed(series, origin, 5).values
    assert rk.fit_risk(changed, h, 0.05, 300, train - 1, t0) == fitted
    p2 = p
    q2 = rk.track_q(p2, changed, train, len(series), t0)
    b2 = rk.bound(p2, changed, q2, 0.0, t0)
    np.testing.assert_array_equal(q[: origin + 1], q2[: origin + 1])
    np.testing.assert_array_equal(b[: origin + 1], b2[: origin + 1])
    now = rk.forecast_now(p, series.values[: origin + 1], 500, t0)
    assert now == rk.forecast_now(p, changed[: origin + 1], 500, t0)


@pytest.mark.parametrize("h", [1, 10])
def test_learnt_width_is_bit_identical_when_only_the_future_changes(h: int) -> None:
    series = generate(days=4, step=300, seed=12)
    t0, train, origin = series.start, 600, 900
    z = np.log(series.values + 50.0)
    x = rk.width_features(z, 300, t0)
    changed = _future_changed(series, origin, 7).values
    x2 = rk.width_features(np.log(changed + 50.0), 300, t0)
    np.testing.assert_array_equal(x[: origin + 1], x2[: origin + 1])
    # a width model fitted on the training part, then tracked and bounded past the origin
    zmax = np.log(rk.window_max(series.values[:train], h) + 50.0)
    g = rk._fit_width_model(z[:train], zmax, x[:train], train)
    assert g is not None
    p = replace(rk.fit_risk(series.values, h, 0.05, 300, train - 1, t0), offset=50.0, tod=(), width_model=g)
    q = rk.track_q(p, series.values, train, len(series), t0)
    q2 = rk.track_q(p, changed, train, len(series), t0)
    np.testing.assert_array_equal(q[: origin + 1], q2[: origin + 1])
    b, b2 = rk.bound(p, series.values, q, 0.0, t0), rk.bound(p, changed, q2, 0.0, t0)
    np.testing.assert_array_equal(b[: origin + 1], b2[: origin + 1])
    assert rk.forecast_now(p, series.values[: origin + 1], 500, t0) == rk.forecast_now(
        p, changed[: origin + 1], 500, t0
    )


@pytest.mark.parametrize(("rel_offset", "anchor"), [(1e-6, 0), (2.0, 6), (100.0, 288)])
def test_constant_width_is_bit_identical_when_only_the_future_changes(rel_offset: float, anchor: int) -> None:
    """The constant width anchored on now or on the max of a trailing window (reads ``z[: i + 1]``)."""
    series = generate(days=4, step=300, seed=12)
    t0, train, origin = series.start, 600, 900
    fitted = rk.fit_risk(series.values, 10, 0.05, 300, train - 1, t0)
    mean = float(np.mean(series.values[:train]))
    p = replace(fitted, offset=rel_offset * mean, vol_window=0, eps=1.0, tod=(), width_model=None, anchor=anchor)
    changed = _future_changed(series, origin, 9).values
    q, q2 = rk.track_q(p, series.values, train, len(series), t0), rk.track_q(p, changed, train, len(series), t0)
    np.testing.assert_array_equal(q[: origin + 1], q2[: origin + 1])
    b, b2 = rk.bound(p, series.values, q, 0.0, t0), rk.bound(p, changed, q2, 0.0, t0)
    np.testing.assert_array_equal(b[: origin + 1], b2[: origin + 1])
    assert rk.forecast_now(p, series.values[: origin + 1], 500, t0) == rk.forecast_now(
        p, changed[: origin + 1], 500, t0
    )


def _clients(values: list[np.ndarray], t0: int) -> list[Series]:
    return [Series(start=t0, step=300, values=v, name=f"ds/client-{i}") for i, v in enumerate(values)]


def _shared_bounds(clients: list[Series], train: int) -> dict[tuple[str, int], np.ndarray]:
    """Every client's bound at every origin, with the shared width model in use (forced, so the
    test does not depend on the validation choosing it)."""
    from benchmarks.predictor_pool_sweep import shared_widths

    shared = shared_widths(clients)
    out = {}
    for c in clients:
        for h, sw in shared[c.name].items():
            assert sw.full is not None and sw.series == len(clients)
            fitted = rk.fit_risk(c.values, h, 0.05, 300, train - 1, c.start, sw)
            mean = float(np.nanmean(c.values[:train]))
            p = replace(
                fitted,
                offset=rk.GBM_OFFSET * mean,
                tod=(),
                width_model=sw.full,
                shared=True,
                level_ref=rk._level_ref(mean),
            )
            q = rk.track_q(p, c.values, train, len(c), c.start)
            out[(c.name, h)] = rk.bound(p, c.values, q, 0.0, c.start)
            out[(c.name, -h)] = np.array([fitted.q0, fitted.offset, fitted.anchor, float(fitted.shared)])
    return out


def test_shared_width_is_bit_identical_when_only_one_clients_future_changes() -> None:
    """A width model learnt on every client's training half: changing one client's values after
    the training half leaves every forecast of every client unchanged up to the origin."""
    t0 = 1_700_000_000 - 1_700_000_000 % 86400
    values = [generate(days=4, step=300, seed=s).values for s in (12, 13, 14)]
    train = len(values[0]) // 2
    origin = train + 100  # the first client's values change from its evaluated part on
    before = _shared_bounds(_clients(values, t0), train)
    changed = [_future_changed(_clients(values, t0)[0], origin, 11).values, *values[1:]]
    changed[0][train:origin] = changed[0][train:origin] * 3.0  # the first client's evaluated part, too
    after = _shared_bounds(_clients(changed, t0), train)
    for key, b in before.items():
        if key[1] < 0:
            np.testing.assert_array_equal(b, after[key])
        elif key[0] == "ds/client-0":
            np.testing.assert_array_equal(b[:train], after[key][:train])
        else:  # another client: its data and the shared model are unchanged, so every forecast is
            np.testing.assert_array_equal(b, after[key])

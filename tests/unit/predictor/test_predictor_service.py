"""The service's pure parts: stale logic and safe bounds, buffers, Prometheus result parsing, storage."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from predictor.backtest import backtest
from predictor.generator import generate
from predictor.ingest import HistoryBuffer, IngestError, grid_from_result
from predictor.model import QuantileForecaster
from predictor.series import Series
from predictor.service import NoForecast, PoolConfig, PredictorService, Settings, build_response, load_pools
from predictor.store import ModelStore
from rose_common.forecast_api import ForecastResponse
from tests.support.predictor_fixtures import small_config

POOL = PoolConfig(name="pool-a", query="sum(x)", capacity=64)
QS = (0.5, 0.9)


@pytest.fixture(scope="module")
def fitted() -> tuple[Series, QuantileForecaster]:
    s = generate(days=4, step=600, seed=5)
    return s, QuantileForecaster(small_config()).fit(s)


def test_fresh_forecast(fitted: tuple[Series, QuantileForecaster]) -> None:
    s, m = fitted
    now = s.end + 30.0
    r = build_response(POOL, s, m, "v1", now, [1800], QS, 300.0)
    ForecastResponse.model_validate_json(r.model_dump_json())  # the shared wire model
    assert not r.stale
    assert r.data_age_seconds == pytest.approx(30.0)
    assert r.current == pytest.approx(s.values[-1])
    (p,) = r.points
    assert p.horizon_seconds == 1800
    assert p.timestamp.timestamp() == s.end + 1800
    assert set(p.quantiles) == {"0.5", "0.9"}
    assert p.quantiles["0.5"] <= p.quantiles["0.9"] < 64


def test_old_data_is_stale_with_the_capacity_as_bound(fitted: tuple[Series, QuantileForecaster]) -> None:
    s, m = fitted
    r = build_response(POOL, s, m, "v1", s.end + 301.0, [1800], QS, 300.0)
    assert r.stale
    assert r.points[0].quantiles == {"0.5": 64.0, "0.9": 64.0}


def test_no_model_without_capacity_uses_the_history_max(fitted: tuple[Series, QuantileForecaster]) -> None:
    s, _ = fitted
    pool = PoolConfig(name="b", query="q")
    r = build_response(pool, s, None, "none", s.end + 1.0, [600, 1800], QS, 300.0)
    assert r.stale
    assert [p.quantiles["0.9"] for p in r.points] == [float(np.nanmax(s.values))] * 2


def test_no_data_at_all() -> None:
    r = build_response(POOL, None, None, "none", 1000.0, [1800], QS, 300.0)
    assert r.stale
    assert r.current is None
    assert r.data_age_seconds is None
    assert r.points[0].quantiles["0.9"] == 64.0
    with pytest.raises(NoForecast, match="no capacity configured"):
        build_response(PoolConfig(name="b", query="q"), None, None, "none", 1000.0, [1800], QS, 300.0)


def test_trailing_gap_anchors_on_the_last_observation(fitted: tuple[Series, QuantileForecaster]) -> None:
    s, m = fitted
    v = s.values.copy()
    v[-2:] = np.nan
    s2 = Series(start=s.start, step=s.step, values=v)
    r = build_response(POOL, s2, m, "v1", s.end, [1800], QS, 3600.0)
    assert not r.stale
    assert r.last_observation_at is not None
    assert r.last_observation_at.timestamp() == s.end - 2 * s.step
    assert r.data_age_seconds == 2 * s.step


def test_history_buffer_is_bounded_and_merges() -> None:
    b = HistoryBuffer(step=60, capacity=10)
    b.merge(Series(start=0, step=60, values=np.arange(8, dtype=np.float64)))
    b.merge(Series(start=300, step=60, values=np.array([50.0, np.nan, 70.0, 80.0, 90.0, 100.0])))
    assert b.values is not None
    assert len(b.values) == 10
    assert b.start == 60
    assert b.values.tolist() == [1, 2, 3, 4, 50, 6, 70, 80, 90, 100]  # a NaN never overwrites data
    assert b.last_observed() == (600, 100.0)
    with pytest.raises(ValueError, match="step"):
        b.merge(Series(start=0, step=30, values=np.ones(2)))


def test_grid_from_prometheus_result() -> None:
    res = [{"metric": {}, "values": [[100, "1"], [160, "NaN"], [280, "4.5"]]}]
    v = grid_from_result(res, 100, 280, 60, "q")
    assert np.isnan(v[1]) and np.isnan(v[2])  # nothing returned → a gap, not a zero
    assert v[0] == 1.0 and v[3] == 4.5
    assert np.isnan(grid_from_result([], 0, 120, 60, "q")).all()
    two = [{"metric": {"pool": "a"}, "values": []}, {"metric": {"pool": "b"}, "values": []}]
    with pytest.raises(IngestError, match=r"returned 2 series .* sum\(\.\.\.\)"):
        grid_from_result(two, 0, 120, 60, "q")


def test_store_round_trip_and_retention(tmp_path: Path, fitted: tuple[Series, QuantileForecaster]) -> None:
    s, m = fitted
    store = ModelStore(tmp_path, keep=2)
    versions = [store.save("pool-a", m, {"fitted_at": 1000.0 + i}, now=1_700_000_000 + i) for i in range(3)]
    assert store.versions("pool-a") == versions[1:]
    found = store.load_latest("pool-a")
    assert found is not None
    version, loaded, meta = found
    assert version == versions[-1]
    assert meta["fitted_at"] == 1002.0
    np.testing.assert_allclose(loaded.predict(s, np.array([500]))[1800], m.predict(s, np.array([500]))[1800])
    assert not list(tmp_path.rglob(".tmp-*"))
    assert store.load_latest("other") is None


def test_pools_file_errors(tmp_path: Path) -> None:
    p = tmp_path / "pools.yaml"
    p.write_text("pools:\n  - name: a\n    query: sum(x)\n    capacity: 8\n")
    assert load_pools(p)[0].capacity == 8
    p.write_text("pools:\n  - name: Bad Name\n    query: q\n")
    with pytest.raises(ValueError, match="invalid"):
        load_pools(p)
    p.write_text("pools:\n  - {name: a, query: q}\n  - {name: a, query: r}\n")
    with pytest.raises(ValueError, match="duplicate pool names"):
        load_pools(p)


def test_backtest_json_has_every_method(tmp_path: Path) -> None:
    s = generate(days=10, step=1800, seed=9)  # 30-minute steps keep this test cheap
    r = backtest(s, [1800, 3600], 0.9, initial_train=340, refit_every=96, config=small_config())
    out = r.to_json()
    json.dumps(out)
    h = out["horizons"]["1h"]
    assert set(h["baselines"]) == {"persistence", "seasonal_day", "seasonal_week", "ewma"}
    assert h["baselines"]["seasonal_week"] is not None  # 7 days of history: the week baseline is available
    for k in ("wape", "mase", "coverage"):
        assert 0 <= h["model"][k] < 10
    assert h["n_eval"] > 100
    assert "ratio" in r.table()


class _DownSource:
    """Prometheus unreachable."""

    def range(self, query: str, start: int, end: int, step: int) -> Series:
        raise IngestError("range query to http://127.0.0.1:1 failed: connection refused")


def test_restart_loads_the_newest_compatible_model_and_survives_ingest_errors(
    tmp_path: Path, fitted: tuple[Series, QuantileForecaster]
) -> None:
    _, m = fitted
    store = ModelStore(tmp_path)
    v = store.save("pool-a", m, {"fitted_at": 2e9 - 86400}, now=1_700_000_000)
    svc = PredictorService([POOL], _DownSource(), Settings(step=600, model=m.config), store, clock=lambda: 2e9)
    assert svc.pools["pool-a"].version == v
    svc.refresh()
    r = svc.forecast("pool-a")
    assert r is not None and r.stale and r.points[0].quantiles["0.9"] == 64.0
    assert svc.metrics.ingests.labels("pool-a", "error")._value.get() == 1
    other = Settings(step=600, model=small_config(horizons=(600,)))
    assert PredictorService([POOL], _DownSource(), other, store).pools["pool-a"].model is None


def test_a_model_saved_under_other_library_versions_is_refit_not_loaded(
    tmp_path: Path, fitted: tuple[Series, QuantileForecaster]
) -> None:
    _, m = fitted
    store = ModelStore(tmp_path)
    v = store.save("pool-a", m, {"fitted_at": time.time()}, now=1_700_000_000)
    meta_path = tmp_path / "pool-a" / f"{v}.json"
    meta = json.loads(meta_path.read_text())
    assert set(meta["runtime"]) == {"scikit-learn", "numpy"}
    settings = Settings(step=600, model=m.config)
    assert PredictorService([POOL], _DownSource(), settings, store).pools["pool-a"].version == v
    for lib in ("scikit-learn", "numpy"):
        other = {**meta, "runtime": {**meta["runtime"], lib: "0.0.1"}}
        meta_path.write_text(json.dumps(other))
        assert PredictorService([POOL], _DownSource(), settings, store).pools["pool-a"].model is None, lib
    meta_path.write_text(json.dumps({k: x for k, x in meta.items() if k != "runtime"}))  # saved before recording
    assert PredictorService([POOL], _DownSource(), settings, store).pools["pool-a"].model is None


def test_window_max_bounds_per_risk_in_the_forecast_and_gpus_with_a_capacity_per_gpu() -> None:
    s = generate(days=4, step=600, seed=5)
    pool = PoolConfig(name="pool-a", query="sum(x)", capacity=64, capacity_per_gpu=2.0)
    settings = Settings(step=600, risks=(0.01, 0.05), model=small_config())
    svc = PredictorService([pool], _DownSource(), settings)
    st = svc.pools["pool-a"]
    st.risk_models = svc._fit_risks("pool-a", s)
    assert sorted(st.risk_models) == [(1800, 0.01), (1800, 0.05)]
    m = QuantileForecaster(small_config()).fit(s)
    r = build_response(pool, s, m, "v", s.end + 30.0, [1800], QS, 300.0, st.risk_models, settings.risks)
    ForecastResponse.model_validate_json(r.model_dump_json())
    (p,) = r.points
    assert p.window_max is not None and p.gpus_needed is not None
    assert set(p.window_max) == {"0.01", "0.05"}
    assert p.window_max["0.01"] >= p.window_max["0.05"] >= s.values[-1] * 0.5
    assert p.gpus_needed == {k: int(np.ceil(v / 2.0 - 1e-9)) for k, v in p.window_max.items()}
    # stale: the same safe bound for the windows
    old = build_response(pool, s, m, "v", s.end + 3600.0, [1800], QS, 300.0, st.risk_models, settings.risks)
    assert old.stale and old.points[0].window_max == {"0.01": 64.0, "0.05": 64.0}
    assert old.points[0].gpus_needed == {"0.01": 32, "0.05": 32}
    # without risks the points carry nothing new (backward compatible)
    plain = build_response(POOL, s, m, "v", s.end + 30.0, [1800], QS, 300.0)
    assert plain.points[0].window_max is None and plain.points[0].gpus_needed is None

"""A restarted predictor serves from its persisted models at once, over real HTTP, before any refit.

Two pools' models are persisted and made older than ``--retrain-interval`` (soak finding 5).
The service starts with them and a fitter that blocks until released: while the first refit is
held, both pools must answer ``200``, not stale, with the loaded model's version and window-max
bounds, and ``/readyz`` must say ready. Released, both models are refit and ``fitted_at`` moves.
The data come from the product's explicit replay source (``serve --replay``) on the real clock.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from predictor.generator import generate
from predictor.model import ModelConfig, QuantileForecaster
from predictor.replay import ReplaySource
from predictor.series import Series
from predictor.server import PredictorHTTPServer, serve_in_thread
from predictor.service import PoolConfig, PredictorService, Settings, fit_model
from predictor.store import ModelStore
from rose_common.forecast_api import ForecastResponse
from tests.support.predictor_fixtures import small_config

RETRAIN = 600.0
POOLS = [PoolConfig(name="pool-a", query="sum(a)", capacity=48), PoolConfig(name="pool-b", query="sum(b)", capacity=48)]


class HeldFitter:
    """The real fit, held until ``release`` is set (so a test can look at the service meanwhile)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, config: ModelConfig, series: Series) -> QuantileForecaster:
        self.entered.set()
        if not self.release.wait(120):
            raise TimeoutError("the test never released the fit")
        return fit_model(config, series)


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _metric(text: str, name: str, pool: str) -> float:
    prefix = f'{name}{{pool="{pool}"}} '
    (line,) = [ln for ln in text.splitlines() if ln.startswith(prefix)]
    return float(line[len(prefix) :])


def _wait(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_loaded_models_older_than_the_retrain_interval_answer_before_any_refit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    series = generate(days=4, step=600, seed=11)
    cfg = small_config(horizons=(600, 1800))
    settings = Settings(
        step=600,
        history=4 * 86400,
        retrain_interval=RETRAIN,
        refresh_interval=0.2,
        max_data_age=900.0,
        risks=(0.05,),
        model=cfg,
    )
    store = ModelStore(tmp_path / "models")
    model = QuantileForecaster(cfg).fit(series)
    fitted_at = time.time() - 3 * RETRAIN  # older than the retrain interval: due for a refit at once
    saved = {p.name: store.save(p.name, model, {"fitted_at": fitted_at}, now=fitted_at) for p in POOLS}

    fitter = HeldFitter()
    svc = PredictorService(POOLS, ReplaySource(series), settings, store, fitter=fitter)
    assert {n: (st.version, st.loaded) for n, st in svc.pools.items()} == {n: (v, True) for n, v in saved.items()}
    srv = PredictorHTTPServer(("127.0.0.1", 0), svc)
    serve_in_thread(srv)
    stop = threading.Event()
    loop = threading.Thread(target=svc.run, args=(stop,), daemon=True)
    try:
        with caplog.at_level(logging.INFO, logger="rose.predictor"):
            loop.start()
            assert fitter.entered.wait(60), "the service never started a refit"
            # the first refit is held: every pool answers from its loaded model all the same
            for pool, version in saved.items():
                code, body = _get(f"{srv.url}/v1/forecast?pool={pool}")
                assert code == 200, body
                r = ForecastResponse.model_validate_json(body)
                assert (r.model_version, r.stale) == (version, False)
                assert r.data_age_seconds is not None and r.data_age_seconds < 900  # computed from current data
                assert [p.horizon_seconds for p in r.points] == [600, 1800]
                assert all(p.window_max is not None and "0.05" in p.window_max for p in r.points)
            assert _get(f"{srv.url}/readyz")[0] == 200
            metrics = _get(f"{srv.url}/metrics")[1]
            for pool in saved:
                assert _metric(metrics, "rose_forecast_model_loaded", pool) == 1
                assert _metric(metrics, "rose_forecast_model_age_seconds", pool) >= 3 * RETRAIN
                assert _metric(metrics, "rose_forecast_stale", pool) == 0
            assert 'rose_forecast_fits_total{pool="pool-a",result="ok"} 0.0' in metrics
            served = [r for r in caplog.records if r.getMessage() == "serving persisted model until its refit"]
            assert sorted(r.__dict__["pool"] for r in served) == ["pool-a", "pool-b"]

            fitter.release.set()  # now the refits: both, and fitted_at moves
            _wait(lambda: not any(st.loaded for st in svc.pools.values()), 120, "both pools to be refit")
        for pool, version in saved.items():
            st = svc.pools[pool]
            assert st.fitted_at > fitted_at + 2 * RETRAIN and st.version != version
            _wait(
                lambda p=pool: json.loads(_get(f"{srv.url}/v1/forecast?pool={p}")[1])["model_version"] != saved[p],
                10,
                f"{pool} to serve its refit model",
            )
        metrics = _get(f"{srv.url}/metrics")[1]
        assert _metric(metrics, "rose_forecast_model_loaded", "pool-a") == 0
        assert _metric(metrics, "rose_forecast_model_age_seconds", "pool-a") < RETRAIN
    finally:
        stop.set()
        fitter.release.set()
        loop.join(timeout=60)
        srv.shutdown()
        srv.server_close()

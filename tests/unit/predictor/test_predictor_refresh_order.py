"""The order of a refresh cycle (``plan_refresh``, pure) and the age bound on a persisted model."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from predictor.generator import generate
from predictor.model import QuantileForecaster
from predictor.series import Series
from predictor.service import PoolConfig, PoolView, PredictorService, Settings, plan_refresh
from predictor.store import ModelStore
from tests.support.predictor_fixtures import small_config

HOUR = 3600.0


def view(name: str, **kw: object) -> PoolView:
    base: dict[str, object] = {
        "has_series": True,
        "has_model": True,
        "model_age": 0.0,
        "loaded": False,
        "needs_risks": False,
        "answered": True,
    }
    base.update(kw)
    return PoolView(name=name, **base)  # type: ignore[arg-type]


def test_after_a_restart_every_loaded_model_answers_before_any_refit() -> None:
    # the soak's case: both models loaded, older than the retrain interval, never answered yet
    pools = [view(p, model_age=age, loaded=True, answered=False) for p, age in (("a", 2 * HOUR), ("b", 3 * HOUR))]
    plan = plan_refresh(pools, HOUR)
    assert plan == [("a", "answer"), ("b", "answer"), ("b", "fit"), ("a", "fit")]  # refits: the oldest first


def test_a_pool_without_a_model_is_fitted_after_the_pools_that_can_answer() -> None:
    pools = [view("new", has_model=False, answered=False), view("old", model_age=5 * HOUR, loaded=True)]
    plan = plan_refresh(pools, HOUR)
    assert plan == [("old", "answer"), ("new", "fit"), ("old", "fit")]
    # a pool whose fit was tried (and failed, or had too little history) answers its safe bound first
    tried = [view("new", has_model=False, answered=True), view("old", model_age=5 * HOUR)]
    assert plan_refresh(tried, HOUR) == [("new", "answer"), ("old", "answer"), ("new", "fit"), ("old", "fit")]


def test_a_model_younger_than_the_retrain_interval_only_answers() -> None:
    assert plan_refresh([view("a", model_age=HOUR - 1), view("b", model_age=HOUR)], HOUR) == [
        ("a", "answer"),
        ("b", "answer"),
        ("b", "fit"),
    ]


def test_no_data_answers_without_a_fit() -> None:
    # nothing to fit on: the pool answers (its safe bound, or 503 with the reason) and fits nothing
    pools = [view("a", has_series=False, has_model=False, answered=False), view("b", has_series=False)]
    assert plan_refresh(pools, HOUR) == [("a", "answer"), ("b", "answer")]


def test_window_max_bounds_come_after_every_answer_and_before_the_fits() -> None:
    pools = [
        view("a", loaded=True, needs_risks=True, model_age=2 * HOUR, answered=False),
        view("b", loaded=True, needs_risks=True, model_age=60.0, answered=False),
        view("c", has_model=False, answered=False),
    ]
    assert plan_refresh(pools, HOUR) == [
        ("a", "answer"),
        ("b", "answer"),
        ("a", "risks"),
        ("b", "risks"),
        ("c", "fit"),
        ("a", "fit"),
    ]
    # a model fitted here (not loaded) and due anyway: its refit fits the bounds too
    assert plan_refresh([view("a", needs_risks=True, model_age=2 * HOUR)], HOUR) == [("a", "answer"), ("a", "fit")]


class _NoSource:
    def range(self, query: str, start: int, end: int, step: int) -> Series:
        raise AssertionError("not called while constructing")


@pytest.fixture(scope="module")
def model() -> QuantileForecaster:
    return QuantileForecaster(small_config()).fit(generate(days=4, step=600, seed=5))


def test_a_persisted_model_older_than_max_model_age_is_refit_not_served(
    tmp_path: Path, model: QuantileForecaster, caplog: pytest.LogCaptureFixture
) -> None:
    now = 2e9
    store = ModelStore(tmp_path)
    store.save("pool-a", model, {"fitted_at": now - 3 * 86400}, now=now - 3 * 86400)
    pool = PoolConfig(name="pool-a", query="q", capacity=8)

    def service(max_age: float) -> PredictorService:
        settings = Settings(step=600, retrain_interval=HOUR, max_model_age=max_age, model=model.config)
        return PredictorService([pool], _NoSource(), settings, store, clock=lambda: now)

    with caplog.at_level(logging.INFO, logger="rose.predictor"):
        young = service(7 * 86400)  # three days old, older than the retrain interval: still served
    st = young.pools["pool-a"]
    assert st.model is not None and st.loaded and st.fitted_at == now - 3 * 86400
    (rec,) = [r for r in caplog.records if r.getMessage() == "loaded persisted model"]
    assert rec.__dict__["ageSeconds"] == 3 * 86400
    assert young.metrics.fits.labels("pool-a", "expired")._value.get() == 0

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rose.predictor"):
        old = service(2 * 86400)
    assert old.pools["pool-a"].model is None and not old.pools["pool-a"].loaded
    assert old.metrics.fits.labels("pool-a", "expired")._value.get() == 1
    (rec,) = [r for r in caplog.records if r.getMessage() == "persisted model not used; will refit"]
    assert "older than --max-model-age 2d" in rec.__dict__["why"]

    assert service(0).pools["pool-a"].loaded  # 0: any age

"""The planner replay benchmark's model: trace scaling, a causal forecaster, and the three policies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks import planner_replay as rp

CFG = rp.Config(pool_gpus=16, peak_util=1.0, tick_s=60, horizon_s=3600, jobs=2, min_gpus=2, max_gpus=6,
                min_useful_run_s=600.0, dwell_s=300.0)  # fmt: skip


def test_demand_scales_the_peak_to_the_pool_and_carries_gaps() -> None:
    d = rp.demand_gpus(np.array([10.0, np.nan, 20.0]), 600, CFG)
    assert len(d) == 21 and d.max() == 16 and d[0] == 8
    assert d[10] == 8, "a gap carries the last observed value"


def test_the_forecast_at_a_tick_does_not_see_that_tick() -> None:
    d = np.full(3 * 1440, 4.0)
    spike = d.copy()
    spike[2000] = 16.0
    f, g = rp.seasonal_forecaster(d, CFG), rp.seasonal_forecaster(spike, CFG)
    assert f(2000).upper == g(2000).upper
    assert g(2001).upper[0] == pytest.approx(16 * 1.1)
    assert g(2000 + 1440 - 10).upper[10] == pytest.approx(16 * 1.1), "yesterday's spike is expected again"


def _waves(days: int = 3) -> np.ndarray:
    """Serving idle (2 GPUs) except a daily wave to 14 GPUs from 09:00 to 11:00."""
    d = np.full(days * 1440, 2.0)
    for day in range(days):
        d[day * 1440 + 540 : day * 1440 + 660] = 14.0
    return d


def test_planner_gives_back_before_the_wave_and_reactive_makes_serving_wait() -> None:
    d = _waves()
    planned = rp.simulate(d, CFG, rp.seasonal_forecaster(d, CFG))
    reactive = rp.simulate(d, CFG, rp.persistence_forecaster(d, CFG))
    none = rp.simulate(d, CFG, None)
    assert none.lent_gpu_hours == 0 and none.serving_gpu_seconds_waited == 0
    assert reactive.unplanned_reclaims > 0 and reactive.serving_gpu_seconds_waited > 0
    # The first wave cannot be foreseen (no yesterday yet); the next two are.
    assert planned.planned_reclaims > 0 and planned.unplanned_reclaims < reactive.unplanned_reclaims
    assert 0 < planned.lent_gpu_hours < reactive.lent_gpu_hours


def test_cli_refuses_a_missing_series_with_where_to_look(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        rp.main(["--series", str(tmp_path / "nope.csv")])
    assert "derived" in capsys.readouterr().err

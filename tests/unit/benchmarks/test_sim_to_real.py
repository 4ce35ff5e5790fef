"""benchmarks.sim_to_real's pure parts: reading both sides at the simulator's tick, the figures
from the per-tick series, the tolerance, and the simulated side on a hand-made slice."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.sim_to_real import TOLERANCE, Tolerance, compare, markdown, series_figures, simulate, tick_series
from benchmarks.soak import HISTORY_ROWS

JOBS = ("a", "b")


def test_tick_series_takes_the_last_sample_within_each_tick_and_carries_it_over_a_gap() -> None:
    samples = [(-3.0, {"a": 1}), (0.5, {"a": 2}), (4.9, {"a": 3, "b": 1}), (11.0, {"a": 0, "b": 2})]
    # tick 0 = [0, 5): the last sample is 3+1; tick 1 = [5, 10) has none: it carries; tick 2 sees 0+2
    assert tick_series(samples, 4, 5.0, JOBS) == [
        {"a": 3, "b": 1},
        {"a": 3, "b": 1},
        {"a": 0, "b": 2},
        {"a": 0, "b": 2},
    ]
    # a real system a little late: the state reached at 5.2 s belongs to tick 1, not tick 0
    assert tick_series([(5.2, {"a": 4})], 2, 5.0, JOBS) == [{"a": 0, "b": 0}, {"a": 4, "b": 0}]


def test_series_figures_counts_gpus_grown_and_dropped_per_job_and_the_lent_hours() -> None:
    series = [{"a": 2, "b": 0}, {"a": 3, "b": 0}, {"a": 1, "b": 2}, {"a": 1, "b": 2}]
    f = series_figures(series, 600.0)
    assert f == {"lent_gpu_hours": round((2 + 3 + 3 + 3) * 600 / 3600, 3), "grows": 2 + 1 + 2, "drops": 2}
    assert series_figures([], 600.0) == {"lent_gpu_hours": 0.0, "grows": 0, "drops": 0}


def _side(**kw: float) -> dict[str, float]:
    base = {
        "lent_gpu_hours": 10.0,
        "grows": 6,
        "drops": 2,
        "suspends": 2,
        "planned_reclaims": 2,
        "unplanned_reclaims": 0,
        "serving_waits": 0,
    }
    return {**base, **kw}


def test_compare_allows_each_transition_a_tick_of_lent_gpu_time_and_small_count_differences() -> None:
    rows = {r["figure"]: r for r in compare(_side(lent_gpu_hours=11.2, grows=7), _side(), TOLERANCE, 600.0)}
    # (6 grows + 2 drops) x one 10-minute tick = 1.333 GPU-hours allowed
    assert rows["lent_gpu_hours"]["allowed"] == pytest.approx(8 * 600 / 3600, abs=1e-3)
    assert rows["lent_gpu_hours"]["ok"] and rows["grows"]["ok"]
    assert all(r["ok"] for r in rows.values())


def test_compare_fails_a_figure_beyond_the_tolerance() -> None:
    rows = {r["figure"]: r for r in compare(_side(lent_gpu_hours=12.0, unplanned_reclaims=3), _side(), TOLERANCE)}
    assert not rows["lent_gpu_hours"]["ok"] and rows["lent_gpu_hours"]["diff"] == 2.0
    assert not rows["unplanned_reclaims"]["ok"]
    assert rows["grows"]["ok"]
    # the relative part: 10 vs 13 suspends is within 25 % of 13
    strict = Tolerance(count_abs=0, count_rel=0.25)
    assert {r["figure"]: r["ok"] for r in compare(_side(suspends=13), _side(suspends=10), strict)}["suspends"]
    assert not {r["figure"]: r["ok"] for r in compare(_side(suspends=14), _side(suspends=10), strict)}["suspends"]
    assert "**no**" in markdown(list(rows.values()))


def test_compare_refuses_a_missing_figure() -> None:
    real = _side()
    del real["grows"]
    with pytest.raises(ValueError, match="'grows' missing on the real side"):
        compare(real, _side())


def test_the_simulated_side_reclaims_ahead_of_a_burst_with_the_oracle_and_grows_back_after() -> None:
    # two pools of 4 GPUs; pool-a's serving goes 1 -> 3 for ticks 10..13, pool-b stays at 1
    played = [1] * 10 + [3] * 4 + [1] * 10
    a = np.array([1.0] * HISTORY_ROWS + played)
    b = np.array([1.0] * (HISTORY_ROWS + len(played)))
    figures, series = simulate({"pool-a": (4, a), "pool-b": (4, b)}, 5, (5, 15, 30), 2.0)
    assert len(series) == len(played)
    held = [sum(row.values()) for row in series]
    # 6 GPUs free: elastic-a at its max 4 and rl-hi's 1; elastic-b (min 2) does not fit in the last one
    assert held[0] == 5 and series[0]["elastic-b"] == 0
    # the 30 s (6-tick) window sees the burst at tick 4: two GPUs given back before it, held through it
    assert held.index(3) == 10 - 6 and set(held[4:14]) == {3}
    assert held[14:] == [5] * 10  # and taken again once it is over
    assert figures == {"planned_reclaims": 2, "unplanned_reclaims": 0, "serving_waits": 0, "suspends": 2}

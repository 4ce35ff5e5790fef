"""The planner replay benchmark: a thin caller of ``rose simulate`` (three of its policies, its figures)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from benchmarks import planner_replay as rp
from rose_sim.inputs import DAY, demand_from_values, parse_jobs
from tests.support.sim_fixtures import raw_job

STEP = 600


def _waves(days: int = 3) -> np.ndarray:
    """Serving idle (2 GPUs) except a daily wave to 14 GPUs from 09:00 to 11:00 (10-minute points)."""
    d = np.full(days * 144, 2.0)
    for day in range(days):
        d[day * 144 + 54 : day * 144 + 66] = 14.0
    return d


def test_the_replay_is_rose_simulate_planner_vs_reactive_vs_no_lending() -> None:
    demand = demand_from_values(0, _waves(), STEP, tick_s=60, history_s=DAY, pool_gpus=16, capacity_per_gpu=1.0)
    jobs = parse_jobs([("t", raw_job("a", 2, 6)), ("t", raw_job("b", 2, 6))])
    out = rp.replay(demand, jobs, "oracle", pool_gpus=16)
    assert list(out["policies"]) == ["planner", "reactive", "no-lending"]
    sim = out["simulate"]["results"]
    for name, row in out["policies"].items():  # drawn from rose_sim's report, not a model of its own
        assert row["lent_gpu_hours"] == sim[name]["rl_lent_gpu_hours"]
        assert row["unplanned_reclaims"] == sim[name]["unplanned_reclaims"]
        assert row["serving_gpu_seconds_waited"] == sim[name]["serving_wait_gpu_seconds"]
    planned, reactive, none = (out["policies"][k] for k in ("planner", "reactive", "no-lending"))
    assert none["lent_gpu_hours"] == 0 and none["serving_gpu_seconds_waited"] == 0
    assert reactive["unplanned_reclaims"] > 0 and reactive["serving_gpu_seconds_waited"] > 0
    # the waves are foreseen (the oracle): given back before they arrive
    assert planned["planned_reclaims"] > 0 and planned["unplanned_reclaims"] == 0
    assert 0 < planned["lent_gpu_hours"] < reactive["lent_gpu_hours"]
    assert planned["suspends_per_lent_gpu_hour"] == round(sim["planner"]["suspends"] / planned["lent_gpu_hours"], 3)
    assert not hasattr(rp, "plan") and not hasattr(rp, "seasonal_forecaster")  # no copy of the planner or a model


def test_cli_writes_the_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    series = tmp_path / "waves.csv"
    values = np.tile(_waves(1), 8)  # 7 days of history, 1 evaluated
    series.write_text("t_seconds,value\n" + "".join(f"{i * STEP},{v * 1000}\n" for i, v in enumerate(values)))
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "a.yaml").write_text(yaml.safe_dump(raw_job("a", 2, 6)))
    argv = ["--series", str(series), "--jobs", str(jobs), "--pool-gpus", "16", "--json", str(tmp_path / "o.json")]
    assert rp.main(argv) == 0
    out = capsys.readouterr().out
    assert "| planner |" in out and "| reactive |" in out and "| no-lending |" in out
    report = json.loads((tmp_path / "o.json").read_text())
    assert report["simulate"]["pool_gpus"] == 16 and report["simulate"]["evaluated_days"] == 1.0
    assert report["forecaster"] == report["simulate"]["forecasters"]["baseline"]


def test_cli_refuses_a_missing_series_with_where_to_look(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        rp.main(["--series", str(tmp_path / "nope.csv")])
    assert "derived" in capsys.readouterr().err

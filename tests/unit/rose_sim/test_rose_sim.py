"""``rose simulate`` (issue 24): the cost model, demand held at the trace's resolution, each policy on
a scripted burst, the leak test (changing demand after T changes no decision before T), the drift
test (the simulator and the controller's plan loop decide the same from the same objects), and
bad input as one line."""

from __future__ import annotations

import copy
import datetime as dt
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from dra_driver.suspend import budget
from elastic_controller import controller as ec_controller
from elastic_controller import observe, planner, pools
from elastic_controller.controller import Controller, ControllerSettings
from elastic_controller.metrics import ControllerMetrics
from rose_cli.main import main as rose_main
from rose_common import names
from rose_common.informer import ADDED
from rose_sim import engine
from rose_sim import forecasters as fc
from rose_sim import report as sim_report
from rose_sim.cli import main as sim_main
from rose_sim.engine import Policy, PoolInput, SimConfig, Simulation, default_policies
from rose_sim.inputs import DAY, CostModel, Demand, SimInputError, demand_from_values, held, parse_jobs
from rose_sim.prometheus import parse_time
from rose_sim.report import HORIZONS_S, bounds_for, markdown, simulate, timeslice_groups
from scheduler_extender import forecast as extender_forecast_module
from scheduler_extender import policy as extender_policy
from tests.support.controller_fakes import NOW, Recorder, drain, inventory, running_pod
from tests.support.sim_fixtures import GIB16, STEP, FixedForecast, decisions, raw_job, run_policy, series_csv, wavy
from timeslice import advise as timeslice_advise
from timeslice.advise import advise


def burst_demand(pool: int = 8) -> Demand:
    """1 day of history at 2 GPUs, then 2 h 10 min at 2, 1 h at all 8, the rest of 5 h at 2 (10-minute points)."""
    values = np.array([2.0] * 144 + [2.0] * 13 + [8.0] * 6 + [2.0] * 11)
    return demand_from_values(
        0, values, STEP, tick_s=60, history_s=DAY, pool_gpus=pool, capacity_per_gpu=1.0, min_evaluated_s=3600
    )


# --------------------------------------------------------------------------- cost model and demand


def test_cost_model_defaults_and_formulas() -> None:
    c = CostModel()
    assert c.pcie_bytes_per_s == observe.PCIE_BYTES_PER_SECOND == 25e9  # the controller's planning rate
    assert c.suspend_s(GIB16, 20.0) == pytest.approx(20.0 + 0.5 + GIB16 / 25e9)
    assert c.transfer_s(GIB16) == pytest.approx(0.687, abs=1e-3)
    assert c.checkpoint_s(GIB16) == pytest.approx(GIB16 / 2e9)
    assert c.throughput(0.5) == 0.5 and c.throughput(1) == 1 and c.throughput(4) == pytest.approx(1 + 3 * 0.9)
    for bad in ({"pin_s": -1.0}, {"scaling_efficiency": 1.5}, {"pcie_bytes_per_s": 0.0}, {"evict_s": math.nan}):
        with pytest.raises(SimInputError):
            CostModel(**bad)  # type: ignore[arg-type]


def test_demand_is_held_at_the_trace_resolution_never_interpolated() -> None:
    x = held(np.array([1.0, np.nan, 5.0]), 600, 60)
    assert list(x) == [1.0] * 20 + [5.0] * 10  # a gap carries the last value; the jump is a step, not a ramp
    d = burst_demand()
    jump = d.history + 13 * 10
    assert d.busy[jump - 1] == 2 and d.busy[jump] == 8


def test_pool_sizing_reads_the_history_only() -> None:
    base = np.array([3.0] * 144 + [4.0] * 144)
    late = base.copy()
    late[-10:] = 100.0  # a late burst in the evaluated day
    a = demand_from_values(0, base, STEP, tick_s=60, history_s=DAY, pool_gpus=64)
    b = demand_from_values(0, late, STEP, tick_s=60, history_s=DAY, pool_gpus=64)
    assert a.capacity_per_gpu == b.capacity_per_gpu == 3.0 / (64 * 0.9)
    assert np.array_equal(a.busy[:-100], b.busy[:-100])


# --------------------------------------------------------------------------- policies on a burst


def test_each_policy_on_a_burst_of_serving() -> None:
    d = burst_demand()
    wait = CostModel().suspend_s(GIB16, 20.0)
    out = {p.name: run_policy(p, d).r for p in default_policies(("oracle", "baseline"))}
    none = out["no-lending"]
    assert none.useful_gpu_s == 0 and not none.waits and none.suspends == 0
    reactive = out["reactive"]  # grows to max 4, gives them back only when serving is there
    assert reactive.unplanned_reclaims == 4 and reactive.waits == pytest.approx([wait] * 4)
    assert reactive.suspends == 4 and reactive.host_bytes_peak == 4 * GIB16 and reactive.lost_gpu_s == 0
    oracle = out["planned-oracle"]  # the planner gives them back before serving arrives
    assert oracle.waits == [] and oracle.planned_reclaims == 4 and oracle.suspends == 4
    assert 0 < oracle.useful_gpu_s <= reactive.useful_gpu_s
    evict = out["evict-restart"]  # evicted: serving waits for the exit, the job loses its uncheckpointed work
    assert evict.evictions == 4 and evict.waits == pytest.approx([CostModel().evict_s] * 4)
    assert evict.lost_gpu_s > 0 and evict.suspends == 0 and evict.host_bytes_peak == 0
    assert evict.useful_gpu_s < reactive.useful_gpu_s
    dedicated = out["dedicated"]  # a static split from the history: RL keeps 8 - 2 GPUs, serving waits the hour
    assert dedicated.lent_gpu_s == pytest.approx(4 * 5 * 3600)  # the job's max, all 5 hours
    assert dedicated.waits == pytest.approx([3600.0] * 6)
    for r in out.values():
        assert r.over_capacity_gpu_s == 0
    job = raw_job()
    job["metadata"]["annotations"] = {"sim.rose.io/checkpoint-interval": "45m"}  # not on the eviction's tick
    twin = run_policy(Policy("evict-planned-oracle", "evict-planned", "oracle"), d, [job]).r  # the planner, evicting
    assert twin.waits == [] and twin.evictions == 4 and twin.suspends == 0 and twin.lost_gpu_s > 0
    assert twin.useful_gpu_s < oracle.useful_gpu_s


def test_host_memory_full_falls_back_to_checkpoint_and_evict() -> None:
    """The burst takes all 4 lent GPUs back; host memory for 2.5 workers' state: 2 suspend, the other
    2 are checkpointed and evicted (the driver's fallback: nothing lost, serving waits for the checkpoint
    write), and come back as new pods that read the checkpoint."""
    d = burst_demand()
    cost = CostModel()
    unlimited = run_policy(Policy("reactive", "reactive"), d).r
    assert unlimited.host_fallbacks == 0 and unlimited.host_bytes_peak == 4 * GIB16
    roomy = run_policy(Policy("reactive", "reactive"), d, host_memory=10 * GIB16).r
    assert replace(roomy, plan_s=0.0) == replace(unlimited, plan_s=0.0)
    s = run_policy(Policy("reactive", "reactive"), d, host_memory=int(2.5 * GIB16), record=True)
    r = s.r
    fallback_wait = 20.0 + cost.checkpoint_s(GIB16) + cost.evict_s
    assert r.suspends == 2 and r.host_fallbacks == 2 and r.evictions == 0 and r.lost_gpu_s == 0
    assert r.host_bytes_peak == 2 * GIB16
    assert sorted(r.waits) == pytest.approx(sorted([cost.suspend_s(GIB16, 20.0)] * 2 + [fallback_wait] * 2))
    assert r.unplanned_reclaims == 4
    # after the burst the job is back at 4: the 2 suspended resumed, 2 new workers replaced the evicted
    grown = [t for _, what, targets in s.decisions for t in targets.values() if what == "plan" and (t.add or t.resume)]
    assert sum(len(t.resume) for t in grown) == 2 and sum(len(t.add) for t in grown) >= 2 + 4  # first 4, then 2
    assert {w.state for w in s.workers} == {"active"} and len(s.workers) == 4
    assert r.useful_gpu_s < unlimited.useful_gpu_s
    report = r.report(5 * 3600, 8)
    assert report["host_memory_fallbacks"] == 2 and report["host_memory_fallbacks_per_day"] == pytest.approx(9.6)
    # no host memory at all: every reclaim is a checkpoint-and-evict
    none = run_policy(Policy("reactive", "reactive"), d, host_memory=0).r
    assert none.suspends == 0 and none.host_fallbacks == 4 and none.host_bytes_peak == 0


def _grouped(name: str, on: str | None = "60s", off: str | None = "4m", group: str = "pair") -> dict[str, Any]:
    job = raw_job(name, timesliceGroup=group)
    ann = {k: v for k, v in (("sim.rose.io/gpu-phase-seconds", on), ("sim.rose.io/off-phase-seconds", off)) if v}
    job["metadata"]["annotations"] = ann
    return job


def test_timeslice_groups_are_judged_by_timeslices_own_round_model() -> None:
    cost = CostModel()
    jobs = parse_jobs([("t", _grouped("a")), ("t", _grouped("b", "90s", "3m")), ("t", raw_job("solo"))])
    out = timeslice_groups(jobs, cost)
    switch = cost.suspend_s(GIB16, 20.0) + cost.transfer_s(GIB16)
    want = advise({"rl/a": [(60.0, 240.0)], "rl/b": [(90.0, 180.0)]}, switch)
    assert list(out) == ["pair"] and out["pair"]["jobs"] == ["rl/a", "rl/b"]
    assert out["pair"]["pays"] is want.pays is True and out["pair"]["round_s"] == round(want.round_s, 2)
    assert out["pair"]["shared_duty"] == round(150 / (300 + switch), 4)  # the slowest own cycle + a switch
    # switches that eat the off-group window: advise says it does not pay, and why
    slow = timeslice_groups(jobs, replace(cost, pcie_bytes_per_s=GIB16 / 200))
    assert slow["pair"]["pays"] is False and "not longer than one switch" in slow["pair"]["reason"]
    alone = timeslice_groups(parse_jobs([("t", _grouped("a", group="lonely"))]), cost)
    assert alone["lonely"]["pays"] is False and "one job" in alone["lonely"]["reason"]
    report = simulate(burst_demand(), jobs[:2], cost, SimConfig(pool_gpus=8), ("oracle",))
    assert report["timeslice_groups"] == out
    assert "Time-slice group pair (rl/a, rl/b): pays" in markdown(report)
    with pytest.raises(SimInputError, match=r"timesliceGroup 'pair': give its cycle as annotations"):
        parse_jobs([("t", _grouped("c", off=None))])


def _two_pools(pool: int = 8) -> tuple[Demand, PoolInput, SimConfig]:
    """Pool a: the burst of :func:`burst_demand`; pool b: 2 GPUs busy throughout."""
    a = burst_demand(pool)
    b = demand_from_values(
        0,
        np.full(len(a.busy) // 10, 2.0),
        STEP,
        tick_s=60,
        history_s=DAY,
        pool_gpus=pool,
        capacity_per_gpu=1.0,
        min_evaluated_s=3600,
    )
    cfg = SimConfig(pool_gpus=pool, pool_name="a")
    return a, PoolInput("b", pool, b, {}), cfg


def run_two_pools(policy: Policy, job: dict[str, Any]) -> Simulation:
    a, b, cfg = _two_pools()
    fs = (policy.forecaster,) if policy.forecaster else ()
    b = replace(b, bounds=bounds_for(b.demand, replace(cfg, pool_gpus=b.gpus), fs))
    s = Simulation(
        a, parse_jobs([("t", job)]), CostModel(), cfg, policy, bounds_for(a, cfg, fs), record=True, more_pools=(b,)
    )
    s.run()
    return s


def test_several_pools_the_planner_places_and_serving_reclaims_only_its_own_pool() -> None:
    """A job of 2-12 GPUs grows past what one pool lends (6 each): the planner places it in both; the
    burst in pool a takes back only what is in a, pool b's workers keep computing."""
    job = raw_job("wide", 2, 12)
    reactive = run_two_pools(Policy("reactive", "reactive"), job)
    placed = [p for _, what, targets in reactive.decisions if what == "plan" for t in targets.values() for p in t.add]
    assert set(placed) == {"a", "b"}  # the planner's own placement, one pool name per new worker
    r = reactive.r
    assert r.lent_by_pool["a"] > 0 and r.lent_by_pool["b"] > 0
    assert sum(r.lent_by_pool.values()) == pytest.approx(r.lent_gpu_s)
    wait = CostModel().suspend_s(GIB16, 20.0)
    assert r.unplanned_reclaims == 6 and r.waits == pytest.approx([wait] * 6)  # the burst needs all 8 of a
    assert r.lent_by_pool["b"] == pytest.approx(6 * 5 * 3600, rel=0.01)  # b: never reclaimed
    oracle = run_two_pools(Policy("planned-oracle", "planned", "oracle"), job).r
    assert oracle.waits == [] and oracle.planned_reclaims == 6 and oracle.unplanned_reclaims == 0
    dedicated = run_two_pools(Policy("dedicated", "dedicated"), job).r  # each pool split from its own history
    assert dedicated.lent_by_pool == pytest.approx({"a": 6 * 5 * 3600, "b": 6 * 5 * 3600})
    assert dedicated.waits == pytest.approx([3600.0] * 6)  # pool a's serving partition (2) is short by 6
    a, b, cfg = _two_pools()
    with pytest.raises(SimInputError, match="must span the same time"):
        Simulation(
            a,
            parse_jobs([("t", job)]),
            CostModel(),
            cfg,
            Policy("reactive", "reactive"),
            {},
            more_pools=(replace(b, demand=replace(b.demand, history=1)),),
        )


def test_the_extenders_filter_is_asked_about_every_new_worker() -> None:
    """Measured, not enforced: serving holds the whole pool until 30 min in, then 2 GPUs. The oracle's
    planner grows the job at the tick the demand falls (it knows); the extender, seeing serving's GPUs
    as last observed (all 8), would refuse those 4 workers. Persistence grows a tick later: no refusal."""
    values = np.array([8.0] * 144 + [8.0] * 3 + [2.0] * 27)
    d = demand_from_values(
        0, values, STEP, tick_s=60, history_s=DAY, pool_gpus=8, capacity_per_gpu=1.0, min_evaluated_s=3600
    )
    oracle = run_policy(Policy("planned-oracle", "planned", "oracle"), d).r
    assert oracle.extender_checked == 4 and oracle.extender_refusals == 4
    reactive = run_policy(Policy("reactive", "reactive"), d).r
    assert reactive.extender_checked == 4 and reactive.extender_refusals == 0
    assert run_policy(Policy("dedicated", "dedicated"), d).r.extender_checked == 0
    report = oracle.report(5 * 3600, 8)
    assert report["extender_checked"] == 4 and report["extender_refusals"] == 4


def test_transitions_cost_time_useful_work_is_less_than_lent() -> None:
    r = run_policy(Policy("reactive", "reactive", "persistence"), burst_demand()).r
    assert r.productive_gpu_s < r.lent_gpu_s  # pod start, world changes, suspend and resume
    assert r.useful_gpu_s < r.productive_gpu_s  # scaling efficiency and the checkpoint stall
    assert r.steps == pytest.approx(r.useful_gpu_s / 20.0)  # one step per 20 s of one worker (default)


# --------------------------------------------------------------------------- leak test


@pytest.mark.parametrize(
    "policy",
    [p for p in default_policies(("oracle", "baseline", "model")) if p.name not in ("planned-oracle", "no-lending")],
    ids=lambda p: p.name,
)
def test_leak_changing_demand_after_t_changes_no_decision_before_t(policy: Policy) -> None:
    values = wavy(3, 1)
    changed = values.copy()
    cut = 2 * 144 + 60  # 10 h into the evaluated day
    changed[cut:] = changed[cut:] * 1.6 + 5
    jobs = [raw_job("a", 2, 8), raw_job("b", 4, 8, priority=1)]
    kw: dict[str, Any] = {"tick_s": 60, "history_s": 2 * DAY, "pool_gpus": 48}
    a = run_policy(policy, demand_from_values(0, values, STEP, **kw), jobs, 48, record=True)
    b = run_policy(policy, demand_from_values(0, changed, STEP, **kw), jobs, 48, record=True)
    t_cut = float(cut * STEP)
    assert len(decisions(a, t_cut)) > 100
    assert decisions(a, t_cut) == decisions(b, t_cut)
    if policy.kind != "dedicated":  # (its decisions never read the demand)
        assert a.decisions != b.decisions  # the change itself is seen after T


def test_leak_check_catches_a_forecaster_that_reads_the_future() -> None:
    """The same comparison fails for the oracle, which reads ahead by definition: the check can fail."""
    values = wavy(3, 1)
    changed = values.copy()
    cut = 2 * 144 + 60
    changed[cut:] = changed[cut:] * 1.6 + 5
    kw: dict[str, Any] = {"tick_s": 60, "history_s": 2 * DAY, "pool_gpus": 48}
    policy = Policy("planned-oracle", "planned", "oracle")
    a = run_policy(policy, demand_from_values(0, values, STEP, **kw), [raw_job("a", 2, 8)], 48, record=True)
    b = run_policy(policy, demand_from_values(0, changed, STEP, **kw), [raw_job("a", 2, 8)], 48, record=True)
    assert decisions(a, float(cut * STEP)) != decisions(b, float(cut * STEP))


def test_forecasters_read_only_the_past() -> None:
    busy = np.arange(300, dtype=float) % 17
    later = busy.copy()
    later[200:] += 50
    for make in (lambda y: fc.persistence(y, HORIZONS_S, 64), lambda y: fc.baseline(y, HORIZONS_S, 60, 150, 64, 0.05)):
        assert np.array_equal(make(busy).values[:201], make(later).values[:201])  # tick 200 reads busy[:200]
    assert not np.array_equal(
        fc.oracle(busy, HORIZONS_S, 60).values[:200], fc.oracle(later, HORIZONS_S, 60).values[:200]
    )


# --------------------------------------------------------------------------- drift test


def test_the_simulator_calls_the_controllers_own_functions() -> None:
    assert engine.plan is planner.plan is ec_controller.plan
    assert engine.without_reclaims is planner.without_reclaims is ec_controller.without_reclaims
    assert engine.ec_pools.to_forecast is pools.to_forecast
    assert engine.planner_job is observe.planner_job is ec_controller.planner_job
    assert engine.fits is budget.fits  # the driver's host-memory budget decides the checkpoint-and-evict fallback
    assert sim_report.advise is timeslice_advise.advise  # time-slice groups: timeslice's own round model
    assert engine.filter_nodes is extender_policy.filter_nodes and engine.pool_outlooks is extender_policy.pool_outlooks
    assert engine.build_snapshot is extender_policy.build_snapshot
    assert engine.extender_forecast is extender_forecast_module.reduce  # the reply reduced as the extender does


def test_drift_the_simulator_and_the_controllers_plan_loop_decide_the_same() -> None:
    """One job, the controller's own loops (a recording API) and the simulator, fed the same objects
    and the same predictor reply: equal planner inputs and equal targets, step after step (grow to
    max on an idle forecast; planned reclaims when it rises). Fails if either side changes how it
    maps a job, a worker or a forecast, or calls another planner."""
    raw = raw_job()
    t0 = int(NOW.timestamp()) - DAY
    values = np.array([2.0] * 144 + [2.0] * 6 + [7.0] * 6 + [2.0] * 6)
    d = demand_from_values(
        t0, values, STEP, tick_s=60, history_s=DAY, pool_gpus=8, capacity_per_gpu=1.0, min_evaluated_s=3600
    )
    cfg = SimConfig(pool_gpus=8, pool_name="pool-a")
    bounds = bounds_for(d, cfg, ("oracle",))
    sim = Simulation(
        d, parse_jobs([("t", raw)]), CostModel(), cfg, Policy("planned-oracle", "planned", "oracle"), bounds
    )
    cache = FixedForecast()
    api = Recorder()
    settings = ControllerSettings(plan_interval_s=60.0, dwell_s=300.0)
    clock = {"now": NOW}
    ctl = Controller(api, cache, inventory, ControllerMetrics(), settings, clock=lambda: clock["now"])
    ctl.on_job_list([copy.deepcopy(raw)])
    assert inventory() == {"pool-a": 8}
    seen = 0
    grew = reclaimed = False
    for i in range(d.history, d.ticks):
        now = float(t0 + i * 60)
        clock["now"] = dt.datetime.fromtimestamp(now, dt.UTC)
        sim.settle(now)
        reply = engine.forecast_reply(bounds["oracle"], i, now, cfg.risk, cfg.pool_gpus)
        cache.forecast = pools.to_forecast(reply, "0.9", risk=cfg.risk)  # as `rose controller`'s cache reduces it
        ctl_inp, _ = ctl.plan_input(clock["now"])
        sim_inp = sim.plan_input(i, now)
        assert sim_inp.pools == ctl_inp.pools and sim_inp.settings == ctl_inp.settings
        assert sim_inp.jobs == ctl_inp.jobs, i
        assert sorted(sim_inp.workers, key=lambda w: w.name) == sorted(ctl_inp.workers, key=lambda w: w.name)
        ctl_plan = ctl.plan_once()
        sim_plan = sim.decide(i, now)
        assert ctl_plan is not None and sim_plan is not None
        assert ctl_plan.targets == sim_plan.targets, i
        sim.carry_out(sim_plan, now)
        drain(ctl)
        for body in api.created[seen:]:  # the pods start (the simulator's pod start is 60 s: next tick)
            pod = running_pod(body, f"uid-{body['metadata']['name']}")
            pod["metadata"]["annotations"][names.ANNOTATION_SECONDS_TO_SAFE_POINT] = "20"  # the worker's report
            ctl.on_pod_event(ADDED, pod)
        seen = len(api.created)
        grew |= bool(sim_plan.targets["rl/grpo"].add)
        reclaimed |= bool(sim_plan.reclaims)
        if reclaimed:
            break
        drain(ctl)
    assert grew and reclaimed


# --------------------------------------------------------------------------- CLI and bad input


def _jobs_dir(path: Path, *jobs: dict[str, Any]) -> Path:
    path.mkdir()
    for j in jobs:
        (path / f"{j['metadata']['name']}.yaml").write_text(yaml.safe_dump(j))
    return path


def test_cli_writes_json_markdown_and_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    series = series_csv(tmp_path / "s.csv", list(wavy(2, 3)))
    jobs = _jobs_dir(tmp_path / "jobs", raw_job("a", 2, 8), raw_job("b", 2, 8))
    out, md, png = tmp_path / "r.json", tmp_path / "r.md", tmp_path / "r.png"
    rc = rose_main(["simulate", "--series", str(series), "--jobs", str(jobs), "--history", "1d", "--pool-gpus", "32",
                    "--json", str(out), "--markdown", str(md), "--report", str(png)])  # fmt: skip
    assert rc == 0
    report = json.loads(out.read_text())
    assert list(report["results"]) == [
        "no-lending",
        "dedicated",
        "evict-restart",
        "reactive",
        "planned-oracle",
        "planned-baseline",
        "planned-model",
        "evict-planned-model",
    ]
    assert report["cost_model"]["pin_s"] == 0.5 and report["evaluated_days"] == 1.0
    assert "| planned-oracle |" in md.read_text() and png.read_bytes()[:4] == b"\x89PNG"
    assert "RL useful GPU-h" in capsys.readouterr().out


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str], match: str) -> None:
    assert sim_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rose simulate: error: ") and match in err, err


def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = series_csv(tmp_path / "s.csv", list(wavy(2, 3)))
    jobs = _jobs_dir(tmp_path / "jobs", raw_job())
    txt = tmp_path / "s.txt"
    txt.write_text("whatever")
    _one_line_error(capsys, ["--series", str(txt), "--jobs", str(jobs)], "unknown series format '.txt'")
    bad = _jobs_dir(tmp_path / "bad", raw_job("x", 4, 2))
    _one_line_error(capsys, ["--series", str(good), "--jobs", str(bad), "--history", "1d"],
                    "minGPUs must be less than or equal to maxGPUs")  # fmt: skip
    short = series_csv(tmp_path / "short.csv", [1.0] * 6)  # one hour, like the Azure 2023 trace
    _one_line_error(capsys, ["--series", str(short), "--jobs", str(jobs)], "the series spans 1.0 h")
    _one_line_error(capsys, ["--series", str(good), "--jobs", str(tmp_path / "nowhere")], "no such file or folder")
    _one_line_error(capsys, ["--series", str(good), "--jobs", str(jobs), "--forecasters", "crystal-ball"],
                    "unknown crystal-ball")  # fmt: skip
    _one_line_error(capsys, ["--series", str(good), "--jobs", str(jobs), "--history", "1d", "--risk", "0.0004",
                             "--forecasters", "model"], "the predictor's model at risk 0.0004")  # fmt: skip
    wrong_kind = _jobs_dir(tmp_path / "kind", {**raw_job(), "kind": "Deployment"})
    _one_line_error(capsys, ["--series", str(good), "--jobs", str(wrong_kind)], "is not ElasticRLJob")
    with pytest.raises(SystemExit):
        sim_main(["--series", str(good), "--jobs", str(jobs), "--pool-gpus", "0"])
    assert capsys.readouterr().err.count("\n") == 1
    # the demand's source: exactly one of --series and --prometheus, with what each needs
    _one_line_error(capsys, ["--jobs", str(jobs)], "give the demand as --series FILE.csv, as --prometheus")
    _one_line_error(capsys, ["--series", str(good), "--prometheus", "http://127.0.0.1:9", "--jobs", str(jobs)],
                    "give the demand as --series FILE.csv, as --prometheus")  # fmt: skip
    _one_line_error(capsys, ["--series", str(good), "--query", "up", "--jobs", str(jobs)], "go with --prometheus")
    _one_line_error(capsys, ["--prometheus", "http://127.0.0.1:9", "--start", "now-3d", "--jobs", str(jobs)],
                    "--prometheus needs --query")  # fmt: skip
    prom = ["--prometheus", "http://127.0.0.1:9", "--query", "up", "--jobs", str(jobs)]
    _one_line_error(capsys, [*prom, "--start", "last tuesday"], "--start 'last tuesday': give epoch seconds")
    _one_line_error(capsys, [*prom, "--start", "now-3x"], "--start 'now-3x'")
    _one_line_error(capsys, [*prom, "--start", "now", "--end", "now-1d"], "must be after --start")
    _one_line_error(
        capsys,
        ["--prometheus", "127.0.0.1:9090", "--query", "up", "--start", "now-3d", "--jobs", str(jobs)],
        "give the server's base URL",
    )


def test_prometheus_range_times() -> None:
    now = 1_800_000_123.7
    assert parse_time("now", now, "--end") == 1_800_000_123
    assert parse_time("now-21d", now, "--start") == 1_800_000_123 - 21 * DAY
    assert parse_time("1764547200", now, "--start") == 1_764_547_200
    assert parse_time("2025-12-01T00:00:00Z", now, "--start") == 1_764_547_200
    assert parse_time("2025-12-01T01:00:00+01:00", now, "--start") == 1_764_547_200
    assert parse_time("2025-12-01T00:10:00", now, "--start") == 1_764_547_800  # UTC unless it says
    with pytest.raises(SimInputError, match="epoch seconds must be a finite number >= 0"):
        parse_time("-5", now, "--start")


def test_cli_several_pools_from_a_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    series_csv(tmp_path / "a.csv", list(wavy(2, 3)))
    series_csv(tmp_path / "b.csv", [float(x) for x in wavy(2, 4) / 2])
    jobs = _jobs_dir(tmp_path / "jobs", raw_job("w", 2, 12))
    pools = tmp_path / "pools.yaml"
    pools.write_text(
        "pools:\n- {name: a, gpus: 16, series: a.csv}\n- {name: b, gpus: 8, series: b.csv, peak_util: 0.5}\n"
    )
    out = tmp_path / "o.json"
    argv = ["--pools", str(pools), "--jobs", str(jobs), "--history", "1d", "--forecasters", "oracle"]
    argv += ["--json", str(out)]
    assert sim_main(argv) == 0
    report = json.loads(out.read_text())
    assert [p["name"] for p in report["pools"]] == ["a", "b"] and report["pool_gpus"] == 24
    assert report["pools"][1]["capacity_per_gpu"] == pytest.approx(float(np.max(wavy(2, 4)[:144] / 2)) / (8 * 0.5))
    assert set(report["results"]["reactive"]["rl_lent_gpu_hours_by_pool"]) == {"a", "b"}
    assert report["series"] == f"pools {pools}: a (16 GPUs), b (8 GPUs)"
    capsys.readouterr()
    base = ["--jobs", str(jobs), "--history", "1d"]
    _one_line_error(capsys, ["--pools", str(pools), "--series", str(tmp_path / "a.csv"), *base], "drop --series")
    _one_line_error(capsys, ["--pools", str(pools), "--busy-gpus", *base], "per pool in the YAML")
    for text, match in [
        ("pools: []\n", "expected 'pools:' with a list"),
        ("pools:\n- {name: a, gpus: 16}\n", "pool 1: needs name, gpus and series"),
        ("pools:\n- {name: a, gpus: 16, series: a.csv, colour: red}\n", "unknown field(s) colour"),
        ("pools:\n- {name: a, gpus: -1, series: a.csv}\n", "gpus must be a whole number in 1..100000"),
        ("pools:\n- {name: a, gpus: 4, series: a.csv}\n- {name: a, gpus: 4, series: b.csv}\n", "defined twice"),
        ("pools:\n- {name: a, gpus: 4, series: a.csv}\n- {name: c, gpus: 4, series: c.csv}\n", "pool c: "),
        ("pools: [\n", "not valid YAML"),
    ]:
        pools.write_text(text)
        _one_line_error(capsys, ["--pools", str(pools), *base], match)
    series_csv(tmp_path / "c.csv", list(wavy(3, 4)))  # a day longer than a.csv
    pools.write_text("pools:\n- {name: a, gpus: 4, series: a.csv}\n- {name: c, gpus: 4, series: c.csv}\n")
    _one_line_error(capsys, ["--pools", str(pools), *base], "must cover the same times as pool a's")


def test_simulate_report_judges_the_goals() -> None:
    d = burst_demand()
    report = simulate(d, parse_jobs([("t", raw_job())]), CostModel(), SimConfig(pool_gpus=8))
    g = report["goals"]
    assert g["judged"].startswith("planned-") and set(g) >= {"waits_per_day", "duty_cycle", "useful_vs_evict_restart"}
    assert report["runtime_s"]["total_s"] > 0

"""``rose simulate`` with jobs that declare ``spec.roles`` (a trainer and rollout workers, issue 23 §3):
rollout workers are reclaimed before the trainer (removed above their minimum, then suspended), the
trainer only when no rollout runs; a Dedicated trainer is outside the pool; trainer steps need the
trainer's gang and a rollout; the drift test for roles (the simulator and the controller's plan loop
decide the same); bad roles input is one line."""

from __future__ import annotations

import copy
import datetime as dt
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from elastic_controller import observe, pools
from elastic_controller.controller import Controller, ControllerSettings
from elastic_controller.metrics import ControllerMetrics
from rose_common import names
from rose_common.elasticrljob import MSG_ROLES_EXCLUSIVE, MSG_ROLES_TIMESLICE, MSG_ROLLOUT_MIN_LE_MAX
from rose_common.informer import ADDED
from rose_sim import engine
from rose_sim.cli import main as sim_main
from rose_sim.engine import Policy, SimConfig, Simulation
from rose_sim.inputs import DAY, CostModel, Demand, SimInputError, demand_from_values, parse_jobs
from rose_sim.report import bounds_for
from tests.support.controller_fakes import NOW, Recorder, drain, inventory, running_pod
from tests.support.sim_fixtures import STEP, FixedForecast, decisions, raw_job, run_policy, series_csv, wavy

EXAMPLE02 = Path(__file__).resolve().parents[3] / "examples" / "02_grpo_tiny_llm" / "elasticrljob.yaml"
HOLDS = ("pending", "active", "resuming")


class RolesRecorder(Recorder):
    """The controller's recording API, with the trainer's headless Service a job with roles ensures."""

    def ensure_service(self, body: dict[str, Any]) -> None:
        self.calls.append(("service", body["metadata"]["name"]))


def roles_job(name: str = "grpo-tiny", placement: str = "Lent", **rollout: Any) -> dict[str, Any]:
    """Example 02's ElasticRLJob (1 trainer, 2-4 rollout workers, removed above min) in namespace rl."""
    raw: dict[str, Any] = yaml.safe_load(EXAMPLE02.read_text())
    raw["metadata"].update(name=name, namespace="rl", uid=f"u-{name}", generation=1, resourceVersion="1")
    raw["spec"]["roles"]["trainer"]["placement"] = placement
    raw["spec"]["roles"]["rollout"].update(rollout)
    return raw


def burst(peak: float, pool: int = 8) -> Demand:
    """1 day of history at 2 busy GPUs, then 2 h 10 min at 2, 1 h at ``peak``, the rest of 5 h at 2."""
    values = np.array([2.0] * 144 + [2.0] * 13 + [peak] * 6 + [2.0] * 11)
    return demand_from_values(
        0, values, STEP, tick_s=60, history_s=DAY, pool_gpus=pool, capacity_per_gpu=1.0, min_evaluated_s=3600
    )


def simulation(policy: Policy, demand: Demand, jobs: list[dict[str, Any]], pool: int = 8) -> Simulation:
    cfg = SimConfig(pool_gpus=pool)
    bounds = bounds_for(demand, cfg, (policy.forecaster,) if policy.forecaster else ())
    return Simulation(demand, parse_jobs([("t", j) for j in jobs]), CostModel(), cfg, policy, bounds)


def step_through(s: Simulation) -> list[tuple[float, int, int]]:
    """``Simulation.run``'s loop, tick by tick; per tick (now, trainer workers holding a GPU, rollout
    workers holding one) once the tick's decisions and serving's reclaims are carried out."""
    seen = []
    for i in range(s.d.history, s.d.ticks):
        now = float(s.d.start + i * s.d.tick_s)
        s.settle(now)
        p = s.decide(i, now)
        if p is not None:
            s.carry_out(p, now)
        s.serving(i, now)
        s.account(now)
        live = [w for w in s.workers if w.state in HOLDS and not w.evicted]
        seen.append((now, sum(w.job.endswith("#trainer") for w in live), sum(w.job.endswith("#rollout") for w in live)))
    for key in s.sims:
        s._commit(key)
    return seen


POLICIES = [
    Policy("reactive", "reactive", "persistence"),
    Policy("planned-oracle", "planned", "oracle"),
    Policy("planned-baseline", "planned", "baseline"),
    Policy("evict-restart", "evict-restart", "persistence"),
]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_rollouts_are_reclaimed_before_the_trainer(policy: Policy) -> None:
    """Serving at 5 of 8 GPUs leaves 3: the rollouts go down to their minimum (removed, reclaim:
    Remove), the trainer stays. Serving at all 8: the rollouts go first, the trainer only with none left."""
    s = simulation(policy, burst(5.0), [roles_job()])
    ticks = step_through(s)
    assert max(r for _, _, r in ticks) == 4 and min(t for _, t, _ in ticks) == 1  # grew to max; trainer never left
    acts = s.r.by_role
    evict = policy.kind == "evict-restart"
    assert acts["rollout"].get("removals", 0) >= 2 and "suspends" not in acts["rollout"], acts
    assert not {"suspends", "evictions"} & set(acts["trainer"]), acts
    assert s.r.steps_by_job["rl/grpo-tiny"] > 0

    s = simulation(policy, burst(8.0), [roles_job()])
    ticks = step_through(s)
    acts = s.r.by_role
    taken = "evictions" if evict else "suspends"
    assert acts["trainer"][taken] >= 1 and acts["rollout"].get("removals", 0) >= 2, acts
    assert acts["rollout"].get(taken, 0) >= 1, acts  # at their minimum, the rollouts go as a gang
    gone = [now for now, t, _ in ticks if t == 0]
    assert gone  # the trainer was taken off
    assert all(r == 0 for _, t, r in ticks if t == 0)  # ... and never while a rollout held a GPU
    first_rollout_gone = next(now for now, _, r in ticks if r < 4 and now > ticks[0][0] + 600)
    assert first_rollout_gone <= gone[0]
    assert s.r.report(float(len(ticks) * 60), 8)["role_actions"][f"trainer_{taken}"] == acts["trainer"][taken]


def test_a_dedicated_trainer_is_outside_the_pool() -> None:
    """placement: Dedicated: the planner gets the rollouts only (no ``requires``); no GPU of the pool
    is the trainer's; the trainer always computes, so steps come whenever a rollout runs."""
    s = simulation(Policy("planned-oracle", "planned", "oracle"), burst(8.0), [roles_job(placement="Dedicated")])
    assert set(s.base) == {"rl/grpo-tiny#rollout"} and s.base["rl/grpo-tiny#rollout"].requires is None
    ticks = step_through(s)
    assert all(t == 0 for _, t, _ in ticks) and max(r for _, _, r in ticks) == 4
    assert s.r.lent_gpu_s <= 4 * len(ticks) * 60  # at most the 4 rollouts' GPUs, never the trainer's
    assert s.r.steps_by_job["rl/grpo-tiny"] > 0
    idle = simulation(Policy("no-lending", "no-lending"), burst(8.0), [roles_job(placement="Dedicated")])
    idle.run()
    assert idle.r.steps == 0  # the trainer runs on its own GPUs but no rollout feeds it


def test_trainer_steps_need_its_gang_and_a_rollout_and_are_sample_bound() -> None:
    s = simulation(Policy("reactive", "reactive", "persistence"), burst(2.0), [roles_job()])
    tk, rk, tick = "rl/grpo-tiny#trainer", "rl/grpo-tiny#rollout", 60.0
    job = s.roles["rl/grpo-tiny"]
    ckpt = 1 - CostModel().checkpoint_s(2**30) / job.checkpoint_interval_s  # the trainer's 1 GiB

    def steps(per_job: dict[str, float]) -> float:
        before = s.r.steps
        s.account_roles(per_job, tick)
        return s.r.steps - before

    assert steps({tk: 1.0, rk: 0.0}) == 0 and steps({tk: 0.0, rk: 4.0}) == 0
    full = steps({tk: 1.0, rk: 4.0})
    assert full == pytest.approx(tick / job.step_seconds * ckpt)
    thr = CostModel().throughput
    assert steps({tk: 1.0, rk: 2.0}) == pytest.approx(full * thr(2.0) / thr(4.0))  # sample-bound below max
    assert steps({tk: 0.5, rk: 4.0}) == pytest.approx(full / 2)  # the gang computed half the tick


def test_rollout_workers_are_named_and_pay_pod_start_and_weight_pull() -> None:
    s = simulation(Policy("planned-oracle", "planned", "oracle"), burst(2.0), [roles_job()])
    now = float(s.d.start + s.d.history * 60)
    s.carry_out(s.decide(s.d.history, now), now)
    by = {w.name: w for w in s.workers}
    assert sorted(by) == [
        "grpo-tiny-rollout-0",
        "grpo-tiny-rollout-1",
        "grpo-tiny-rollout-2",
        "grpo-tiny-rollout-3",
        "grpo-tiny-trainer-0",
    ]
    cost = CostModel()
    assert by["grpo-tiny-trainer-0"].ready_at == now + cost.pod_start_s
    assert by["grpo-tiny-rollout-0"].ready_at == now + cost.pod_start_s + cost.weight_pull_s


def test_bad_roles_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad_range = roles_job(minWorkers=5, maxWorkers=4)
    with_size = roles_job()
    with_size["spec"]["minGPUs"] = 1
    with_group = roles_job()
    with_group["spec"]["timesliceGroup"] = "g"
    long_name = roles_job("a" * 51)
    for raw, msg in (
        (bad_range, MSG_ROLLOUT_MIN_LE_MAX),
        (with_size, MSG_ROLES_EXCLUSIVE),
        (with_group, MSG_ROLES_TIMESLICE),
        (long_name, "must be a DNS label of at most 50"),
    ):
        with pytest.raises(SimInputError, match=msg) as e:
            parse_jobs([("jobs/x.yaml", raw)])
        assert "\n" not in str(e.value) and str(e.value).startswith("jobs/x.yaml: ")
    series = series_csv(tmp_path / "s.csv", list(wavy(2, 3)))
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "bad.yaml").write_text(yaml.safe_dump(bad_range))
    assert sim_main(["--series", str(series), "--jobs", str(tmp_path / "jobs"), "--history", "1d"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and MSG_ROLLOUT_MIN_LE_MAX in err, err


def test_cli_reports_a_roles_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    series = series_csv(tmp_path / "s.csv", list(wavy(2, 3)))
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "x.yaml").write_text(yaml.safe_dump(roles_job()))
    out = tmp_path / "r.json"
    rc = sim_main(["--series", str(series), "--jobs", str(tmp_path / "jobs"), "--history", "1d", "--pool-gpus", "32",
                   "--forecasters", "baseline", "--json", str(out)])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    report = json.loads(out.read_text())
    planned = report["results"]["planned-baseline"]
    assert planned["steps_by_job"]["rl/grpo-tiny"] > 0 and planned["role_actions"]["rollout_adds"] >= 4
    assert "role_actions" not in report["results"]["no-lending"]
    assert report["cost_model"]["weight_pull_s"] == CostModel().weight_pull_s
    assert report["jobs"][0]["roles"]["rollout"] == {
        "minWorkers": 2,
        "maxWorkers": 4,
        "gpusPerWorker": 1,
        "stateBytesPerWorker": 2**28,
        "reclaim": "Remove",
    }


@pytest.mark.parametrize("policy", POLICIES[::2], ids=lambda p: p.name)
def test_leak_with_a_roles_job_changing_demand_after_t_changes_no_decision_before_t(policy: Policy) -> None:
    """The leak test of test_rose_sim.py with example 02's job beside a plain one."""
    values = wavy(3, 1)
    changed = values.copy()
    cut = 2 * 144 + 60
    changed[cut:] = changed[cut:] * 1.6 + 5
    jobs = [raw_job("a", 2, 8), roles_job()]
    kw: dict[str, Any] = {"tick_s": 60, "history_s": 2 * DAY, "pool_gpus": 48}
    a = run_policy(policy, demand_from_values(0, values, STEP, **kw), jobs, 48, record=True)
    b = run_policy(policy, demand_from_values(0, changed, STEP, **kw), jobs, 48, record=True)
    t_cut = float(cut * STEP)
    assert any("rl/grpo-tiny#rollout" in x[2] and x[2]["rl/grpo-tiny#rollout"].add for x in decisions(a, t_cut))
    assert decisions(a, t_cut) == decisions(b, t_cut)
    assert a.decisions != b.decisions


# --------------------------------------------------------------------------- drift test, roles


def test_the_simulator_maps_roles_with_the_controllers_own_functions() -> None:
    assert engine.role_planner_jobs is observe.role_planner_jobs
    from elastic_controller import controller as ec_controller
    from elastic_controller import workers

    assert ec_controller.role_planner_jobs is observe.role_planner_jobs
    assert engine.worker_name is workers.worker_name


def test_drift_roles_the_simulator_and_the_controllers_plan_loop_decide_the_same() -> None:
    """Example 02's roles job, the controller's own loops (a recording API) and the simulator, fed the
    same objects and forecasts: equal planner inputs (jobs per role, workers named per role) and
    equal targets, tick after tick, until a planned reclaim of the rollouts."""
    raw = roles_job()
    t0 = int(NOW.timestamp()) - DAY
    values = np.array([2.0] * 144 + [2.0] * 6 + [5.0] * 6 + [2.0] * 6)
    d = demand_from_values(
        t0, values, STEP, tick_s=60, history_s=DAY, pool_gpus=8, capacity_per_gpu=1.0, min_evaluated_s=3600
    )
    cfg = SimConfig(pool_gpus=8, pool_name="pool-a")
    bounds = bounds_for(d, cfg, ("oracle",))
    sim = Simulation(
        d, parse_jobs([("t", raw)]), CostModel(), cfg, Policy("planned-oracle", "planned", "oracle"), bounds
    )
    cache = FixedForecast()
    api = RolesRecorder()
    clock = {"now": NOW}
    ctl = Controller(
        api,
        cache,
        inventory,
        ControllerMetrics(),
        ControllerSettings(plan_interval_s=60.0),
        clock=lambda: clock["now"],
    )
    ctl.on_job_list([copy.deepcopy(raw)])
    seen = 0
    grew = reclaimed = False
    for i in range(d.history, d.ticks):
        now = float(t0 + i * 60)
        clock["now"] = dt.datetime.fromtimestamp(now, dt.UTC)
        sim.settle(now)
        reply = engine.forecast_reply(bounds["oracle"], i, now, cfg.risk, cfg.pool_gpus)
        cache.forecast = pools.to_forecast(reply, "0.9", risk=cfg.risk)
        ctl_inp, _ = ctl.plan_input(clock["now"])
        sim_inp = sim.plan_input(i, now)
        assert sim_inp.pools == ctl_inp.pools and sim_inp.settings == ctl_inp.settings
        assert sorted(sim_inp.jobs, key=lambda j: j.key) == sorted(ctl_inp.jobs, key=lambda j: j.key), i
        assert sorted(sim_inp.workers, key=lambda w: w.name) == sorted(ctl_inp.workers, key=lambda w: w.name), i
        ctl_plan = ctl.plan_once()
        sim_plan = sim.decide(i, now)
        assert ctl_plan is not None and sim_plan is not None
        assert ctl_plan.targets == sim_plan.targets, i
        sim.carry_out(sim_plan, now)
        drain(ctl)
        for body in api.created[seen:]:  # pods only (the trainer's Service is ensured apart)
            pod = running_pod(body, f"uid-{body['metadata']['name']}")
            pod["metadata"]["annotations"][names.ANNOTATION_SECONDS_TO_SAFE_POINT] = "20"
            ctl.on_pod_event(ADDED, pod)
        seen = len(api.created)
        grew |= bool(sim_plan.targets["rl/grpo-tiny#rollout"].add)
        reclaimed |= bool(sim_plan.reclaims)
        if reclaimed:
            assert {r.job for r in sim_plan.reclaims} == {"rl/grpo-tiny#rollout"}
            break
        drain(ctl)
    assert grew and reclaimed

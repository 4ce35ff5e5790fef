"""The planner with an ElasticRLJob's roles (issue 23 §3): rollout workers reclaimed first (removed
above their minimum, suspended as a gang below it), the trainer suspended last and grown first,
rollouts never running without their trainer. Scenarios, then properties over random fleets
(hypothesis); every check recomputes what it needs from the plan's input and its targets."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_controller.planner import (
    HOLDING,
    Forecast,
    Job,
    JobTarget,
    Plan,
    PlanInput,
    Pool,
    Settings,
    Worker,
    merge_roles,
    plan,
)

NOW = 10_000.0
KEY = "rl/grpo"
TRAINER, ROLLOUT = f"{KEY}#trainer", f"{KEY}#rollout"


def flat(need: float) -> Forecast:
    return Forecast(start=NOW - 60, step=60.0, upper=(need,) * 30)


def role_jobs(trainer: int = 2, lo: int = 1, hi: int = 4, remove: bool = True, gpw: int = 1) -> tuple[Job, Job]:
    t = Job(TRAINER, trainer * gpw, trainer * gpw, gpw, state_bytes=40 << 30, min_useful_run_s=0.0, role="trainer")
    r = Job(
        ROLLOUT,
        lo,
        hi,
        1,
        state_bytes=2 << 30,
        min_useful_run_s=0.0,
        role="rollout",
        requires=TRAINER,
        remove_on_shrink=remove,
    )
    return t, r


def running(trainer: int = 2, rollouts: int = 4, pool: str = "p") -> tuple[Worker, ...]:
    return tuple(Worker(f"grpo-trainer-{i}", TRAINER, "active", pool) for i in range(trainer)) + tuple(
        Worker(f"grpo-rollout-{i}", ROLLOUT, "active", pool) for i in range(rollouts)
    )


def plan_at(
    need: float,
    workers: tuple[Worker, ...],
    jobs: tuple[Job, ...] | None = None,
    capacity: int = 8,
    remove: bool = True,
) -> Plan:
    inp = PlanInput(
        NOW, (Pool("p", capacity, flat(need)),), jobs or role_jobs(remove=remove), workers, Settings(dwell_s=0.0)
    )
    return plan(inp)


def test_a_forecast_rise_reclaims_rollouts_above_min_first_by_removal() -> None:
    # 8 GPUs, trainer 2 + rollouts 4 lent; serving needs 4: two GPUs go back, both rollouts
    p = plan_at(4, running())
    assert p.targets[TRAINER].suspend == () and p.targets[TRAINER].active_gpus == 2
    assert p.targets[ROLLOUT].remove == ("grpo-rollout-3", "grpo-rollout-2")
    assert p.targets[ROLLOUT].suspend == () and p.targets[ROLLOUT].active_gpus == 2
    assert all(r.startswith("PlannedShrink: rollout grpo-rollout-") for r in p.targets[ROLLOUT].reasons)


def test_a_job_that_prefers_suspension_keeps_its_rollouts_suspended() -> None:
    p = plan_at(4, running(), remove=False)
    assert p.targets[ROLLOUT].suspend == ("grpo-rollout-3", "grpo-rollout-2") and p.targets[ROLLOUT].remove == ()


def test_below_min_the_rollouts_are_suspended_as_a_gang_and_the_trainer_keeps_running() -> None:
    # serving needs 6 of 8: rollouts above min removed (3), then the last one (at min 1) suspended
    p = plan_at(6, running())
    assert p.targets[ROLLOUT].remove == ("grpo-rollout-3", "grpo-rollout-2", "grpo-rollout-1")
    assert p.targets[ROLLOUT].suspend == ("grpo-rollout-0",) and p.targets[ROLLOUT].active_gpus == 0
    assert p.targets[TRAINER].suspend == () and p.targets[TRAINER].active_gpus == 2


def test_the_trainer_is_suspended_last_and_takes_no_rollout_with_it_left_running() -> None:
    p = plan_at(7, running())
    assert p.targets[TRAINER].suspend == ("grpo-trainer-0", "grpo-trainer-1")
    assert p.targets[ROLLOUT].active_gpus == 0
    kinds = [(r.job, r.kind) for r in p.reclaims]
    assert kinds.index((TRAINER, "gang-suspend")) == len(kinds) - 1  # the last reclaim


def test_rollouts_in_another_pool_are_suspended_with_their_trainer() -> None:
    pools = (Pool("p", 2, flat(2)), Pool("q", 8, flat(0)))
    workers = running(2, 0, "p") + tuple(Worker(f"grpo-rollout-{i}", ROLLOUT, "active", "q") for i in range(3))
    p = plan(PlanInput(NOW, pools, role_jobs(), workers, Settings(dwell_s=0.0)))
    assert p.targets[TRAINER].active_gpus == 0
    assert sorted(p.targets[ROLLOUT].suspend) == ["grpo-rollout-0", "grpo-rollout-1", "grpo-rollout-2"]
    assert any("is not running" in r for r in p.targets[ROLLOUT].reasons)


def test_grow_from_zero_starts_the_trainer_then_the_rollouts() -> None:
    p = plan_at(0, ())
    assert p.targets[TRAINER].add == ("p", "p") and len(p.targets[ROLLOUT].add) == 4
    merged = merge_roles(p.targets, role_jobs())
    assert merged[KEY].add_roles == ("trainer", "trainer", "rollout", "rollout", "rollout", "rollout")
    assert dict(merged[KEY].role_workers) == {"trainer": 2, "rollout": 4} and merged[KEY].active_gpus == 6


def test_no_rollout_starts_where_the_trainer_cannot() -> None:
    # 3 free GPUs: the trainer (a gang of 4) does not fit; the rollouts alone would, but wait
    p = plan_at(5, (), jobs=role_jobs(trainer=4))
    assert p.targets[TRAINER].add == () and p.targets[ROLLOUT].add == ()


def test_a_suspended_trainer_resumes_before_new_rollouts_are_added() -> None:
    parked = tuple(Worker(f"grpo-trainer-{i}", TRAINER, "suspended", "p") for i in range(2))
    p = plan_at(5, parked)  # 3 free: the trainer's 2, then one rollout
    assert p.targets[TRAINER].resume == ("grpo-trainer-0", "grpo-trainer-1")
    assert p.targets[ROLLOUT].add == ("p",)


def test_merge_leaves_a_job_without_roles_alone() -> None:
    plain = JobTarget("rl/other", 2, add=("p",))
    merged = merge_roles({"rl/other": plain}, (Job("rl/other", 1, 2),))
    assert merged == {"rl/other": plain}


# ---------------------------------------------------------------- properties


@st.composite
def fleets(draw: st.DrawFn) -> PlanInput:
    trainer_n = draw(st.integers(1, 3))
    lo = draw(st.integers(0, 2))
    hi = draw(st.integers(max(lo, 1), 5))
    t, r = role_jobs(trainer_n, lo, hi, draw(st.booleans()), gpw=draw(st.sampled_from([1, 2])))
    states = st.sampled_from(("active", "active", "pending", "resuming", "suspended", "suspending"))
    trainer_state = draw(states)  # the trainer moves as a gang
    workers = [
        Worker(f"grpo-trainer-{i}", TRAINER, trainer_state, "p") for i in range(draw(st.sampled_from([0, trainer_n])))
    ]
    workers += [Worker(f"grpo-rollout-{i}", ROLLOUT, draw(states), "p") for i in range(draw(st.integers(0, hi)))]
    other = Job("rl/plain", 1, 3, state_bytes=draw(st.sampled_from([0, 80 << 30])), min_useful_run_s=0.0)
    workers += [Worker(f"plain-w{i}", other.key, "active", "p") for i in range(draw(st.integers(0, 3)))]
    capacity = draw(st.integers(1, 16))
    pool = Pool("p", capacity, flat(draw(st.floats(0, capacity))))
    return PlanInput(NOW, (pool,), (t, r, other), tuple(workers), Settings(dwell_s=0.0))


def _holding(inp: PlanInput, p: Plan, job: str) -> int:
    """Workers of ``job`` holding a GPU once the plan is carried out, from the input and the target."""
    t = p.targets[job]
    gone = set(t.suspend) | set(t.remove)
    before = sum(1 for w in inp.workers if w.job == job and w.state in HOLDING and w.name not in gone)
    return before + len(t.resume) + len(t.add)


@settings(max_examples=300, deadline=None)
@given(fleets())
def test_roles_reclaim_and_grow_order(inp: PlanInput) -> None:
    p = plan(inp)
    t, r = inp.jobs[0], inp.jobs[1]
    trainer, rollouts = _holding(inp, p, TRAINER), _holding(inp, p, ROLLOUT)
    # the trainer runs whole or not at all, the rollouts never above max
    assert trainer * t.gpus_per_worker in (0, t.min_gpus)
    assert rollouts <= r.max_gpus
    # no rollout holds a GPU while its trainer does not
    assert trainer > 0 or rollouts == 0
    # the trainer is suspended only when no rollout of the job is left holding a GPU
    if p.targets[TRAINER].suspend:
        assert rollouts == 0
    # rollouts are added only when the trainer holds its gang
    if p.targets[ROLLOUT].add:
        assert trainer * t.gpus_per_worker == t.min_gpus
    # a rollout worker reclaimed above the minimum is removed when the job asks for it
    was = sum(1 for w in inp.workers if w.job == ROLLOUT and w.state in HOLDING)
    if r.remove_on_shrink and was > r.min_gpus:
        running_suspended = [
            n for n in p.targets[ROLLOUT].suspend if any(w.name == n and w.state != "pending" for w in inp.workers)
        ]
        assert not running_suspended or rollouts == 0 or trainer == 0
    # the pool is never planned past its capacity by the grants
    pool = inp.pools[0]
    lent = Counter({k: _holding(inp, p, k) * j.gpus_per_worker for k, j in ((j.key, j) for j in inp.jobs)})
    if p.targets[TRAINER].add or p.targets[ROLLOUT].add or p.targets[TRAINER].resume or p.targets[ROLLOUT].resume:
        assert sum(lent.values()) <= pool.capacity - pool.forecast.peak(NOW, NOW + 60)


@settings(max_examples=300, deadline=None)
@given(fleets())
def test_rollouts_go_before_the_trainer_in_every_pool_reclaim(inp: PlanInput) -> None:
    p = plan(inp)
    order = [(x.job, x.kind) for x in p.reclaims if x.job in (TRAINER, ROLLOUT)]
    if (TRAINER, "gang-suspend") in order:
        after = order[order.index((TRAINER, "gang-suspend")) + 1 :]
        assert all(job != ROLLOUT for job, _ in after), order


def test_the_roles_benchmark_gives_back_and_grows_what_the_plain_fleet_does() -> None:
    from benchmarks.planner_roles import measure

    rows = {(r["roles"], r["serving_share"]): r for r in measure(jobs=8, pools=2, repeat=1)}
    for share in (0.0, 0.8):
        assert rows[(True, share)]["reclaimed_workers"] == rows[(False, share)]["reclaimed_workers"]
        assert rows[(True, share)]["added_workers"] == rows[(False, share)]["added_workers"]
    assert rows[(True, 0.8)]["reclaimed_workers"] > 0 and rows[(True, 0.0)]["added_workers"] == 8

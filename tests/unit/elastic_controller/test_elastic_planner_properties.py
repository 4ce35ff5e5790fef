"""Properties of the reclaim planner over random fleets, forecasts and jobs (hypothesis).

Every check recomputes what it needs from the plan's input and its per-job targets; none trusts
the planner's own bookkeeping (``Plan.lent`` is compared, not used).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_controller.planner import HOLDING, Forecast, Job, Plan, PlanInput, Pool, Settings, Worker, plan

NOW = 10_000.0
STATES = ("active", "pending", "resuming", "suspending", "suspended")


@st.composite
def forecasts(draw: st.DrawFn, capacity: int) -> Forecast:
    upper = draw(st.lists(st.floats(0, capacity + 2, allow_nan=False), min_size=1, max_size=40))
    start = NOW - draw(st.integers(0, 120))
    return Forecast(start=start, step=60.0, upper=tuple(upper))


@st.composite
def jobs(draw: st.DrawFn, key: str) -> Job:
    gpw = draw(st.sampled_from([1, 1, 2]))
    lo = draw(st.integers(1, 3))
    hi = draw(st.integers(lo, 5))
    shrink_ago = draw(st.none() | st.floats(0, 900))
    return Job(
        key=key,
        min_gpus=lo * gpw,
        max_gpus=hi * gpw,
        gpus_per_worker=gpw,
        priority=draw(st.integers(0, 3)),
        state_bytes=draw(st.sampled_from([0, 2**30, 8 * 2**30, 40 * 2**30])),
        seconds_to_safe_point=draw(st.floats(0, 60)),
        grace_s=draw(st.floats(0, 120)),
        suspend_s=draw(st.floats(0, 10)),
        min_useful_run_s=draw(st.sampled_from([0.0, 120.0, 600.0, 1200.0])),
        last_shrink_at=None if shrink_ago is None else NOW - shrink_ago,
    )


@st.composite
def plan_inputs(draw: st.DrawFn) -> PlanInput:
    pools = tuple(
        Pool(f"pool-{i}", cap, draw(forecasts(cap)))
        for i, cap in enumerate(draw(st.lists(st.integers(1, 16), min_size=1, max_size=2)))
    )
    the_jobs = tuple(draw(jobs(f"ns/job-{i}")) for i in range(draw(st.integers(2, 4))))
    workers: list[Worker] = []
    for job in the_jobs:
        for i in range(draw(st.integers(0, job.max_gpus // job.gpus_per_worker + 1))):
            state = draw(st.sampled_from(STATES))
            pool = draw(st.sampled_from([p.name for p in pools]))
            workers.append(Worker(f"{job.key}-w{i}", job.key, state, pool))
    interval = draw(st.sampled_from([0.0, 0.0, 30.0, 60.0]))
    return PlanInput(NOW, pools, the_jobs, tuple(workers), Settings(dwell_s=300.0, interval_s=interval))


def _gpw(inp: PlanInput) -> dict[str, int]:
    return {j.key: j.gpus_per_worker for j in inp.jobs}


def holders_after(inp: PlanInput, p: Plan) -> dict[str, list[tuple[str, str | None]]]:
    """job -> (worker or '+new', pool) of every worker that holds a GPU once the plan is carried out."""
    out: dict[str, list[tuple[str, str | None]]] = defaultdict(list)
    for w in inp.workers:
        t = p.targets[w.job]
        gone = w.name in t.suspend or w.name in t.remove
        if (w.state in HOLDING and not gone) or w.name in t.resume:
            out[w.job].append((w.name, w.pool))
    for key, t in p.targets.items():
        out[key].extend(("+new", pool) for pool in t.add)
    return out


def active_before(inp: PlanInput, key: str) -> int:
    return sum(_gpw(inp)[key] for w in inp.workers if w.job == key and w.state in HOLDING)


@settings(max_examples=150, deadline=None)
@given(plan_inputs())
def test_never_above_max_and_target_matches_workers(inp: PlanInput) -> None:
    p = plan(inp)
    after = holders_after(inp, p)
    for job in inp.jobs:
        t = p.targets[job.key]
        assert t.active_gpus == len(after[job.key]) * job.gpus_per_worker
        assert t.active_gpus <= job.max_gpus, t


@settings(max_examples=150, deadline=None)
@given(plan_inputs())
def test_never_below_min_while_running(inp: PlanInput) -> None:
    p = plan(inp)
    for job in inp.jobs:
        active = p.targets[job.key].active_gpus
        assert active == 0 or active >= job.min_gpus, (job, p.targets[job.key])


@settings(max_examples=150, deadline=None)
@given(plan_inputs())
def test_never_a_partial_gang(inp: PlanInput) -> None:
    """A gang suspend takes every worker that held a GPU; nothing of the job keeps running."""
    p = plan(inp)
    after = holders_after(inp, p)
    for r in p.reclaims:
        if r.kind != "gang-suspend":
            continue
        assert after[r.job] == [], (r, after[r.job])
        t = p.targets[r.job]
        held = {w.name for w in inp.workers if w.job == r.job and w.state in HOLDING}
        assert held <= set(t.suspend) | set(t.remove), (held, t)


@settings(max_examples=150, deadline=None)
@given(plan_inputs())
def test_serving_never_planned_short_at_the_quantile(inp: PlanInput) -> None:
    p = plan(inp)
    after = holders_after(inp, p)
    by_key = {j.key: j for j in inp.jobs}
    lent: dict[str, int] = defaultdict(int)
    lead: dict[str, float] = defaultdict(lambda: inp.settings.interval_s)
    for key, ws in after.items():
        for _, pool in ws:
            if pool is not None:
                lent[pool] += by_key[key].gpus_per_worker
                lead[pool] = max(lead[pool], inp.settings.interval_s + by_key[key].lead_s)
    for pool in inp.pools:
        assert p.lent[pool.name] == lent[pool.name]
        if _frozen(inp, pool):  # no forecast for the next plan: nothing planned there (issue 22 §5)
            continue
        if lent[pool.name]:
            need = math.ceil(pool.forecast.peak(NOW, NOW + lead[pool.name]))
            assert lent[pool.name] <= pool.capacity - need, (pool, lent[pool.name], need)


def _frozen(inp: PlanInput, pool: Pool) -> bool:
    return math.isinf(pool.forecast.peak(NOW, NOW + inp.settings.interval_s))


def _overreaches(inp: PlanInput, job: Job, pool: str) -> bool:
    """The job's own lead reaches past the pool's forecast (it is reclaimed there alone)."""
    fc = next(p.forecast for p in inp.pools if p.name == pool)
    return math.isinf(fc.peak(NOW, NOW + inp.settings.interval_s + job.lead_s))


@settings(max_examples=150, deadline=None)
@given(plan_inputs())
def test_frozen_pools_get_no_grants_and_no_planned_reclaims(inp: PlanInput) -> None:
    p = plan(inp)
    frozen = {pool.name for pool in inp.pools if _frozen(inp, pool)}
    assert not [r for r in p.reclaims if r.pool in frozen], p.reclaims
    for t in p.targets.values():
        assert not frozen & set(t.add), t
    parked_in = {w.name: w.pool for w in inp.workers}
    assert not [n for t in p.targets.values() for n in t.resume if parked_in[n] in frozen]


@settings(max_examples=150, deadline=None)
@given(plan_inputs())
def test_a_job_whose_lead_overreaches_is_reclaimed_alone(inp: PlanInput) -> None:
    """A job whose own lead the pool's forecast does not cover loses its workers there and never
    grows there; the other occupants' fate is decided by the leads that fit (no infinite need)."""
    p = plan(inp)
    by_key = {j.key: j for j in inp.jobs}
    for pool in inp.pools:
        if _frozen(inp, pool):
            continue
        for key, ws in holders_after(inp, p).items():
            assert not [w for w, at in ws if at == pool.name and _overreaches(inp, by_key[key], pool.name)], ws


def _shrinkable_at_end(inp: PlanInput, p: Plan, job: Job) -> bool:
    t = p.targets[job.key]
    removed = sum(
        1
        for w in inp.workers
        if w.job == job.key and w.state in HOLDING and (w.name in t.suspend or w.name in t.remove)
    )
    gang = any(r.job == job.key and r.kind == "gang-suspend" for r in p.reclaims)
    left = active_before(inp, job.key) - removed * job.gpus_per_worker
    return not gang and left - job.gpus_per_worker >= job.min_gpus


def _kept_in(inp: PlanInput, p: Plan, pool: str) -> set[str]:
    """Jobs with a worker in ``pool`` that held a GPU before the plan and still does."""
    t = p.targets
    return {
        w.job
        for w in inp.workers
        if w.pool == pool and w.state in HOLDING and w.name not in t[w.job].suspend and w.name not in t[w.job].remove
    }


@settings(max_examples=150, deadline=None)
@given(plan_inputs())
def test_cheapest_first_and_shrink_before_suspend(inp: PlanInput) -> None:
    p = plan(inp)
    by_key = {j.key: j for j in inp.jobs}

    def cost(j: Job) -> tuple[int, int, float, str]:  # the order: state, priority, safe point
        return (j.state_bytes, j.priority, j.seconds_to_safe_point, j.key)  # (one namespace, one class)

    for r in p.reclaims:
        victim = by_key[r.job]
        if _overreaches(inp, victim, r.pool):
            continue  # reclaimed for its own lead, whatever it costs
        for other in (by_key[k] for k in _kept_in(inp, p, r.pool) if k != r.job):
            shrinkable = _shrinkable_at_end(inp, p, other)
            if r.kind == "gang-suspend":
                assert not shrinkable, f"gang {r.job} suspended while {other.key} could shrink in {r.pool}"
                assert cost(other) > cost(victim), f"gang {r.job} suspended before cheaper {other.key}"
            elif shrinkable:
                assert cost(other) > cost(victim), f"{r.workers} shrunk before cheaper {other.key} in {r.pool}"


def _apply(inp: PlanInput, p: Plan, now: float) -> tuple[Worker, ...]:
    out: list[Worker] = []
    for w in inp.workers:
        t = p.targets[w.job]
        if w.name in t.remove:
            continue
        if w.name in t.suspend:
            out.append(replace(w, state="suspended"))
        elif w.name in t.resume or w.state in ("pending", "resuming"):
            out.append(replace(w, state="active"))
        else:
            out.append(w)
    for key, t in p.targets.items():
        out.extend(Worker(f"{key}-n{int(now)}-{i}", key, "pending", pool) for i, pool in enumerate(t.add))
    return tuple(out)


@settings(max_examples=150, deadline=None)
@given(plan_inputs(), st.lists(st.integers(0, 10**6), min_size=2, max_size=8))
def test_no_flapping_inside_the_dwell_time(inp: PlanInput, seeds: list[int]) -> None:
    """Rounds 60 s apart over noisy forecasts: a job never grows or resumes within dwell of a shrink."""
    shrunk: dict[str, float] = {}
    for step, seed in enumerate(seeds):
        now = NOW + 60.0 * step
        pools = tuple(replace(pl, forecast=_noisy(pl.forecast, seed, now)) for pl in inp.pools)
        jobs_now = tuple(replace(j, last_shrink_at=shrunk.get(j.key, j.last_shrink_at)) for j in inp.jobs)
        cur = replace(inp, now=now, pools=pools, jobs=jobs_now)
        p = plan(cur)
        for j in jobs_now:
            t = p.targets[j.key]
            if j.last_shrink_at is not None and now - j.last_shrink_at < cur.settings.dwell_s:
                assert not t.resume and not t.add, f"{j.key} grew {now - j.last_shrink_at:.0f}s after a shrink"
            if t.shrinks and any(r.job == j.key for r in p.reclaims):
                shrunk[j.key] = now
        inp = replace(cur, workers=_apply(cur, p, now))


def _noisy(f: Forecast, seed: int, now: float) -> Forecast:
    wobble = [((seed >> (i % 20)) & 3) - 1.5 for i in range(len(f.upper))]
    return Forecast(now - 30.0, f.step, tuple(max(0.0, u + d) for u, d in zip(f.upper, wobble, strict=True)))


@settings(max_examples=300, deadline=None)
@given(plan_inputs())
def test_a_suspended_worker_is_removed_only_by_a_max_below_the_jobs_workers(inp: PlanInput) -> None:
    """Suspended state is never lost to a plan (soak finding 1): a suspended worker is removed only
    when the job's workers (held and suspended) are above its maxGPUs (a live edit), never to grow
    the job in another pool."""
    p = plan(inp)
    for job in inp.jobs:
        mine = [w for w in inp.workers if w.job == job.key]
        if len(mine) * job.gpus_per_worker > job.max_gpus:
            continue
        removed = [w.name for w in mine if w.state == "suspended" and w.name in p.targets[job.key].remove]
        assert not removed, f"{job.key} (max {job.max_gpus}, {len(mine)} workers) lost suspended {removed}"

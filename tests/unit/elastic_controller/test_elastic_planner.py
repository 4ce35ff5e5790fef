"""The reclaim planner on named scenarios: a serving wave, shrink then gang suspend, regrow, dwell."""

from __future__ import annotations

import math

import pytest

from elastic_controller.planner import Forecast, Job, PlanInput, Pool, Settings, Worker, plan

NOW = 1_000.0


def flat(*levels: float, step: float = 60.0) -> Forecast:
    return Forecast(start=NOW, step=step, upper=tuple(levels))


def job(key: str = "ns/a", lo: int = 2, hi: int = 4, **kw: float) -> Job:
    base: dict[str, float] = {"grace_s": 30.0, "suspend_s": 5.0, "min_useful_run_s": 300.0}
    base.update(kw)
    return Job(key, lo, hi, **base)  # type: ignore[arg-type]


def workers(key: str, n: int, pool: str = "p", state: str = "active") -> tuple[Worker, ...]:
    return tuple(Worker(f"{key}-{i}", key, state, pool) for i in range(n))  # type: ignore[arg-type]


def inp(fc: Forecast, jobs: tuple[Job, ...], ws: tuple[Worker, ...], cap: int = 8, dwell: float = 300.0) -> PlanInput:
    return PlanInput(NOW, (Pool("p", cap, fc),), jobs, ws, Settings(dwell_s=dwell))


def test_forecast_peak_is_the_max_over_the_window_and_infinite_beyond_the_horizon() -> None:
    f = flat(1, 5, 2)
    assert f.peak(NOW, NOW + 10) == 1
    assert f.peak(NOW + 30, NOW + 130) == 5
    assert f.peak(NOW, NOW + 180) == math.inf


def test_forecast_refuses_bad_values_with_what_to_fix() -> None:
    with pytest.raises(ValueError, match="step must be > 0"):
        Forecast(NOW, 0, (1.0,))
    with pytest.raises(ValueError, match=">= 0"):
        Forecast(NOW, 60, (-1.0,))


def test_grows_from_zero_to_max_when_the_forecast_is_idle() -> None:
    t = plan(inp(flat(*[2] * 20), (job(),), ())).targets["ns/a"]
    assert t.active_gpus == 4 and t.add == ("p",) * 4
    assert t.reasons and t.reasons[0].startswith("Grow")


def test_never_starts_below_min_when_only_part_of_the_gang_fits() -> None:
    t = plan(inp(flat(*[7] * 20), (job(),), ())).targets["ns/a"]  # one GPU free, min is 2
    assert t.active_gpus == 0 and not t.add


def test_does_not_grow_without_room_for_the_minimum_useful_run() -> None:
    fc = flat(*([2] * 4 + [8] * 20))  # idle for 4 min, busy after: a 5-min run does not fit
    assert plan(inp(fc, (job(),), ())).targets["ns/a"].active_gpus == 0


def test_planned_reclaim_before_the_wave_shrinks_above_min_first() -> None:
    # 8 GPUs, serving needs 5 within the lead time (30 s grace + 5 s suspend): 3 may stay lent.
    p = plan(inp(flat(5, 5, 5), (job(),), workers("ns/a", 4)))
    t = p.targets["ns/a"]
    assert t.active_gpus == 3 and t.suspend == ("ns/a-3",)
    assert [r.kind for r in p.reclaims] == ["shrink"]
    assert "PlannedShrink" in t.reasons[0] and "p90 needs 5 of 8" in t.reasons[0]


def test_at_min_the_whole_gang_is_suspended() -> None:
    p = plan(inp(flat(7, 7), (job(),), workers("ns/a", 2)))
    t = p.targets["ns/a"]
    assert t.active_gpus == 0 and set(t.suspend) == {"ns/a-0", "ns/a-1"}
    assert [r.kind for r in p.reclaims] == ["gang-suspend"]


def test_a_wave_beyond_the_lead_time_reclaims_nothing_yet() -> None:
    fc = flat(*([2] + [8] * 20))  # the wave starts at +60 s; lead is 35 s
    t = plan(inp(fc, (job(),), workers("ns/a", 4))).targets["ns/a"]
    assert not t.suspend and t.active_gpus == 4


def test_cheapest_job_gives_back_first() -> None:
    big, small = job("ns/big", 1, 2, state_bytes=8e9), job("ns/small", 1, 2, state_bytes=1e9)
    ws = workers("ns/big", 2) + workers("ns/small", 2)
    p = plan(inp(flat(5, 5), (big, small), ws))  # 3 lendable, 4 lent: one must go
    assert p.targets["ns/small"].suspend == ("ns/small-1",) and not p.targets["ns/big"].suspend


def test_near_safe_point_gives_back_before_mid_phase() -> None:
    far, near = job("ns/far", 1, 2, seconds_to_safe_point=50), job("ns/near", 1, 2, seconds_to_safe_point=1)
    p = plan(inp(flat(5, 5), (far, near), workers("ns/far", 2) + workers("ns/near", 2)))
    assert p.targets["ns/near"].suspend and not p.targets["ns/far"].suspend


def test_suspended_gang_resumes_all_at_once_when_room_returns() -> None:
    j = job(last_shrink_at=NOW - 1000)
    t = plan(inp(flat(*[2] * 20), (j,), workers("ns/a", 3, state="suspended"))).targets["ns/a"]
    assert set(t.resume) == {"ns/a-0", "ns/a-1", "ns/a-2"} and t.add == ("p",) and t.active_gpus == 4


def _two_pools(ws: tuple[Worker, ...], j: Job) -> PlanInput:
    """Pool ``full`` with serving at 4 of 4 GPUs; pool ``idle`` with serving at 0 of 4."""
    pools = (Pool("full", 4, flat(*[4] * 20)), Pool("idle", 4, flat(*[0] * 20)))
    return PlanInput(NOW, pools, (j,), ws, Settings(dwell_s=3.0))


def test_a_suspended_worker_is_never_removed_to_grow_elsewhere() -> None:
    """Soak finding 1 (issue 25): a gang-suspended 1-GPU job (min = max = 1) whose pool stays full
    while another pool has room. Before, the grow step removed the suspended worker (its pod, so
    its state in host memory) and added a fresh one in the other pool, with only a ``Grow`` Event.
    It waits for room in its own pool instead, and resumes there."""
    j = job("soak/trainer", lo=1, hi=1, grace_s=5.0, suspend_s=1.0, min_useful_run_s=10.0)
    parked = (Worker("trainer-w0", j.key, "suspended", "full"),)
    t = plan(_two_pools(parked, j)).targets[j.key]
    assert (t.remove, t.add, t.resume, t.active_gpus) == ((), (), (), 0), t
    freed = PlanInput(
        NOW, (Pool("full", 4, flat(*[0] * 20)), Pool("idle", 4, flat(*[0] * 20))), (j,), parked, Settings(dwell_s=3.0)
    )
    t = plan(freed).targets[j.key]
    assert (t.remove, t.add, t.resume, t.active_gpus) == ((), (), ("trainer-w0",), 1), t


def test_a_job_with_room_below_max_grows_elsewhere_while_its_suspended_worker_waits() -> None:
    """Room under maxGPUs beside the parked worker: a new worker in the idle pool, the parked one kept."""
    j = job("ns/a", lo=1, hi=2, grace_s=5.0, suspend_s=1.0, min_useful_run_s=10.0)
    t = plan(_two_pools((Worker("a-w0", j.key, "suspended", "full"),), j)).targets[j.key]
    assert (t.remove, t.add, t.resume, t.active_gpus) == ((), ("idle",), (), 1), t


def test_dwell_blocks_regrow_but_never_a_reclaim() -> None:
    j = job(last_shrink_at=NOW - 60)
    assert not plan(inp(flat(*[2] * 20), (j,), workers("ns/a", 2, state="suspended"))).targets["ns/a"].resume
    assert plan(inp(flat(8, 8), (j,), workers("ns/a", 2))).targets["ns/a"].active_gpus == 0


def test_a_live_max_edit_removes_workers_beyond_it() -> None:
    t = plan(inp(flat(*[0] * 20), (job(hi=2),), workers("ns/a", 3))).targets
    assert t["ns/a"].active_gpus == 2 and t["ns/a"].remove == ("ns/a-2",)


def test_a_lost_worker_is_replaced_or_the_gang_suspended() -> None:
    j = job(lo=2, hi=2)
    assert plan(inp(flat(*[0] * 20), (j,), workers("ns/a", 1))).targets["ns/a"].add == ("p",)
    t = plan(inp(flat(*[7] * 20), (j,), workers("ns/a", 1))).targets["ns/a"]
    assert t.active_gpus == 0 and t.suspend == ("ns/a-0",)


def test_pending_workers_are_removed_not_suspended() -> None:
    t = plan(inp(flat(8, 8), (job(),), workers("ns/a", 2, state="pending"))).targets["ns/a"]
    assert set(t.remove) == {"ns/a-0", "ns/a-1"} and not t.suspend


def test_new_workers_go_to_the_pool_with_most_headroom() -> None:
    pools = (Pool("busy", 16, flat(*[14] * 20)), Pool("idle", 16, flat(*[4] * 20)))
    t = plan(PlanInput(NOW, pools, (job(lo=1, hi=4),), ())).targets["ns/a"]
    assert t.add == ("idle",) * 4


def test_a_grow_keeps_room_for_the_slowest_occupant_to_leave() -> None:
    # ns/slow needs 120 s to give its GPU back; serving rises to 6 of 8 GPUs at +60 s. ns/fast
    # (no lead, no minimum run) would fit for its own window, but a third lent GPU would leave
    # serving short when it arrives, since ns/slow could not leave in time.
    slow = job("ns/slow", 2, 2, grace_s=120, suspend_s=0)
    fast = job("ns/fast", 1, 1, grace_s=0, suspend_s=0, min_useful_run_s=0)
    t = plan(inp(flat(0, 6, 6, 6), (slow, fast), workers("ns/slow", 2))).targets
    assert t["ns/slow"].active_gpus == 2 and t["ns/fast"].active_gpus == 0


def test_the_cheapest_gang_is_suspended_when_every_job_is_at_min() -> None:
    big, small = job("ns/big", 2, 2, state_bytes=8e9), job("ns/small", 2, 2, state_bytes=1e9)
    p = plan(inp(flat(5, 5), (big, small), workers("ns/big", 2) + workers("ns/small", 2)))
    assert p.targets["ns/small"].active_gpus == 0 and p.targets["ns/big"].active_gpus == 2
    assert [(r.job, r.kind) for r in p.reclaims] == [("ns/small", "gang-suspend")]

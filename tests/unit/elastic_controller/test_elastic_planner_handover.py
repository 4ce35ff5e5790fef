"""A time-slice group's hand-over is not a reclaim (issue 25, group soak g2/g3/g5): while the group's
shared claim is allocated on a GPU serving does not hold, the group holds that GPU, so neither
member's target flips to 0 at the instant when the old holder is suspending and the new one is not
yet resumed. Replayed here as the planner's input at each step of one hand-over, with g5's pool-b
(6 GPUs, serving's forecast 3 now and 4 a few seconds on, two of elastic-a's workers there)."""

from __future__ import annotations

from elastic_controller.observe import ObservedWorker, handed, to_planner
from elastic_controller.planner import Forecast, Job, Plan, PlanInput, Pool, Settings, Worker, plan
from rose_common import names

NOW = 1_000_000.0
CLAIM = "soak/ts-tsg-w0-gpus"


def pool_b(later: float = 4.0, capacity: int = 6) -> Pool:
    """Serving needs 3 over the next 10 s (the members' lead, 5 s, falls inside) and ``later`` after:
    a resume needs room for lead + minUsefulRunSeconds (15 s), a holder only for its lead."""
    return Pool("pool-b", capacity, Forecast(NOW, 10.0, (3.0, *(later,) * 60)))


def job(key: str, lo: int, hi: int) -> Job:
    return Job(key, lo, hi, grace_s=5, min_useful_run_s=10, last_shrink_at=NOW - 3.0)


JOBS = (job("soak/ts-a", 1, 1), job("soak/ts-b", 1, 1), job("soak/elastic-a", 1, 4))
ELASTIC = (
    Worker("elastic-a-w0", "soak/elastic-a", "active", "pool-b", "soak/elastic-a-w0-gpus"),
    Worker("elastic-a-w2", "soak/elastic-a", "active", "pool-b", "soak/elastic-a-w2-gpus"),
)


def member(job_key: str, state: str, by_handover: bool) -> Worker:
    name = job_key.rpartition("/")[2] + "-w0"
    return Worker(name, job_key, state, "pool-b", CLAIM, handed=by_handover)  # type: ignore[arg-type]


def at(a: tuple[str, bool], b: tuple[str, bool], p: Pool | None = None) -> Plan:
    workers = (member("soak/ts-a", *a), member("soak/ts-b", *b), *ELASTIC)
    return plan(PlanInput(NOW, (p or pool_b(),), JOBS, workers, Settings(dwell_s=300)))


def test_neither_members_target_flips_to_zero_through_a_hand_over() -> None:
    steps = {
        "ts-a holds, ts-b parked by the last hand-over": at(("active", False), ("suspended", True)),
        "ts-a suspending, ts-b not resumed yet (g5's instant)": at(("suspending", True), ("suspended", True)),
        "ts-a suspended, ts-b's request removed, not resumed yet": at(("suspended", True), ("active", False)),
        "ts-b resuming": at(("suspended", True), ("resuming", False)),
    }
    for step, result in steps.items():
        got = {k: result.targets[k].active_gpus for k in ("soak/ts-a", "soak/ts-b", "soak/elastic-a")}
        assert got == {"soak/ts-a": 1, "soak/ts-b": 1, "soak/elastic-a": 2}, step
        assert result.lent == {"pool-b": 3} and result.claimed == {"pool-b": 3}, step  # the shared GPU once
        assert not result.reclaims, step


def test_the_group_keeps_its_gpu_from_other_jobs_mid_hand_over() -> None:
    """A pool of 7 and elastic-a free to grow: one new worker fits (7 - serving 3 - 3 claimed:
    elastic-a's two and the group's one), not two; the shared GPU is the group's while both members
    are parked by the hand-over, and counted once."""
    grown = plan(
        PlanInput(
            NOW,
            (pool_b(later=1.0, capacity=7),),
            (JOBS[0], JOBS[1], Job("soak/elastic-a", 1, 4, grace_s=5, min_useful_run_s=10)),
            (member("soak/ts-a", "suspending", True), member("soak/ts-b", "suspended", True), *ELASTIC),
            Settings(dwell_s=300),
        )
    )
    assert grown.targets["soak/elastic-a"].active_gpus == 3 and grown.claimed == {"pool-b": 4}
    assert grown.targets["soak/ts-a"].active_gpus == 1 and grown.targets["soak/ts-b"].active_gpus == 1


def test_serving_still_reclaims_the_groups_gpu_mid_hand_over() -> None:
    """A hand-over is not a reclaim, but serving's need is: with serving needing the pool within the
    members' lead, both members parked by the hand-over are planned suspended (target 0)."""
    p = Pool("pool-b", 2, Forecast(NOW, 10.0, (2.0,) * 60))
    workers = (member("soak/ts-a", "suspending", True), member("soak/ts-b", "suspended", True))
    result = plan(PlanInput(NOW, (p,), JOBS[:2], workers, Settings(dwell_s=300)))
    assert result.targets["soak/ts-a"].active_gpus == 0 and result.targets["soak/ts-b"].active_gpus == 0
    assert {r.job for r in result.reclaims} == {"soak/ts-a", "soak/ts-b"} and result.lent == {"pool-b": 0}


def test_a_member_suspended_by_someone_else_is_not_held_for_the_group() -> None:
    """Only the orchestrator's hand-over keeps the GPU the group's: the same members parked with no
    hand-over mark get no room at g5's instant (serving's 4 later leaves none for a resume)."""
    result = at(("suspending", False), ("suspended", False))
    assert result.targets["soak/ts-a"].active_gpus == 0 and result.targets["soak/ts-b"].active_gpus == 0


def _observed(by: str | None, serving_held: str = "", claim: str | None = "ts-tsg-w0-gpus") -> ObservedWorker:
    return ObservedWorker(
        name="ts-a-w0",
        uid="u",
        phase="Running",
        index=0,
        pool="pool-b",
        node="rose-node-3",
        request_by=by,
        suspend_state="Suspended" if by else None,
        claim=claim,
        serving_held=serving_held,
    )


def test_handed_is_the_orchestrators_request_on_a_shared_claim_serving_does_not_hold() -> None:
    assert handed(_observed(names.SUSPEND_BY_TIMESLICE), grouped=True)
    assert not handed(_observed(names.SUSPEND_BY_TIMESLICE), grouped=False)  # not a group member
    assert not handed(_observed("rose-elastic-controller"), grouped=True)  # the controller's reclaim
    assert not handed(_observed(None), grouped=True)
    assert not handed(_observed(names.SUSPEND_BY_TIMESLICE, serving_held="claim x held by serving"), grouped=True)
    assert not handed(_observed(names.SUSPEND_BY_TIMESLICE, claim=None), grouped=True)
    w = to_planner("soak/ts-a", _observed(names.SUSPEND_BY_TIMESLICE), grouped=True)
    assert w is not None and w.handed and w.state == "suspended" and w.claim == "soak/ts-tsg-w0-gpus"

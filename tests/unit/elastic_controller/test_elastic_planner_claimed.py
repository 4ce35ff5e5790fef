"""The planner counts a lent claim's GPU as taken for NEW workers whatever its worker's state
(``rose_common.lending``; issue 25, group soak g6): a suspended worker's claim stays allocated, so
another job gets no new worker on it, while the suspended worker's own job grows by resuming it in
place; a time-slice group's shared claim counts once."""

from __future__ import annotations

from elastic_controller.planner import Forecast, Job, PlanInput, Pool, Settings, Worker, plan

NOW = 1_000_000.0


def pool(capacity: int = 6, need: float = 3.0) -> Pool:
    return Pool("p", capacity, Forecast(NOW, 60.0, (need,) * 60))


def job(key: str, lo: int, hi: int, shrunk: float | None = None) -> Job:
    return Job(key, lo, hi, grace_s=5, min_useful_run_s=10, last_shrink_at=shrunk)


def test_another_job_gets_no_new_worker_on_a_suspended_workers_gpu() -> None:
    """g6: 6 GPUs, serving needs 3, a runs 2, b's worker suspended (b in its dwell): no room left."""
    workers = (
        Worker("a-w0", "rl/a", "active", "p", "rl/a-w0-gpus"),
        Worker("a-w1", "rl/a", "active", "p", "rl/a-w1-gpus"),
        Worker("b-w0", "rl/b", "suspended", "p", "rl/b-w0-gpus"),
    )
    jobs = (job("rl/a", 1, 3), job("rl/b", 1, 1, shrunk=NOW - 10))
    result = plan(PlanInput(NOW, (pool(),), jobs, workers, Settings(dwell_s=300)))
    assert result.targets["rl/a"].add == ()
    assert result.lent == {"p": 2} and result.claimed == {"p": 3}


def test_the_suspended_workers_job_grows_by_resuming_it_in_place() -> None:
    """Same pool, b out of its dwell: b's worker resumes on its own claim; a still gets no new one."""
    workers = (
        Worker("a-w0", "rl/a", "active", "p", "rl/a-w0-gpus"),
        Worker("a-w1", "rl/a", "active", "p", "rl/a-w1-gpus"),
        Worker("b-w0", "rl/b", "suspended", "p", "rl/b-w0-gpus"),
    )
    jobs = (job("rl/a", 1, 3), job("rl/b", 1, 1))
    result = plan(PlanInput(NOW, (pool(),), jobs, workers, Settings(dwell_s=300)))
    assert result.targets["rl/b"].resume == ("b-w0",)
    assert result.targets["rl/a"].add == ()
    assert result.lent == {"p": 3} and result.claimed == {"p": 3}


def test_a_time_slice_groups_shared_claim_counts_once() -> None:
    """Two members on one shared claim (one holds, one suspended by a hand-over): one GPU claimed,
    so a job may still get the pool's last free GPU."""
    workers = (
        Worker("ts-a-w0", "rl/ts-a", "active", "p", "rl/ts-tsg-w0-gpus"),
        Worker("ts-b-w0", "rl/ts-b", "suspended", "p", "rl/ts-tsg-w0-gpus"),
        Worker("a-w0", "rl/a", "active", "p", "rl/a-w0-gpus"),
    )
    jobs = (job("rl/ts-a", 1, 1), job("rl/ts-b", 1, 1, shrunk=NOW - 10), job("rl/a", 1, 2))
    result = plan(PlanInput(NOW, (pool(capacity=6, need=3),), jobs, workers, Settings(dwell_s=300)))
    assert result.targets["rl/a"].add == ("p",)
    assert result.claimed == {"p": 3}


def test_a_gang_resume_undone_leaves_its_claims_taken() -> None:
    """g (a gang of 2, both suspended) can resume only one: the attempt is undone, and both its
    claims still count as taken for new workers."""
    workers = (
        Worker("z-w0", "rl/z", "active", "p", "rl/z-w0-gpus"),
        Worker("z-w1", "rl/z", "active", "p", "rl/z-w1-gpus"),
        Worker("g-w0", "rl/g", "suspended", "p", "rl/g-w0-gpus"),
        Worker("g-w1", "rl/g", "suspended", "p", "rl/g-w1-gpus"),
    )
    jobs = (job("rl/z", 1, 2), job("rl/g", 2, 2))
    result = plan(PlanInput(NOW, (pool(capacity=6, need=3),), jobs, workers, Settings(dwell_s=300)))
    assert result.targets["rl/g"].resume == () and result.targets["rl/g"].add == ()
    assert result.claimed == {"p": 4}


def test_a_granted_worker_not_yet_scheduled_is_removed_when_the_rule_leaves_it_no_room() -> None:
    """g1 on this branch: a's third worker was granted, then b's worker was suspended in place; the
    pending, unplaced worker (what the extender refuses) is removed, not kept as a target; one the
    scheduler already placed (its claim allocated) stays."""
    base = (
        Worker("a-w0", "rl/a", "active", "p", "rl/a-w0-gpus"),
        Worker("a-w1", "rl/a", "active", "p", "rl/a-w1-gpus"),
        Worker("b-w0", "rl/b", "suspended", "p", "rl/b-w0-gpus"),
    )
    jobs = (job("rl/a", 1, 3), job("rl/b", 1, 1, shrunk=NOW - 10))
    unplaced = Worker("a-w2", "rl/a", "pending", "p", "rl/a-w2-gpus", bound=False)
    result = plan(PlanInput(NOW, (pool(),), jobs, (*base, unplaced), Settings(dwell_s=300)))
    target = result.targets["rl/a"]
    assert target.remove == ("a-w2",) and target.active_gpus == 2
    assert any(r.startswith("Shrink: a-w2 removed before it was scheduled: p has no GPU") for r in target.reasons)
    placed = Worker("a-w2", "rl/a", "pending", "p", "rl/a-w2-gpus", bound=True)
    result = plan(PlanInput(NOW, (pool(),), jobs, (*base, placed), Settings(dwell_s=300)))
    assert result.targets["rl/a"].remove == () and result.targets["rl/a"].active_gpus == 3


def test_a_granted_worker_not_yet_scheduled_stays_while_the_rule_leaves_it_room() -> None:
    workers = (
        Worker("a-w0", "rl/a", "active", "p", "rl/a-w0-gpus"),
        Worker("a-w1", "rl/a", "pending", "p", "rl/a-w1-gpus", bound=False),
        Worker("b-w0", "rl/b", "suspended", "p", "rl/b-w0-gpus"),
    )
    jobs = (job("rl/a", 1, 2), job("rl/b", 1, 1, shrunk=NOW - 10))
    result = plan(PlanInput(NOW, (pool(),), jobs, workers, Settings(dwell_s=300)))
    assert result.targets["rl/a"].remove == () and result.targets["rl/a"].active_gpus == 2


def test_a_group_member_resumes_onto_the_shared_claim_another_member_holds() -> None:
    """Group soak suspalloc g2/g3: with no spare GPU in the pool, the member just handed away from
    was planned 0 (its resume counted as a second GPU) and 1 once it held again, never both at
    target. The shared claim's GPU is one GPU: both members are planned on it, it is lent once."""
    workers = (
        Worker("ts-a-w0", "rl/ts-a", "active", "p", "rl/ts-tsg-w0-gpus"),
        Worker("ts-b-w0", "rl/ts-b", "suspended", "p", "rl/ts-tsg-w0-gpus"),
        Worker("a-w0", "rl/a", "active", "p", "rl/a-w0-gpus"),
        Worker("a-w1", "rl/a", "active", "p", "rl/a-w1-gpus"),
    )
    jobs = (job("rl/ts-a", 1, 1), job("rl/ts-b", 1, 1), job("rl/a", 1, 2))
    result = plan(PlanInput(NOW, (pool(capacity=6, need=3),), jobs, workers, Settings(dwell_s=300)))
    assert result.targets["rl/ts-b"].active_gpus == 1 and result.targets["rl/ts-a"].active_gpus == 1
    assert result.lent == {"p": 3} and result.claimed == {"p": 3} and not result.reclaims


def test_serving_reclaims_a_shared_claims_gpu_from_every_member() -> None:
    workers = (
        Worker("ts-a-w0", "rl/ts-a", "active", "p", "rl/ts-tsg-w0-gpus"),
        Worker("ts-b-w0", "rl/ts-b", "active", "p", "rl/ts-tsg-w0-gpus"),
    )
    jobs = (job("rl/ts-a", 1, 1), job("rl/ts-b", 1, 1))
    result = plan(PlanInput(NOW, (pool(capacity=2, need=2),), jobs, workers, Settings(dwell_s=300)))
    assert result.lent == {"p": 0}
    assert {r.job for r in result.reclaims} == {"rl/ts-a", "rl/ts-b"}

"""The reclaim planner with GPU shares (issue 27 §3): shares are reclaimed before whole GPUs, a
job's min/max count shares as fractions, a partly shared GPU takes another share."""

from __future__ import annotations

import pytest

from elastic_controller.planner import Forecast, Job, Plan, PlanInput, Pool, Settings, Worker, plan, without_reclaims

NOW = 1_000.0


def flat(level: float, n: int = 30) -> Forecast:
    return Forecast(start=NOW, step=60.0, upper=(level,) * n)


def job(key: str, lo: int, hi: int, share: float = 0.0, **kw: float) -> Job:
    base: dict[str, float] = {"grace_s": 30.0, "suspend_s": 5.0, "min_useful_run_s": 300.0}
    base.update(kw)
    return Job(key, lo, hi, share=share, **base)  # type: ignore[arg-type]


def workers(key: str, n: int, state: str = "active") -> tuple[Worker, ...]:
    return tuple(Worker(f"{key}-{i}", key, state, "p") for i in range(n))  # type: ignore[arg-type]


def run(level: float, jobs: tuple[Job, ...], ws: tuple[Worker, ...], cap: int = 4) -> Plan:
    return plan(PlanInput(NOW, (Pool("p", cap, flat(level)),), jobs, ws, Settings(dwell_s=300.0)))


@pytest.mark.parametrize(
    ("case", "share", "lo", "hi", "serving", "want_workers"),
    [
        # 4 GPUs, serving 2: 2 GPUs lendable = 8 quarter shares, capped by max 1 GPU = 4 workers
        ("max counts shares as fractions", 0.25, 1, 1, 2.0, 4),
        ("max of 3 GPUs in quarter shares, room for 2 GPUs", 0.25, 1, 3, 2.0, 8),
        ("serving 3.5 counts 4 whole GPUs: no room for a share", 0.25, 1, 2, 3.5, 0),
        ("half shares: min 1 = 2 workers", 0.5, 1, 4, 1.0, 6),
        ("whole GPUs, same pool", 0.0, 1, 4, 2.0, 2),
    ],
)
def test_grow_counts_shares_as_fractions(
    case: str, share: float, lo: int, hi: int, serving: float, want_workers: int
) -> None:
    result = run(serving, (job("ns/a", lo, hi, share),), ())
    t = result.targets["ns/a"]
    assert len(t.add) == want_workers, case
    if share:
        assert (t.active_gpus, t.active_share) == (0, pytest.approx(want_workers * share)), case
        assert result.lent_shares.get("p", 0.0) == pytest.approx(want_workers * share)


def test_a_partly_shared_gpu_takes_another_share_where_no_whole_gpu_is_free() -> None:
    """4 GPUs, serving 3, three quarter shares hold a quarter-empty GPU: one more share fits (it is
    packed onto that GPU), a whole-GPU job gets nothing."""
    share_job = job("ns/s", 0, 4, share=0.25)
    whole_job = job("ns/w", 1, 1)
    result = run(3.0, (share_job, whole_job), workers("ns/s", 3))
    assert result.targets["ns/s"].add == ("p",)
    assert result.targets["ns/w"].add == ()
    assert result.lent == {"p": 1}


def test_serving_growth_reclaims_the_share_first() -> None:
    """4 GPUs, 2 lent whole (job w, min 1) and one GPU in two half shares (job s, min 0). Serving
    rises from 1 to 2: one GPU must come back. The shares go first (both: one alone frees nothing),
    the whole GPUs stay, though w is above its minimum and s is the job with more state."""
    s = job("ns/s", 0, 1, share=0.5, state_bytes=10**12)
    w = job("ns/w", 1, 2, state_bytes=1)
    result = run(2.0, (s, w), workers("ns/s", 2) + workers("ns/w", 2))
    ts, tw = result.targets["ns/s"], result.targets["ns/w"]
    assert sorted(ts.suspend) == ["ns/s-0", "ns/s-1"] and ts.active_share == 0.0
    assert tw.suspend == () and tw.active_gpus == 2
    assert [r.kind for r in result.reclaims] == ["shrink", "shrink"]  # min 0
    assert ts.reasons[0].startswith("PlannedShrink: ns/s-1 (a 0.5 GPU share) in p; serving p90 needs 2 of 4 GPUs")
    assert "1 GPU in shares counts 1" in ts.reasons[0]
    assert result.lent == {"p": 2}


def test_share_jobs_stay_within_their_min_when_reclaimed() -> None:
    """A share job at its minimum (1 GPU = 4 quarter shares) is suspended as a gang, never left at 0.75."""
    s = job("ns/s", 1, 2, share=0.25)
    result = run(3.5, (s,), workers("ns/s", 6), cap=5)  # 5 - 4 = 1 GPU left: 6 quarters (2 GPUs) too many
    t = result.targets["ns/s"]
    assert t.active_share == pytest.approx(1.0) and len(t.suspend) == 2


def test_without_reclaims_keeps_the_shares_in_the_target() -> None:
    s = job("ns/s", 0, 1, share=0.5)
    result = run(4.0, (s,), workers("ns/s", 2))
    assert result.targets["ns/s"].active_share == 0.0
    kept = without_reclaims(result, {"ns/s": 1}, {"ns/s": 0.5})
    assert (kept.targets["ns/s"].active_share, kept.targets["ns/s"].active_gpus) == (1.0, 0)


@pytest.mark.parametrize("bad", [1.0, -0.1, 1.5, float("nan")])
def test_a_share_is_a_fraction_below_one(bad: float) -> None:
    with pytest.raises(ValueError, match="share must be 0 \\(whole GPUs\\) or a fraction of a GPU below 1"):
        Job("ns/x", 0, 1, share=bad)

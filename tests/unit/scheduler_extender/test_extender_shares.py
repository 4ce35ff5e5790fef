"""The extender's decisions for RL pods claiming GPU shares (issue 27 §3): pure functions, and the
real cache fed with the objects the driver and the scheduler write."""

from __future__ import annotations

from typing import Any

import pytest

from rose_common import names
from scheduler_extender import policy, shares
from scheduler_extender.model import PodInfo, PodKind, PoolForecast, PoolState, ShareRequest
from tests.support.extender_fixtures import claim, share_cache, share_claim

CFG = policy.PolicyConfig(default_min_run_s=600)
GIB = 2**30
GPU = 80 * GIB  # the fixtures' share devices


def _spec(cls: str, capacity: dict[str, str] | None, count: int = 1) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "count": count}
    if capacity is not None:
        exactly["capacity"] = {"requests": capacity}
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        (_spec(names.DEVICE_CLASS_SHARE, {"memory": "20Gi", "compute": "25"}), [(20 * GIB, 25)]),
        # rounded up to the driver's steps, as the scheduler writes consumedCapacity
        (_spec(names.DEVICE_CLASS_SHARE, {"memory": "1500Mi", "compute": "23"}), [(2 * GIB, 25)]),
        (_spec(names.DEVICE_CLASS_SHARE, None), [(GIB, 5)]),  # the request policy's defaults
        (_spec(names.DEVICE_CLASS_SHARE, {"memory": "10Gi", "compute": "10"}, count=2), [(10 * GIB, 10)] * 2),
        (_spec(names.DEVICE_CLASS_LENDABLE, None), []),  # whole GPUs: no share
        (None, []),
        ({"devices": {"requests": [{"name": "x", "firstAvailable": []}]}}, []),
    ],
)
def test_claim_share_requests(spec: dict[str, Any] | None, want: list[tuple[int, int]]) -> None:
    assert shares.claim_share_requests(spec) == tuple(ShareRequest(m, c) for m, c in want)


@pytest.mark.parametrize(
    ("memory", "compute", "fraction"),
    [
        (20 * GIB, 25, 0.25),  # memory 20/80 = compute 25 %
        (40 * GIB, 10, 0.5),  # memory dominates
        (8 * GIB, 60, 0.6),  # compute dominates
    ],
)
def test_share_fraction_is_the_larger_of_memory_and_compute(memory: int, compute: int, fraction: float) -> None:
    assert shares.share_fraction(ShareRequest(memory, compute), GPU) == pytest.approx(fraction)


@pytest.mark.parametrize(("demand", "gpus"), [(0.0, 0), (7.0, 7), (7.4, 8), (7.0000000001, 7), (0.2, 1)])
def test_serving_is_counted_in_whole_gpus(demand: float, gpus: int) -> None:
    assert shares.serving_gpus(demand) == gpus


@pytest.mark.parametrize(
    ("rooms", "requests", "fits"),
    [
        ([(40 * GIB, 50)], [(20 * GIB, 25)], True),
        ([(40 * GIB, 50)], [(20 * GIB, 25), (20 * GIB, 25)], True),  # two shares on one GPU
        ([(40 * GIB, 50)], [(20 * GIB, 25)] * 3, False),
        ([(10 * GIB, 90), (30 * GIB, 20)], [(20 * GIB, 25)], False),  # neither GPU has both
        ([(10 * GIB, 90), (30 * GIB, 30)], [(20 * GIB, 25)], True),
        ([], [(GIB, 5)], False),
    ],
)
def test_fit_shares(rooms: list[tuple[int, int]], requests: list[tuple[int, int]], fits: bool) -> None:
    assert shares.fit_shares(rooms, [ShareRequest(m, c) for m, c in requests]) is fits


FULL = PoolForecast("p", ((600, 7.0), (1800, 7.0), (3600, 7.0)))


@pytest.mark.parametrize(
    ("case", "pool", "forecast", "need", "window"),
    [
        # 8 GPUs, serving forecast 7, one GPU half lent in shares: no whole GPU is left, a quarter share fits
        ("room on a partly shared GPU", PoolState(8, 7, 0, 1, 0.5, GPU), FULL, 0.25, 3600.0),
        ("the share's fraction exceeds what is left", PoolState(8, 7, 0, 1, 0.5, GPU), FULL, 0.75, 0.0),
        # a fractional forecast (7.4 of 8) leaves no share room: serving's 8th claim takes the GPU
        ("fractional forecast, whole GPUs", PoolState(8, 7, 0), PoolForecast("p", ((600, 7.4),)), 0.25, 0.0),
        ("forecast rises at 30 min", PoolState(8, 6, 0), PoolForecast("p", ((600, 6.0), (1800, 8.0))), 0.5, 600.0),
        ("a GPU lent whole counts whole", PoolState(8, 6, 2), FULL, 0.25, 0.0),
        # no forecast: the fallback rule, with the share's fraction as the need (25 % of 8 = 2 GPUs free after)
        ("fallback, room", PoolState(8, 5, 0), None, 0.5, CFG.fallback_window_s),
        ("fallback, no room", PoolState(8, 6, 0), None, 0.5, 0.0),
    ],
)
def test_share_outlook_window(
    case: str, pool: PoolState, forecast: PoolForecast | None, need: float, window: float
) -> None:
    assert shares.share_outlook(pool, forecast, need, CFG).window_s == window, case


def test_whole_gpu_pod_counts_a_partly_shared_gpu_whole() -> None:
    """The same pool as the first case above: a pod of one whole GPU finds no room (the shared GPU
    cannot be lent whole), where a quarter share does."""
    pool = PoolState(8, 7, 0, 1, 0.5, GPU)
    assert policy.idle_window_s(pool, FULL, 1, CFG) == (0.0, False)
    assert shares.share_outlook(pool, FULL, 0.25, CFG).window_s == 3600.0


def _share_pod(memory: int = 20 * GIB, compute: int = 25, job: str = "j") -> PodInfo:
    return PodInfo("ns", "w", "u-w", PodKind.RL, job=job, shares=(ShareRequest(memory, compute),))


def _decide(objects: list[tuple[str, dict[str, Any]]], forecast: PoolForecast | None) -> Any:
    cache = share_cache({"p": ["n1", "n2"]}, gpus=2, objects=objects)
    snap = cache.snapshot()
    pod = _share_pod()
    looks, _ = shares.share_outlooks(snap, {"p": forecast}, pod.shares, CFG)
    return cache, snap, looks, pod


def test_cache_counts_shares_and_filter_judges_in_shares() -> None:
    """4 GPUs in the pool; serving holds n1's GPU 1 and n2's GPU 0; n1's GPU 0 has a 40 GiB + 50 %
    share, n2's GPU 1 is lent whole. The forecast keeps 2 GPUs for serving: no whole GPU is left
    (4 - 2 - 1 lent whole - 1 shared), yet n1's shared GPU takes a 20 GiB + 25 % share
    (4 - 2 - 1 - 0.5 = 0.5 of a GPU in shares)."""
    objects = [
        ("ResourceClaim", claim("ns", "serve-1", "n1", ["gpu-1-serving"])),
        ("ResourceClaim", claim("ns", "serve-2", "n2", ["gpu-0-serving"])),
        ("ResourceClaim", claim("ns", "whole", "n2", ["gpu-1-lendable"])),
        ("ResourceClaim", share_claim("ns", "half", "40Gi", "50", [("n1", "gpu-0-share", 40 * GIB, 50)])),
    ]
    fc = PoolForecast("p", ((600, 2.0), (3600, 2.0)))
    cache, snap, looks, pod = _decide(objects, fc)
    n1, n2 = snap.nodes["n1"], snap.nodes["n2"]
    assert (n1.shared_gpus, n1.share_lent, n1.share_room, n1.lendable_free) == (1, 0.5, ((40 * GIB, 50),), 0)
    assert (n2.shared_gpus, n2.share_room, n2.lent) == (0, (), 1)
    assert policy.serving_score(n1, CFG) < 10  # shares make the node "lent" for serving's score
    pool = snap.pools["p"]
    assert (pool.capacity, pool.lent, pool.shared_gpus, pool.share_lent, pool.gpu_memory) == (4, 1, 1, 0.5, GPU)
    out = shares.filter_nodes(pod, ["n1", "n2", "gone"], snap, looks, CFG)
    assert out.passed == ["n1"]
    assert out.unresolvable["n2"].startswith("no room for a share of 20 GiB + 25 % on one GPU: no GPU of this node")
    assert out.failed == {"gone": "node not in the ROSE extender cache yet"}
    # the whole-GPU rule for the same pool: nothing fits
    whole, _ = policy.pool_outlooks(snap, {"p": fc}, 1, CFG)
    whole_pod = PodInfo("ns", "x", "u-x", PodKind.RL, job="j")
    assert policy.filter_nodes(whole_pod, ["n1", "n2"], snap, whole, CFG).passed == []
    # the share's claim is gone: its GPU is free again
    cache.apply("ResourceClaim", "DELETED", share_claim("ns", "half", "40Gi", "50"))
    n1 = cache.snapshot().nodes["n1"]
    assert (n1.shared_gpus, n1.share_lent, n1.share_room, n1.lendable_free) == (0, 0.0, ((80 * GIB, 100),), 1)


def test_forecast_verdict_says_it_counted_shares() -> None:
    objects = [("ResourceClaim", claim("ns", "serve-1", "n1", ["gpu-1-serving"]))]
    _, snap, looks, pod = _decide(objects, PoolForecast("p", ((600, 3.2),)))  # ⌈3.2⌉ = 4 of 4 GPUs
    out = shares.filter_nodes(pod, ["n1"], snap, looks, CFG)
    assert out.passed == []
    assert out.unresolvable["n1"] == (
        "serving forecast needs pool 'p' within 0s < min useful run 600s for a share of 20 GiB + 25 % "
        "(counted in shares: 4 GPUs, serving in whole GPUs, 0 lent whole, 0.00 GPU lent in shares)"
    )


def test_prioritize_shares() -> None:
    """n1 has a GPU with 40 GiB + 50 % free (the pod's share fits twice: +1); n2 has two free GPUs
    (also twice); n3's GPUs are held by serving (0). A worker of the job on n2 adds 2."""
    objects = [
        ("ResourceClaim", share_claim("ns", "half", "40Gi", "50", [("n1", "gpu-0-share", 40 * GIB, 50)])),
        ("ResourceClaim", claim("ns", "s1", "n1", ["gpu-1-serving"])),
        ("ResourceClaim", claim("ns", "s3", "n3", ["gpu-0-serving", "gpu-1-serving"])),
    ]
    cache = share_cache({"p": ["n1", "n2", "n3"]}, gpus=2, objects=objects)
    snap = cache.snapshot()
    pod = _share_pod(job="j")
    fc = PoolForecast("p", ((600, 1.0), (3600, 1.0)))
    looks, _ = shares.share_outlooks(snap, {"p": fc}, pod.shares, CFG)
    base = policy.pool_points(looks["p"], 600, CFG)
    # window: the whole hour (4); headroom: the fewest spare fractions, now (6 GPUs - 3 serving
    # - 0.5 in shares - the pod's 0.25) rather than at the forecast (6 - 1 - 0.5 - 0.25), of 6
    assert base == 4 + round(3 * (6 - 3 - 0.5 - 0.25) / 6) == 5
    got = shares.prioritize_nodes(pod, ["n1", "n2", "n3", "gone"], snap, looks, CFG)
    assert got == [min(10, base + 1), min(10, base + 1), 0, 0]
    snap_job = policy.build_snapshot(dict(snap.nodes), {}, CFG, {"ns/j": frozenset({"n2"})})
    got = shares.prioritize_nodes(pod, ["n1", "n2"], snap_job, looks, CFG)
    assert got == [min(10, base + 2), min(10, base + 3)]

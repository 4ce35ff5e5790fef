"""The extender cache's snapshots: immutable and self-consistent while the cache moves on.

Two scheduling calls may overlap (one still running after kube-scheduler's timeout), so an
older snapshot is read while the watch threads apply events and another call takes a newer one.
"""

from __future__ import annotations

import threading
from typing import Any

from scheduler_extender import policy
from scheduler_extender.cache import ClusterCache
from scheduler_extender.model import PodInfo, PodKind, Snapshot
from tests.support.extender_fixtures import claim, cluster_cache, pod

CFG = policy.PolicyConfig()
NODES = ["n1", "n2", "n3"]
# pool "a": 3 nodes x 4 GPUs, idle for ever, 11 GPUs spare once a worker is placed
WINDOWS = {"a": policy.PoolOutlook(1e9, 12, 11.0, ((3600, 11.0),))}


def rl_pod(gpus: int = 1) -> PodInfo:
    return PodInfo("ns", "w", "u-w", PodKind.RL, job="j", gpus=gpus)


def frozen(snap: Snapshot) -> dict[str, Any]:
    """A deep-enough copy of everything a snapshot shows, to compare with later."""
    return {
        "nodes": dict(snap.nodes),
        "pools": dict(snap.pools),
        "pods": dict(snap.pods),
        "rl_pods": dict(snap.rl_pods or {}),
        "job_nodes": dict(snap.job_nodes),
        "group_of": dict(snap.group_of),
        "groups": tuple(snap.groups),
        "host_mem": dict(snap.host_mem),
        "serving_score": dict(snap.serving_score),
    }


def assert_consistent(snap: Snapshot) -> None:
    assert set(snap.group_of) == set(snap.nodes)
    assert all(0 <= g < len(snap.groups) for g in snap.group_of.values()), (snap.group_of, snap.groups)
    for name, node in snap.nodes.items():
        assert snap.groups[snap.group_of[name]] == (node.pool, node.lendable_free)


def test_older_snapshot_survives_a_newer_one() -> None:
    """Issue 9 §2 defect 1: three nodes, s1, two claims ADDED, s2, then filter on s1."""
    cache = cluster_cache({"a": NODES}, gpus=4)
    s1 = cache.snapshot()
    before = frozen(s1)
    cache.apply("ResourceClaim", "ADDED", claim("ns", "c1", "n1", ["gpu-0-lendable"]))
    cache.apply("ResourceClaim", "ADDED", claim("ns", "c2", "n2", ["gpu-0-lendable", "gpu-1-lendable"]))
    s2 = cache.snapshot()

    old = policy.filter_nodes(rl_pod(gpus=4), NODES, s1, WINDOWS, CFG)
    assert old.passed == NODES  # s1: every node still had 4 lendable GPUs free
    fresh = cluster_cache({"a": NODES}, gpus=4).snapshot()  # the state s1 captured, rebuilt
    expected = policy.prioritize_nodes(rl_pod(), NODES, fresh, WINDOWS, CFG)
    assert len(set(expected)) == 1 and expected[0] > 0
    assert policy.prioritize_nodes(rl_pod(), NODES, s1, WINDOWS, CFG) == expected
    assert frozen(s1) == before
    assert_consistent(s1)

    new = policy.filter_nodes(rl_pod(gpus=4), NODES, s2, WINDOWS, CFG)
    assert new.passed == ["n3"]
    assert sorted(new.unresolvable) == ["n1", "n2"]
    assert_consistent(s2)


def test_pod_events_and_suspend_marks_do_not_reach_an_older_snapshot() -> None:
    cache = cluster_cache({"a": NODES}, objects=[("Pod", pod("w0", "u0", node_name="n1", job="j"))])
    s1 = cache.snapshot()
    before = frozen(s1)
    cache.apply("Pod", "ADDED", pod("w1", "u1", node_name="n2", job="j"))
    cache.mark_suspend_requested("u0")
    s2 = cache.snapshot()
    assert frozen(s1) == before
    assert "u1" in s2.pods and "u1" in (s2.rl_pods or {})
    assert s2.pods["u0"].suspend_requested
    assert not s1.pods["u0"].suspend_requested


def test_unchanged_cache_hands_out_the_same_snapshot() -> None:
    cache = cluster_cache({"a": NODES})
    assert cache.snapshot() is cache.snapshot()


def _writer(cache: ClusterCache, stop: threading.Event) -> None:
    i = 0
    while not stop.is_set():
        node = NODES[i % 3]
        devices = [f"gpu-{d}-lendable" for d in range(1 + i % 4)]
        cache.apply("ResourceClaim", "ADDED", claim("ns", f"c{i % 7}", node, devices))
        if i % 5 == 0:
            cache.apply("ResourceClaim", "DELETED", claim("ns", f"c{(i + 3) % 7}", node, []))
        i += 1


def _reader(cache: ClusterCache, stop: threading.Event, errors: list[BaseException]) -> None:
    try:
        while not stop.is_set():
            snap = cache.snapshot()
            before = frozen(snap)
            for _ in range(3):  # a slow call: the cache moves on meanwhile
                policy.filter_nodes(rl_pod(gpus=2), NODES, snap, WINDOWS, CFG)
                policy.prioritize_nodes(rl_pod(), NODES, snap, WINDOWS, CFG)
            assert frozen(snap) == before
            assert_consistent(snap)
    except BaseException as exc:  # reported by the test thread
        errors.append(exc)
        stop.set()


def test_overlapping_snapshots_under_concurrent_events() -> None:
    cache = cluster_cache({"a": NODES}, gpus=4)
    stop = threading.Event()
    errors: list[BaseException] = []
    threads = [threading.Thread(target=_writer, args=(cache, stop))]
    threads += [threading.Thread(target=_reader, args=(cache, stop, errors)) for _ in range(3)]
    for t in threads:
        t.start()
    stop.wait(0.5)
    stop.set()
    for t in threads:
        t.join(5)
    assert not errors, errors[0]

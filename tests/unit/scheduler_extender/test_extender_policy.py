"""The extender's pure decisions: filter, prioritize, preempt, idle windows, reclaim cost."""

from __future__ import annotations

import dataclasses
import json

from hypothesis import given
from hypothesis import strategies as st

from rose_common import extender_names, names
from scheduler_extender import policy
from scheduler_extender.forecast import reduce
from scheduler_extender.model import NodeState, PodInfo, PodKind, PoolForecast, PoolState, Snapshot
from scheduler_extender.server import Extender
from tests.support.extender_fixtures import T0, args_body, claim, cluster_cache, forecast, pod

CFG = policy.PolicyConfig()


def rl(job: str = "j", gpus: int = 1, state: int = 0, min_run: float | None = None) -> PodInfo:
    return PodInfo("ns", "w", "u-w", PodKind.RL, job=job, gpus=gpus, state_bytes=state, min_run_s=min_run)


def serving() -> PodInfo:
    return PodInfo("ns", "s", "u-s", PodKind.SERVING)


def state(name: str, pool: str = "p", **kw: object) -> NodeState:
    base: dict[str, object] = dict(
        name=name,
        pool=pool,
        gpus=4,
        serving_used=0,
        lent=0,
        lendable_free=4,
        host_mem_free=None,
        reclaim_cost_s=0.0,
    )
    base.update(kw)
    return NodeState(**base)  # type: ignore[arg-type]


def snap(
    *nodes: NodeState, pods: dict[str, PodInfo] | None = None, job_nodes: dict[str, frozenset[str]] | None = None
) -> Snapshot:
    return policy.build_snapshot({n.name: n for n in nodes}, pods or {}, CFG, job_nodes)


def outlooks(windows: dict[str, float], capacity: int = 16, spare: float = 0.0) -> dict[str, policy.PoolOutlook]:
    """Outlooks that differ by idle window only (the same spare GPUs everywhere)."""
    return {p: policy.PoolOutlook(w, capacity, spare, ((3600, spare),)) for p, w in windows.items()}


def scores_of(pod: PodInfo, names: list[str], s: Snapshot, looks: dict[str, policy.PoolOutlook]) -> dict[str, int]:
    return dict(zip(names, policy.prioritize_nodes(pod, names, s, looks, CFG), strict=True))


def test_classify_by_label_owner_and_role() -> None:
    assert policy.classify({names.LABEL_JOB: "a"}, []) == (PodKind.RL, "a")
    assert policy.classify({}, ["ElasticRLJob"]) == (PodKind.RL, "")
    assert policy.classify({names.LABEL_ROLE: "serving"}, []) == (PodKind.SERVING, "")
    assert policy.classify({}, ["ReplicaSet"]) == (PodKind.OTHER, "")
    info = policy.pod_info(
        namespace="n", name="x", uid="u", labels={}, annotations={}, owners=[("ElasticRLJob", "job7")]
    )
    assert info.kind is PodKind.RL and info.job == "job7"


def test_pod_info_reads_annotations_and_ignores_garbage() -> None:
    info = policy.pod_info(
        namespace="n",
        name="x",
        uid="u",
        labels={names.LABEL_JOB: "j"},
        annotations={
            extender_names.ANNOTATION_GPUS: "2",
            names.ANNOTATION_STATE_BYTES: "1000",
            names.ANNOTATION_GRACE: "7",
            extender_names.ANNOTATION_MIN_RUN: "120",
            extender_names.ANNOTATION_AT_SAFE_POINT: "True",
        },
    )
    assert (info.gpus, info.state_bytes, info.grace_s, info.min_run_s, info.at_safe_point) == (
        2,
        1000,
        7.0,
        120.0,
        True,
    )
    bad = policy.pod_info(
        namespace="n",
        name="x",
        uid="u",
        labels={},
        claim_count=3,
        annotations={extender_names.ANNOTATION_GPUS: "lots", names.ANNOTATION_STATE_BYTES: "-5"},
    )
    assert (bad.gpus, bad.state_bytes) == (3, 0)


def test_idle_window_walks_horizons_until_demand_exceeds_free() -> None:
    pool = PoolState(capacity=16, serving_used=4, lent=2)
    fc = PoolForecast("p", ((600, 8.0), (1800, 10.0), (3600, 14.0)))
    # free at each horizon = 16 - demand - lent: 6, 4, 0
    assert policy.idle_window_s(pool, fc, 4, CFG) == (1800.0, False)
    assert policy.idle_window_s(pool, fc, 5, CFG) == (600.0, False)
    assert policy.idle_window_s(pool, fc, 7, CFG) == (0.0, False)
    # not even free now
    assert policy.idle_window_s(PoolState(16, 15, 0), fc, 2, CFG) == (0.0, False)


def test_idle_window_fallback_is_conservative() -> None:
    # 16 GPUs, 25 % headroom = 4 must stay free after placing the pod.
    assert policy.idle_window_s(PoolState(16, 8, 0), None, 4, CFG) == (CFG.fallback_window_s, True)
    assert policy.idle_window_s(PoolState(16, 8, 0), None, 5, CFG) == (0.0, True)
    assert policy.idle_window_s(PoolState(16, 0, 0), PoolForecast("p", ()), 1, CFG)[1] is True


def test_upper_demand_prefers_wanted_then_highest_quantile() -> None:
    assert policy.upper_demand({"0.5": 1, "0.9": 3}, "0.9") == 3
    assert policy.upper_demand({"0.5": 1, "0.95": 4, "bogus": 9}, "0.9") == 4
    assert policy.upper_demand({}, "0.9") is None


def test_filter_serving_and_other_pods_pass_every_node() -> None:
    s = snap(state("a", lendable_free=0))
    for p in (serving(), PodInfo("n", "o", "u", PodKind.OTHER)):
        d = policy.filter_nodes(p, ["a", "unknown"], s, {}, CFG)
        assert d.passed == ["a", "unknown"] and not d.failed and not d.unresolvable


def test_filter_rl_reasons_and_resolvability() -> None:
    s = snap(
        state("ok", pool="long"),
        state("full", pool="long", lendable_free=0),
        state("nomem", pool="long", host_mem_free=10),
        state("soon", pool="short"),
    )
    windows = outlooks({"long": 3600.0, "short": 600.0})
    d = policy.filter_nodes(rl(state=100, min_run=1800), ["ok", "full", "nomem", "soon", "ghost"], s, windows, CFG)
    assert d.passed == ["ok"]
    assert set(d.unresolvable) == {"full", "nomem", "soon"}
    assert d.failed == {"ghost": "node not in the ROSE extender cache yet"}
    assert "min useful run 1800s" in d.unresolvable["soon"]
    assert "lendable" in d.unresolvable["full"] and "host memory" in d.unresolvable["nomem"]
    # default min run (600 s) accepts the short pool
    assert "soon" in policy.filter_nodes(rl(), ["soon"], s, windows, CFG).passed


def test_prioritize_rl_prefers_longest_idle_window_then_free_then_job() -> None:
    s = snap(
        state("long1", pool="long", lendable_free=1),
        state("long4", pool="long", lendable_free=4),
        state("mid", pool="mid"),
        state("short", pool="short"),
        state("jobnode", pool="mid", lendable_free=1),
        job_nodes={"ns/j": frozenset({"jobnode"})},
    )
    looks = outlooks({"long": 3600.0, "mid": 1800.0, "short": 0.0})  # no spare GPU: headroom 0
    scores = scores_of(rl(), ["long1", "long4", "mid", "short", "jobnode", "ghost"], s, looks)
    # window 4 / 2 / 0, +1 where the pod fits twice, +1 in the job's pool, +1 on its node
    assert scores == {"long1": 4, "long4": 5, "mid": 4, "short": 1, "jobnode": 4, "ghost": 0}
    assert all(0 <= v <= 10 for v in scores.values())


def test_headroom_is_the_least_spare_share_through_the_min_useful_run() -> None:
    pool = PoolState(capacity=16, serving_used=2, lent=1)
    fc = PoolForecast("p", ((600, 4.0), (1800, 9.0), (3600, 14.0)))
    look = policy.pool_outlook(pool, fc, 1, CFG)
    assert (look.spare_now, look.spare) == (12.0, ((600, 10.0), (1800, 5.0), (3600, 0.0)))
    # min run 600 s: now and the 600 s point; 1200 s: up to the first point at or after it
    assert policy.headroom(look, 600) == 10 / 16
    assert policy.headroom(look, 1200) == 5 / 16
    assert policy.headroom(look, 7200) == 0.0
    # no forecast: from what is free now alone
    assert policy.headroom(policy.pool_outlook(pool, None, 1, CFG), 600) == 12 / 16
    assert policy.headroom(policy.PoolOutlook(0.0, 0, 0.0), 600) == 0.0


# The pools of `rose demo` act 2 (two nodes of 8 GPUs each) and the forecast it printed when it
# failed: both pools fit a 1-GPU worker for the whole horizon, one with 11 GPUs to spare.
DEMO_POOLS = {"pool-a": ["rose-node-0", "rose-node-2"], "pool-b": ["rose-node-1", "rose-node-3"]}
DEMO_P90 = {"pool-a": {600: 3.8, 1800: 4.3, 3600: 4.8}, "pool-b": {600: 14.0, 1800: 14.5, 3600: 15.0}}


class _Forecasts:
    def __init__(self, p90: dict[str, dict[int, float]]) -> None:
        self.by_pool = {p: reduce(forecast(p, d), "0.9") for p, d in p90.items()}

    def get(self, pool: str) -> PoolForecast | None:
        return self.by_pool.get(pool)


def test_rl_worker_prefers_the_roomier_pool_when_both_fit_the_whole_horizon() -> None:
    """Regression (issue 10 §4): with the same idle window everywhere, the pool with the most
    headroom over the minimum useful run must score strictly higher — the demo put all four
    workers in the pool with 1 GPU to spare. Goes through the extender's HTTP handler, the
    path kube-scheduler calls."""
    ext = Extender(cluster_cache(DEMO_POOLS, gpus=8), forecasts=_Forecasts(DEMO_P90), clock=T0.timestamp)
    nodes = [n for ns in DEMO_POOLS.values() for n in ns]
    worker = pod("grpo-worker-0", "u-0", ns="demo", job="grpo")
    code, body = ext.handle("filter", args_body(worker, nodes))
    assert code == 200 and json.loads(body)["NodeNames"] == nodes  # both pools fit
    code, body = ext.handle("prioritize", args_body(worker, nodes))
    assert code == 200
    scores = {h["Host"]: h["Score"] for h in json.loads(body)}
    roomy = min(scores[n] for n in DEMO_POOLS["pool-a"])
    tight = max(scores[n] for n in DEMO_POOLS["pool-b"])
    assert roomy > tight, f"pool-a (11 GPUs spare) must beat pool-b (1 spare): {scores}"


def test_pool_points_rise_with_the_window_and_with_headroom() -> None:
    """Pool points order pools by window first at equal headroom, by headroom at equal window."""
    s = snap(state("a", pool="a"), state("b", pool="b"), state("c", pool="c"))
    looks = {
        "a": policy.PoolOutlook(3600.0, 16, 15.0, ((3600, 12.0),)),  # 12/16 → 2 points
        "b": policy.PoolOutlook(3600.0, 16, 15.0, ((3600, 1.0),)),  # 1/16 → 0
        "c": policy.PoolOutlook(1800.0, 16, 15.0, ((3600, 12.0),)),  # half the window
    }
    scores = scores_of(rl(), ["a", "b", "c"], s, looks)
    assert scores["a"] > scores["b"] and scores["a"] > scores["c"]


def test_prioritize_serving_prefers_unlent_then_cheapest_reclaim() -> None:
    s = snap(
        state("clean"),
        state("cheap", lent=1, reclaim_cost_s=2.0),
        state("dear", lent=2, reclaim_cost_s=45.0),
        state("awful", lent=4, reclaim_cost_s=10_000.0),
    )
    scores = scores_of(serving(), ["clean", "cheap", "dear", "awful", "ghost"], s, {})
    assert scores == {"clean": 10, "cheap": 9, "dear": 5, "awful": 1, "ghost": 0}


def test_reclaim_cost_is_longest_wait_plus_transfer() -> None:
    a = PodInfo("n", "a", "1", PodKind.RL, grace_s=30, state_bytes=55 * 10**9)
    b = PodInfo("n", "b", "2", PodKind.RL, grace_s=90, state_bytes=55 * 10**9, at_safe_point=True)
    assert policy.reclaim_cost_s([a, b], CFG) == 30 + 2.0


P = 100  # the preemptor's priority in these tests (victims run at 0)


def _pods() -> dict[str, PodInfo]:
    return {
        "rl1": PodInfo("n", "rl1", "rl1", PodKind.RL, job="j", node="a"),
        "rl2": PodInfo("n", "rl2", "rl2", PodKind.RL, job="j", node="b"),
        "b1": PodInfo("n", "b1", "b1", PodKind.OTHER, node="b"),
        "b2": PodInfo("n", "b2", "b2", PodKind.OTHER, node="c"),
    }


def test_preempt_keeps_pure_nodes_only_and_suspends_nothing_when_they_exist() -> None:
    s = snap(state("a"), state("b"), state("c"), pods=_pods())
    d = policy.preempt({"a": (["rl1"], 0), "b": (["b1", "rl2"], 0), "c": (["b2"], 1)}, s, P)
    assert d.victims == {"c": (["b2"], 1)}
    assert d.suspend == [] and d.dropped_nodes == ["a", "b"]


def test_preempt_only_rl_victims_suspends_on_one_node_and_drops_it() -> None:
    s = snap(state("a", reclaim_cost_s=50.0), state("b", reclaim_cost_s=5.0), pods=_pods())
    d = policy.preempt({"a": (["rl1"], 0), "b": (["rl2"], 0)}, s, P)
    assert d.victims == {}
    assert [p.uid for p in d.suspend] == ["rl2"]  # the cheaper node
    assert d.dropped_nodes == ["a", "b"]


def test_preempt_mixed_node_returns_other_victims_in_order() -> None:
    pods = {**_pods(), "b1": PodInfo("n", "b1", "b1", PodKind.OTHER, node="a")}
    s = snap(state("a"), pods=pods)
    d = policy.preempt({"a": (["b1", "rl1", "b2"], 0)}, s, P)
    assert d.victims == {"a": (["b1", "b2"], 0)}
    assert [p.uid for p in d.suspend] == ["rl1"]


def test_preempt_retry_sticks_to_node_already_suspending() -> None:
    pods = _pods()
    pods["rl1"] = PodInfo("n", "rl1", "rl1", PodKind.RL, job="j", node="a", suspend_requested=True)
    s = snap(state("a", reclaim_cost_s=50.0), state("b", reclaim_cost_s=5.0), pods=pods)
    d = policy.preempt({"a": (["rl1"], 0), "b": (["rl2"], 0)}, s, P)
    assert [p.uid for p in d.suspend] == ["rl1"]


def test_preempt_unknown_victims_are_kept_and_empty_nodes_dropped() -> None:
    s = snap(state("a"), pods=_pods())
    d = policy.preempt({"a": (["nobody"], 2), "ghost": ([], 0)}, s, P)
    assert d.victims == {"a": (["nobody"], 2)} and d.kept_unknown == 1 and d.suspend == []


def test_preempt_suspends_nothing_for_an_unverified_preemptor() -> None:
    s = snap(state("a"), pods=_pods())
    d = policy.preempt({"a": (["rl1"], 0)}, s, None)
    assert d.suspend == [] and d.victims == {} and d.refused["a"][0] == policy.REFUSE_PREEMPTOR


def test_preempt_refuses_victims_the_preemptor_does_not_outrank_or_off_their_node_or_over_the_cap() -> None:
    pods = {**_pods(), "hi": PodInfo("n", "hi", "hi", PodKind.RL, job="j", node="a", priority=P)}
    s = snap(state("a"), state("b"), pods=pods)
    d = policy.preempt({"a": (["hi"], 0), "b": (["rl1"], 0)}, s, P)
    assert d.suspend == [] and d.victims == {}
    assert {n: r for n, (r, _) in d.refused.items()} == {"a": policy.REFUSE_PRIORITY, "b": policy.REFUSE_NODE}
    many = {f"r{i}": PodInfo("n", f"r{i}", f"r{i}", PodKind.RL, job="j", node="a") for i in range(3)}
    d = policy.preempt({"a": (list(many), 0)}, snap(state("a"), pods=many), P, max_suspend=2)
    assert d.suspend == [] and d.refused["a"][0] == policy.REFUSE_CAP


def test_verify_preemptor_needs_the_same_pending_pod() -> None:
    pending = PodInfo("n", "s", "u1", PodKind.SERVING, priority=P)
    assert policy.verify_preemptor("u1", pending) == ""
    assert policy.verify_preemptor("u1", None) == "preemptor not found"
    assert "UID" in policy.verify_preemptor("u2", pending)
    assert "bound" in policy.verify_preemptor("u1", dataclasses.replace(pending, node="a"))
    assert "deleted" in policy.verify_preemptor("u1", dataclasses.replace(pending, terminating=True))


def test_own_request_and_withdraw_reason() -> None:
    import datetime as dt
    import json as js

    from rose_common import extender_names

    at = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
    doc = {
        "by": extender_names.EXTENDER_COMPONENT,
        "at": "2026-01-01T12:00:00Z",
        "preemptor": {"namespace": "n", "name": "s", "uid": "u1"},
    }
    req = policy.own_request(js.dumps(doc))
    assert req == policy.OwnRequest("n", "s", "u1", at)
    assert policy.own_request(js.dumps({**doc, "by": "rose-planner"})) is None  # not ours: never removed
    assert policy.own_request("{not json") is None
    pending = PodInfo("n", "s", "u1", PodKind.SERVING)
    soon, late = at + dt.timedelta(seconds=10), at + dt.timedelta(seconds=600)
    assert policy.withdraw_reason(req, pending, soon, 600) == ""
    assert policy.withdraw_reason(req, pending, late, 600) == policy.WITHDRAW_TTL
    assert policy.withdraw_reason(req, dataclasses.replace(pending, node="a"), soon, 600) == policy.WITHDRAW_BOUND
    assert policy.withdraw_reason(req, None, soon, 600) == policy.WITHDRAW_GONE
    assert policy.withdraw_reason(req, dataclasses.replace(pending, uid="u2"), soon, 600) == policy.WITHDRAW_GONE


@given(
    st.dictionaries(
        st.sampled_from(["a", "b", "c", "d"]),
        st.tuples(st.lists(st.sampled_from(["rl1", "rl2", "b1", "b2", "nobody"]), max_size=4), st.integers(0, 2)),
        max_size=4,
    )
)
def test_preempt_screening_by_rl_index_decides_like_the_full_scan(
    candidates: dict[str, tuple[list[str], int]],
) -> None:
    """The C-level screen against ``snapshot.rl_pods`` changes speed, not decisions: the same
    candidates give the same decision with the index derived from the pods."""
    nodes = [state(n, reclaim_cost_s=float(i)) for i, n in enumerate("abcd")]
    indexed = snap(*nodes, pods=_pods())
    assert indexed.rl_pods is not None and set(indexed.rl_pods) == {"rl1", "rl2"}
    derived = dataclasses.replace(indexed, rl_pods=None)  # index derived from pods
    a, c = policy.preempt(candidates, indexed, P), policy.preempt(candidates, derived, P)
    assert (c.victims, [p.uid for p in c.suspend], c.kept_unknown, c.dropped_nodes) == (
        a.victims,
        [p.uid for p in a.suspend],
        a.kept_unknown,
        a.dropped_nodes,
    )


def test_cache_derives_node_state_from_slices_claims_and_pods() -> None:
    cache = cluster_cache(
        {"p": ["n1", "n2"]},
        gpus=4,
        objects=[
            ("ResourceClaim", claim("ns", "c-serving", "n1", ["gpu-0-serving", "gpu-1-serving"])),
            ("ResourceClaim", claim("ns", "c-lent", "n1", ["gpu-1-lendable", "gpu-2-lendable"])),
            (
                "Pod",
                pod(
                    "w",
                    "uid-w",
                    ns="ns",
                    node_name="n1",
                    job="j",
                    annotations={names.ANNOTATION_STATE_BYTES: str(110 * 10**9), names.ANNOTATION_GRACE: "20"},
                ),
            ),
        ],
    )
    s = cache.snapshot()
    n1 = s.nodes["n1"]
    assert (n1.gpus, n1.serving_used, n1.lent, n1.lendable_free) == (4, 2, 2, 1)  # gpu-3 only
    assert n1.jobs == frozenset({"ns/j"}) and n1.reclaim_cost_s == 22.0
    assert s.pools["p"].capacity == 8 and s.job_nodes["ns/j"] == frozenset({"n1"})
    # delete the lendable claim and the pod: state follows
    cache.apply("ResourceClaim", "DELETED", claim("ns", "c-lent", "n1", []))
    cache.apply("Pod", "DELETED", pod("w", "uid-w", ns="ns", node_name="n1", job="j"))
    n1 = cache.snapshot().nodes["n1"]
    assert (n1.lent, n1.lendable_free, n1.jobs, n1.reclaim_cost_s) == (0, 2, frozenset(), 0.0)


def test_cache_uses_highest_slice_generation_and_replace_drops_gone_objects() -> None:
    cache = cluster_cache({"p": ["n1"]}, gpus=2)
    from tests.support.extender_fixtures import slice_for

    newer = slice_for("n1", 4, generation=2)
    newer["metadata"]["name"] = "n1-other-slice"
    cache.apply("ResourceSlice", "ADDED", newer)
    assert cache.snapshot().nodes["n1"].gpus == 4
    cache.replace("ResourceSlice", [])
    cache.replace("Node", [])
    assert "n1" not in cache.snapshot().nodes
    assert cache.counts()["ResourceSlice"] == 0


def test_cache_ignores_other_drivers_and_finished_pods() -> None:
    cache = cluster_cache({"p": ["n1"]}, gpus=2)
    other = claim("ns", "c", "n1", ["gpu-0-serving"])
    other["status"]["allocation"]["devices"]["results"][0]["driver"] = "other.example.com"
    cache.apply("ResourceClaim", "ADDED", other)
    done = pod("d", "uid-d", node_name="n1", job="j")
    done["status"]["phase"] = "Succeeded"
    cache.apply("Pod", "ADDED", done)
    s = cache.snapshot()
    assert s.nodes["n1"].serving_used == 0 and "uid-d" not in s.pods

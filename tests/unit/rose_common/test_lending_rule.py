"""The planner's grants and the extender's filter agree on a suspended worker's allocated claim
(``rose_common.lending``; issue 25, group soak g6 on branch ``groupwait``).

One cluster, as the API server shows it to both (nodes, the driver's slices, claims, pods), is read
by each side the way it reads it in production: the controller through ``observe`` and
``pools.capacities`` into the planner, the extender through its ``ClusterCache`` into its filter.
g6's pool-b: 2 nodes x 3 GPUs, serving on GPU 0 of each, job ``a`` running 2 workers on n3, job
``b``'s worker suspended on n1 by a planned reclaim, its claim still allocated there (its lendable
device reserved to it, so it can resume in place). Job ``a`` may grow to 3.

Checked, for serving forecasts of 2, 3 and 4 GPUs: the planner adds a worker to the pool exactly
when the extender's filter passes a node of it for that worker. On the previous planner, which
counted the suspended worker's GPU as free room, a forecast of 3 made it grant a worker the
extender refused ("serving forecast needs pool 'pool-b' within 0s"): g6's never-converged job.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from elastic_controller import observe, pools
from elastic_controller.planner import Job, PlanInput, Pool, Settings, Worker, plan
from elastic_controller.workers import CLAIM_NAME, CONTROLLER
from rose_common import extender_names, lending, names
from scheduler_extender import policy
from scheduler_extender.forecast import reduce
from tests.support.extender_fixtures import T0, claim, cluster_cache, forecast, node, pod, slice_for

POOL = "pool-b"
NODES = ("n1", "n3")
NOW = T0.timestamp()
MIN_RUN = 10


def worker_pod(job: str, index: int, node_name: str, suspended: bool = False) -> dict[str, Any]:
    """A running worker pod of ``rl/<job>`` with its generated lent claim ``<job>-w<index>-gpus``;
    ``suspended``: by this controller's planned reclaim (its request, the driver's state)."""
    ann = {extender_names.ANNOTATION_MIN_RUN: str(MIN_RUN)}
    if suspended:
        ann[names.ANNOTATION_SUSPEND_REQUEST] = json.dumps({"by": CONTROLLER, "reason": "planned reclaim"})
        ann[names.ANNOTATION_SUSPEND_STATE] = observe.SUSPENDED
    p = pod(f"{job}-w{index}", f"uid-{job}-{index}", ns="rl", node_name=node_name, job=job, annotations=ann)
    p["spec"]["resourceClaims"] = [{"name": CLAIM_NAME, "resourceClaimTemplateName": f"{job}-gpus"}]
    p["status"]["resourceClaimStatuses"] = [{"name": CLAIM_NAME, "resourceClaimName": f"{job}-w{index}-gpus"}]
    return p


def cluster() -> list[tuple[str, dict[str, Any]]]:
    """g6's pool-b: (kind, object) as the API server holds them."""
    objs: list[tuple[str, dict[str, Any]]] = [
        ("ResourceClaim", claim("serve", "s1", "n1", ["gpu-0-serving"])),
        ("ResourceClaim", claim("serve", "s3", "n3", ["gpu-0-serving"])),
        ("ResourceClaim", claim("rl", "a-w0-gpus", "n3", ["gpu-2-lendable"])),
        ("ResourceClaim", claim("rl", "a-w2-gpus", "n3", ["gpu-1-lendable"])),
        ("ResourceClaim", claim("rl", "b-w1-gpus", "n1", ["gpu-1-lendable"])),  # suspended, still allocated
    ]
    pods = [worker_pod("a", 0, "n3"), worker_pod("a", 2, "n3"), worker_pod("b", 1, "n1", suspended=True)]
    return objs + [("Pod", p) for p in pods]


def planner_grants(demand: float) -> list[str]:
    """The pools the planner adds a worker of job ``a`` to, from the cluster as the controller reads it."""
    nodes = [node(n, POOL) for n in NODES]
    capacity = pools.capacities(nodes, [slice_for(n, 3) for n in NODES])[POOL]
    fc = pools.to_forecast(forecast(POOL, {60: demand, 600: demand, 1800: demand, 3600: demand}), "0.9")
    workers: list[Worker] = []
    for kind, obj in cluster():
        job = obj["metadata"].get("labels", {}).get(names.LABEL_JOB) if kind == "Pod" else None
        seen = observe.observe(job, obj, node_pool=POOL) if job else None
        w = observe.to_planner(f"rl/{job}", seen) if seen is not None else None
        if w is not None:
            workers.append(w)
    jobs = (
        Job("rl/a", 1, 3, grace_s=5, min_useful_run_s=MIN_RUN),
        # b shrank 10 s ago: within its dwell it does not grow, so its suspended worker stays suspended
        Job("rl/b", 1, 2, grace_s=5, min_useful_run_s=MIN_RUN, last_shrink_at=NOW - 10),
    )
    result = plan(PlanInput(NOW, (Pool(POOL, capacity, fc),), jobs, tuple(workers), Settings(dwell_s=300)))
    assert not result.reclaims, "serving's forecast never exceeds what the running workers leave"
    return list(result.targets["rl/a"].add)


def extender_passes(demand: float) -> list[str]:
    """The nodes the extender's filter passes for a new worker of job ``a``."""
    cache = cluster_cache({POOL: list(NODES)}, gpus=3, objects=cluster())
    snap = cache.snapshot()
    new = policy.pod_info(
        namespace="rl",
        name="a-w3",
        uid="uid-a-3",
        labels={names.LABEL_JOB: "a"},
        annotations={extender_names.ANNOTATION_MIN_RUN: str(MIN_RUN)},
        claim_count=1,
    )
    fc = reduce(forecast(POOL, {60: demand, 600: demand, 1800: demand, 3600: demand}), "0.9")
    cfg = policy.PolicyConfig()
    looks, _ = policy.pool_outlooks(snap, {POOL: fc}, new.gpus, cfg)
    return policy.filter_nodes(new, list(NODES), snap, looks, cfg).passed


@pytest.mark.parametrize("demand", [2.0, 3.0, 4.0])
def test_planner_grants_a_new_worker_exactly_where_the_extender_passes_it(demand: float) -> None:
    grants, passed = planner_grants(demand), extender_passes(demand)
    assert bool(grants) == bool(passed), (
        f"serving forecast {demand:g}: the planner adds {grants or 'nothing'} to job a, "
        f"the extender passes {passed or 'no node'}"
    )
    if demand == 2.0:  # not vacuous: with room for one more, both give it, on the one free GPU's node
        assert grants == [POOL] and passed == ["n1"]


def test_the_suspended_workers_allocated_gpu_is_taken_for_a_new_claim() -> None:
    """g6's numbers through the rule itself: 6 GPUs, serving 3, 2 running + 1 suspended claim."""
    assert lending.spare_for_new_claim(6, 3, 3) == 0  # no room for a new worker
    assert lending.spare_for_new_claim(6, 3, 2) == 1  # what the planner counted (the suspended GPU as free)


class _Fc:
    def __init__(self, demand: float) -> None:
        self.fc = reduce(forecast(POOL, {60: demand, 600: demand, 1800: demand, 3600: demand}), "0.9")

    def get(self, pool: str) -> object:
        return self.fc if pool == POOL else None


def test_a_pod_on_an_allocated_shared_claim_is_not_a_new_claim() -> None:
    """Group soak suspalloc g4: a time-slice member's pod names the group's shared claim, already
    allocated on n1; it asks for no new device, so the extender does not hold it to the new-claim
    rule (it refused it "within 0s" for 90 s, the member never bound). A pod on a claim not allocated
    yet still is."""
    from scheduler_extender.server import Extender
    from tests.support.extender_fixtures import args_body

    shared = claim("rl", "ts-tsg-w0-gpus", "n1", ["gpu-2-lendable"])
    ext = Extender(cluster_cache({POOL: list(NODES)}, gpus=3, objects=[*cluster(), ("ResourceClaim", shared)]),
                   forecasts=_Fc(3.0))  # fmt: skip
    member = pod("ts-b-w0", "uid-ts-b", ns="rl", job="ts-b", annotations={extender_names.ANNOTATION_MIN_RUN: "10"})
    member["spec"]["resourceClaims"] = [{"name": CLAIM_NAME, "resourceClaimName": "ts-tsg-w0-gpus"}]
    reply = json.loads(ext.filter(args_body(member, list(NODES))))
    assert reply["NodeNames"] == list(NODES), reply
    member["spec"]["resourceClaims"] = [{"name": CLAIM_NAME, "resourceClaimName": "not-allocated-yet"}]
    reply = json.loads(ext.filter(args_body(member, list(NODES))))
    assert reply["NodeNames"] == [], reply

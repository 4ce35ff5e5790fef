"""Smoke test of ``benchmarks.controller_scale`` on the session's local cluster, at a tiny size
(2 jobs of 2 workers): the real controller and extender processes, the forecast rewrite, the pod
watch and the metric scrapes all run; no timing is asserted (speed is the benchmark's output)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from benchmarks import controller_scale
from local_cluster import ClusterHandle
from tests.support.k8s_helpers import delete_namespace


def test_controller_scale_benchmark_runs_end_to_end(cluster: ClusterHandle, api: Any, tmp_path: Path) -> None:
    p = controller_scale.Params(jobs=2, max_workers=2, timeout_s=120, namespace=f"bench-{uuid.uuid4().hex[:6]}")
    try:
        out = controller_scale.measure(cluster, dict(cluster.pools), p, tmp_path)
    finally:
        delete_namespace(api, p.namespace)
    target = sorted(set(cluster.pools.values()))[0]
    assert out["params"]["nodes"] == len(cluster.pools)
    # every worker in the pool whose forecast rose got the controller's request; elsewhere only gang mates
    assert out["unexpected_requests"] == 0
    assert out["suspend_requests"] == out["victims"], out
    assert out["victim_pool"] == target
    assert out["reconcile_all"]["count"] > 0 and out["plan_all"]["count"] > 0
    assert out["reconciles_error"] == 0
    assert out["apiserver_writes_reclaim"]["by_kind"].get("PATCH pods", 0) >= out["victims"]  # the requests
    assert out["queue_depth_at_change"] >= 0 and out["settle_s"] >= 0

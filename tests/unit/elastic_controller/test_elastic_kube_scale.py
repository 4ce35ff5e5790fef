"""kube.py pieces found by the scale benchmark: the pool inventory kept by informers (not listed on
every plan), and Events posted in the background (a reconcile does not wait on them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from elastic_controller import pools
from elastic_controller.kube import EventQueue, InventoryStore
from rose_common import names, slices

REPO = Path(__file__).resolve().parents[3]


def _node(name: str, pool: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {names.LABEL_POOL: pool}}}


def test_plan_waits_until_both_kinds_are_listed_then_follows_the_events() -> None:
    store = InventoryStore()
    with pytest.raises(RuntimeError, match="not listed yet"):
        store()
    store.handler("Node").on_list([_node("n0", "pool-a"), _node("n1", "pool-a")])
    with pytest.raises(RuntimeError):
        store()  # slices not listed yet: no plan on half an inventory
    store.handler("ResourceSlice").on_list([slices.resource_slice("n0", slices.simulated_gpus("n0", 4), 1)])
    assert store() == {"pool-a": 4}
    store.handler("ResourceSlice").on_event("ADDED", slices.resource_slice("n1", slices.simulated_gpus("n1", 4), 1))
    assert store() == {"pool-a": 8}
    store.handler("Node").on_event("DELETED", _node("n1", "pool-a"))
    assert store() == {"pool-a": 4}


def test_a_plan_reads_the_capacities_without_walking_the_devices_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (controller_scale benchmark): every plan counted the 16,000 devices of 1,000
    nodes' slices (~60 ms); a slice's devices are counted when its event arrives, not per plan."""
    walked: list[object] = []
    role = pools._role
    monkeypatch.setattr(pools, "_role", lambda d: walked.append(d) or role(d))
    store = InventoryStore()
    store.handler("Node").on_list([_node(f"n{i}", "pool-a" if i % 2 else "pool-b") for i in range(4)])
    store.handler("ResourceSlice").on_list(
        [slices.resource_slice(f"n{i}", slices.simulated_gpus(f"n{i}", 8), 1) for i in range(4)]
    )
    counted = len(walked)
    assert store() == {"pool-a": 16, "pool-b": 16}
    assert store() == {"pool-a": 16, "pool-b": 16}
    assert len(walked) == counted  # the plans walked no device
    store.handler("Node").on_event("MODIFIED", _node("n0", "pool-a"))  # relabelled: its GPUs move
    assert store() == {"pool-a": 24, "pool-b": 8}
    other = slices.resource_slice("n1", slices.simulated_gpus("n1", 8), 1)
    other["metadata"]["name"] = "other-driver"
    other["spec"]["driver"] = "gpu.example.com"
    store.handler("ResourceSlice").on_event("ADDED", other)
    assert store() == {"pool-a": 24, "pool-b": 8}


def test_events_are_posted_in_order_in_the_background_and_a_failure_does_not_stop_them() -> None:
    posted: list[str] = []

    def post(body: dict[str, Any]) -> None:
        if body["reason"] == "Bad":
            raise RuntimeError("refused")
        posted.append(body["reason"])

    q = EventQueue(post)
    for reason in ("A", "Bad", "B", "C"):
        q.put({"reason": reason})
    q.join()
    assert posted == ["A", "B", "C"]


def test_the_controller_role_lets_the_inventory_informers_list_and_watch() -> None:
    """Regression: the role granted only ``list`` on nodes and resourceslices (enough for a list
    per plan); the informers also watch, and a watch refused by RBAC would leave the plan waiting."""
    docs = list(yaml.safe_load_all((REPO / "manifests/controller/rbac.yaml").read_text()))
    role = next(d for d in docs if d and d.get("kind") == "ClusterRole")
    verbs = {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert {"list", "watch"} <= verbs[("", "nodes")]
    assert {"list", "watch"} <= verbs[("resource.k8s.io", "resourceslices")]

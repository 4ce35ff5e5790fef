from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from dra_driver.claims import PreparedDevice
from dra_driver.metrics import DriverMetrics
from dra_driver.node import serving_held
from dra_driver.publisher import (
    HASH_ANNOTATION,
    SlicePublisher,
    needs_reconcile,
    plan_slices,
    spec_hash,
    with_serving_holds,
)
from dra_driver.state import ClaimRecord, NodeStateData
from rose_common import names
from rose_common.slices import resource_slice, simulated_gpus, taint_serving_held

DESIRED = resource_slice("node-a", simulated_gpus("node-a", 2), 1)


def _stored(body: dict[str, Any], rv: str = "5") -> dict[str, Any]:
    s = copy.deepcopy(body)
    s["metadata"]["resourceVersion"] = rv
    return s


def test_empty_pool_is_created_with_hash() -> None:
    plan = plan_slices([], DESIRED)
    assert plan.create is not None and plan.replace is None and plan.delete == []
    assert plan.create["spec"]["pool"]["generation"] == 1
    assert plan.create["metadata"]["annotations"][HASH_ANNOTATION] == spec_hash(DESIRED)


def test_current_pool_is_left_alone() -> None:
    assert plan_slices([_stored(plan_slices([], DESIRED).create)], DESIRED).empty()  # type: ignore[arg-type]


def test_seed_slice_without_hash_is_replaced_with_bumped_generation() -> None:
    seed = _stored(resource_slice("node-a", simulated_gpus("node-a", 2), 3))
    plan = plan_slices([seed], DESIRED)
    assert plan.replace is not None and plan.replace["spec"]["pool"]["generation"] == 4
    assert plan.replace["metadata"]["resourceVersion"] == "5"


def test_changed_gpus_bump_generation_and_strays_are_deleted() -> None:
    old = plan_slices([], resource_slice("node-a", simulated_gpus("node-a", 1), 1)).create
    stray = {"metadata": {"name": "node-a-old"}, "spec": {"pool": {"generation": 9}}}
    plan = plan_slices([_stored(old), stray], DESIRED)  # type: ignore[arg-type]
    assert plan.delete == ["node-a-old"]
    assert plan.replace is not None and plan.replace["spec"]["pool"]["generation"] == 10


def test_generation_never_goes_back_after_wipe() -> None:
    assert plan_slices([], DESIRED, min_generation=7).create["spec"]["pool"]["generation"] == 8  # type: ignore[index]


def test_watch_events() -> None:
    mine = plan_slices([], DESIRED).create
    assert not needs_reconcile("MODIFIED", mine, DESIRED)  # type: ignore[arg-type]
    assert needs_reconcile("DELETED", mine, DESIRED)  # type: ignore[arg-type]
    assert needs_reconcile("ADDED", {"metadata": {"name": "x"}}, DESIRED)


class MemSlices:
    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self.writes: list[str] = []

    def list(self) -> tuple[list[dict[str, Any]], str]:
        return list(self.items.values()), "1"

    def create(self, body: dict[str, Any]) -> None:
        self.writes.append("create")
        self.items[body["metadata"]["name"]] = body

    def replace(self, body: dict[str, Any]) -> None:
        self.writes.append("replace")
        self.items[body["metadata"]["name"]] = body

    def delete(self, name: str) -> None:
        self.writes.append("delete")
        self.items.pop(name, None)

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[tuple[str, dict[str, Any]]]:
        return iter(())


def test_publisher_republishes_after_wipe_and_removes_on_shutdown() -> None:
    api = MemSlices()
    p = SlicePublisher(api, DESIRED, DriverMetrics([0, 1]))
    p.reconcile()
    p.reconcile()
    assert api.writes == ["create"]
    api.items.clear()  # the kubelet wiped the node's slices
    p.reconcile()
    assert api.writes == ["create", "create"]
    assert next(iter(api.items.values()))["spec"]["pool"]["generation"] == 2
    p.remove()
    assert api.items == {}


# ---------------------------------------------------------------- serving holds: lendable devices tainted


def _taints(body: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return {d["name"]: d["taints"] for d in body["spec"]["devices"] if d.get("taints")}


def test_serving_holds_taint_only_that_gpus_lendable_device() -> None:
    plan = plan_slices([], DESIRED, serving_holds=frozenset({1}))
    assert plan.create is not None
    assert _taints(plan.create) == {
        "gpu-1-lendable": [{"key": names.TAINT_SERVING_HOLDS, "value": "1", "effect": "NoSchedule"}]
    }
    assert "taints" not in DESIRED["spec"]["devices"][3]  # the desired slice itself is not changed


def test_holds_changing_rewrites_the_slice_and_going_away_untaints() -> None:
    untainted = _stored(plan_slices([], DESIRED).create)  # type: ignore[arg-type]
    tainted = plan_slices([untainted], DESIRED, serving_holds=frozenset({0}))
    assert tainted.replace is not None and set(_taints(tainted.replace)) == {"gpu-0-lendable"}
    assert tainted.replace["spec"]["pool"]["generation"] == 2
    stored = _stored(tainted.replace)
    assert plan_slices([stored], DESIRED, serving_holds=frozenset({0})).empty()  # current: no write
    back = plan_slices([stored], DESIRED)
    assert back.replace is not None and _taints(back.replace) == {}
    assert not needs_reconcile("MODIFIED", stored, with_serving_holds(DESIRED, frozenset({0})))
    assert needs_reconcile("MODIFIED", stored, DESIRED)


def test_other_taints_of_a_device_are_kept() -> None:
    other = {"key": "example.com/x", "effect": "NoSchedule"}
    devices = [dict(d, taints=[other]) for d in DESIRED["spec"]["devices"]]
    out = taint_serving_held(devices, frozenset({0}))
    by = {d["name"]: d["taints"] for d in out}
    assert by["gpu-0-serving"] == [other] and by["gpu-1-lendable"] == [other]
    assert [t["key"] for t in by["gpu-0-lendable"]] == ["example.com/x", names.TAINT_SERVING_HOLDS]
    assert taint_serving_held(out, frozenset())[1] == dict(devices[1])  # removing ours keeps theirs


def _dev(index: int, role: str) -> PreparedDevice:
    return PreparedDevice(("gpu",), "node-a", f"gpu-{index}-{role}", (), index, f"uuid-{index}", role)


def test_serving_held_is_serving_claims_and_bindings_never_lent_ones() -> None:
    data = NodeStateData(boot_id="b")
    data.claims["s"] = ClaimRecord("s", "ns", "serve", "PrepareStarted", [_dev(0, names.ROLE_SERVING)])
    data.claims["l"] = ClaimRecord("l", "ns", "lent", "PrepareCompleted", [_dev(1, names.ROLE_LENDABLE)])
    assert serving_held(data, {}) == frozenset({0})
    assert serving_held(data, {"b": frozenset({2, 3})}) == frozenset({0, 2, 3})
    assert serving_held(NodeStateData(boot_id="b"), {}) == frozenset()


def _tainted(metrics: DriverMetrics) -> float | None:
    return metrics.registry.get_sample_value("rose_driver_lendable_devices_tainted")


def test_publisher_republishes_on_holds_and_counts_tainted_devices() -> None:
    api, metrics = MemSlices(), DriverMetrics([0, 1])
    p = SlicePublisher(api, DESIRED, metrics)
    p.reconcile()
    p.set_serving_holds(frozenset({0, 1}))
    p.reconcile()
    assert set(_taints(next(iter(api.items.values())))) == {"gpu-0-lendable", "gpu-1-lendable"}
    assert _tainted(metrics) == 2
    p.set_serving_holds(frozenset())
    p.reconcile()
    assert _taints(next(iter(api.items.values()))) == {} and _tainted(metrics) == 0
    assert api.writes == ["create", "replace", "replace"]

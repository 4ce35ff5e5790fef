from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from dra_driver.metrics import DriverMetrics
from dra_driver.publisher import HASH_ANNOTATION, SlicePublisher, needs_reconcile, plan_slices, spec_hash
from rose_common.slices import resource_slice, simulated_gpus

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

"""The controller's pool inventory, kept by informers instead of listed on every plan."""

from __future__ import annotations

from typing import Any

import pytest

from elastic_controller import pools
from elastic_controller.kube import InventoryStore
from rose_common import names, slices


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
    assert pools.capacities(*store()) == {"pool-a": 4}
    store.handler("ResourceSlice").on_event("ADDED", slices.resource_slice("n1", slices.simulated_gpus("n1", 4), 1))
    assert pools.capacities(*store()) == {"pool-a": 8}
    store.handler("Node").on_event("DELETED", _node("n1", "pool-a"))
    assert pools.capacities(*store()) == {"pool-a": 4}

"""Serving claims allocated on this node taint their GPUs' lent devices from the allocation on
(dra_driver/servingalloc.py and the publisher's union with the node's own holds)."""

from __future__ import annotations

import copy
from typing import Any

from dra_driver.metrics import DriverMetrics
from dra_driver.publisher import SlicePublisher
from dra_driver.servingalloc import ServingAllocWatch, serving_allocated
from rose_common import names
from rose_common.informer import InformerSettings
from rose_common.slices import resource_slice, simulated_gpus
from tests.support.driver_fixtures import make_claim

NODE = "node-a"
SETTINGS = InformerSettings(kind="ResourceClaim", path="/apis/resource.k8s.io/v1/resourceclaims")


def _claim(uid: str, *devices: str, pool: str = NODE, driver: str = names.DRIVER_NAME) -> dict[str, Any]:
    return make_claim(uid, uid, [(f"r{i}", d) for i, d in enumerate(devices)], pool=pool, driver=driver)


def test_serving_allocated_is_this_nodes_serving_devices_of_this_driver_only() -> None:
    assert serving_allocated(_claim("a", "gpu-0-serving", "gpu-3-serving"), names.DRIVER_NAME, NODE) == {0, 3}
    assert serving_allocated(_claim("b", "gpu-0-lendable", "gpu-1-share"), names.DRIVER_NAME, NODE) == set()
    assert serving_allocated(_claim("c", "gpu-0-serving", pool="node-b"), names.DRIVER_NAME, NODE) == set()
    assert serving_allocated(_claim("d", "gpu-0-serving", driver="x.example"), names.DRIVER_NAME, NODE) == set()
    assert serving_allocated(_claim("e", "not-a-rose-device"), names.DRIVER_NAME, NODE) == set()
    unallocated = make_claim("f", "f", [("r", "gpu-0-serving")], allocated=False)
    assert serving_allocated(unallocated, names.DRIVER_NAME, NODE) == set()
    deleting = _claim("g", "gpu-0-serving")
    deleting["metadata"]["deletionTimestamp"] = "2026-12-02T00:00:00Z"
    assert serving_allocated(deleting, names.DRIVER_NAME, NODE) == set()


class Recorder:
    """Stands in for the binding watch: records what the claim watch hands on."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def on_list(self, items: list[dict[str, Any]]) -> None:
        self.seen.append(("LIST", ",".join(sorted(i["metadata"]["uid"] for i in items))))

    def on_event(self, event_type: str, obj: dict[str, Any]) -> None:
        self.seen.append((event_type, obj["metadata"]["uid"]))


def test_watch_follows_allocations_through_list_events_deletion_and_deallocation() -> None:
    pushed: list[frozenset[int]] = []
    also = Recorder()
    w = ServingAllocWatch(object(), SETTINGS, NODE, pushed.append, also=[also])  # type: ignore[arg-type]
    s0, lent = _claim("s0", "gpu-0-serving"), _claim("l1", "gpu-1-lendable")
    w.on_list([s0, lent, _claim("x", "gpu-1-serving", pool="node-b")])
    assert pushed == [{0}]
    w.on_event("ADDED", _claim("s1", "gpu-1-serving"))
    assert pushed[-1] == {0, 1}
    w.on_event("MODIFIED", _claim("s1", "gpu-1-serving"))  # no change: nothing pushed
    assert len(pushed) == 2
    w.on_event("ADDED", _claim("s0b", "gpu-0-serving"))  # a second claim on GPU 0 (a failed binding's next try)
    w.on_event("DELETED", s0)
    assert pushed[-1] == {0, 1}  # GPU 0 still allocated to s0b
    dealloc = copy.deepcopy(_claim("s1", "gpu-1-serving"))
    dealloc["status"] = {}
    w.on_event("MODIFIED", dealloc)
    assert pushed[-1] == {0} and w.allocated() == {0}
    w.on_list([])  # a relist after a restart of the watch: nothing allocated any more
    assert pushed[-1] == set()
    assert also.seen == [
        ("LIST", "l1,s0,x"),
        ("ADDED", "s1"),
        ("MODIFIED", "s1"),
        ("ADDED", "s0b"),
        ("DELETED", "s0"),
        ("MODIFIED", "s1"),
        ("LIST", ""),
    ]


class MemSlices:
    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}

    def list(self) -> tuple[list[dict[str, Any]], str]:
        return list(self.items.values()), "1"

    def create(self, body: dict[str, Any]) -> None:
        self.items[body["metadata"]["name"]] = body

    def replace(self, body: dict[str, Any]) -> None:
        self.items[body["metadata"]["name"]] = body

    def delete(self, name: str) -> None:
        self.items.pop(name, None)


def _held(api: MemSlices) -> set[str]:
    (body,) = api.items.values()
    return {
        d["name"]
        for d in body["spec"]["devices"]
        if any(t["key"] == names.TAINT_SERVING_HOLDS for t in d.get("taints") or [])
    }


def test_publisher_taints_the_union_of_prepared_holds_and_api_allocations() -> None:
    api, metrics = MemSlices(), DriverMetrics([0, 1])
    p = SlicePublisher(api, resource_slice(NODE, simulated_gpus(NODE, 2), 1), metrics)  # type: ignore[arg-type]
    p.set_serving_allocated(frozenset({1}))  # allocated, not prepared yet
    p.reconcile()
    assert _held(api) == {"gpu-1-lendable"}
    assert metrics.gpus_tainted.labels(names.TAINT_SERVING_HOLDS)._value.get() == 1
    p.set_serving_holds(frozenset({0, 1}))  # both prepared
    p.reconcile()
    assert _held(api) == {"gpu-0-lendable", "gpu-1-lendable"}
    p.set_serving_holds(frozenset())  # unprepared; GPU 1's claim still allocated in the API
    p.reconcile()
    assert _held(api) == {"gpu-1-lendable"}
    p.set_serving_allocated(frozenset())  # its claim deleted
    p.reconcile()
    assert _held(api) == set()
    assert metrics.gpus_tainted.labels(names.TAINT_SERVING_HOLDS)._value.get() == 0

"""The planner's reclaim taint carried onto a GPU's share devices (issue 27 §2 and §3): which devices
a GPU's taint covers, which GPUs the DeviceTaintRules taint on a node, the publisher's slice and
its taint gauges (devices, and GPUs by taint)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_driver.metrics import DriverMetrics
from dra_driver.publisher import LentHolds, ReclaimPlanned, SlicePublisher, devices_tainted, with_serving_holds
from dra_driver.reclaimtaints import planned_reclaims
from dra_driver.rulewatch import ReclaimTaintWatch
from rose_common import names
from rose_common.informer import ADDED, DELETED, MODIFIED
from rose_common.slices import resource_slice, simulated_gpus, taint_covers, taint_reclaim_planned

NODE = "node-a"
SHARES = resource_slice(NODE, simulated_gpus(NODE, 2), 1, shares=True)
WHOLE_ONLY = resource_slice(NODE, simulated_gpus(NODE, 2), 1)
RECLAIM = {"key": names.TAINT_RECLAIM_PLANNED, "value": "pool-a", "effect": "NoSchedule"}


def _rule(
    name: str,
    device: str | None,
    *,
    node: str | None = NODE,
    key: str = names.TAINT_RECLAIM_PLANNED,
    driver: str | None = names.DRIVER_NAME,
    value: str = "pool-a",
) -> dict[str, Any]:
    sel = {k: v for k, v in (("driver", driver), ("pool", node), ("device", device)) if v is not None}
    return {
        "metadata": {"name": name, "labels": {names.LABEL_TAINT_POOL: value}},
        "spec": {
            "deviceSelector": sel,
            "taint": {"key": key, "value": value, "effect": "NoSchedule", "timeAdded": "2026-12-02T01:00:00Z"},
        },
    }


def _taints(body_or_devices: Any) -> dict[str, list[tuple[str, str]]]:
    devices = body_or_devices["spec"]["devices"] if isinstance(body_or_devices, dict) else body_or_devices
    return {d["name"]: [(t["key"], t["value"]) for t in d["taints"]] for d in devices if d.get("taints")}


# ---------------------------------------------------------------------- which devices a taint covers


def test_a_gpus_taint_covers_its_lendable_and_share_devices_never_serving() -> None:
    devices = SHARES["spec"]["devices"]
    assert taint_covers(devices, 0) == ["gpu-0-lendable", "gpu-0-share"]
    assert taint_covers(devices, 1) == ["gpu-1-lendable", "gpu-1-share"]
    assert taint_covers(WHOLE_ONLY["spec"]["devices"], 1) == ["gpu-1-lendable"]
    assert taint_covers(devices, 7) == []


def test_every_share_device_of_the_gpu_is_covered_however_many() -> None:
    devices = copy.deepcopy(SHARES["spec"]["devices"])
    second = copy.deepcopy(next(d for d in devices if d["name"] == "gpu-0-share"))
    second["name"] = "gpu-0-share-b"  # a second shareable device of GPU 0 (found by its attributes)
    devices.append(second)
    assert taint_covers(devices, 0) == ["gpu-0-lendable", "gpu-0-share", "gpu-0-share-b"]
    out = taint_reclaim_planned(devices, {0: RECLAIM}, frozenset({"gpu-0-lendable"}))
    assert _taints(out) == {n: [(RECLAIM["key"], "pool-a")] for n in ("gpu-0-share", "gpu-0-share-b")}


def test_share_devices_gain_and_lose_the_taint_with_their_gpu_and_keep_other_taints() -> None:
    devices = copy.deepcopy(SHARES["spec"]["devices"])
    other = {"key": "example.com/x", "value": "1", "effect": "NoSchedule"}
    next(d for d in devices if d["name"] == "gpu-0-share")["taints"] = [other]
    out = taint_reclaim_planned(devices, {0: RECLAIM}, frozenset({"gpu-0-lendable"}))
    assert _taints(out) == {"gpu-0-share": [("example.com/x", "1"), (RECLAIM["key"], "pool-a")]}
    assert taint_reclaim_planned(out, {0: RECLAIM}, frozenset({"gpu-0-lendable"})) == out  # idempotent
    # no rule names the lendable device (say, one named the share device): the slice taints it
    assert set(_taints(taint_reclaim_planned(devices, {1: RECLAIM}))) == {
        "gpu-0-share",
        "gpu-1-lendable",
        "gpu-1-share",
    }
    assert taint_reclaim_planned(out, {}) == devices  # the rule gone: only the other taint left
    assert devices[0].get("taints") is None  # the input is not changed


def test_a_taint_of_another_key_is_refused() -> None:
    with pytest.raises(ValueError, match=r"not a rose\.io/reclaim-planned taint"):
        taint_reclaim_planned(SHARES["spec"]["devices"], {0: {"key": "rose.io/other", "effect": "NoSchedule"}})


# ---------------------------------------------------------------------- which GPUs the rules taint


def test_rules_on_this_nodes_lent_devices_taint_their_gpus() -> None:
    rules = [
        _rule("r0", "gpu-0-lendable"),
        _rule("r-other-node", "gpu-1-lendable", node="node-b"),
        _rule("r-other-driver", "gpu-1-lendable", driver="gpu.example.com"),
        _rule("r-other-key", "gpu-1-lendable", key="example.com/maintenance"),
        _rule("r-pool-wide", None),  # taints every device of the pool already, shares included
        _rule("r-serving", "gpu-1-serving"),
        _rule("r-not-ours", "nvme-0"),
    ]
    planned, ruled = planned_reclaims(rules, NODE)
    assert planned == {0: RECLAIM} and ruled == frozenset({"gpu-0-lendable"})  # timeAdded not carried


def test_a_selector_without_pool_or_driver_matches_and_the_first_rule_by_name_wins() -> None:
    rules = [_rule("b", "gpu-1-lendable", value="pool-b"), _rule("a", "gpu-1-share", node=None, driver=None)]
    planned, ruled = planned_reclaims(rules, NODE)
    assert planned == {1: RECLAIM} and ruled == frozenset({"gpu-1-lendable", "gpu-1-share"})
    assert planned_reclaims([], NODE) == ({}, frozenset())


def test_the_watch_hands_the_publisher_each_change_of_the_rules() -> None:
    got: list[tuple[dict[int, dict[str, str]], frozenset[str]]] = []
    w = ReclaimTaintWatch(api=None, node=NODE, publish=lambda p, r: got.append((p, r)))  # type: ignore[arg-type]
    w.on_list([_rule("r0", "gpu-0-lendable")])
    w.on_event(ADDED, _rule("r1", "gpu-1-lendable", node="node-b"))
    w.on_event(MODIFIED, _rule("r1", "gpu-1-lendable"))
    w.on_event(DELETED, _rule("r0", "gpu-0-lendable"))
    w.on_list([])
    assert [sorted(p) for p, _ in got] == [[0], [0], [0, 1], [1], []]


# ---------------------------------------------------------------------- the publisher and its gauges


class MemSlices:
    """The node's slices in memory (a unit test of the publisher's decisions; e2e uses the API server)."""

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


def _gauge(m: DriverMetrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_publisher_carries_the_reclaim_taint_onto_share_devices_and_counts_gpus() -> None:
    api, m = MemSlices(), DriverMetrics([0, 1])
    p = SlicePublisher(api, SHARES, m)  # type: ignore[arg-type]
    p.set_reclaim_planned({0: RECLAIM}, frozenset({"gpu-0-lendable"}))
    p.reconcile()
    assert _taints(next(iter(api.items.values()))) == {"gpu-0-share": [(RECLAIM["key"], "pool-a")]}
    assert _gauge(m, "rose_driver_gpus_tainted", taint=names.TAINT_RECLAIM_PLANNED) == 1
    p.set_reclaim_planned({}, frozenset())
    p.reconcile()
    assert _taints(next(iter(api.items.values()))) == {}
    assert _gauge(m, "rose_driver_gpus_tainted", taint=names.TAINT_RECLAIM_PLANNED) == 0


def test_serving_holds_gauge_counts_devices_and_its_gpu_gauge_counts_gpus() -> None:
    body = with_serving_holds(SHARES, frozenset({0}), LentHolds(), ReclaimPlanned())
    assert devices_tainted(body, names.TAINT_SERVING_HOLDS) == 2  # gpu-0-lendable and gpu-0-share
    api, m = MemSlices(), DriverMetrics([0, 1])
    p = SlicePublisher(api, SHARES, m)  # type: ignore[arg-type]
    p.set_serving_holds(frozenset({0, 1}))
    p.reconcile()
    assert _gauge(m, "rose_driver_lendable_devices_tainted") == 4
    assert _gauge(m, "rose_driver_gpus_tainted", taint=names.TAINT_SERVING_HOLDS) == 2
    whole = SlicePublisher(MemSlices(), WHOLE_ONLY, DriverMetrics([0, 1]))  # type: ignore[arg-type]
    whole.set_serving_holds(frozenset({1}))
    whole.reconcile()
    assert _gauge(whole.metrics, "rose_driver_lendable_devices_tainted") == 1  # no share devices

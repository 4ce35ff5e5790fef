"""The planner's reclaim taint covers a GPU's share devices (issue 27 §2 and §3), on the session
cluster's real kube-apiserver and kube-scheduler with one real ``rose driver --gpu-shares``.

The elastic controller taints a pool with one ``rose.io/reclaim-planned`` NoSchedule
DeviceTaintRule per *lendable* device (tests/e2e/elastic_controller/test_elastic_taints_e2e.py runs
it). Here the test writes such a rule itself for GPU 0's lendable device, as the controller does:
the driver publishes GPU 0's share device with the same taint, so the scheduler allocates no share
claim on GPU 0 while a share claim on untainted GPU 1 is allocated; when the rule goes, the share
device loses the taint and the waiting claim is allocated.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from local_cluster import ClusterHandle
from local_cluster.kubelet import DriverProcess
from local_cluster.objects import allocated_claim
from rose_common import names
from tests.support.driver_fixtures import E2E_DRIVER_ARGS, driver_published, node_driver
from tests.support.k8s_helpers import create_claim_template, delete_namespace, gpu_pod, new_namespace, wait_for

REPO = Path(__file__).resolve().parents[3]
RULES = ("resource.k8s.io", "v1", "devicetaintrules")


@pytest.fixture
def share_driver(cluster: ClusterHandle) -> Iterator[DriverProcess]:
    with node_driver(
        cluster, cluster.node_names[-1], "rose-sht-", lambda _: [*E2E_DRIVER_ARGS, "--gpu-shares", "true"]
    ) as d:
        yield d


@pytest.fixture
def ns(api: Any) -> Iterator[str]:
    name = new_namespace(api, "sht")
    yield name
    delete_namespace(api, name)


def _share_template(name: str, gpu: int) -> dict[str, Any]:
    """examples/share-claim-template.yaml, renamed and pinned to one GPU."""
    t: dict[str, Any] = copy.deepcopy(yaml.safe_load((REPO / "examples/share-claim-template.yaml").read_text()))
    t["metadata"]["name"] = name
    exactly = t["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    exactly["selectors"] = [{"cel": {"expression": f'device.attributes["gpu.rose.io"].index == {gpu}'}}]
    return t


def _rule(name: str, node: str, device: str) -> dict[str, Any]:
    """The rule the elastic controller writes for one lendable device (elastic_controller/taints.py)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name, "labels": {names.LABEL_TAINT_POOL: "e2e-share-taint"}},
        "spec": {
            "deviceSelector": {"driver": names.DRIVER_NAME, "pool": node, "device": device},
            "taint": {"key": names.TAINT_RECLAIM_PLANNED, "value": "e2e-share-taint", "effect": "NoSchedule"},
        },
    }


def _reclaim_tainted(api: Any, node: str) -> set[str]:
    """The devices of the driver's slice that carry the reclaim taint in the slice itself."""
    s = driver_published(api, node) or {"spec": {"devices": []}}
    return {
        d["name"]
        for d in s["spec"]["devices"]
        if any(t["key"] == names.TAINT_RECLAIM_PLANNED for t in d.get("taints") or [])
    }


def _failed_scheduling(api: Any, ns: str, pod: str) -> bool:
    evs = client.CoreV1Api(api).list_namespaced_event(ns, field_selector=f"involvedObject.name={pod}").items
    return any(e.reason == "FailedScheduling" for e in evs)


def test_a_reclaim_tainted_gpu_takes_no_share_claim_until_the_rule_goes(
    share_driver: DriverProcess, api: Any, ns: str
) -> None:
    drv, node = share_driver, share_driver.node
    wait_for("the driver's slice with shares", lambda: driver_published(api, node), timeout=60)
    rules = client.CustomObjectsApi(api)
    name = f"rose-reclaim-e2e-{node}-gpu-0-lendable"
    rules.create_cluster_custom_object(*RULES, _rule(name, node, "gpu-0-lendable"))
    try:
        got = wait_for("gpu-0-share tainted", lambda: _reclaim_tainted(api, node) or None, timeout=30)
        assert got == {"gpu-0-share"}  # the rule taints gpu-0-lendable itself; GPU 1 untouched
        taint = {d["name"]: d for d in driver_published(api, node)["spec"]["devices"]}["gpu-0-share"]["taints"]  # type: ignore[index]
        assert [(t["key"], t["value"], t["effect"]) for t in taint] == [
            (names.TAINT_RECLAIM_PLANNED, "e2e-share-taint", "NoSchedule")
        ]
        reclaim = {"taint": names.TAINT_RECLAIM_PLANNED}
        assert wait_for("gpus_tainted{reclaim} 1", lambda: drv.metric("rose_driver_gpus_tainted", reclaim) == 1 or None)

        core = client.CoreV1Api(api)
        for gpu in (0, 1):
            create_claim_template(api, ns, _share_template(f"share-gpu{gpu}", gpu))
            core.create_namespaced_pod(ns, gpu_pod(f"rl-{gpu}", f"share-gpu{gpu}", node_name=node))
        ok = wait_for("the share on untainted GPU 1 allocated", lambda: allocated_claim(api, ns, "rl-1"), timeout=60)
        assert ok["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-1-share"
        wait_for("the share on GPU 0 unschedulable", lambda: _failed_scheduling(api, ns, "rl-0") or None, timeout=30)
        assert allocated_claim(api, ns, "rl-0") is None
    finally:
        rules.delete_cluster_custom_object(*RULES, name)

    # the forecast fell: the rule goes, gpu-0-share loses the taint and the waiting share lands there
    wait_for("gpu-0-share untainted", lambda: _reclaim_tainted(api, node) == set() or None, timeout=30)
    late = wait_for("the share on GPU 0 allocated", lambda: allocated_claim(api, ns, "rl-0"), timeout=60)
    assert late["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0-share"
    assert drv.metric("rose_driver_gpus_tainted", {"taint": names.TAINT_RECLAIM_PLANNED}) == 0

"""DRA end to end on the real binaries: kube-apiserver, the resourceclaim controller in
kube-controller-manager, the real kube-scheduler's DynamicResources plugin, and KWOK.

No kubelet runs here (KWOK plays the nodes), so nothing calls a driver's
NodePrepareResources in these tests: the harness plays the part of the kubelet's node-side
publisher only in that the seed ResourceSlices are written through the API at cluster start
(as a driver would after registering). Allocation, claim creation, binding and the Running
status are all done by the real components.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from local_cluster import ClusterHandle
from rose_common import names
from tests.support.k8s_helpers import (
    claim_template,
    create_claim_template,
    gpu_pod,
    pod_claim,
    scratch_namespace,
    wait_for,
)


@pytest.fixture
def ns(api: Any) -> Iterator[str]:
    with scratch_namespace(api, "dra") as name:
        yield name


def _running(api: Any, ns: str, pod: str) -> bool:
    p = client.CoreV1Api(api).read_namespaced_pod(pod, ns)
    return bool(p.spec.node_name and p.status.phase == "Running")


def test_slices_published_for_every_node(cluster: ClusterHandle, api: Any) -> None:
    items = client.CustomObjectsApi(api).list_cluster_custom_object(
        "resource.k8s.io", "v1", "resourceslices", field_selector=f"spec.driver={names.DRIVER_NAME}"
    )["items"]
    by_node = {s["spec"]["nodeName"]: s for s in items}
    assert set(cluster.node_names) <= set(by_node)
    for node in cluster.node_names:
        devices = by_node[node]["spec"]["devices"]
        # every physical GPU twice: serving and lendable, same physicalGPU attribute
        assert len(devices) == 2 * cluster.gpus_per_node
        phys = {}
        for d in devices:
            role = d["attributes"][names.ATTR_ROLE]["string"]
            phys.setdefault(d["attributes"][names.ATTR_PHYSICAL_GPU]["string"], set()).add(role)
        assert all(v == {"serving", "lendable"} for v in phys.values())


def test_pod_with_claim_template_is_allocated_bound_and_running(api: Any, ns: str) -> None:
    create_claim_template(api, ns, claim_template("one-gpu", names.DEVICE_CLASS_LENDABLE))
    client.CoreV1Api(api).create_namespaced_pod(ns, gpu_pod("worker", "one-gpu"))

    # the resourceclaim controller creates the claim from the template
    claim = wait_for("generated ResourceClaim", lambda: pod_claim(api, ns, "worker"))
    assert claim["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpu"
    # the real scheduler allocates a lendable device and binds; KWOK reports Running
    wait_for("pod Running", lambda: _running(api, ns, "worker"))
    claim = pod_claim(api, ns, "worker")
    assert claim is not None
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 1
    assert results[0]["driver"] == names.DRIVER_NAME
    assert results[0]["device"].endswith("-lendable")
    pod = client.CoreV1Api(api).read_namespaced_pod("worker", ns)
    assert results[0]["pool"] == pod.spec.node_name
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [pod.metadata.uid]


def test_pod_asking_for_more_gpus_than_exist_stays_pending(cluster: ClusterHandle, api: Any, ns: str) -> None:
    too_many = cluster.gpus_per_node + 1  # one node never has this many
    create_claim_template(api, ns, claim_template("too-many", names.DEVICE_CLASS_SERVING, count=too_many))
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(ns, gpu_pod("greedy", "too-many"))

    def unschedulable() -> str | None:
        p = core.read_namespaced_pod("greedy", ns)
        for c in p.status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                return str(c.message)
        return None

    message = wait_for("PodScheduled=False/Unschedulable", unschedulable)
    assert "cannot allocate all claims" in message, message
    assert core.read_namespaced_pod("greedy", ns).spec.node_name is None


def test_two_pods_never_receive_the_same_exclusive_device(cluster: ClusterHandle, api: Any, ns: str) -> None:
    total = len(cluster.node_names) * cluster.gpus_per_node
    create_claim_template(api, ns, claim_template("serving-gpu", names.DEVICE_CLASS_SERVING))
    core = client.CoreV1Api(api)
    for i in range(total + 1):
        core.create_namespaced_pod(ns, gpu_pod(f"srv-{i}", "serving-gpu"))

    def scheduled() -> list[str] | None:
        pods = core.list_namespaced_pod(ns).items
        bound = [p.metadata.name for p in pods if p.spec.node_name]
        return bound if len(bound) == total else None

    bound = wait_for(f"{total} pods bound", scheduled, timeout=90)
    allocated = []
    for name in bound:
        claim = pod_claim(api, ns, name)
        assert claim is not None
        for r in claim["status"]["allocation"]["devices"]["results"]:
            allocated.append((r["pool"], r["device"]))
    assert len(allocated) == total
    assert len(set(allocated)) == total, "a device was allocated to two claims"
    # the one extra pod has no device left anywhere
    pending = [p for p in core.list_namespaced_pod(ns).items if not p.spec.node_name]
    assert len(pending) == 1

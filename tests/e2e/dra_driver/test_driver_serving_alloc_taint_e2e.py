"""A serving claim's GPU is kept from new lent claims from its *allocation* on, not only from its
prepare (issue 25, soak finding T2), on the session cluster's real kube-apiserver, kube-scheduler
and kube-controller-manager with one real ``rose driver`` (``--serving-wait prepare``, the mode
the soak ran; KWOK has no kubelet, so the test plays the kubelet's prepare over the driver's gRPC
socket).

In the soak, a lent claim scheduled between the scheduler allocating a serving claim on
``gpu-0-serving`` and the kubelet's prepare of it was allocated ``gpu-0-lendable`` (the driver
tainted it only once serving was prepared), and its prepare was then refused for as long as
serving stayed. Here the serving claim is allocated and never prepared while the new lent claim is
scheduled: the lent claim must land on another GPU of the node. A lent claim allocated on GPU 0
*before* serving came (the race the taint cannot undo) is refused, visibly: one
``LentPrepareRefused`` Event however often the kubelet retries, and a counter. When serving goes,
GPU 0 is lendable again and the refused claim prepares.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from dra_driver.refusals import EVENT_LENT_PREPARE_REFUSED
from local_cluster import ClusterHandle
from local_cluster.kubelet import DriverProcess
from local_cluster.objects import allocated_claim
from rose_common import names
from tests.support.driver_fixtures import E2E_DRIVER_ARGS, driver_published, node_driver
from tests.support.k8s_helpers import claim_template, create_claim_template, gpu_pod, scratch_namespace, wait_for

HOLDS = {"taint": names.TAINT_SERVING_HOLDS}


@pytest.fixture
def drv(cluster: ClusterHandle) -> Iterator[DriverProcess]:
    with node_driver(cluster, cluster.node_names[-1], "rose-sat-", lambda _: list(E2E_DRIVER_ARGS), show_log=True) as d:
        yield d


@pytest.fixture
def ns(api: Any) -> Iterator[str]:
    with scratch_namespace(api, "sat") as name:
        yield name


def _held(api: Any, node: str) -> set[str]:
    """The devices of the driver's slice tainted rose.io/serving-holds."""
    s = driver_published(api, node) or {"spec": {"devices": []}}
    return {
        d["name"]
        for d in s["spec"]["devices"]
        if any(t.get("key") == names.TAINT_SERVING_HOLDS for t in d.get("taints") or [])
    }


def _device(claim: dict[str, Any]) -> str:
    (res,) = claim["status"]["allocation"]["devices"]["results"]
    return str(res["device"])


def _bound(api: Any, ns: str, pod: str) -> bool:
    return bool(client.CoreV1Api(api).read_namespaced_pod(pod, ns).spec.node_name)


def _events(api: Any, ns: str, pod: str, reason: str) -> list[Any]:
    evs = client.CoreV1Api(api).list_namespaced_event(ns, field_selector=f"involvedObject.name={pod}").items
    return [e for e in evs if e.reason == reason]


def _claim_gone(api: Any, claim: dict[str, Any]) -> bool:
    m = claim["metadata"]
    items = client.CustomObjectsApi(api).list_namespaced_custom_object(
        "resource.k8s.io", "v1", m["namespace"], "resourceclaims", field_selector=f"metadata.name={m['name']}"
    )["items"]
    return not items


def _pin(gpu: int) -> list[str]:
    return [f'device.attributes["gpu.rose.io"].index == {gpu}']


def test_a_serving_allocation_keeps_new_lent_claims_off_its_gpu_before_any_prepare(
    drv: DriverProcess, api: Any, ns: str
) -> None:
    node, core = drv.node, client.CoreV1Api(api)
    wait_for("the driver's slice", lambda: driver_published(api, node), timeout=60)
    assert _held(api, node) == set()
    for gpu in (0, 1):
        create_claim_template(api, ns, claim_template(f"serve{gpu}", names.DEVICE_CLASS_SERVING, selectors=_pin(gpu)))
    create_claim_template(api, ns, claim_template("lent0", names.DEVICE_CLASS_LENDABLE, selectors=_pin(0)))
    create_claim_template(api, ns, claim_template("lent", names.DEVICE_CLASS_LENDABLE))
    serving = {"labels": {names.LABEL_ROLE: "serving"}, "node_name": node}
    rl = {"labels": {names.LABEL_JOB: "job-a"}, "node_name": node}

    # serving is allocated GPU 0 and bound; the kubelet has not prepared it (nor will, for now)
    core.create_namespaced_pod(ns, gpu_pod("serve-0", "serve0", **serving))
    srv0 = wait_for("the serving claim allocated", lambda: allocated_claim(api, ns, "serve-0"), timeout=90)
    wait_for("the serving pod bound", lambda: _bound(api, ns, "serve-0"), timeout=60)
    assert _device(srv0) == "gpu-0-serving"
    # the allocation alone taints GPU 0's lendable device (before: only serving's prepare did)
    wait_for("gpu-0-lendable tainted at allocation", lambda: _held(api, node) == {"gpu-0-lendable"} or None, timeout=30)
    assert drv.metric("rose_driver_gpus_tainted", HOLDS) == 1

    # a new lent claim on this node: first fit would be gpu-0-lendable; it gets the other GPU
    core.create_namespaced_pod(ns, gpu_pod("rl-new", "lent", **rl))
    new = wait_for("the new lent claim allocated", lambda: allocated_claim(api, ns, "rl-new"), timeout=90)
    assert new["status"]["allocation"]["devices"]["results"][0]["pool"] == node
    assert _device(new) == "gpu-1-lendable"

    # the race the taint cannot undo: serving comes to GPU 1 before the kubelet prepared rl-new there
    core.create_namespaced_pod(ns, gpu_pod("serve-1", "serve1", **serving))
    srv1 = wait_for("the second serving claim allocated", lambda: allocated_claim(api, ns, "serve-1"), timeout=90)
    assert _device(srv1) == "gpu-1-serving"
    wait_for("both lendable devices tainted", lambda: len(_held(api, node)) == 2 or None, timeout=30)
    # serving prepares (nothing prepared on GPU 1 to reclaim); rl-new's claim is refused, visibly
    assert drv.prepare(srv1).error == ""
    for _ in range(3):  # the kubelet retries
        err = drv.prepare(new).error
        assert "is held by serving claim" in err and "serving wins" in err, err
    assert drv.metric("rose_driver_lent_prepare_refused_total") == 3
    told = wait_for("LentPrepareRefused", lambda: _events(api, ns, "rl-new", EVENT_LENT_PREPARE_REFUSED), timeout=30)
    assert len(told) == 1 and told[0].type == "Warning", told  # once, not once per retry
    assert f"GPU 1 of {node}" in (told[0].message or "") and "serve-1" in (told[0].message or "")

    # serving leaves: pods deleted, unprepared, claims deleted by the claim controller: lendable again
    for pod, claim in (("serve-0", srv0), ("serve-1", srv1)):
        core.delete_namespaced_pod(pod, ns, grace_period_seconds=0)
        if claim is srv1:
            assert drv.unprepare(claim).error == ""
        wait_for(f"{pod}'s claim deleted", lambda claim=claim: _claim_gone(api, claim), timeout=60)
    wait_for("no lendable device tainted", lambda: _held(api, node) == set() or None, timeout=30)
    assert drv.metric("rose_driver_gpus_tainted", HOLDS) == 0
    assert drv.prepare(new).error == ""  # the refused claim prepares now
    core.create_namespaced_pod(ns, gpu_pod("rl-late", "lent0", **rl))
    late = wait_for("a lent claim on GPU 0 again", lambda: allocated_claim(api, ns, "rl-late"), timeout=90)
    assert _device(late) == "gpu-0-lendable"
    assert drv.unprepare(new).error == ""

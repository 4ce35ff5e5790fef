"""Serving and an RL share on one GPU, end to end (issue 27 §3 acceptance: "an RL share and serving
run on one simulated GPU within their capacities; serving's growth reclaims the share first"). The
session cluster's real v1.37.2 kube-apiserver and kube-scheduler, one real ``rose driver
--gpu-shares`` process (simulated GPUs of 141 GiB, the node suspend engine with its explicit
``simulated`` backend), and this harness playing the kubelet's prepare as
tests/e2e/dra_driver/test_driver_shares_e2e.py does.

GPU 0 is lent whole (a lendable claim); an RL share of 60 GiB + 40 % runs on GPU 1. Serving asks for
a fraction (``examples/serving-share-claim-template.yaml``: 60 GiB + 40 %, first choice a GPU not lent
whole): the scheduler puts it on GPU 1's ``gpu-1-servingshare`` (GPU 0's is tainted
``rose.io/lent-whole``), and the driver prepares it beside the share — 120 GiB and 80 % of the GPU,
both prepared, nothing suspended. Serving grows by a second fraction (40 GiB + 30 %): 100 GiB / 70 %
for serving leaves no room for the share, so the driver suspends the share (state kept in host
memory) before serving's prepare, while the whole-GPU occupant on GPU 0 keeps running; when that
serving leaves, the share resumes. The node facts say GPU 0 is lent whole and GPU 1 in a share.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from dra_driver import cdi
from local_cluster import ClusterHandle
from local_cluster.kubelet import DriverProcess
from local_cluster.objects import allocated_claim
from rose_common import names, promtext
from rose_common.quantity import to_int
from tests.support.driver_fixtures import E2E_DRIVER_ARGS, driver_published, node_driver
from tests.support.k8s_helpers import claim_template, create_claim_template, gpu_pod, scratch_namespace, wait_for

REPO = Path(__file__).resolve().parents[3]
GiB = 1024**3


def _on_gpu(i: int) -> str:
    return f'device.attributes["gpu.rose.io"].index == {i}'


@pytest.fixture(scope="module")
def share_driver(cluster: ClusterHandle) -> Iterator[DriverProcess]:
    with node_driver(
        cluster, cluster.node_names[-1], "rose-ssh-", lambda _: [*E2E_DRIVER_ARGS, "--gpu-shares", "true"]
    ) as d:
        yield d


@pytest.fixture
def ns(api: Any) -> Iterator[str]:
    with scratch_namespace(api, "ssh") as name:
        yield name


def serving_template(name: str, memory: str, compute: str) -> dict[str, Any]:
    """examples/serving-share-claim-template.yaml, renamed, with these capacities (both choices)."""
    t: dict[str, Any] = copy.deepcopy(yaml.safe_load((REPO / "examples/serving-share-claim-template.yaml").read_text()))
    t["metadata"]["name"] = name
    for sub in t["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]:
        sub["capacity"]["requests"] = {"memory": memory, "compute": compute}
    return t


def rl_share_template(name: str, gpu: int) -> dict[str, Any]:
    t: dict[str, Any] = copy.deepcopy(yaml.safe_load((REPO / "examples/share-claim-template.yaml").read_text()))
    t["metadata"]["name"] = name
    exactly = t["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    exactly["capacity"]["requests"] = {"memory": "60Gi", "compute": "40"}
    exactly["selectors"] = [{"cel": {"expression": _on_gpu(gpu)}}]
    return t


def _ann(api: Any, ns: str, pod: str) -> dict[str, str]:
    got: dict[str, str] = client.CoreV1Api(api).read_namespaced_pod(pod, ns).metadata.annotations or {}
    return got


def _reasons(api: Any, ns: str, pod: str) -> set[str]:
    evs = client.CoreV1Api(api).list_namespaced_event(ns, field_selector=f"involvedObject.name={pod}").items
    return {e.reason for e in evs}


def _result(claim: dict[str, Any]) -> dict[str, Any]:
    res: dict[str, Any] = claim["status"]["allocation"]["devices"]["results"][0]
    return res


def _device_taints(api: Any, node: str, device: str) -> list[str]:
    devs = {d["name"]: d for d in (driver_published(api, node) or {"spec": {"devices": []}})["spec"]["devices"]}
    return [t["key"] for t in (devs.get(device) or {}).get("taints") or []]


def _allocate_and_prepare(api: Any, drv: DriverProcess, ns: str, pod: dict[str, Any]) -> dict[str, Any]:
    client.CoreV1Api(api).create_namespaced_pod(ns, pod)
    name = pod["metadata"]["name"]
    claim = wait_for(f"{name}'s claim allocated", lambda: allocated_claim(api, ns, name), timeout=60)
    out = drv.prepare(claim)
    assert out.error == "", out
    return claim


def _mps(drv: DriverProcess, claim: dict[str, Any]) -> set[str]:
    spec = json.loads((drv.cdi_dir / cdi.spec_filename(claim["metadata"]["uid"])).read_text())
    return {e for e in spec["containerEdits"]["env"] if e.startswith("CUDA_MPS_") and "DIRECTORY" not in e}


def test_serving_fraction_beside_an_rl_share_and_its_growth_reclaims_the_share_first(
    cluster: ClusterHandle, share_driver: DriverProcess, api: Any, ns: str
) -> None:
    drv, node = share_driver, share_driver.node
    assert cluster.gpus_per_node >= 2
    wait_for("the driver's slice with shares", lambda: driver_published(api, node), timeout=60)
    serving = {names.LABEL_ROLE: "serving"}
    rl = {names.LABEL_JOB: "job-ssh"}
    create_claim_template(api, ns, claim_template("whole-gpu0", names.DEVICE_CLASS_LENDABLE, selectors=[_on_gpu(0)]))
    create_claim_template(api, ns, rl_share_template("rl-share-gpu1", 1))
    create_claim_template(api, ns, serving_template("serve-60", "60Gi", "40"))
    create_claim_template(api, ns, serving_template("serve-40", "40Gi", "30"))

    # GPU 0 lent whole: its serving-fraction device gets tainted against serving fractions
    whole = gpu_pod("rl-whole", "whole-gpu0", labels=rl, node_name=node)
    whole["metadata"]["annotations"] = {names.ANNOTATION_GRACE: "10"}
    _allocate_and_prepare(api, drv, ns, whole)
    wait_for(
        "gpu-0-servingshare tainted lent-whole",
        lambda: _device_taints(api, node, "gpu-0-servingshare") == [names.TAINT_LENT_WHOLE],
        timeout=30,
    )
    # an RL share on GPU 1
    share_pod = gpu_pod("rl-share", "rl-share-gpu1", labels=rl, node_name=node)
    share_pod["metadata"]["annotations"] = {names.ANNOTATION_GRACE: "10"}
    share = _allocate_and_prepare(api, drv, ns, share_pod)
    assert _result(share)["device"] == "gpu-1-share"

    # serving's fraction lands beside the share (not on the GPU lent whole) and both are prepared
    srv_a = _allocate_and_prepare(api, drv, ns, gpu_pod("serve-a", "serve-60", labels=serving, node_name=node))
    res_a = _result(srv_a)
    assert res_a["device"] == "gpu-1-servingshare" and res_a["request"] == "gpu/beside-shares"
    assert {k: to_int(v) for k, v in res_a["consumedCapacity"].items()} == {"memory": 60 * GiB, "compute": 40}
    limits = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=61440M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40"}
    assert _mps(drv, srv_a) == limits and _mps(drv, share) == limits
    assert names.ANNOTATION_SUSPEND_STATE not in _ann(api, ns, "rl-share")  # never suspended
    # no whole serving claim is allocated where serving's fractions are (the driver would refuse it)
    wait_for(
        "gpu-1-serving tainted serving-fractions",
        lambda: _device_taints(api, node, "gpu-1-serving") == [names.TAINT_SERVING_FRACTIONS],
        timeout=30,
    )
    assert names.ANNOTATION_SUSPEND_STATE not in _ann(api, ns, "rl-whole")
    m = "\n".join(drv.metrics())
    assert promtext.value(m, "rose_driver_share_claims", {"gpu": "1"}) == 1
    assert promtext.value(m, "rose_driver_suspended_occupants", {}) == 0
    # lent now: GPU 0 whole and the share's 60 of GPU 1's 141 GiB
    assert promtext.value(m, "rose_driver_lent_gpus", {}) == pytest.approx(1 + 60 / 141)

    # the node facts: GPU 0 lent whole, GPU 1 only in a share (60 of 141 GiB, 40 %: 0.43)
    def facts() -> tuple[str, str] | None:
        ann = client.CoreV1Api(api).read_node(node).metadata.annotations or {}
        got = (ann.get(names.ANNOTATION_LENT, ""), ann.get(names.ANNOTATION_LENT_SHARES, ""))
        return got if got == ("0", "1=0.43") else None

    wait_for("node facts: GPU 0 whole, GPU 1 in shares", facts, timeout=15)

    # serving grows past what is free on GPU 1: the share is suspended first, GPU 0 is left alone
    srv_b = _allocate_and_prepare(api, drv, ns, gpu_pod("serve-b", "serve-40", labels=serving, node_name=node))
    assert _result(srv_b)["device"] == "gpu-1-servingshare"
    assert _ann(api, ns, "rl-share")[names.ANNOTATION_SUSPEND_STATE] == "Suspended"
    assert "Suspended" in _reasons(api, ns, "rl-share")
    assert names.ANNOTATION_SUSPEND_STATE not in _ann(api, ns, "rl-whole")
    m = "\n".join(drv.metrics())
    assert promtext.value(m, "rose_driver_suspended_occupants", {}) == 1  # the share's state, kept
    assert promtext.value(m, "rose_driver_suspended_state_bytes", {}) == GiB  # in host memory
    assert promtext.value(m, "rose_driver_lent_gpus", {}) == 1  # GPU 0 only: the share is suspended
    assert not ({"LentWorkloadEvicted", "ReclaimEnforced"} & _reasons(api, ns, "rl-share"))

    # serving shrinks back: the share runs again
    assert drv.unprepare(srv_b).error == ""
    assert _ann(api, ns, "rl-share")[names.ANNOTATION_SUSPEND_STATE] == "Running"
    for name in ("serve-a", "rl-share", "rl-whole"):
        claim = allocated_claim(api, ns, name)
        assert claim is not None and drv.unprepare(claim).error == ""

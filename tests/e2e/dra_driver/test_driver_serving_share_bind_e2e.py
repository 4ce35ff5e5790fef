"""Serving's fraction of a GPU waits in the scheduler too (issue 27 §1 with §3), on the real control
plane: the session cluster's v1.37.2 kube-apiserver and kube-scheduler, and one real ``rose driver
--gpu-shares --serving-wait=prebind`` (simulated GPUs of 141 GiB, the node suspend engine with its
explicit ``simulated`` backend, the node agent serving each lent claim's socket and simulated
device memory). KWOK has no kubelet: the test plays NodePrepareResources over the
driver's real gRPC socket once the scheduler has bound a pod.

An RL share of 60 GiB + 40 % runs on GPU 1. Serving's first fraction (60 GiB + 40 %) fits beside
it: the driver reports ``gpu-1-servingshare`` free at once (``NoOccupant``) and the share keeps
running. Serving's second fraction (40 GiB + 30 %) does not: the scheduler holds its pod in PreBind
while the driver suspends the share, and binds it only once the driver reported the device freed in
the claim's status (with the allocation's ``shareID``); the kubelet's prepare is then immediate (no
second suspend). When that serving leaves, the share resumes.
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
from rose_common import names, promtext
from tests.support.driver_fixtures import driver_published, node_driver
from tests.support.k8s_helpers import create_claim_template, gpu_pod, scratch_namespace, wait_for

REPO = Path(__file__).resolve().parents[3]
GRACE_S, ENFORCE_S, SLACK_S = 2.0, 2.0, 5.0
BOUND_S = GRACE_S + SLACK_S + 2 * ENFORCE_S  # the driver's documented bound on one reclaim
ON_GPU1 = [{"cel": {"expression": 'device.attributes["gpu.rose.io"].index == 1'}}]


@pytest.fixture(scope="module")
def drv(cluster: ClusterHandle) -> Iterator[DriverProcess]:
    def args(root: Path) -> list[str]:
        return [
            "--suspend-engine", "node", "--suspend-backends", "simulated,cooperative",
            "--simulated-occupant-bytes", "1Gi", "--host-memory-budget", "8Gi",
            "--default-grace-seconds", f"{GRACE_S:g}", "--enforce-timeout-seconds", f"{ENFORCE_S:g}",
            "--agent-control-socket", str(root / "a" / "control.sock"), "--suspended-cpu=",
            "--node-facts-seconds", "0", "--gpu-shares", "true", "--serving-wait", "prebind",
        ]  # fmt: skip

    with node_driver(cluster, cluster.node_names[-1], "rose-ssb-", args, show_log=True) as d:
        yield d


@pytest.fixture
def ns(api: Any) -> Iterator[str]:
    with scratch_namespace(api, "ssb") as name:
        yield name


def _template(example: str, name: str, memory: str, compute: str) -> dict[str, Any]:
    """An example claim template, renamed, asking for this much of GPU 1 (its first subrequest's
    or its one request's capacity)."""
    t: dict[str, Any] = copy.deepcopy(yaml.safe_load((REPO / "examples" / example).read_text()))
    t["metadata"]["name"] = name
    req = t["spec"]["spec"]["devices"]["requests"][0]
    if "firstAvailable" in req:  # serving's: only its first choice (a GPU not lent whole) is kept
        req["firstAvailable"] = req["firstAvailable"][:1]
    sub = req["firstAvailable"][0] if "firstAvailable" in req else req["exactly"]
    sub["capacity"]["requests"] = {"memory": memory, "compute": compute}
    sub["selectors"] = ON_GPU1
    return t


def _metric(d: DriverProcess, name: str, **labels: str) -> float:
    return promtext.value("\n".join(d.metrics()), name, labels, default=0.0)


def _reasons(api: Any, ns: str, pod: str) -> list[str]:
    evs = client.CoreV1Api(api).list_namespaced_event(ns, field_selector=f"involvedObject.name={pod}").items
    return [e.reason for e in evs]


def _bound(api: Any, ns: str, pod: str) -> str:
    return str(client.CoreV1Api(api).read_namespaced_pod(pod, ns).spec.node_name or "")


def _suspend_state(api: Any, ns: str, pod: str) -> str:
    ann = client.CoreV1Api(api).read_namespaced_pod(pod, ns).metadata.annotations or {}
    return str(ann.get(names.ANNOTATION_SUSPEND_STATE, ""))


def _fraction_slice(api: Any, node: str) -> dict[str, Any] | None:
    s = driver_published(api, node)
    if not s:
        return None
    devs = {d["name"]: d for d in s["spec"]["devices"]}
    ok = devs.get("gpu-1-servingshare", {}).get("bindingConditions") == [names.BINDING_CONDITION_FREED]
    return s if ok and not devs["gpu-1-share"].get("bindingConditions") else None


def _serve(api: Any, d: DriverProcess, ns: str, pod: str, template: str) -> dict[str, Any]:
    """A serving pod on ``template``, its claim allocated on gpu-1-servingshare with ROSE's binding
    condition and bound by the scheduler (once the driver reported); returns the claim as bound."""
    client.CoreV1Api(api).create_namespaced_pod(
        ns, gpu_pod(pod, template, labels={names.LABEL_ROLE: "serving"}, node_name=d.node)
    )
    claim = wait_for(f"{pod}'s claim allocated", lambda: allocated_claim(api, ns, pod), timeout=90)
    (res,) = claim["status"]["allocation"]["devices"]["results"]
    assert res["device"] == "gpu-1-servingshare" and res.get("shareID"), res
    assert res.get("bindingConditions") == [names.BINDING_CONDITION_FREED], res
    assert wait_for(f"{pod} bound by the scheduler", lambda: _bound(api, ns, pod), timeout=60) == d.node
    got = allocated_claim(api, ns, pod)
    assert got is not None
    return got


def _condition(claim: dict[str, Any]) -> tuple[str, str, str, str]:
    """(device, shareID, condition type, reason) of the claim's one reported device."""
    (dev,) = claim["status"]["devices"]
    (cond,) = dev["conditions"]
    assert cond["status"] == "True"
    return dev["device"], dev.get("shareID", ""), cond["type"], cond["reason"]


def test_a_serving_fraction_that_needs_a_share_reclaimed_waits_in_prebind_and_prepares_at_once(
    cluster: ClusterHandle, drv: DriverProcess, api: Any, ns: str
) -> None:
    wait_for("driver slice: servingshare with binding conditions", lambda: _fraction_slice(api, drv.node), timeout=60)
    assert _metric(drv, "rose_driver_serving_wait_mode", mode="prebind") == 1
    create_claim_template(api, ns, _template("share-claim-template.yaml", "rl-share", "60Gi", "40"))
    create_claim_template(api, ns, _template("serving-share-claim-template.yaml", "serve-60", "60Gi", "40"))
    create_claim_template(api, ns, _template("serving-share-claim-template.yaml", "serve-40", "40Gi", "30"))
    rl = gpu_pod("rl-share", "rl-share", labels={names.LABEL_JOB: "job-ssb"}, node_name=drv.node)
    rl["metadata"]["annotations"] = {names.ANNOTATION_GRACE: f"{GRACE_S:g}"}
    client.CoreV1Api(api).create_namespaced_pod(ns, rl)
    share = wait_for("RL share allocated", lambda: allocated_claim(api, ns, "rl-share"), timeout=90)
    wait_for("RL share bound", lambda: _bound(api, ns, "rl-share"), timeout=30)  # RL shares never wait
    assert drv.prepare(share).error == ""

    # serving's first fraction fits beside the share: reported free at once, nothing suspended
    srv_a = _serve(api, drv, ns, "serve-a", "serve-60")
    res_a = srv_a["status"]["allocation"]["devices"]["results"][0]
    assert _condition(srv_a) == (
        "gpu-1-servingshare", res_a["shareID"], names.BINDING_CONDITION_FREED, "NoOccupant"
    )  # fmt: skip
    assert drv.prepare(srv_a).error == ""
    assert _suspend_state(api, ns, "rl-share") in ("", "Running")

    # the second does not fit (100 GiB / 70 % for serving + the share's 60 GiB / 40 %): the pod
    # waits in PreBind while the driver suspends the share; bound only after it reported freed, so
    # the share is Suspended by then (the causal order)
    srv_b = _serve(api, drv, ns, "serve-b", "serve-40")
    assert _suspend_state(api, ns, "rl-share") == "Suspended"
    res_b = srv_b["status"]["allocation"]["devices"]["results"][0]
    assert _condition(srv_b) == ("gpu-1-servingshare", res_b["shareID"], names.BINDING_CONDITION_FREED, "Freed")
    reasons = _reasons(api, ns, "serve-b")
    for r in ("BindingConditionsPending", names.EVENT_DEVICE_FREEING, names.EVENT_DEVICE_FREED, "Scheduled"):
        assert r in reasons, reasons
    assert _metric(drv, "rose_driver_binding_conditions_total", result="freed") == 2
    assert 0 < _metric(drv, "rose_driver_binding_wait_seconds_sum") <= 2 * BOUND_S
    suspends = _metric(drv, "rose_driver_occupant_suspend_total", outcome="suspended")
    assert suspends == 1

    # the kubelet's prepare: immediate, no second reclaim
    assert drv.prepare(srv_b).error == ""
    assert _metric(drv, "rose_driver_occupant_suspend_total", outcome="suspended") == suspends
    assert _metric(drv, "rose_driver_suspended_occupants") == 1

    # serving shrinks back: the prepare took the hold over, its unprepare releases it
    assert drv.unprepare(srv_b).error == ""
    wait_for("RL share resumed", lambda: _suspend_state(api, ns, "rl-share") == "Running", timeout=30)
    assert drv.unprepare(srv_a).error == ""
    assert drv.unprepare(share).error == ""


def test_a_serving_fraction_whose_share_cannot_be_freed_fails_the_binding_and_is_rescheduled(
    cluster: ClusterHandle, drv: DriverProcess, api: Any, ns: str
) -> None:
    wait_for("driver slice: servingshare with binding conditions", lambda: _fraction_slice(api, drv.node), timeout=60)
    create_claim_template(api, ns, _template("share-claim-template.yaml", "rl-share", "100Gi", "40"))
    create_claim_template(api, ns, _template("serving-share-claim-template.yaml", "serve-60", "60Gi", "40"))
    rl = gpu_pod("rl-share", "rl-share", labels={names.LABEL_JOB: "job-ssb"}, node_name=drv.node)
    rl["metadata"]["annotations"] = {names.ANNOTATION_GRACE: f"{GRACE_S:g}"}
    client.CoreV1Api(api).create_namespaced_pod(ns, rl)
    share = wait_for("RL share allocated", lambda: allocated_claim(api, ns, "rl-share"), timeout=90)
    wait_for("RL share bound", lambda: _bound(api, ns, "rl-share"), timeout=30)
    assert drv.prepare(share).error == ""
    # a share the driver cannot free: its simulated device memory is a directory, which observes as
    # 4 KiB resident and cannot be truncated (what a stuck context leaves behind)
    mem = drv.plugin_dir / "claims" / share["metadata"]["uid"] / "device-memory"
    mem.unlink()
    mem.mkdir()
    client.CoreV1Api(api).create_namespaced_pod(
        ns, gpu_pod("serve-a", "serve-60", labels={names.LABEL_ROLE: "serving"}, node_name=drv.node)
    )
    failed = wait_for(
        "the scheduler fails the binding on the driver's failure condition",
        lambda: [
            e.message
            for e in client.CoreV1Api(api).list_namespaced_event(ns, field_selector="involvedObject.name=serve-a").items
            if e.reason == "FailedScheduling" and "device binding failed" in (e.message or "")
        ],
        timeout=BOUND_S + 30,
    )
    assert "reason=NotFreed" in failed[0], failed
    assert names.EVENT_DEVICE_NOT_FREED in _reasons(api, ns, "serve-a")
    assert _bound(api, ns, "serve-a") == ""  # never bound beside the share it could not free
    assert _metric(drv, "rose_driver_binding_conditions_total", result="failed") >= 1
    # rescheduled, not stuck: once the share can be freed the pod binds and prepares at once
    mem.rmdir()
    mem.touch(mode=0o666)
    srv = wait_for(
        "serving pod bound after the retry",
        lambda: allocated_claim(api, ns, "serve-a") if _bound(api, ns, "serve-a") else None,
        timeout=BOUND_S + 40,
    )
    assert _condition(srv)[2:] == (names.BINDING_CONDITION_FREED, "Freed")
    assert drv.prepare(srv).error == ""
    assert drv.unprepare(srv).error == ""  # (the unfreeable share's pod is gone by now: not resumed)
    assert drv.unprepare(share).error == ""

"""Serving waits in the scheduler, on the real control plane (issue 27 §1).

One ``rose driver`` for the session cluster's first KWOK node, in its default ``--serving-wait``
(auto: it probes the API server, which keeps device bindingConditions on v1.37.2, so prebind), with
the node agent and the suspend engine's explicit ``simulated`` backend. The real kube-scheduler's
DynamicResources plugin allocates the serving claim and holds the pod in PreBind; the driver's
claim watch frees the GPU and reports ``rose.io/device-freed`` (or ``rose.io/device-free-failed``)
in the claim's status. KWOK has no kubelet: the test plays the kubelet's NodePrepareResources over
the driver's real gRPC socket once the scheduler has bound the pod.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from local_cluster import ClusterHandle
from local_cluster.kubelet import DriverProcess
from local_cluster.objects import allocated_claim
from rose_common import names, promtext
from tests.support.driver_fixtures import driver_published, node_driver
from tests.support.k8s_helpers import (
    claim_template,
    create_claim_template,
    gpu_pod,
    scratch_namespace,
    wait_for,
)

GRACE_S, ENFORCE_S, SLACK_S = 2.0, 2.0, 5.0
# the driver's documented bound on a reclaim: grace + 5 s + --enforce-timeout-seconds, plus as long
# again for a durable checkpoint the engine asked for (dra_driver/README.md)
BOUND_S = GRACE_S + SLACK_S + 2 * ENFORCE_S


@pytest.fixture(scope="module")
def drv(cluster: ClusterHandle) -> Iterator[DriverProcess]:
    def args(root: Path) -> list[str]:
        return [
            "--suspend-engine", "node", "--suspend-backends", "simulated,cooperative",
            "--simulated-occupant-bytes", "1Gi", "--host-memory-budget", "8Gi",
            "--default-grace-seconds", f"{GRACE_S:g}", "--enforce-timeout-seconds", f"{ENFORCE_S:g}",
            "--agent-control-socket", str(root / "a" / "control.sock"), "--node-facts-seconds", "0",
            "--suspended-cpu=",
        ]  # fmt: skip

    with node_driver(cluster, cluster.node_names[0], "rose-bind-", args, show_log=True) as d:
        yield d


@pytest.fixture
def ns(api: Any) -> Iterator[str]:
    with scratch_namespace(api, "bind") as name:
        yield name


def _metric(d: DriverProcess, name: str, **labels: str) -> float:
    return promtext.value("\n".join(d.metrics()), name, labels, default=0.0)


def _events(api: Any, ns: str, pod: str) -> list[tuple[str, str]]:
    evs = client.CoreV1Api(api).list_namespaced_event(ns, field_selector=f"involvedObject.name={pod}").items
    return [(e.reason, e.message or "") for e in sorted(evs, key=lambda e: e.metadata.creation_timestamp)]


def _bound(api: Any, ns: str, pod: str) -> str:
    return str(client.CoreV1Api(api).read_namespaced_pod(pod, ns).spec.node_name or "")


def _suspend_state(api: Any, ns: str, pod: str) -> str:
    ann = client.CoreV1Api(api).read_namespaced_pod(pod, ns).metadata.annotations or {}
    return str(ann.get(names.ANNOTATION_SUSPEND_STATE, ""))


def _lend_then_serve(api: Any, d: DriverProcess, ns: str, gpu: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """An RL pod's lendable claim on ``gpu`` of the driver's node, prepared; then a serving pod
    whose claim the scheduler allocates on the same physical GPU. Returns (RL claim, serving pod)."""
    wait_for("driver slice with binding conditions", lambda: _binding_slice(api, d.node), timeout=60)
    sel = [f'device.attributes["gpu.rose.io"].index == {gpu}']
    create_claim_template(api, ns, claim_template("lent", names.DEVICE_CLASS_LENDABLE, selectors=sel))
    create_claim_template(api, ns, claim_template("serve", names.DEVICE_CLASS_SERVING, selectors=sel))
    core = client.CoreV1Api(api)
    rl = gpu_pod("rl-0", "lent", labels={names.LABEL_JOB: "job-a"}, node_name=d.node)
    rl["metadata"]["annotations"] = {names.ANNOTATION_GRACE: f"{GRACE_S:g}"}
    core.create_namespaced_pod(ns, rl)
    rl_claim = wait_for("RL claim allocated", lambda: allocated_claim(api, ns, "rl-0"), timeout=90)
    wait_for("RL pod bound", lambda: _bound(api, ns, "rl-0"), timeout=30)  # no binding condition on lendable
    out = d.prepare(rl_claim)
    assert out.error == "" and out.devices[0].device_name == f"gpu-{gpu}-lendable"
    serve = gpu_pod("serve-0", "serve", labels={names.LABEL_ROLE: "serving"}, node_name=d.node)
    core.create_namespaced_pod(ns, serve)
    return rl_claim, serve


def _binding_slice(api: Any, node: str) -> dict[str, Any] | None:
    s = driver_published(api, node)
    if not s:
        return None
    serving = [x for x in s["spec"]["devices"] if x["name"].endswith("-serving")]
    lendable = [x for x in s["spec"]["devices"] if x["name"].endswith("-lendable")]
    ok = all(x.get("bindingConditions") == [names.BINDING_CONDITION_FREED] for x in serving) and not any(
        x.get("bindingConditions") for x in lendable
    )
    return s if ok else None


def test_serving_waits_in_prebind_visible_and_bounded_and_its_prepare_is_immediate(
    cluster: ClusterHandle, drv: DriverProcess, api: Any, ns: str
) -> None:
    rl_claim, _ = _lend_then_serve(api, drv, ns, gpu=0)
    assert _metric(drv, "rose_driver_serving_wait_mode", mode="prebind") == 1  # auto chose prebind, reported
    srv_claim = wait_for("serving claim allocated", lambda: allocated_claim(api, ns, "serve-0"), timeout=90)
    (res,) = srv_claim["status"]["allocation"]["devices"]["results"]
    assert res["device"] == "gpu-0-serving" and res["bindingConditions"] == [names.BINDING_CONDITION_FREED]

    node = wait_for("serving pod bound by the scheduler", lambda: _bound(api, ns, "serve-0"), timeout=60)
    # causal order: the scheduler binds only after the driver reported the GPU freed, and the
    # driver reports that only after the occupant was suspended: so it is Suspended already
    assert node == drv.node
    assert _suspend_state(api, ns, "rl-0") == "Suspended"
    reasons = [r for r, _ in _events(api, ns, "serve-0")]
    # visible: the scheduler's own Event for the wait, the driver's, the binding (Events carry
    # whole seconds: their order is not asserted; the causal order is the Suspended state above)
    for r in ("BindingConditionsPending", names.EVENT_DEVICE_FREEING, names.EVENT_DEVICE_FREED, "Scheduled"):
        assert r in reasons, reasons
    claim = allocated_claim(api, ns, "serve-0")
    assert claim is not None
    (dev,) = claim["status"]["devices"]
    (cond,) = dev["conditions"]
    assert (dev["device"], cond["type"], cond["status"]) == ("gpu-0-serving", names.BINDING_CONDITION_FREED, "True")
    assert cond["reason"] == "Freed"
    # bounded: the wait the driver measured is within the occupant's documented reclaim bound
    assert _metric(drv, "rose_driver_binding_conditions_total", result="freed") == 1
    assert _metric(drv, "rose_driver_binding_wait_seconds_count") == 1
    assert 0 < _metric(drv, "rose_driver_binding_wait_seconds_sum") <= BOUND_S
    suspends = _metric(drv, "rose_driver_occupant_suspend_total", outcome="suspended")
    assert suspends == 1

    # the kubelet's prepare: nothing left to wait for, no second reclaim
    out = drv.prepare(claim)
    assert out.error == "" and out.devices[0].device_name == "gpu-0-serving"
    assert _metric(drv, "rose_driver_occupant_suspend_total", outcome="suspended") == suspends
    assert _metric(drv, "rose_driver_gpu_residency", gpu="0", resident="serving") == 1

    # serving leaves: the unprepare releases the hold the prepare took over, the occupant resumes
    assert drv.unprepare(claim).error == ""
    wait_for("RL resumed", lambda: _suspend_state(api, ns, "rl-0") == "Running", timeout=30)
    assert drv.unprepare(rl_claim).error == ""


def test_a_failed_free_fails_the_binding_and_the_scheduler_reschedules_the_pod(
    cluster: ClusterHandle, drv: DriverProcess, api: Any, ns: str
) -> None:
    rl_claim, _ = _lend_then_serve(api, drv, ns, gpu=1)
    # a device the driver cannot free: the claim's simulated device memory is a directory, which
    # observes as 4 KiB resident and cannot be truncated (what a stuck context leaves behind)
    mem = drv.plugin_dir / "claims" / rl_claim["metadata"]["uid"] / "device-memory"
    mem.unlink()
    mem.mkdir()
    failed = wait_for(
        "the scheduler fails the binding on the driver's failure condition",
        lambda: [m for r, m in _events(api, ns, "serve-0") if r == "FailedScheduling" and "device binding failed" in m],
        timeout=BOUND_S + 30,
    )
    assert "reason=NotFreed" in failed[0], failed
    assert any(r == names.EVENT_DEVICE_NOT_FREED for r, _ in _events(api, ns, "serve-0"))
    assert _bound(api, ns, "serve-0") == ""  # never bound onto the occupied GPU
    assert _metric(drv, "rose_driver_binding_conditions_total", result="failed") >= 1
    # rescheduled, not stuck: the scheduler allocates again; once the device can be freed the pod binds
    mem.rmdir()
    mem.touch(mode=0o666)
    wait_for("serving pod bound after the retry", lambda: _bound(api, ns, "serve-0"), timeout=BOUND_S + 40)
    claim = allocated_claim(api, ns, "serve-0")
    assert claim is not None
    conds = {c["type"]: c["status"] for c in claim["status"]["devices"][0]["conditions"]}
    assert conds == {names.BINDING_CONDITION_FREED: "True"}  # the failed attempt's status went with its allocation
    assert drv.prepare(claim).error == ""
    assert drv.unprepare(claim).error == ""
    assert drv.unprepare(rl_claim).error == ""


def _serving_holds_taints(api: Any, node: str) -> dict[str, list[dict[str, Any]]]:
    """Per device of the driver's slice: its rose.io/serving-holds taints (devices without one left out)."""
    s = driver_published(api, node) or {"spec": {"devices": []}}
    out = {}
    for d in s["spec"]["devices"]:
        mine = [t for t in d.get("taints") or [] if t.get("key") == names.TAINT_SERVING_HOLDS]
        if mine:
            out[d["name"]] = mine
    return out


def test_serving_holds_taint_keeps_new_lent_claims_off_the_gpu_until_serving_leaves(
    cluster: ClusterHandle, drv: DriverProcess, api: Any, ns: str
) -> None:
    wait_for("driver slice with binding conditions", lambda: _binding_slice(api, drv.node), timeout=60)
    # nothing held: nothing tainted, once the module's earlier serving claims are gone with their
    # namespaces (an allocated serving claim taints its GPU until it is deleted or deallocated)
    wait_for("no serving-holds taint left", lambda: _serving_holds_taints(api, drv.node) == {}, timeout=90)
    gpu0 = ['device.attributes["gpu.rose.io"].index == 0']
    create_claim_template(api, ns, claim_template("serve", names.DEVICE_CLASS_SERVING, selectors=gpu0))
    create_claim_template(api, ns, claim_template("lent", names.DEVICE_CLASS_LENDABLE))
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(
        ns, gpu_pod("serve-0", "serve", labels={names.LABEL_ROLE: "serving"}, node_name=drv.node)
    )
    srv = wait_for("serving claim allocated", lambda: allocated_claim(api, ns, "serve-0"), timeout=90)
    wait_for("serving pod bound", lambda: _bound(api, ns, "serve-0"), timeout=60)
    assert drv.prepare(srv).error == ""

    # serving holds GPU 0: its lendable device carries the taint, its serving device none
    held = wait_for("GPU 0's lendable device tainted", lambda: _serving_holds_taints(api, drv.node), timeout=30)
    assert list(held) == ["gpu-0-lendable"], held
    (taint,) = held["gpu-0-lendable"]
    assert (taint["value"], taint["effect"]) == ("0", "NoSchedule")
    assert _metric(drv, "rose_driver_lendable_devices_tainted") == 1

    # a new lent claim pinned to this node: the scheduler's first fit would be gpu-0-lendable (the
    # first lendable device); the taint keeps it off, so it gets another GPU of the same node
    core.create_namespaced_pod(ns, gpu_pod("rl-0", "lent", labels={names.LABEL_JOB: "job-a"}, node_name=drv.node))
    rl = wait_for("lent claim allocated", lambda: allocated_claim(api, ns, "rl-0"), timeout=90)
    (res,) = rl["status"]["allocation"]["devices"]["results"]
    assert res["pool"] == drv.node and res["device"].endswith("-lendable"), res
    assert res["device"] != "gpu-0-lendable", res
    assert drv.prepare(rl).error == ""

    # serving leaves: the pod goes, the kubelet unprepares: the taint goes
    core.delete_namespaced_pod("serve-0", ns, grace_period_seconds=0)
    assert drv.unprepare(srv).error == ""
    wait_for("GPU 0's lendable device untainted", lambda: _serving_holds_taints(api, drv.node) == {}, timeout=30)
    assert _metric(drv, "rose_driver_lendable_devices_tainted") == 0
    assert drv.unprepare(rl).error == ""

"""The DRA driver end to end on the real control plane (kube-apiserver, kube-scheduler's
DynamicResources plugin, the resourceclaim controller, KWOK nodes).

One ``rose driver`` process per KWOK node (simulated GPUs, the agent's suspend engine with its
explicit ``simulated`` backend) publishes that node's ResourceSlices. KWOK has no kubelet, so
this test plays the kubelet's DRA manager: it reads the registration socket (GetInfo), then
calls NodePrepareResources / NodeUnprepareResources on the driver's DRA socket with the real
method names, as the kubelet would once a pod is bound.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client, watch
from urllib3.exceptions import ProtocolError

from dra_driver import cdi
from dra_driver.state import PREPARE_COMPLETED, decode
from local_cluster import ClusterHandle, free_port
from local_cluster.kubelet import DriverProcess
from local_cluster.objects import allocated_claim, report_container_resources
from rose_common import names, promtext
from tests.support.driver_fixtures import E2E_DRIVER_ARGS, driver_published, restore_seed_slices
from tests.support.k8s_helpers import (
    claim_template,
    create_claim_template,
    gpu_pod,
    scratch_namespace,
    wait_for,
)

REPO = Path(__file__).resolve().parents[3]
V1 = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/"


class DriverProc(DriverProcess):
    """The driver under test; the harness's KubeletDRA plays the kubelet (local_cluster/kubelet.py)."""

    def __init__(self, cluster: ClusterHandle, node: str, root: Path) -> None:
        super().__init__(
            cluster.kubeconfig,
            node,
            root,
            cluster.gpus_per_node,
            free_port(),
            extra_args=E2E_DRIVER_ARGS,
        )


@pytest.fixture(scope="module")
def drivers(cluster: ClusterHandle) -> Iterator[dict[str, DriverProc]]:
    root = Path(tempfile.mkdtemp(prefix="rose-drv-", dir="/tmp"))  # short: unix socket paths <= 107 bytes
    procs = {n: DriverProc(cluster, n, root) for n in cluster.node_names}
    api = cluster.api_client()
    try:
        yield procs
    finally:
        codes = {n: p.stop() for n, p in procs.items()}
        try:
            restore_seed_slices(cluster, api, list(procs))  # removed on shutdown, seeds back
            assert codes == {n: 0 for n in procs}, codes
        finally:
            api.close()
            if os.environ.get("ROSE_E2E_KEEP_DRIVER_LOGS") != "1":
                shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def ns(api: Any) -> Iterator[str]:
    with scratch_namespace(api, "drv") as name:
        yield name


def test_every_driver_publishes_and_republishes_after_wipe(
    cluster: ClusterHandle, drivers: dict[str, DriverProc], api: Any
) -> None:
    for node in cluster.node_names:
        s = wait_for(
            f"slice of {node} published by its driver", lambda node=node: driver_published(api, node), timeout=60
        )
        assert len(s["spec"]["devices"]) == 2 * cluster.gpus_per_node
        assert s["spec"]["pool"]["name"] == node and s["spec"]["pool"]["generation"] >= 2  # above the seed's
    node = cluster.node_names[0]
    before = driver_published(api, node)
    assert before is not None
    client.CustomObjectsApi(api).delete_cluster_custom_object(
        "resource.k8s.io", "v1", "resourceslices", before["metadata"]["name"]
    )  # the kubelet's wipe
    after = wait_for(
        "slice republished after wipe",
        lambda: (
            driver_published(api, node)
            if ((driver_published(api, node) or {}).get("metadata", {}).get("uid") != before["metadata"]["uid"])
            else None
        ),
        timeout=60,
    )
    assert after["spec"]["pool"]["generation"] > before["spec"]["pool"]["generation"]


def _ann(api: Any, ns: str, pod: str) -> dict[str, str]:
    return client.CoreV1Api(api).read_namespaced_pod(pod, ns).metadata.annotations or {}


def _node_ann(api: Any, node: str) -> dict[str, str]:
    return client.CoreV1Api(api).read_node(node).metadata.annotations or {}


def _events(api: Any, ns: str, pod: str) -> list[str]:
    evs = client.CoreV1Api(api).list_namespaced_event(ns, field_selector=f"involvedObject.name={pod}").items
    return [e.reason for e in sorted(evs, key=lambda e: e.metadata.creation_timestamp)]


def _gpu0_templates(api: Any, ns: str, node: str, lent: str, serve: str) -> None:
    """Once the node's driver has published: a lendable and a serving claim template, both pinned
    to physical GPU 0 (so the two claims share one physical GPU)."""
    wait_for("driver slice", lambda: driver_published(api, node), timeout=60)
    gpu0 = ['device.attributes["gpu.rose.io"].index == 0']
    create_claim_template(api, ns, claim_template(lent, names.DEVICE_CLASS_LENDABLE, selectors=gpu0))
    create_claim_template(api, ns, claim_template(serve, names.DEVICE_CLASS_SERVING, selectors=gpu0))


def test_serving_wins_on_a_shared_physical_gpu(
    cluster: ClusterHandle, drivers: dict[str, DriverProc], api: Any, ns: str
) -> None:
    node = cluster.node_names[0]
    drv = drivers[node]
    _gpu0_templates(api, ns, node, "lent-gpu0", "serve-gpu0")
    core = client.CoreV1Api(api)
    rl = gpu_pod("rl-0", "lent-gpu0", labels={names.LABEL_JOB: "job-a"}, node_name=node)
    rl["metadata"]["annotations"] = {names.ANNOTATION_GRACE: "15"}
    core.create_namespaced_pod(ns, rl)
    rl_claim = wait_for("RL claim allocated and reserved", lambda: allocated_claim(api, ns, "rl-0"), timeout=90)
    rl_uid = core.read_namespaced_pod("rl-0", ns).metadata.uid

    # the kubelet prepares the RL pod's claim
    out = drv.prepare(rl_claim)
    assert out.error == "" and out.devices[0].device_name == "gpu-0-lendable"
    cdi_id = f"gpu.rose.io/gpu={rl_claim['metadata']['uid']}-gpu-0-lendable"
    assert list(out.devices[0].cdi_device_ids) == [cdi_id]
    spec = json.loads((drv.cdi_dir / f"gpu.rose.io-gpu_{rl_claim['metadata']['uid']}.json").read_text())
    assert spec["kind"] == "gpu.rose.io/gpu"

    # a serving pod lands on the same physical GPU (the real scheduler allocates gpu-0-serving)
    core.create_namespaced_pod(
        ns, gpu_pod("serve-0", "serve-gpu0", labels={names.LABEL_ROLE: "serving"}, node_name=node)
    )
    srv_claim = wait_for("serving claim allocated", lambda: allocated_claim(api, ns, "serve-0"), timeout=90)
    srv_dev = srv_claim["status"]["allocation"]["devices"]["results"][0]["device"]
    assert srv_dev == "gpu-0-serving"
    assert names.ANNOTATION_SUSPEND_STATE not in _ann(api, ns, "rl-0")

    # watch the RL pod: every change of its suspend-state annotation, in the API server's order
    seen: list[str] = []
    w = watch.Watch()
    rv = core.read_namespaced_pod("rl-0", ns).metadata.resource_version

    def watch_rl() -> None:
        stream = w.stream(
            core.list_namespaced_pod, ns, field_selector="metadata.name=rl-0", resource_version=rv, timeout_seconds=30
        )
        try:
            for ev in stream:
                st = (ev["object"].metadata.annotations or {}).get(names.ANNOTATION_SUSPEND_STATE, "")
                if not seen or seen[-1] != st:
                    seen.append(st)
        except ProtocolError:  # the watch connection closing after stop(): what it saw is recorded
            pass

    t = threading.Thread(target=watch_rl, daemon=True)
    t.start()
    time.sleep(0.5)  # the watch is established
    out = drv.prepare(srv_claim)
    # observed order: when the serving prepare returns, the occupant is already Suspended and the
    # Event says so (nothing else could have written them after the call returned)
    assert out.error == "" and out.devices[0].device_name == "gpu-0-serving"
    assert _ann(api, ns, "rl-0")[names.ANNOTATION_SUSPEND_STATE] == "Suspended"
    assert "Suspended" in _events(api, ns, "rl-0")
    wait_for("watch saw Suspended", lambda: "Suspended" in seen, timeout=10)
    # node facts for the extender: GPU 0 lent, the suspended 1Gi counted against the 8Gi budget
    wait_for("node facts", lambda: _node_ann(api, node).get(names.ANNOTATION_HOST_MEM_FREE) == str(7 * 2**30), 15)
    assert _node_ann(api, node)[names.ANNOTATION_LENT] == "0"
    m = drv.metrics()
    assert 'rose_driver_gpu_residency{gpu="0",resident="serving"} 1.0' in m
    assert "rose_driver_suspended_occupants 1.0" in m
    assert 'rose_driver_occupant_suspend_total{outcome="suspended"} 1.0' in m
    assert seen[seen.index("Suspending") + 1] == "Suspended", seen

    # serving leaves: unprepare resumes the occupant
    assert drv.unprepare(srv_claim).error == ""
    assert _ann(api, ns, "rl-0")[names.ANNOTATION_SUSPEND_STATE] == "Running"
    evs = _events(api, ns, "rl-0")
    assert "Suspended" in evs and "Resumed" in evs
    wait_for("watch saw Running", lambda: seen[-1:] == ["Running"], timeout=10)
    k = seen.index("Suspending")
    assert seen[k : k + 4] == ["Suspending", "Suspended", "Resuming", "Running"], seen
    rl_now = core.read_namespaced_pod("rl-0", ns)
    assert rl_now.metadata.uid == rl_uid and rl_now.metadata.deletion_timestamp is None  # never deleted

    # a suspend request through the API server (the extender's / controller's path)
    req = {"by": "e2e", "reason": "planned reclaim", "graceSeconds": 5, "at": "2026-11-29T00:00:00Z"}
    core.patch_namespaced_pod(
        "rl-0", ns, {"metadata": {"annotations": {names.ANNOTATION_SUSPEND_REQUEST: json.dumps(req)}}}
    )
    wait_for(
        "Suspended by request",
        lambda: _ann(api, ns, "rl-0").get(names.ANNOTATION_SUSPEND_STATE) == "Suspended",
        timeout=30,
    )
    core.patch_namespaced_pod("rl-0", ns, {"metadata": {"annotations": {names.ANNOTATION_SUSPEND_REQUEST: None}}})
    wait_for(
        "Running after the request is withdrawn",
        lambda: _ann(api, ns, "rl-0").get(names.ANNOTATION_SUSPEND_STATE) == "Running",
        timeout=30,
    )
    assert core.read_namespaced_pod("rl-0", ns).metadata.uid == rl_uid
    w.stop()  # end the watch: one more event wakes the stream so it sees the stop
    core.patch_namespaced_pod("rl-0", ns, {"metadata": {"labels": {"e2e-done": "1"}}})
    t.join(timeout=30)
    assert not t.is_alive()
    assert drv.unprepare(rl_claim).error == ""


def _cpu(api: Any, ns: str, pod: str) -> tuple[str, str | None, str]:
    """(cpu request, cpu limit, uid) of the pod's container ``main``."""
    p = client.CoreV1Api(api).read_namespaced_pod(pod, ns)
    res = p.spec.containers[0].resources
    return (res.requests or {}).get("cpu", ""), (res.limits or {}).get("cpu"), p.metadata.uid


def _metric(drv: DriverProc, name: str, **labels: str) -> float:
    return promtext.value("\n".join(drv.metrics()), name, labels, default=0.0)


def test_suspended_worker_gives_its_cpu_back_through_pods_resize(
    cluster: ClusterHandle, drivers: dict[str, DriverProc], api: Any, ns: str
) -> None:
    """A suspended RL worker's CPU leaves the scheduler's accounting: when the driver reports it
    ``Suspended`` (serving wins, then a suspend request), it saves the original cpu values in
    ``rose.io/suspended-cpu`` and lowers the request to ``--suspended-cpu`` (100m) through the
    real API server's ``pods/resize`` subresource: same pod UID, never deleted. After the resume
    the originals are back and the annotation is gone. (KWOK runs no kubelet, so nothing actuates
    the resize in a container here: the spec is what this checks; a real kubelet resizes in place.
    The test plays the kubelet's report of container resources in the status, without which the
    API server refuses any resize: "Pod running on node without support for resize".)"""
    node = cluster.node_names[1]
    drv = drivers[node]
    _gpu0_templates(api, ns, node, "lent-cpu", "serve-cpu")
    core = client.CoreV1Api(api)
    rl = gpu_pod("rl-cpu", "lent-cpu", labels={names.LABEL_JOB: "job-cpu"}, cpu="6", node_name=node)
    rl["spec"]["containers"][0]["resources"]["limits"] = {"cpu": "8"}  # Burstable: only the request moves
    core.create_namespaced_pod(ns, rl)
    rl_claim = wait_for("RL claim allocated", lambda: allocated_claim(api, ns, "rl-cpu"), timeout=90)
    assert drv.prepare(rl_claim).error == ""
    report_container_resources(api, ns, "rl-cpu")  # the kubelet (played): it runs with 6 CPUs
    req0, lim0, uid = _cpu(api, ns, "rl-cpu")
    assert (req0, lim0) == ("6", "8")

    def shrunk() -> bool:
        return _cpu(api, ns, "rl-cpu")[0] == "100m" and names.ANNOTATION_SUSPENDED_CPU in _ann(api, ns, "rl-cpu")

    def restored() -> bool:
        return _cpu(api, ns, "rl-cpu")[0] == "6" and names.ANNOTATION_SUSPENDED_CPU not in _ann(api, ns, "rl-cpu")

    # serving wins on the same physical GPU
    core.create_namespaced_pod(
        ns, gpu_pod("srv-cpu", "serve-cpu", labels={names.LABEL_ROLE: "serving"}, node_name=node)
    )
    srv_claim = wait_for("serving claim allocated", lambda: allocated_claim(api, ns, "srv-cpu"), timeout=90)
    assert drv.prepare(srv_claim).error == ""
    assert _ann(api, ns, "rl-cpu")[names.ANNOTATION_SUSPEND_STATE] == "Suspended"
    wait_for("cpu request lowered through pods/resize", shrunk, timeout=30)
    req, lim, uid_now = _cpu(api, ns, "rl-cpu")
    assert (req, lim, uid_now) == ("100m", "8", uid)  # limit untouched (Burstable), same pod
    saved = json.loads(_ann(api, ns, "rl-cpu")[names.ANNOTATION_SUSPENDED_CPU])
    assert saved["containers"] == {"main": {"request": "6"}} and saved["target"] == "100m"
    assert names.EVENT_CPU_RELEASED in _events(api, ns, "rl-cpu")
    assert _metric(drv, "rose_driver_pod_resize_total", action="shrink", result="ok") >= 1
    report_container_resources(api, ns, "rl-cpu")  # the kubelet (played) actuated the resize

    # serving leaves: resumed, the originals back, the annotation gone
    assert drv.unprepare(srv_claim).error == ""
    assert _ann(api, ns, "rl-cpu")[names.ANNOTATION_SUSPEND_STATE] == "Running"
    wait_for("cpu request restored", restored, timeout=30)
    assert _cpu(api, ns, "rl-cpu") == ("6", "8", uid)
    assert names.EVENT_CPU_RESTORED in _events(api, ns, "rl-cpu")
    report_container_resources(api, ns, "rl-cpu")
    assert _metric(drv, "rose_driver_pod_resize_total", action="restore", result="ok") >= 1

    # the same through a suspend request (the extender's path), then withdrawn
    req_ann = {"by": "e2e", "reason": "serving needs cpu", "graceSeconds": 5, "at": "2026-11-29T00:00:00Z"}
    core.patch_namespaced_pod(
        "rl-cpu", ns, {"metadata": {"annotations": {names.ANNOTATION_SUSPEND_REQUEST: json.dumps(req_ann)}}}
    )
    wait_for("cpu lowered after a suspend request", shrunk, timeout=30)
    report_container_resources(api, ns, "rl-cpu")
    core.patch_namespaced_pod("rl-cpu", ns, {"metadata": {"annotations": {names.ANNOTATION_SUSPEND_REQUEST: None}}})
    wait_for("cpu restored after the request is withdrawn", restored, timeout=30)
    p = core.read_namespaced_pod("rl-cpu", ns)
    assert p.metadata.uid == uid and p.metadata.deletion_timestamp is None
    assert _metric(drv, "rose_driver_pod_resize_total", action="shrink", result="error") == 0
    assert _metric(drv, "rose_driver_pod_resize_total", action="restore", result="error") == 0
    assert drv.unprepare(rl_claim).error == ""


def test_bad_claims_get_clear_per_claim_errors(
    cluster: ClusterHandle, drivers: dict[str, DriverProc], api: Any, ns: str
) -> None:
    node0, node1 = cluster.node_names[0], cluster.node_names[1]
    drv = drivers[node0]
    create_claim_template(api, ns, claim_template("lent", names.DEVICE_CLASS_LENDABLE))
    client.CoreV1Api(api).create_namespaced_pod(ns, gpu_pod("elsewhere", "lent", node_name=node1))
    other_node = wait_for("claim on another node", lambda: allocated_claim(api, ns, "elsewhere"), timeout=90)
    assert "belongs to another node" in drv.prepare(other_node).error
    # an unallocated claim (no pod uses it, so the scheduler never allocated it)
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "idle"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": names.DEVICE_CLASS_LENDABLE}}]}
        },
    }
    idle = client.CustomObjectsApi(api).create_namespaced_custom_object(
        "resource.k8s.io", "v1", ns, "resourceclaims", body
    )
    assert "not allocated" in drv.prepare(idle).error
    gone = {"metadata": {"namespace": ns, "name": "no-such-claim", "uid": "00000000-0000-0000-0000-000000000000"}}
    assert "not found" in drv.prepare(gone).error
    assert drv.unprepare(gone).error == ""  # unprepare of an unknown claim is not an error


def _quietly(call: Any, claim: dict[str, Any]) -> None:
    """The kubelet's call that the kill interrupts: its failure is expected."""
    with contextlib.suppress(grpc.RpcError):
        call(claim)


def _retry(what: str, fn: Any) -> Any:
    """Call like the kubelet does after a plugin restart: retry while the socket is not served yet."""

    def attempt() -> Any:
        try:
            return fn()
        except grpc.RpcError:
            return None

    return wait_for(what, attempt, timeout=60, interval=0.5)


def test_driver_process_killed_mid_call_recovers(
    cluster: ClusterHandle, drivers: dict[str, DriverProc], api: Any, ns: str
) -> None:
    """A few full-driver kill -9 trials: the real driver process, the real API, the real sockets."""
    node = cluster.node_names[-1]
    drv = drivers[node]
    wait_for("driver slice", lambda: driver_published(api, node), timeout=60)
    create_claim_template(
        api,
        ns,
        claim_template("s1", names.DEVICE_CLASS_SERVING, selectors=['device.attributes["gpu.rose.io"].index == 0']),
    )
    create_claim_template(
        api,
        ns,
        claim_template("l1", names.DEVICE_CLASS_LENDABLE, selectors=['device.attributes["gpu.rose.io"].index == 1']),
    )
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(ns, gpu_pod("srv", "s1", node_name=node))
    core.create_namespaced_pod(ns, gpu_pod("rl", "l1", labels={names.LABEL_JOB: "j"}, node_name=node))
    claims = [wait_for(f"claim of {p}", lambda p=p: allocated_claim(api, ns, p), timeout=90) for p in ("srv", "rl")]
    uids = sorted(c["metadata"]["uid"] for c in claims)
    checkpoint = drv.plugin_dir / "checkpoint.json"
    rng = random.Random(11)
    for _trial in range(3):
        for op in ("prepare", "unprepare"):
            for claim in claims:
                call = getattr(drv, op)
                t = threading.Thread(target=_quietly, args=(call, claim))
                t.start()
                time.sleep(rng.uniform(0.0, 0.3))
                drv.kill9_and_restart()
                t.join(timeout=60)
                if checkpoint.exists():
                    decode(checkpoint.read_bytes())  # never corrupt
                out = _retry(f"{op} after restart", lambda call=call, claim=claim: call(claim))
                assert out.error == "", out.error
            data = decode(checkpoint.read_bytes())
            if op == "prepare":  # both prepared exactly once, CDI specs for both, nothing else
                assert sorted(data.claims) == uids and {r.state for r in data.claims.values()} == {PREPARE_COMPLETED}
                assert cdi.list_specs(drv.cdi_dir) == uids
                again = drv.prepare(claims[0])  # idempotent after all that
                assert again.error == "" and again.devices[0].device_name == "gpu-0-serving"
            else:
                assert data.claims == {} and cdi.list_specs(drv.cdi_dir) == []

"""The real node: a kubelet v1.37 and containerd 2.x next to the KWOK nodes (docs/real-node.md).

What these tests cover that the played kubelet (local_cluster/kubelet.py) cannot: the node
registered by the real kubelet with its client certificate; a container really started by
containerd + runc from an OCI archive built here (no Docker, no registry); the ROSE driver found
by the kubelet's plugin watcher, its ResourceSlice, ``NodePrepareResources`` /
``NodeUnprepareResources`` called by the kubelet's DRA manager, and the CDI edits applied by
containerd to the container's real environment (read from ``/proc/<pid>/environ``).
Pods use host networking: no CNI plugin runs (the node stays ``NetworkReady=false`` and
tainted ``not-ready``; the pods tolerate it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from local_cluster import ClusterHandle, free_port
from local_cluster.realnode import RealNode, load_binaries
from rose_common import names
from tests.k8s_helpers import claim_template, create_claim_template, delete_namespace, new_namespace, wait_for

TOLERATE_NOT_READY = [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"}]


@pytest.fixture(scope="module")
def real_node(cluster: ClusterHandle) -> Iterator[RealNode]:
    if os.geteuid() != 0:
        pytest.skip("the real node needs root (containerd mounts, runc, cgroups): run the e2e tier as root")
    load_binaries()  # a clear error naming `hack/build-binaries.sh real-node` if they are absent
    node = RealNode(cluster)
    try:
        node.up()
        yield node
    finally:
        node.down()


@pytest.fixture
def ns(api: Any) -> Iterator[str]:
    name = new_namespace(api, "realnode")
    yield name
    delete_namespace(api, name)


def _pod(name: str, image: str, node: str, claim_template_name: str | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",
        "resources": {"requests": {"cpu": "100m", "memory": "16Mi"}, "limits": {"cpu": "500m", "memory": "64Mi"}},
    }
    spec: dict[str, Any] = {
        "hostNetwork": True,
        "automountServiceAccountToken": False,
        "nodeSelector": {"kubernetes.io/hostname": node},
        "tolerations": TOLERATE_NOT_READY,
        "terminationGracePeriodSeconds": 1,
        "containers": [container],
    }
    if claim_template_name:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": claim_template_name}]
        container["resources"]["claims"] = [{"name": "gpu"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _running_pid(api: Any, real_node: RealNode, ns: str, pod: str) -> int:
    """The host pid of the pod's container, once the kubelet reports it Running."""

    def cid() -> str | None:
        p = client.CoreV1Api(api).read_namespaced_pod(pod, ns)
        sts = p.status.container_statuses or []
        if p.status.phase == "Running" and sts and sts[0].state.running:
            return str(sts[0].container_id).split("://", 1)[1]
        return None

    container_id = wait_for(f"{ns}/{pod} Running on the real node", cid, timeout=120, interval=1)
    out = real_node.ctr(load_binaries(), "tasks", "ls")
    for line in out.splitlines()[1:]:
        task, pid, *_ = line.split()
        if task == container_id:
            return int(pid)
    raise AssertionError(f"containerd has no task {container_id}:\n{out}")


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in raw if b"=" in e)


def test_kubelet_registers_node(cluster: ClusterHandle, api: Any, real_node: RealNode) -> None:
    node = wait_for("the real node's Node object", lambda: _node(api, real_node.node), timeout=120, interval=1)
    assert node.status.node_info.kubelet_version == cluster.kubernetes_version
    assert node.status.node_info.container_runtime_version.startswith("containerd://2.")
    assert (node.metadata.labels or {}).get(names.LABEL_GPU_NODE) == "true"


def _node(api: Any, name: str) -> Any:
    try:
        return client.CoreV1Api(api).read_node(name)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def test_container_runs_from_oci_archive(api: Any, ns: str, real_node: RealNode) -> None:
    bins = load_binaries()
    client.CoreV1Api(api).create_namespaced_pod(ns, _pod("sleeper", real_node.pause_image(bins), real_node.node))
    pid = _running_pid(api, real_node, ns, "sleeper")
    # really a process of this machine, started by runc from the image's only file
    assert Path(f"/proc/{pid}/exe").resolve().name == "pause"
    limits = _cgroup_value(pid, "memory", "memory.limit_in_bytes")
    assert limits == 64 * 1024 * 1024, f"memory limit of the container's cgroup: {limits}"


def _cgroup_value(pid: int, controller: str, file: str) -> int:
    """``file`` of the v1 ``controller`` cgroup ``pid`` is in, read from /sys/fs/cgroup."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if controller in ctrls.split(","):
            return int((Path("/sys/fs/cgroup") / controller / path.lstrip("/") / file).read_text())
    raise AssertionError(f"pid {pid} is in no {controller} cgroup: {Path(f'/proc/{pid}/cgroup').read_text()}")


@pytest.fixture
def driver(cluster: ClusterHandle, real_node: RealNode) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``rose driver`` on the real node, its sockets where the kubelet's plugin watcher looks."""
    port = free_port()
    lay = real_node.lay
    log = cluster.workdir / "logs" / "realnode-driver.log"
    args = [
        sys.executable, "-m", "dra_driver", "--node-name", real_node.node, "--kubeconfig", str(cluster.kubeconfig),
        "--gpu-backend", "simulated", "--simulated-gpus", "1",
        "--plugin-dir", str(lay.plugins_dir / names.DRIVER_NAME), "--registry-dir", str(lay.plugins_registry),
        "--cdi-dir", str(lay.cdi_dir), "--metrics-port", str(port), "--metrics-address", "127.0.0.1",
    ]  # fmt: skip
    with log.open("ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        yield proc, port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _metric(port: int, name: str) -> float:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return sum(
            float(ln.rsplit(" ", 1)[1])
            for ln in r.read().decode().splitlines()
            if ln.startswith(name + "{") and 'result="ok"' in ln
        )


def test_kubelet_drives_the_rose_driver(
    api: Any, ns: str, real_node: RealNode, driver: tuple[subprocess.Popen[bytes], int]
) -> None:
    _, port = driver
    klog = real_node.log("kubelet")
    registered = f'"Connection changed" logger="DRA registration handler" driverName="{names.DRIVER_NAME}"'
    wait_for(
        "the kubelet's plugin watcher registering the ROSE driver (its DRA registration handler connected)",
        lambda: any(
            registered in ln and "connected=true" in ln for ln in klog.read_text(errors="replace").splitlines()
        ),
        timeout=60,
        interval=1,
    )
    slices = wait_for(
        "the driver's ResourceSlice for the real node",
        lambda: client.CustomObjectsApi(api).list_cluster_custom_object(
            "resource.k8s.io", "v1", "resourceslices",
            field_selector=f"spec.driver={names.DRIVER_NAME},spec.nodeName={real_node.node}",
        )["items"],
        timeout=60,
    )  # fmt: skip
    assert sum(len(s["spec"]["devices"]) for s in slices) == 2  # one GPU: serving + lendable
    create_claim_template(api, ns, claim_template("lend", names.DEVICE_CLASS_LENDABLE))
    bins = load_binaries()
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(ns, _pod("worker", real_node.pause_image(bins), real_node.node, "lend"))
    pid = _running_pid(api, real_node, ns, "worker")
    assert _metric(port, "rose_driver_prepare_total") >= 1
    env = _environ(pid)
    claim_vars = [k for k in env if k.startswith("ROSE_CLAIM_UID_")]
    assert claim_vars, f"no ROSE_CLAIM_UID_* in the container's environment: {sorted(env)}"
    assert env.get(names.ENV_SIMULATED_GPU) == "1"
    core.delete_namespaced_pod("worker", ns, grace_period_seconds=0)
    wait_for("the kubelet's NodeUnprepareResources", lambda: _metric(port, "rose_driver_unprepare_total") >= 1, 120, 1)


def test_kubelet_actuates_pod_resize_on_the_cgroup(api: Any, ns: str, real_node: RealNode) -> None:
    """``pods/resize`` (the call the driver makes for a suspended worker) applied by the kubelet
    to the container's real CPU cgroup, not only accepted by the API server."""
    bins = load_binaries()
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(ns, _pod("resized", real_node.pause_image(bins), real_node.node))
    pid = _running_pid(api, real_node, ns, "resized")
    period = _cgroup_value(pid, "cpu", "cpu.cfs_period_us")
    assert _cgroup_value(pid, "cpu", "cpu.cfs_quota_us") == period * 500 // 1000
    body = {
        "spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "50m"}, "limits": {"cpu": "200m"}}}]}
    }
    core.patch_namespaced_pod_resize("resized", ns, body)
    wait_for(
        "the kubelet writing the resized CPU limit (200m) into the container's cpu cgroup",
        lambda: _cgroup_value(pid, "cpu", "cpu.cfs_quota_us") == period * 200 // 1000,
        timeout=60,
        interval=1,
    )

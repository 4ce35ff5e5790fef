"""The real node: a kubelet v1.37 and containerd 2.x next to the KWOK nodes (docs/real-node.md).

What these tests cover that the played kubelet (local_cluster/kubelet.py) cannot: the node
registered by the real kubelet with its client certificate; a container really started by
containerd + runc from an OCI archive built here (no Docker, no registry); the ROSE driver found
by the kubelet's plugin watcher, its ResourceSlice, ``NodePrepareResources`` /
``NodeUnprepareResources`` called by the kubelet's DRA manager, and the CDI edits applied by
containerd to the container's real environment (read from ``/proc/<pid>/environ``), the
kubelet's ``pods/resize`` written into a container's cgroup, and serving wins with nothing
played: the example trainer in a container through rose_sdk and its claim's CDI-mounted agent
socket, suspended before the serving container starts, resized, resumed, bit-identical; and the
disk tier for containers: a worker's host copy spilled through its claim's CDI-mounted spill
directory and resumed from it bit-exact.
Python pods run the host's interpreter in a minimal image through read-only hostPath mounts
(``realnode.host_python_archive``; why not ROSE's image: docs/real-node.md).
Pods use host networking: no CNI plugin runs (the node stays ``NetworkReady=false`` and
tainted ``not-ready``; the pods tolerate it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from kubernetes import client

from local_cluster import ClusterHandle, free_port
from local_cluster.realnode import HOST_PYTHON_REF, RealNode, host_python_archive, host_python_mounts, load_binaries
from rose_common import names
from rose_common.proto import rose_agent_v1_pb2 as pb
from rose_common.proto import rose_agent_v1_pb2_grpc as pb_grpc
from rose_sdk import tensors_equal
from tests.support.agent_fixtures import SCRIPT, reaped, start_workload
from tests.support.k8s_helpers import claim_template, create_claim_template, scratch_namespace, wait_for

REPO = Path(__file__).resolve().parents[3]
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
    with scratch_namespace(api, "realnode") as name:
        yield name


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


def test_container_runs_from_oci_archive(cluster: ClusterHandle, api: Any, ns: str, real_node: RealNode) -> None:
    bins = load_binaries()
    client.CoreV1Api(api).create_namespaced_pod(ns, _pod("sleeper", real_node.pause_image(bins), real_node.node))
    pid = _running_pid(api, real_node, ns, "sleeper")
    # really a process of this machine, started by runc from the image's only file
    assert Path(f"/proc/{pid}/exe").resolve().name == "pause"
    limits = _cgroup_value(pid, "memory", "memory.limit_in_bytes")
    assert limits == 64 * 1024 * 1024, f"memory limit of the container's cgroup: {limits}"
    # `rose cluster status` lists the real node's processes, the container's shim among them
    r = subprocess.run(
        [sys.executable, "-m", "rose_cli", "cluster", "--dir", str(cluster.workdir), "status", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    rows = {(x["component"], x["pid"]): x["alive"] for x in json.loads(r.stdout)}
    running = {c for (c, _), alive in rows.items() if alive and c.startswith("realnode-")}
    assert running == {"realnode-containerd", "realnode-kubelet", "realnode-shim"}, r.stdout
    ppid = next(ln.split()[1] for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("PPid:"))
    assert ("realnode-shim", int(ppid)) in rows, f"the container's parent {ppid} is not a listed shim: {r.stdout}"


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


def _wait_registered(real_node: RealNode) -> None:
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


def test_kubelet_drives_the_rose_driver(
    api: Any, ns: str, real_node: RealNode, driver: tuple[subprocess.Popen[bytes], int]
) -> None:
    _, port = driver
    _wait_registered(real_node)
    slices = wait_for(
        "the driver's ResourceSlice for the real node",
        lambda: client.CustomObjectsApi(api).list_cluster_custom_object(
            "resource.k8s.io",
            "v1",
            "resourceslices",
            field_selector=f"spec.driver={names.DRIVER_NAME},spec.nodeName={real_node.node}",
        )["items"],
        timeout=60,
    )
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


def test_kubelet_prepares_a_serving_claim_after_the_schedulers_prebind_wait(
    api: Any, ns: str, real_node: RealNode, driver: tuple[subprocess.Popen[bytes], int]
) -> None:
    """The driver in its default ``--serving-wait`` (auto: prebind on v1.37.2) with a lent pod on
    the node's one GPU: the real scheduler holds the serving pod in PreBind until the driver reports
    the GPU freed, then binds it, and the real kubelet's NodePrepareResources starts its container."""
    _, port = driver

    # this driver process registered with the kubelet (a pod before that waits out the kubelet's DRA
    # retry backoff, ~1 min); its own count, not the kubelet's log, which an earlier driver wrote to
    def registered() -> float:
        try:
            return _metric(port, "rose_driver_registration_total")
        except OSError:  # its metrics endpoint not up yet
            return 0.0

    wait_for("the kubelet's registration of this driver", registered, 60)
    wait_for(
        "the driver's slice with binding conditions on the serving device",
        lambda: any(
            d.get("bindingConditions") == [names.BINDING_CONDITION_FREED]
            for s in client.CustomObjectsApi(api).list_cluster_custom_object(
                "resource.k8s.io",
                "v1",
                "resourceslices",
                field_selector=f"spec.driver={names.DRIVER_NAME},spec.nodeName={real_node.node}",
            )["items"]
            for d in s["spec"]["devices"]
        ),
        timeout=60,
    )
    create_claim_template(api, ns, claim_template("lend", names.DEVICE_CLASS_LENDABLE))
    create_claim_template(api, ns, claim_template("serve", names.DEVICE_CLASS_SERVING))
    image = real_node.pause_image(load_binaries())
    core = client.CoreV1Api(api)
    worker = _pod("worker", image, real_node.node, "lend")
    worker["metadata"]["annotations"] = {names.ANNOTATION_GRACE: "1"}  # it registers no workload: a short wait
    core.create_namespaced_pod(ns, worker)
    _running_pid(api, real_node, ns, "worker")
    core.create_namespaced_pod(ns, _pod("serve", image, real_node.node, "serve"))
    _running_pid(api, real_node, ns, "serve")  # bound after PreBind, prepared by the kubelet, started
    evs = core.list_namespaced_event(ns, field_selector="involvedObject.name=serve").items
    reasons = [e.reason for e in sorted(evs, key=lambda e: e.metadata.creation_timestamp)]
    # (the scheduler's BindingConditionsPending is not asserted: with no occupant to suspend, the
    # driver may report before the scheduler's first check, and then it binds without waiting)
    assert names.EVENT_DEVICE_FREED in reasons and "Scheduled" in reasons, reasons
    claim = next(
        c
        for c in client.CustomObjectsApi(api).list_namespaced_custom_object(
            "resource.k8s.io", "v1", ns, "resourceclaims"
        )["items"]
        if c["metadata"]["name"].startswith("serve-")
    )
    conds = {c["type"]: c["status"] for c in claim["status"]["devices"][0]["conditions"]}
    assert conds == {names.BINDING_CONDITION_FREED: "True"}  # the scheduler bound it on this
    import urllib.request

    from rose_common import promtext

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert promtext.value(text, "rose_driver_binding_conditions_total", {"result": "freed"}) >= 1
    assert promtext.value(text, "rose_driver_serving_wait_mode", {"mode": "prebind"}) == 1
    for pod in ("serve", "worker"):
        core.delete_namespaced_pod(pod, ns, grace_period_seconds=0)
    wait_for("the kubelet's NodeUnprepareResources", lambda: _metric(port, "rose_driver_unprepare_total") >= 2, 120, 1)


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


# ---------------------------------------------------------------- serving wins on the real node
TRAINER_ARGS = ["--updates", "24", "--seed", "3"]
# in the container: wait at update 12 for the suspend; after the last update keep reaching safe
# points for 30 s so the cgroup's restored cpu can be read from a live container (neither
# changes the training: the solo run has neither)
WORKER_ARGS = [*TRAINER_ARGS, "--suspend-points", "1", "--suspend-wait-seconds", "300", "--linger-seconds", "30"]
# the serving container's first act: ask the driver's control socket what state the worker is in
PROBE = """
import json, os, sys, grpc
from rose_common.proto import rose_agent_v1_pb2 as pb, rose_agent_v1_pb2_grpc as pbg
with grpc.insecure_channel("unix:///ctl/control.sock") as ch:
    st = pbg.NodeControlStub(ch).Status(pb.StatusRequest(), timeout=30)
w = [{"state": pb.WorkloadState.Name(x.state), "host_bytes_held": x.host_bytes_held}
     for x in st.workloads if x.pod_uid == os.environ["RL_POD_UID"]]
json.dump(w, open("/out/serving-start.json", "w"))
os.execv("/usr/bin/sleep", ["sleep", "infinity"])
"""


@dataclass
class AgentDriver:
    proc: subprocess.Popen[bytes]
    port: int
    control_socket: Path
    root: Path


@contextlib.contextmanager
def _agent_driver(
    cluster: ClusterHandle, real_node: RealNode, gpus: int = 1, extra: Callable[[Path], list[str]] | None = None
) -> Iterator[AgentDriver]:
    root = Path(tempfile.mkdtemp(prefix="rose-rn-", dir="/tmp"))
    (root / "a").mkdir()
    port = free_port()
    args = [
        sys.executable, "-m", "dra_driver", "--node-name", real_node.node, "--kubeconfig", str(cluster.kubeconfig),
        "--gpu-backend", "simulated", "--simulated-gpus", str(gpus),
        "--plugin-dir", str(root / "p"), "--registry-dir", str(real_node.lay.plugins_registry),
        "--cdi-dir", str(real_node.lay.cdi_dir), "--metrics-port", str(port), "--metrics-address", "127.0.0.1",
        "--suspend-engine", "node", "--suspend-backends", "cooperative", "--host-memory-budget", "1Gi",
        "--agent-socket", str(root / "a" / "workload.sock"), "--suspended-cpu", "100m",
        "--serving-wait", "prepare",  # the prepare-time serving wait (issue 27: prebind has its own e2e test)
        *(extra(root) if extra is not None else []),
    ]  # fmt: skip
    log = cluster.workdir / "logs" / "realnode-agent-driver.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        yield AgentDriver(proc, port, root / "a" / "control.sock", root)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def agent_driver(cluster: ClusterHandle, real_node: RealNode) -> Iterator[AgentDriver]:
    """``rose driver`` on the real node with the node agent and the cooperative suspend backend
    (simulated GPU backend: this machine has no GPU); its DRA socket, the claims' workload
    sockets and the control socket under a short /tmp directory (unix socket paths <= 107 bytes),
    its registration socket in the kubelet's plugin watcher directory."""
    with _agent_driver(cluster, real_node) as d:
        yield d


def _host_python_pod(
    name: str, real_node: RealNode, out: Path, argv: list[str], cpu: tuple[str, str], claim: str
) -> dict[str, Any]:
    """A pod running this test's interpreter (a host venv) in the host-python image, with ``out``
    mounted read-write at /out and the pod's identity in the environment the SDK reads."""
    pod = _pod(name, HOST_PYTHON_REF, real_node.node, claim)
    mounts = host_python_mounts([Path(sys.prefix), Path(sys.base_prefix).resolve()], REPO)
    vols = [{"name": f"h{i}", "hostPath": {"path": p, "type": t}} for i, (p, t) in enumerate(mounts)]
    vols.append({"name": "out", "hostPath": {"path": str(out), "type": "Directory"}})
    vm = [{"name": f"h{i}", "mountPath": p, "readOnly": True} for i, (p, _) in enumerate(mounts)]
    vm.append({"name": "out", "mountPath": "/out"})
    field = {"ROSE_POD_UID": "uid", "ROSE_POD_NAMESPACE": "namespace", "ROSE_POD_NAME": "name"}
    env = [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.{v}"}}} for k, v in field.items()]
    env += [{"name": "PYTHONPATH", "value": str(REPO)}, {"name": "TMPDIR", "value": "/tmp"}]
    c = pod["spec"]["containers"][0]
    c.update(command=[sys.executable, *argv], env=env, volumeMounts=vm)
    c["resources"]["requests"] = {"cpu": cpu[0], "memory": "256Mi"}
    c["resources"]["limits"] = {"cpu": cpu[1], "memory": "2Gi"}
    pod["spec"]["volumes"] = vols
    pod["spec"]["restartPolicy"] = "Never"
    return pod


def _phase(api: Any, ns: str, pod: str) -> str:
    return str(client.CoreV1Api(api).read_namespaced_pod(pod, ns).status.phase)


def _workload(control: Path, pod_uid: str) -> Any:
    with grpc.insecure_channel(f"unix://{control}") as ch:
        st = pb_grpc.NodeControlStub(ch).Status(pb.StatusRequest(), timeout=10)
    return next((w for w in st.workloads if w.pod_uid == pod_uid), None)


def test_serving_wins_on_the_real_node_and_training_is_bit_identical(
    api: Any, ns: str, real_node: RealNode, agent_driver: AgentDriver, tmp_path: Path
) -> None:
    """The KWOK serving-wins scenario with nothing played: the RL worker is a container started
    by the kubelet running the example trainer through rose_sdk, reaching the node agent through
    the socket its claim's CDI spec mounts; a serving pod on the same GPU makes the kubelet call
    ``NodePrepareResources``, which returns only once the worker is suspended, so the serving
    container's first act sees it ``SUSPENDED``; the driver's ``pods/resize`` lowers the worker's
    cpu request and the kubelet writes it into the worker's cgroup (``cpu.shares``); deleting the
    serving pod resumes the worker, which ends bit-identical to a solo run."""
    bins = load_binaries()
    real_node.import_archive(bins, host_python_archive(tmp_path / "host-python.tar"))
    out = tmp_path / "out"
    out.mkdir()
    create_claim_template(api, ns, claim_template("lend", names.DEVICE_CLASS_LENDABLE))
    create_claim_template(api, ns, claim_template("serve", names.DEVICE_CLASS_SERVING))
    core = client.CoreV1Api(api)
    wait_for("the agent driver's ResourceSlice", lambda: _slices(api, real_node.node), timeout=60)
    base = start_workload(tmp_path, "base", socket=None, extra=TRAINER_ARGS)  # the solo run, on the host
    with reaped(base):
        worker = _host_python_pod(
            "rl-0", real_node, out, [str(SCRIPT), "--out", "/out/rl-0.pt", *WORKER_ARGS], ("500m", "1"), "lend"
        )
        worker["metadata"]["annotations"] = {names.ANNOTATION_GRACE: "60"}
        worker["metadata"]["labels"] = {names.LABEL_JOB: "job-real"}
        core.create_namespaced_pod(ns, worker)
        pid = _running_pid(api, real_node, ns, "rl-0")
        rl_uid = core.read_namespaced_pod("rl-0", ns).metadata.uid
        assert _environ(pid)["ROSE_AGENT_SOCKET"].startswith("/run/rose/claims/")  # the claim's CDI edits
        assert _cgroup_value(pid, "cpu", "cpu.shares") == 512  # 500m requested
        wait_for(
            "the trainer in the worker container registered with the node agent",
            lambda: (w := _workload(agent_driver.control_socket, rl_uid)) is not None and w.connected,
            timeout=120,
            interval=1,
        )

        # serving arrives on the same GPU: the kubelet's prepare suspends the worker first
        serving = _host_python_pod("serve-0", real_node, out, ["-c", PROBE], ("100m", "500m"), "serve")
        serving["metadata"]["labels"] = {names.LABEL_ROLE: "serving"}
        c = serving["spec"]["containers"][0]
        c["env"].append({"name": "RL_POD_UID", "value": rl_uid})
        c["volumeMounts"].append({"name": "ctl", "mountPath": "/ctl"})
        ctl = {"path": str(agent_driver.control_socket.parent), "type": "Directory"}
        serving["spec"]["volumes"].append({"name": "ctl", "hostPath": ctl})
        core.create_namespaced_pod(ns, serving)
        probe = out / "serving-start.json"
        wait_for("the serving container's first act (its probe)", probe.exists, timeout=180, interval=1)
        seen = json.loads(probe.read_text())
        assert seen and seen[0]["state"] == "WORKLOAD_STATE_SUSPENDED" and seen[0]["host_bytes_held"] > 0, seen
        assert _ann(api, ns, "rl-0")[names.ANNOTATION_SUSPEND_STATE] == "Suspended"
        assert _metric(agent_driver.port, "rose_driver_prepare_total") >= 2  # both claims, by the kubelet
        wait_for(
            "the kubelet writing the driver's resize (100m) into the worker's cgroup: cpu.shares 102",
            lambda: _cgroup_value(pid, "cpu", "cpu.shares") == 102,
            timeout=120,
            interval=1,
        )
        rl = core.read_namespaced_pod("rl-0", ns)
        assert rl.metadata.uid == rl_uid and rl.spec.containers[0].resources.requests["cpu"] == "100m"

        # serving leaves: the kubelet's unprepare resumes the worker, its cpu comes back
        core.delete_namespaced_pod("serve-0", ns, grace_period_seconds=0)
        wait_for(
            "the worker resumed (its suspend-state Running)",
            lambda: _ann(api, ns, "rl-0").get(names.ANNOTATION_SUSPEND_STATE) == "Running",
            timeout=120,
            interval=1,
        )
        wait_for(
            "the worker's cpu.shares back to 512 (500m)",
            lambda: _cgroup_value(pid, "cpu", "cpu.shares") == 512,
            timeout=120,
            interval=1,
        )
        phase = wait_for(
            "the worker container's trainer to finish",
            lambda: (p := _phase(api, ns, "rl-0")) in ("Succeeded", "Failed") and p,
            timeout=300,
            interval=2,
        )
        assert phase == "Succeeded", real_node.log("kubelet")
        base.finish()
    a, b = torch.load(out / "rl-0.pt", weights_only=True), torch.load(base.out, weights_only=True)
    assert (a["suspends"], a["resumes"]) == (1, 1)
    assert tensors_equal(a["model"], b["model"]) and tensors_equal(a["optimizer"], b["optimizer"])
    assert torch.equal(a["replay"], b["replay"]) and a["lengths"] == b["lengths"]


def _ann(api: Any, ns: str, pod: str) -> dict[str, str]:
    return client.CoreV1Api(api).read_namespaced_pod(pod, ns).metadata.annotations or {}


def _slices(api: Any, node: str) -> list[Any]:
    sel = f"spec.driver={names.DRIVER_NAME},spec.nodeName={node}"
    items = client.CustomObjectsApi(api).list_cluster_custom_object(
        "resource.k8s.io", "v1", "resourceslices", field_selector=sel
    )["items"]
    return list(items)


MIB = 1 << 20
SPILL_SCRIPT = REPO / "tests" / "support" / "spill_coop_workload.py"


@pytest.fixture
def spill_driver(cluster: ClusterHandle, real_node: RealNode) -> Iterator[AgentDriver]:
    """The agent driver with two GPUs, a DRAM budget that holds one worker's suspended state (80
    MiB) and a disk tier under its own directory."""

    def spill(root: Path) -> list[str]:
        return [
            "--host-memory-budget",
            str(80 * MIB),
            "--spill-dir",
            str(root / "spill"),
            "--spill-budget-bytes",
            "1Gi",
        ]

    with _agent_driver(cluster, real_node, gpus=2, extra=spill) as d:
        yield d


def _log_line(api: Any, ns: str, pod: str, prefix: str) -> str:
    """The rest of the container's first stdout line starting with ``prefix``, read from the
    kubelet's log files (the API server cannot reach this kubelet's log endpoint: no node DNS)."""
    uid = client.CoreV1Api(api).read_namespaced_pod(pod, ns).metadata.uid

    def line() -> str | None:
        for f in sorted(Path("/var/log/pods", f"{ns}_{pod}_{uid}", "main").glob("*.log")):
            for ln in f.read_text(errors="replace").splitlines():  # CRI: <time> <stream> <tag> <text>
                text = ln.split(" ", 3)[3] if ln.count(" ") >= 3 else ""
                if text.startswith(prefix):
                    return text[len(prefix) :].strip()
        return None

    return str(wait_for(f"{ns}/{pod} printing {prefix.strip()!r}", line, timeout=180, interval=1))


def test_a_containers_state_spills_through_its_claims_cdi_mount_and_resumes_bit_exact(
    cluster: ClusterHandle, api: Any, ns: str, real_node: RealNode, spill_driver: AgentDriver, tmp_path: Path
) -> None:
    """Layered memory with a real container runtime: two cooperative workers (64 and 24 MiB of
    state) in containers started by the kubelet; serving on both GPUs. The second suspend does not
    fit the DRAM budget, so the first worker's host copy spills to disk, written by the worker
    through its claim's spill directory, which containerd mounted from the claim's CDI spec (the
    container sees no other part of the driver's spill root); serving leaves, the worker resumes
    from the file, and its state digest after the resume equals the one at its suspend."""
    drv = spill_driver
    bins = load_binaries()
    real_node.import_archive(bins, host_python_archive(tmp_path / "host-python.tar"))
    out = tmp_path / "out"
    out.mkdir()
    core = client.CoreV1Api(api)
    for gpu in (0, 1):
        sel = [f'device.attributes["gpu.rose.io"].index == {gpu}']
        create_claim_template(api, ns, claim_template(f"lend-{gpu}", names.DEVICE_CLASS_LENDABLE, selectors=sel))
        create_claim_template(api, ns, claim_template(f"serve-{gpu}", names.DEVICE_CLASS_SERVING, selectors=sel))
    wait_for("the spill driver's ResourceSlice", lambda: _slices(api, real_node.node), timeout=60)
    uids, pids = {}, {}
    for gpu, mib in ((0, 64), (1, 24)):
        w = _host_python_pod(
            f"rl-{gpu}", real_node, out, [str(SPILL_SCRIPT), "--state-mib", str(mib)], ("200m", "1"), f"lend-{gpu}"
        )
        w["metadata"]["annotations"] = {names.ANNOTATION_GRACE: "120"}
        w["metadata"]["labels"] = {names.LABEL_JOB: "job-spill"}
        core.create_namespaced_pod(ns, w)
    for gpu in (0, 1):
        pids[gpu] = _running_pid(api, real_node, ns, f"rl-{gpu}")
        uids[gpu] = core.read_namespaced_pod(f"rl-{gpu}", ns).metadata.uid
        wait_for(
            f"worker rl-{gpu} registered with the node agent",
            lambda g=gpu: (w := _workload(drv.control_socket, uids[g])) is not None and w.connected,
            timeout=180,
            interval=1,
        )
    env = _environ(pids[0])
    claim_uid = env["ROSE_SPILL_DIR"].removeprefix("/run/rose/spill/")  # the claim's CDI edits
    claim_dir = drv.root / "spill" / "claims" / claim_uid
    assert claim_dir.is_dir() and env["ROSE_SPILL_DIR"] == f"/run/rose/spill/{claim_uid}", env
    view = Path(f"/proc/{pids[0]}/root")
    assert not (view / str(drv.root).lstrip("/")).exists()  # the container sees no host spill root
    seen, host = os.stat(view / "run/rose/spill" / claim_uid), os.stat(claim_dir)
    assert (seen.st_dev, seen.st_ino) == (host.st_dev, host.st_ino)  # the claim's directory, mounted by containerd

    def serve(gpu: int) -> None:
        pod = _host_python_pod(
            f"srv-{gpu}", real_node, out, ["-c", "import time; time.sleep(3600)"], ("50m", "200m"), f"serve-{gpu}"
        )
        pod["metadata"]["labels"] = {names.LABEL_ROLE: "serving"}
        core.create_namespaced_pod(ns, pod)

        def suspended() -> bool:
            try:
                return _ann(api, ns, f"rl-{gpu}").get(names.ANNOTATION_SUSPEND_STATE) == "Suspended"
            except client.ApiException as e:
                if e.status != 404:
                    raise
            log = (cluster.workdir / "logs" / "realnode-agent-driver.log").read_text().splitlines()
            raise AssertionError(
                f"rl-{gpu} is gone (evicted: its suspend fell back); the driver's log:\n"
                + "\n".join(ln for ln in log[-400:] if "Spill" in ln or "evict" in ln)
            )

        wait_for(f"worker rl-{gpu} suspended for serving", suspended, timeout=180, interval=1)

    from rose_common import promtext

    serve(0)
    before = _log_line(api, ns, "rl-0", "DIGEST-SUSPEND ")
    serve(1)  # does not fit beside rl-0 in DRAM: rl-0's host copy spills to disk
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{drv.port}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert promtext.value(text, "rose_suspend_spills_total", {"direction": "to_disk", "result": "ok"}) == 1
    assert promtext.value(text, "rose_suspend_fallbacks_total", {"reason": "host_memory_budget"}, default=0) == 0
    spilled = claim_dir / f"{uids[0]}.spill"
    assert spilled.stat().st_size > 64 * MIB
    for gpu in (1, 0):  # serving leaves: both resume, rl-0 from its spill file
        core.delete_namespaced_pod(f"srv-{gpu}", ns, grace_period_seconds=0)
    assert _log_line(api, ns, "rl-0", "DIGEST-RESUME ") == before  # bit-exact
    wait_for("rl-0's spill file removed after its resume", lambda: not spilled.exists(), timeout=60, interval=1)
    for gpu in (0, 1):
        phase = wait_for(
            f"worker rl-{gpu} to finish",
            lambda g=gpu: (p := _phase(api, ns, f"rl-{g}")) in ("Succeeded", "Failed") and p,
            timeout=300,
            interval=2,
        )
        assert phase == "Succeeded", real_node.log("kubelet")
    assert _log_line(api, ns, "rl-0", "DONE ").split()[1] == "1"  # it freed its host copy once

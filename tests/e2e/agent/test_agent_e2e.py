"""The cooperative suspend path end to end: real control plane, real scheduler allocation, the
real ``rose driver`` process with its node agent socket, and a real training process using
rose_sdk that registers as the RL pod.

KWOK runs no containers, so the workload process (REINFORCE on CartPole, tests/support/agent_fixtures.py)
is started by the test with the RL pod's UID, as the container would be; and the test plays the
kubelet's DRA manager (NodePrepareResources / NodeUnprepareResources over the driver's socket).
Preparing a serving claim on the same physical GPU suspends the RL workload at its safe point
through the agent; unpreparing it resumes it; the training ends bit-identical to an
uninterrupted run, and the RL pod is never deleted.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from kubernetes import client

from dra_driver import cdi
from local_cluster import ClusterHandle, free_port
from local_cluster.kubelet import DriverProcess
from local_cluster.objects import allocated_claim, driver_slices
from rose_common import names
from rose_common.proto import rose_agent_v1_pb2 as pb
from rose_common.proto import rose_agent_v1_pb2_grpc as pb_grpc
from rose_common.slices import resource_slice, simulated_gpus
from rose_sdk import tensors_equal
from tests.support.agent_fixtures import reaped, start_workload
from tests.support.k8s_helpers import (
    claim_template,
    create_claim_template,
    delete_namespace,
    gpu_pod,
    new_namespace,
    wait_for,
)

REPO = Path(__file__).resolve().parents[3]
V1 = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/"


class Driver(DriverProcess):
    """One ``rose driver`` for one KWOK node, with the cooperative backend and the agent sockets;
    the harness's KubeletDRA plays the kubelet (local_cluster/kubelet.py)."""

    def __init__(self, cluster: ClusterHandle, node: str, root: Path) -> None:
        self.control_socket = root / "a" / "control.sock"
        super().__init__(
            cluster.kubeconfig, node, root, cluster.gpus_per_node, free_port(),
            extra_args=[
                "--suspend-engine", "node", "--suspend-backends", "cooperative", "--host-memory-budget", "1Gi",
                "--agent-control-socket", str(self.control_socket),
                "--serving-wait", "prepare",  # the prepare-time serving wait (issue 27: prebind has its own e2e test)
            ],
        )  # fmt: skip


def _claim_socket_from_cdi(drv: Driver, claim_uid: str) -> Path:
    """Where the container runtime would put the claim's agent socket: its CDI mount's host path."""
    spec = json.loads((drv.cdi_dir / cdi.spec_filename(claim_uid)).read_text())
    edits = spec["containerEdits"]
    env = dict(e.split("=", 1) for e in edits["env"])
    (mount,) = edits["mounts"]
    in_container = Path(env["ROSE_AGENT_SOCKET"])
    assert in_container.parent == Path(mount["containerPath"])
    return Path(mount["hostPath"]) / in_container.name


def _ann(api: Any, ns: str, pod: str) -> dict[str, str]:
    return client.CoreV1Api(api).read_namespaced_pod(pod, ns).metadata.annotations or {}


@pytest.fixture
def env(cluster: ClusterHandle) -> Iterator[tuple[Driver, Any, str, str]]:
    node = cluster.node_names[-1]
    root = Path(tempfile.mkdtemp(prefix="rose-agt-", dir="/tmp"))  # short: unix socket paths <= 107 bytes
    api = cluster.api_client()
    drv = Driver(cluster, node, root)
    ns = new_namespace(api, "agt")
    try:
        yield drv, api, ns, node
    finally:
        delete_namespace(api, ns)
        code = drv.stop()
        try:
            wait_for("driver slices removed on shutdown", lambda: not driver_slices(api, node), timeout=30)
            assert code == 0, drv.log_path.read_text()[-3000:]
        finally:
            if not driver_slices(api, node):  # restore the session's seed slice for other tests
                client.CustomObjectsApi(api).create_cluster_custom_object(
                    "resource.k8s.io",
                    "v1",
                    "resourceslices",
                    resource_slice(node, simulated_gpus(node, cluster.gpus_per_node), 1),
                )
            api.close()
            shutil.rmtree(root, ignore_errors=True)


def test_serving_claim_suspends_training_cooperatively_and_training_is_unharmed(
    env: tuple[Driver, Any, str, str], tmp_path: Path
) -> None:
    drv, api, ns, node = env
    core = client.CoreV1Api(api)
    wait_for("driver published its slice", lambda: len(driver_slices(api, node)) == 1 or None, timeout=60)
    gpu0 = ['device.attributes["gpu.rose.io"].index == 0']
    create_claim_template(api, ns, claim_template("lent", names.DEVICE_CLASS_LENDABLE, selectors=gpu0))
    create_claim_template(api, ns, claim_template("serve", names.DEVICE_CLASS_SERVING, selectors=gpu0))
    rl = gpu_pod("rl-0", "lent", labels={names.LABEL_JOB: "job-a"}, node_name=node)
    rl["metadata"]["annotations"] = {names.ANNOTATION_GRACE: "60"}
    core.create_namespaced_pod(ns, rl)
    rl_claim = wait_for("RL claim allocated and reserved", lambda: allocated_claim(api, ns, "rl-0"), timeout=90)
    rl_uid = core.read_namespaced_pod("rl-0", ns).metadata.uid
    out = drv.prepare(rl_claim)
    assert out.error == "" and out.devices[0].device_name == "gpu-0-lendable"

    # the RL pod's container process: reaches the node agent through its claim's own socket, which
    # the claim's CDI spec mounts into the container (played here by the host path of that mount)
    sock = _claim_socket_from_cdi(drv, rl_claim["metadata"]["uid"])
    args = ["--updates", "24", "--seed", "3", "--suspend-points", "1"]
    dev = {"ROSE_SIMULATED_DEVICE_MEMORY": str(sock.parent / "device-memory")}  # the driver observes it
    wl = start_workload(tmp_path, "rl-0", socket=sock, pod_uid=rl_uid, extra=args, namespace=ns, env_extra=dev)
    base = start_workload(tmp_path, "base", socket=None, extra=args)
    with reaped(wl, base), grpc.insecure_channel(f"unix://{drv.control_socket}") as ch:
        control = pb_grpc.NodeControlStub(ch)
        wl.wait_ready()

        def connected() -> bool | None:
            st = control.Status(pb.StatusRequest())
            return any(w.pod_uid == rl_uid and w.connected for w in st.workloads) or None

        wait_for("workload registered with the driver's agent", connected, timeout=60)

        core.create_namespaced_pod(
            ns, gpu_pod("serve-0", "serve", labels={names.LABEL_ROLE: "serving"}, node_name=node)
        )
        srv_claim = wait_for("serving claim allocated", lambda: allocated_claim(api, ns, "serve-0"), timeout=90)
        assert srv_claim["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0-serving"

        out = drv.prepare(srv_claim)  # serving wins: returns once the occupant is suspended
        assert out.error == "" and out.devices[0].device_name == "gpu-0-serving"
        st = control.Status(pb.StatusRequest(pod_uid=rl_uid))
        assert st.workloads[0].state == pb.WORKLOAD_STATE_SUSPENDED
        assert st.workloads[0].suspended_by == pb.BACKEND_COOPERATIVE and st.host_bytes_held > 0
        sus = [o for o in st.recent_operations if o.kind == pb.COMMAND_KIND_SUSPEND]
        assert sus and sus[-1].state == pb.OPERATION_STATE_SUCCEEDED and sus[-1].bytes_moved > 0
        assert _ann(api, ns, "rl-0")[names.ANNOTATION_SUSPEND_STATE] == "Suspended"
        assert drv.unprepare(srv_claim).error == ""  # serving leaves: the occupant resumes
        assert _ann(api, ns, "rl-0")[names.ANNOTATION_SUSPEND_STATE] == "Running"
        st = control.Status(pb.StatusRequest(pod_uid=rl_uid))
        assert st.workloads[0].state == pb.WORKLOAD_STATE_RUNNING and st.host_bytes_held == 0
        text = wl.finish()
        base.finish()
    assert "suspends=1 resumes=1" in text
    a, b = torch.load(wl.out, weights_only=True), torch.load(base.out, weights_only=True)
    assert tensors_equal(a["model"], b["model"]) and tensors_equal(a["optimizer"], b["optimizer"])
    rl_now = core.read_namespaced_pod("rl-0", ns)
    assert rl_now.metadata.uid == rl_uid and rl_now.metadata.deletion_timestamp is None
    assert 'rose_driver_gpu_returned_seconds_count{phase="cooperative"} 1.0' in drv.metrics()
    # its reports through the agent: the phase on its pod (written by the driver), progress in the metrics
    phase = wait_for("reported phase", lambda: _ann(api, ns, "rl-0").get(names.ANNOTATION_WORKLOAD_PHASE), timeout=30)
    steps = [m for m in drv.metrics() if m.startswith(f'rose_rl_steps_total{{job="job-a",namespace="{ns}"')]
    assert phase == "train" and len(steps) == 1 and float(steps[0].split()[-1]) == 24, steps
    assert drv.unprepare(rl_claim).error == ""


def test_an_occupant_that_keeps_its_gpu_is_killed_and_evicted_and_serving_gets_a_free_gpu(
    env: tuple[Driver, Any, str, str], tmp_path: Path
) -> None:
    """Issue 22 finding 1 with the real ``rose driver`` process: a lent pod's process that never
    registers (no SDK) and holds its claim's simulated device memory is stopped at the deadline,
    its pod evicted through the API server (UID precondition), and serving is prepared on a device
    the driver observed free — within grace + 5 s + --enforce-timeout-seconds."""
    import os
    import subprocess
    import sys
    import time

    drv, api, ns, node = env
    core = client.CoreV1Api(api)
    wait_for("driver published its slice", lambda: len(driver_slices(api, node)) == 1 or None, timeout=60)
    gpu0 = ['device.attributes["gpu.rose.io"].index == 0']
    create_claim_template(api, ns, claim_template("lent", names.DEVICE_CLASS_LENDABLE, selectors=gpu0))
    create_claim_template(api, ns, claim_template("serve", names.DEVICE_CLASS_SERVING, selectors=gpu0))
    rl = gpu_pod("rl-h", "lent", labels={names.LABEL_JOB: "job-h"}, node_name=node)
    rl["metadata"]["annotations"] = {names.ANNOTATION_GRACE: "2"}
    core.create_namespaced_pod(ns, rl)
    rl_claim = wait_for("RL claim allocated and reserved", lambda: allocated_claim(api, ns, "rl-h"), timeout=90)
    rl_uid = core.read_namespaced_pod("rl-h", ns).metadata.uid
    assert drv.prepare(rl_claim).error == ""
    dev = _claim_socket_from_cdi(drv, rl_claim["metadata"]["uid"]).parent / "device-memory"
    env_ = {k: v for k, v in os.environ.items() if not k.startswith("ROSE_")}
    env_.update(ROSE_SIMULATED_DEVICE_MEMORY=str(dev), ROSE_POD_UID=rl_uid, PYTHONPATH=str(REPO))
    hostile = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "support" / "enforce_hostile.py"), "--mode", "never-registers"],
        env=env_,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert hostile.stdout is not None and hostile.stdout.readline().startswith("READY")
        assert dev.stat().st_blocks > 0
        core.create_namespaced_pod(
            ns, gpu_pod("serve-h", "serve", labels={names.LABEL_ROLE: "serving"}, node_name=node)
        )
        srv_claim = wait_for("serving claim allocated", lambda: allocated_claim(api, ns, "serve-h"), timeout=90)
        t0 = time.monotonic()
        out = drv.prepare(srv_claim)
        assert out.error == "" and time.monotonic() - t0 < 2 + 5 + 10 + 3
        assert hostile.wait(timeout=5) == -9 and dev.stat().st_blocks == 0
        wait_for("RL pod evicted", lambda: _gone_or_deleting(core, ns, "rl-h", rl_uid), timeout=30)
        reasons = [e.reason for e in core.list_namespaced_event(ns, field_selector="involvedObject.name=rl-h").items]
        assert "ReclaimEnforced" in reasons, reasons
        m = drv.metrics()
        assert 'rose_driver_gpu_returned_seconds_count{phase="enforced"} 1.0' in m
        assert 'rose_driver_reclaim_enforced_total{method="kill",result="freed"} 1.0' in m
        assert drv.unprepare(srv_claim).error == ""
        assert drv.unprepare(rl_claim).error == ""
    finally:
        if hostile.poll() is None:
            hostile.kill()
        hostile.wait(timeout=10)
        if hostile.stdout is not None:
            hostile.stdout.close()


def _gone_or_deleting(core: Any, ns: str, name: str, uid: str) -> bool | None:
    try:
        p = core.read_namespaced_pod(name, ns)
    except client.ApiException as e:
        return True if e.status == 404 else None
    return True if p.metadata.uid != uid or p.metadata.deletion_timestamp is not None else None

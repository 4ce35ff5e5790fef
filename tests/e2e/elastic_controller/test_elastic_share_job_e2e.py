"""An ElasticRLJob of GPU shares end to end (issue 27 §3): the real controller and extender
(``python -m``, forecasts from the explicit ``static-file`` backend), the session cluster's real
kube-scheduler, and one real ``rose driver --gpu-shares`` publishing its node's ``gpu-N-share``
devices (simulated GPUs of 141 GiB). The job is ``examples/elasticrljob-gpu-share.yaml`` with
``gpuShare: {memory: 60Gi, compute: 50}`` and minGPUs = maxGPUs = 1: a share of 0.5 GPU, so the
planner wants two workers. Both get claims against ``share.gpu.rose.io`` allocated on one GPU's
share device of the driver's node and run (KWOK plays the node); the harness plays the kubelet's
prepare of both claims over the real gRPC contract, and the driver takes both on that one GPU.
The status says the share.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from elastic_controller.workers import CLAIM_NAME
from local_cluster import ClusterHandle, free_port, module_process
from local_cluster.kubelet import DriverProcess
from rose_common import names
from rose_common.quantity import to_int
from tests.support.driver_fixtures import E2E_DRIVER_ARGS, driver_published, node_driver
from tests.support.elastic_fixtures import write_forecasts
from tests.support.k8s_helpers import delete_namespace, new_namespace, wait_for

REPO = Path(__file__).resolve().parents[3]
JOB = "grpo-share"


@pytest.fixture(scope="module")
def share_driver(cluster: ClusterHandle) -> Iterator[DriverProcess]:
    with node_driver(
        cluster, cluster.node_names[-1], "rose-sjob-", lambda _: [*E2E_DRIVER_ARGS, "--gpu-shares", "true"]
    ) as d:
        yield d


@pytest.fixture
def world(cluster: ClusterHandle, api: Any, share_driver: DriverProcess, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The extender and the controller on one forecast file: the share node's pool idle, the other
    pools needed whole by serving (so the workers can go only where the shares are)."""
    assert cluster.extender_url, "the cluster must run the rose-scheduler profile with an extender URL"
    wait_for("the driver's slice with shares", lambda: driver_published(api, share_driver.node), timeout=60)
    quiet = cluster.pools[share_driver.node]
    capacity = {p: cluster.gpus_per_node * list(cluster.pools.values()).count(p) for p in set(cluster.pools.values())}
    forecasts = tmp_path / "forecasts.json"
    write_forecasts(forecasts, {p: 0.0 if p == quiet else float(n) for p, n in capacity.items()})
    ext_host, _, ext_port = cluster.extender_url.removeprefix("http://").partition(":")
    port = free_port()
    common = ["--forecast-backend=static-file", f"--forecast-file={forecasts}", "--forecast-refresh=1",
              f"--kubeconfig={cluster.kubeconfig}"]  # fmt: skip
    ext_args = ["scheduler_extender", f"--listen={ext_host}:{ext_port}", *common]
    ctl_args = ["elastic_controller", *common, "--plan-interval=1", "--dwell=0", "--lease-namespace=default",
                f"--lease-name=ctl-share-{port}", f"--metrics-listen=127.0.0.1:{port}"]  # fmt: skip
    ns = new_namespace(api, "sharejob")
    try:
        with (
            module_process(ext_args, tmp_path / "extender.log"),
            module_process(ctl_args, tmp_path / "controller.log") as ctl,
        ):
            yield {"ns": ns, "pool": quiet, "controller": ctl, "log": tmp_path / "controller.log"}
    finally:
        delete_namespace(api, ns)


def _job(ns: str) -> dict[str, Any]:
    """The example, in ``ns``, with a share of 0.5 GPU: 60 GiB of 141 and 50 % compute."""
    body: dict[str, Any] = copy.deepcopy(yaml.safe_load((REPO / "examples/elasticrljob-gpu-share.yaml").read_text()))
    body["metadata"]["namespace"] = ns
    body["spec"].update(
        {
            "minGPUs": 1,
            "maxGPUs": 1,
            "gpuShare": {"memory": "60Gi", "compute": 50},
            "gracefulShutdownPeriod": 5,
            "minUsefulRunSeconds": 60,
        }
    )
    body["spec"]["template"]["spec"]["priorityClassName"] = "rose-rl"
    return body


def _claim(api: Any, ns: str, pod: Any) -> dict[str, Any] | None:
    """The ResourceClaim generated for a worker's ``gpus`` claim entry."""
    for st in pod.status.resource_claim_statuses or []:
        if st.name == CLAIM_NAME and st.resource_claim_name:
            obj: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
                "resource.k8s.io", "v1", ns, "resourceclaims", st.resource_claim_name
            )
            return obj
    return None


def test_a_share_job_runs_two_workers_on_one_gpus_share_device(
    cluster: ClusterHandle, api: Any, share_driver: DriverProcess, world: dict[str, Any]
) -> None:
    ns, node = world["ns"], share_driver.node
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    custom.create_namespaced_custom_object(names.GROUP, names.VERSION, ns, names.PLURAL, _job(ns))

    def running() -> list[Any] | None:
        pods = core.list_namespaced_pod(ns, label_selector=f"{names.LABEL_JOB}={JOB}").items
        return pods if len(pods) == 2 and all(p.status.phase == "Running" for p in pods) else None

    try:
        pods = wait_for("2 share workers running", running, 45)
    except AssertionError:
        print(world["log"].read_text()[-3000:])
        raise
    rct = client.ResourceV1Api(api).read_namespaced_resource_claim_template(f"{JOB}-gpus", ns)
    exactly = rct.spec.spec.devices.requests[0].exactly
    assert exactly.device_class_name == names.DEVICE_CLASS_SHARE
    assert exactly.capacity.requests == {"memory": "60Gi", "compute": "50"}
    claims = []
    for p in pods:
        assert p.spec.node_name == node and p.spec.node_selector == {names.LABEL_POOL: world["pool"]}
        env = {e.name: e.value for e in p.spec.containers[0].env}
        assert (env["ROSE_MIN_WORKERS"], env["ROSE_MAX_WORKERS"]) == ("2", "2")
        claim = _claim(api, ns, p)
        assert claim is not None, p.metadata.name
        claims.append(claim)
    results = [c["status"]["allocation"]["devices"]["results"][0] for c in claims]
    devices = {(r["pool"], r["device"]) for r in results}
    assert len(devices) == 1, f"two shares of 0.5 on one GPU's share device, got {devices}"
    ((pool, device),) = devices
    assert pool == node and device.startswith("gpu-") and device.endswith("-share"), device
    consumed = [{k: to_int(v) for k, v in r["consumedCapacity"].items()} for r in results]
    assert consumed == [{"memory": 60 * 2**30, "compute": 50}] * 2, consumed

    # the harness plays the kubelet: the driver prepares both shares on that one GPU
    prepared = []
    try:
        for c in claims:
            out = share_driver.prepare(c)
            assert out.error == "" and out.devices[0].device_name == device, out
            prepared.append(c)
    finally:
        for c in prepared:
            assert share_driver.unprepare(c).error == ""

    def status() -> dict[str, Any] | None:
        obj = custom.get_namespaced_custom_object(names.GROUP, names.VERSION, ns, names.PLURAL, JOB)
        s: dict[str, Any] = obj.get("status") or {}
        return s if s.get("phase") == "Running" and s.get("activeShareGPUs") == 1.0 else None

    s = wait_for("status Running with the share", status, 20)
    assert (s["gpuShare"], s["targetShareGPUs"], s["activeGPUs"], s["activeWorkers"]) == (0.5, 1.0, 0, 2)
    ready = next(c for c in s["conditions"] if c["type"] == "Ready")
    assert ready["message"] == "2 of 2 target workers with a 0.5 GPU share each active", ready
    events = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={JOB}").items
    assert any("(a 0.5 GPU share each)" in (e.message or "") for e in events), [e.message for e in events]
    assert world["controller"].poll() is None, world["log"].read_text()[-2000:]

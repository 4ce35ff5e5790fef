"""A worker whose lent claim was allocated on a GPU before serving's claim was allocated there is
replaced onto a free GPU (issue 25, soak finding T2's remainder).

Real: the session cluster's kube-apiserver, kube-scheduler (the rose-scheduler profile with the
extender as a process) and claim controller, ``python -m elastic_controller`` (``world``), and one
real ``rose driver`` on a node of the quiet pool (``--serving-wait prepare``, as the soak ran it).
KWOK has no kubelet, and the test plays none: the worker's claim is never prepared, as when the
kubelet's prepare is refused because serving holds the GPU (``LentPrepareRefused``). Serving's
claim is allocated on the worker's GPU after the worker's: the driver taints that GPU's lendable
device ``rose.io/serving-holds``, and the controller must see that the worker never ran there, delete
it and create it again; the scheduler's DRA filter then allocates another GPU of the node.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from elastic_controller.desired import EVENT_BLOCKED_REPLACED
from local_cluster import ClusterHandle
from local_cluster.kubelet import DriverProcess
from local_cluster.objects import allocated_claim
from rose_common import names, promtext
from tests.support.driver_fixtures import E2E_DRIVER_ARGS, driver_published, node_driver
from tests.support.erj_cluster import JOB, job_workers, kubectl, scrape_metrics, world  # noqa: F401  # world: the fixture
from tests.support.erj_manifests import elastic_rl_job
from tests.support.k8s_helpers import claim_template, create_claim_template, gpu_pod, wait_for


@pytest.fixture
def drv(
    cluster: ClusterHandle,
    world: dict[str, Any],  # noqa: F811  # tests/support/erj_cluster.py's fixture
) -> Iterator[DriverProcess]:
    node = sorted(n for n, p in cluster.pools.items() if p == world["quiet"])[-1]
    with node_driver(cluster, node, "rose-sbe-", lambda _: list(E2E_DRIVER_ARGS), show_log=True) as d:
        yield d


def _job(ns: str, node: str) -> str:
    template = {
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},  # the node of the real driver
            "containers": [{"name": "trainer", "image": "rose/grpo"}],
        }
    }
    body = elastic_rl_job(
        JOB,
        ns,
        minGPUs=1,
        maxGPUs=1,
        gpusPerWorker=1,
        gracefulShutdownPeriod=5,
        minUsefulRunSeconds=10,
        stateBytesPerWorker=1 << 30,
        template=template,
    )
    return json.dumps(body)


def _worker_claim(api: Any, ns: str) -> tuple[str, dict[str, Any]] | None:
    """(pod UID, its allocated lent claim) of the job's one live worker."""
    pods = [p for p in job_workers(api, ns) if not p.metadata.deletion_timestamp]
    if len(pods) != 1 or not pods[0].status.resource_claim_statuses:
        return None
    name = pods[0].status.resource_claim_statuses[0].resource_claim_name
    claim = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "resource.k8s.io", "v1", ns, "resourceclaims", name
    )
    return (pods[0].metadata.uid, claim) if (claim.get("status") or {}).get("allocation") else None


def _device(claim: dict[str, Any]) -> tuple[str, str]:
    (res,) = claim["status"]["allocation"]["devices"]["results"]
    return str(res["pool"]), str(res["device"])


def _events(api: Any, ns: str, reason: str) -> list[Any]:
    evs = client.CoreV1Api(api).list_namespaced_event(ns, field_selector=f"involvedObject.name={JOB}").items
    return [e for e in evs if e.reason == reason]


def _condition(api: Any, ns: str, kind: str) -> dict[str, Any] | None:
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(names.GROUP, names.VERSION, ns, names.PLURAL, JOB)
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


def test_a_worker_allocated_on_a_gpu_before_serving_is_replaced_onto_a_free_gpu(
    cluster: ClusterHandle,
    api: Any,
    world: dict[str, Any],  # noqa: F811  # tests/support/erj_cluster.py's fixture
    drv: DriverProcess,
) -> None:
    ns, node = world["ns"], drv.node
    wait_for("the driver's slice", lambda: driver_published(api, node), timeout=60)
    kubectl(cluster, "apply", "-f", "-", stdin=_job(ns, node))
    uid, claim = wait_for("the worker's claim allocated", lambda: _worker_claim(api, ns), timeout=60)
    pool, device = _device(claim)
    assert pool == node and device.endswith("-lendable"), (pool, device)
    gpu = int(device.split("-")[1])

    # serving comes to the same GPU after the worker's claim was allocated there (never prepared)
    pin = [f'device.attributes["gpu.rose.io"].index == {gpu}']
    create_claim_template(api, ns, claim_template("serve", names.DEVICE_CLASS_SERVING, selectors=pin))
    serving = gpu_pod("serve-0", "serve", labels={names.LABEL_ROLE: "serving"}, node_name=node)
    client.CoreV1Api(api).create_namespaced_pod(ns, serving)
    srv = wait_for("the serving claim allocated", lambda: allocated_claim(api, ns, "serve-0"), timeout=60)
    assert _device(srv) == (node, f"gpu-{gpu}-serving")

    # the controller replaces the worker: a new pod (new UID), its claim on another GPU of the node
    def replaced() -> tuple[str, dict[str, Any]] | None:
        got = _worker_claim(api, ns)
        return got if got is not None and got[0] != uid else None

    new_uid, new_claim = wait_for("the worker replaced", replaced, timeout=60)
    new_pool, new_device = _device(new_claim)
    assert new_pool == node and new_device != device and new_device.endswith("-lendable"), new_device
    ev = wait_for("BlockedWorkerReplaced", lambda: _events(api, ns, EVENT_BLOCKED_REPLACED) or None, timeout=30)[0]
    assert ev.type == "Warning" and f"{device} of {node}" in (ev.message or ""), ev.message
    text = scrape_metrics(world["metrics"])
    assert promtext.value(text, "rose_controller_blocked_workers_replaced_total", {}) == 1.0
    # the job shows it, and once the new worker is not blocked the condition is False again
    cond = wait_for(
        "ServingHoldsGPU False again",
        lambda: ((c := _condition(api, ns, "ServingHoldsGPU")) and c["status"] == "False" and c) or None,
        timeout=30,
    )
    assert cond["reason"] == "NotServingHoldsGPU"
    assert drv.prepare(new_claim).error == ""  # the kubelet's prepare of the new claim goes through
    assert drv.unprepare(new_claim).error == ""
    assert new_uid != uid

"""A shared claim prepared after its members' hand-over requests came (issue 25, group soak g6), end
to end: the real API server, one real ``rose driver`` process (simulated GPUs, the engine's explicit
``simulated`` backend) and the kubelet's NodePrepareResources over the driver's real gRPC socket
(KWOK has no kubelet: the test plays it, as the other tests of this directory do).

Both members of a group carry an orchestrator's ``rose.io/suspend-request`` (fencing tokens 5 and 7)
before their shared claim is prepared on the node (in g6 serving held its GPU): the driver refuses
those requests then (``no-claim``: nothing of theirs is prepared here) and no pod event comes again.
Only the holder of the current token may run on a shared claim, and a member carrying a suspend
request must be suspended before it may run: the driver acts on both standing requests before its
prepare returns; the next grant (token 8) resumes one member alone. On the previous driver both
stayed un-suspended (no ``rose.io/suspend-state``).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from local_cluster import ClusterHandle, free_port
from local_cluster.kubelet import DriverProcess
from rose_common import names
from tests.support.driver_fixtures import E2E_DRIVER_ARGS, driver_published, restore_seed_slices
from tests.support.k8s_helpers import delete_namespace, gpu_pod, new_namespace, wait_for

GROUP = "e2e-standing"
REQUEST = '{"by": "timeslice", "reason": "time-slice hand-over", "at": "2026-12-02T08:53:00Z"}'


@pytest.fixture(scope="module")
def one_driver(cluster: ClusterHandle) -> Iterator[DriverProcess]:
    root = Path(tempfile.mkdtemp(prefix="rose-sr-", dir="/tmp"))  # short: unix socket paths <= 107 bytes
    node = cluster.node_names[0]
    proc = DriverProcess(cluster.kubeconfig, node, root, cluster.gpus_per_node, free_port(), extra_args=E2E_DRIVER_ARGS)
    api = cluster.api_client()
    try:
        yield proc
    finally:
        if proc.proc.poll() is None:
            proc.stop()
        try:
            restore_seed_slices(cluster, api, [node])
        finally:
            api.close()
            shutil.rmtree(root, ignore_errors=True)


def _member(ns: str, job: str, node: str, token: int) -> dict[str, Any]:
    body = gpu_pod(f"{job}-0", "unused", labels={names.LABEL_JOB: job, names.LABEL_TIMESLICE_GROUP: GROUP})
    body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "shared"}]
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    body["metadata"]["annotations"] = {
        names.ANNOTATION_SUSPEND_REQUEST: REQUEST,
        names.ANNOTATION_FENCING_TOKEN: names.fencing_token(f"{ns}/{GROUP}", token),
    }
    return body


def _states(core: Any, ns: str) -> dict[str, str | None]:
    pods = {p: core.read_namespaced_pod(p, ns).metadata.annotations or {} for p in ("a-0", "b-0")}
    return {p: ann.get(names.ANNOTATION_SUSPEND_STATE) for p, ann in pods.items()}


def test_members_with_standing_requests_are_suspended_before_the_shared_claims_prepare_returns(
    cluster: ClusterHandle, one_driver: DriverProcess, api: Any
) -> None:
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    node = cluster.node_names[0]
    ns = new_namespace(api, "sr")
    try:
        wait_for(f"driver slice on {node}", lambda: driver_published(api, node), timeout=60)
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "shared"},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": names.DEVICE_CLASS_LENDABLE, "count": 1}}
                    ]
                }
            },
        }
        custom.create_namespaced_custom_object("resource.k8s.io", "v1", ns, "resourceclaims", claim)
        core.create_namespaced_pod(ns, _member(ns, "a", node, 5))
        core.create_namespaced_pod(ns, _member(ns, "b", node, 7))

        def both_reserved() -> dict[str, Any] | None:
            c = custom.get_namespaced_custom_object("resource.k8s.io", "v1", ns, "resourceclaims", "shared")
            st = c.get("status") or {}
            return c if st.get("allocation") and len(st.get("reservedFor") or []) == 2 else None

        shared = wait_for("the shared claim allocated and reserved for both members", both_reserved, timeout=90)
        # the driver saw both requests before the claim was prepared: refused, nothing of theirs here
        wait_for(
            "both hand-overs refused (no-claim)",
            lambda: (
                {
                    e.involved_object.name
                    for e in core.list_namespaced_event(ns).items
                    if e.reason == names.EVENT_FENCING_REJECTED
                }
                == {"a-0", "b-0"}
            ),
            timeout=30,
        )
        assert _states(core, ns) == {"a-0": None, "b-0": None}

        assert one_driver.prepare(shared).error == ""
        # acted on before the prepare returned: both parked members suspended, neither runs
        assert _states(core, ns) == {"a-0": "Suspended", "b-0": "Suspended"}

        # the orchestrator's next grant (token 8) restores b alone
        grant = {
            names.ANNOTATION_SUSPEND_REQUEST: None,
            names.ANNOTATION_FENCING_TOKEN: names.fencing_token(f"{ns}/{GROUP}", 8),
        }
        core.patch_namespaced_pod("b-0", ns, {"metadata": {"annotations": grant}})
        wait_for("b-0 resumed", lambda: _states(core, ns)["b-0"] == "Running", timeout=30)
        assert _states(core, ns)["a-0"] == "Suspended"
        assert one_driver.unprepare(shared).error == ""
    finally:
        delete_namespace(api, ns)

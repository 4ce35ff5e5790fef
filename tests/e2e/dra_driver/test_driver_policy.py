"""The driver's RBAC and ValidatingAdmissionPolicies on the real kube-apiserver: a node's driver,
authenticated by a service-account token bound to its pod on that node, may write only its own
node's ResourceSlices of driver gpu.rose.io and patch (or resize) only pods on its node."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from local_cluster import ClusterHandle
from local_cluster.objects import report_container_resources
from rose_common.kube.client import Raw
from rose_common.kube.errors import ApiError, Conflict, NotFound
from rose_common.slices import resource_slice, simulated_gpus
from tests.support.k8s_helpers import wait_for

MANIFESTS = Path(__file__).resolve().parents[3] / "manifests" / "driver"
NS = "rose-system"
SA = "rose-dra-driver"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]


def _path(doc: dict[str, Any]) -> str:
    kind = doc["kind"]
    return {
        "ServiceAccount": f"/api/v1/namespaces/{NS}/serviceaccounts",
        "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        "ValidatingAdmissionPolicy": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
        "ValidatingAdmissionPolicyBinding": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
    }[kind]


def _kwok_pod(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "serviceAccountName": SA,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "driver",
                    "image": "registry.invalid/rose/fake:1",
                    "resources": {"requests": {"cpu": "1"}},  # Burstable: pods/resize may lower it
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def installed(cluster: ClusterHandle) -> Iterator[tuple[Raw, Raw, dict[str, Any]]]:
    """Admin client, the node-0 driver's client (pod-bound token), and the node-0 driver pod."""
    admin_api = cluster.api_client()
    admin = Raw(admin_api)
    created: list[str] = []
    try:
        with contextlib.suppress(Conflict):  # already there
            admin.json("POST", "/api/v1/namespaces", body={"metadata": {"name": NS}})
        docs = _docs("serviceaccount.yaml") + _docs("rbac.yaml") + _docs("admission-policy.yaml")
        for d in docs:
            for s in d.get("subjects", []):  # what kustomize's namespace fills in
                s["namespace"] = NS
            admin.json("POST", _path(d), body=d)
            created.append(f"{_path(d)}/{d['metadata']['name']}")
        node0, node1 = cluster.node_names[0], cluster.node_names[1]
        pods = {}
        for name, node in (("drv-policy-0", node0), ("drv-policy-1", node1)):
            pods[name] = admin.json("POST", f"/api/v1/namespaces/{NS}/pods", body=_kwok_pod(name, node))
            created.append(f"/api/v1/namespaces/{NS}/pods/{name}")
        pod0 = pods["drv-policy-0"]
        tr = admin.json(
            "POST",
            f"/api/v1/namespaces/{NS}/serviceaccounts/{SA}/token",
            body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {
                    "expirationSeconds": 3600,
                    "boundObjectRef": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": pod0["metadata"]["name"],
                        "uid": pod0["metadata"]["uid"],
                    },
                },
            },
        )
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=cfg)
        cfg.cert_file = cfg.key_file = None
        cfg.api_key = {"BearerToken": tr["status"]["token"]}
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
        driver_api = client.ApiClient(cfg)
        yield admin, Raw(driver_api), pod0
        driver_api.close()
    finally:
        for path in reversed(created):
            with contextlib.suppress(NotFound):
                admin.json("DELETE", path)
        admin_api.close()


def _slice(node: str, name: str, driver: str = "gpu.rose.io") -> dict[str, Any]:
    s = copy.deepcopy(resource_slice(node, simulated_gpus(node, 1), 1))
    s["metadata"]["name"] = name
    s["spec"]["driver"] = driver
    s["spec"]["pool"]["name"] = f"{node}-{name}"
    return s


def _denied(raw: Raw, method: str, path: str, body: Any, cleanup: Raw, content_type: str = "application/json") -> str:
    """Retry until the policy is in force (it is applied asynchronously); return the denial message."""
    deadline = time.monotonic() + 30
    while True:
        try:
            raw.json(method, path, body=body, content_type=content_type)
        except ApiError as e:
            assert e.code in (403, 422), e.status
            return e.status.message
        if method == "POST":  # it got in before the policy was active: undo and retry
            cleanup.json("DELETE", f"{path}/{body['metadata']['name']}")
        assert time.monotonic() < deadline, f"{method} {path} was never denied"
        time.sleep(0.5)


def test_driver_may_write_only_its_own_nodes_slices(cluster: ClusterHandle, installed: Any) -> None:
    admin, drv, _ = installed
    node0, node1 = cluster.node_names[0], cluster.node_names[1]
    msg = _denied(drv, "POST", SLICES, _slice(node1, "vap-test-other-node"), admin)
    assert f"may not write ResourceSlices of node '{node1}'" in msg
    msg = _denied(drv, "POST", SLICES, _slice(node0, "vap-test-other-driver", driver="gpu.example.com"), admin)
    assert "may not write ResourceSlices of driver 'gpu.example.com'" in msg
    own = wait_for("own slice created", lambda: drv.json("POST", SLICES, body=_slice(node0, "vap-test-own")))
    assert own["spec"]["nodeName"] == node0
    drv.json("DELETE", f"{SLICES}/vap-test-own")  # and deleting its own is allowed


def test_driver_may_patch_only_pods_on_its_node(installed: Any) -> None:
    admin, drv, pod0 = installed
    patch = {"metadata": {"annotations": {"rose.io/suspend-state": "Running"}}}
    msg = _denied(
        drv,
        "PATCH",
        f"/api/v1/namespaces/{NS}/pods/drv-policy-1",
        patch,
        admin,
        content_type="application/merge-patch+json",
    )
    assert "may patch only pods bound to that node" in msg
    out = drv.json(
        "PATCH",
        f"/api/v1/namespaces/{NS}/pods/{pod0['metadata']['name']}",
        body=patch,
        content_type="application/merge-patch+json",
    )
    assert out["metadata"]["annotations"]["rose.io/suspend-state"] == "Running"
    with pytest.raises(ApiError) as e:  # RBAC: no verbs beyond the listed ones
        drv.json("DELETE", f"/api/v1/namespaces/{NS}/pods/drv-policy-1")
    assert e.value.code == 403


def test_driver_may_annotate_only_its_own_node(cluster: ClusterHandle, installed: Any) -> None:
    admin, drv, _ = installed
    node0, node1 = cluster.node_names[0], cluster.node_names[1]
    key = "rose.io/lent-gpus"  # one of the two Node annotations the driver owns
    before = admin.json("GET", f"/api/v1/nodes/{node0}")["metadata"].get("annotations", {}).get(key)
    patch = {"metadata": {"annotations": {key: "0"}}}
    msg = _denied(drv, "PATCH", f"/api/v1/nodes/{node1}", patch, admin, content_type="application/merge-patch+json")
    assert "may annotate only its own Node" in msg
    try:
        out = drv.json("PATCH", f"/api/v1/nodes/{node0}", body=patch, content_type="application/merge-patch+json")
        assert out["metadata"]["annotations"][key] == "0"
    finally:
        admin.json(
            "PATCH",
            f"/api/v1/nodes/{node0}",
            body={"metadata": {"annotations": {key: before}}},
            content_type="application/merge-patch+json",
        )


def test_driver_may_resize_only_pods_on_its_node(installed: Any) -> None:
    """pods/resize (a suspended RL worker's CPU given back) is pinned like the pod patch: the
    subresource is named in the policy's matchConstraints, RBAC grants only its patch."""
    admin, drv, pod0 = installed
    for name in ("drv-policy-0", "drv-policy-1"):  # the kubelet's report (played): resize supported
        report_container_resources(admin.api, NS, name)
    patch = {"spec": {"containers": [{"name": "driver", "resources": {"requests": {"cpu": "500m"}}}]}}
    smp = "application/strategic-merge-patch+json"
    msg = _denied(drv, "PATCH", f"/api/v1/namespaces/{NS}/pods/drv-policy-1/resize", patch, admin, content_type=smp)
    assert "may patch only pods bound to that node" in msg
    assert (
        admin.json("GET", f"/api/v1/namespaces/{NS}/pods/drv-policy-1")["spec"]["containers"][0]["resources"][
            "requests"
        ]["cpu"]
        == "1"
    )
    name = pod0["metadata"]["name"]
    out = drv.json("PATCH", f"/api/v1/namespaces/{NS}/pods/{name}/resize", body=patch, content_type=smp)
    assert out["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "500m"
    assert out["metadata"]["uid"] == pod0["metadata"]["uid"]
    with pytest.raises(ApiError) as e:  # RBAC: resize is patch only
        drv.json("PUT", f"/api/v1/namespaces/{NS}/pods/{name}/resize", body=out)
    assert e.value.code == 403


def _allocated_claim(admin: Raw, node: str, name: str) -> dict[str, Any]:
    """A serving claim in the driver's namespace, allocated (as the scheduler would) on ``node``."""
    base = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"
    request = {"name": "gpu", "exactly": {"deviceClassName": "serving.gpu.rose.io"}}
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [request]}},
    }
    c = admin.json("POST", base, body=body)
    c["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": "gpu.rose.io",
                        "pool": node,
                        "device": "gpu-0-serving",
                        "bindingConditions": ["rose.io/device-freed"],
                        "bindingFailureConditions": ["rose.io/device-free-failed"],
                    }
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
            },
        }
    }
    return admin.json("PUT", f"{base}/{name}/status", body=c)


def test_driver_may_report_binding_conditions_only_on_claims_allocated_on_its_node(
    cluster: ClusterHandle, installed: Any
) -> None:
    """The binding watch's status write (issue 27 §1) with the driver's pod-bound token, under
    v1.37.2's granular ResourceClaim status authorization (resourceclaims/driver
    associated-node:patch for gpu.rose.io)."""
    import datetime

    from dra_driver import binding

    admin, drv, _ = installed
    now = datetime.datetime.now(datetime.UTC)
    outcome = binding.Outcome(True, binding.REASON_NO_OCCUPANT, "no lent occupant on the GPU")
    base = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"
    try:
        cases = ((cluster.node_names[0], "bind-own", True), (cluster.node_names[1], "bind-other", False))
        for node, name, allowed in cases:
            claim = _allocated_claim(admin, node, name)
            patch = binding.status_patch(claim, "gpu.rose.io", node, ("gpu-0-serving",), outcome, now)
            if allowed:
                drv.json("PATCH", f"{base}/{name}/status", body=patch, content_type="application/merge-patch+json")
                got = admin.json("GET", f"{base}/{name}")
                assert got["status"]["devices"][0]["conditions"][0]["type"] == "rose.io/device-freed"
            else:
                with pytest.raises(ApiError) as e:
                    drv.json("PATCH", f"{base}/{name}/status", body=patch, content_type="application/merge-patch+json")
                # the granular authorization answers as a field error: the other node's claim would
                # need arbitrary-node:patch, which the driver is not granted
                assert e.value.code == 422 and "arbitrary-node:patch" in str(e.value), e.value
    finally:
        for name in ("bind-own", "bind-other"):
            with contextlib.suppress(NotFound):
                admin.json("DELETE", f"{base}/{name}")

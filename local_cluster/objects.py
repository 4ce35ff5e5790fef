"""Kubernetes objects the harness makes: namespaces, claim templates, GPU pods; and waiting.

Shared by the end-to-end tests (through tests/support/k8s_helpers.py), the benchmarks and ``rose demo``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from rose_common import names

T = TypeVar("T")


def wait_for(what: str, fn: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.25) -> T:
    """Poll ``fn`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def new_namespace(api: Any, prefix: str = "e2e") -> str:
    from kubernetes import client

    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    # the ServiceAccount admission plugin needs the namespace's default SA (kcm creates it)
    wait_for(
        f"default ServiceAccount in {name}",
        lambda: any(
            sa.metadata.name == "default" for sa in client.CoreV1Api(api).list_namespaced_service_account(name).items
        ),
        timeout=30,
    )
    return name


def delete_namespace(api: Any, name: str) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api)
    for pod in core.list_namespaced_pod(name).items:
        core.delete_namespaced_pod(pod.metadata.name, name, grace_period_seconds=0)
    core.delete_namespace(name)


def claim_template(name: str, device_class: str, count: int = 1, selectors: list[str] | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class, "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def create_claim_template(api: Any, ns: str, body: dict[str, Any]) -> None:
    from kubernetes import client

    client.CustomObjectsApi(api).create_namespaced_custom_object(
        "resource.k8s.io", "v1", ns, "resourceclaimtemplates", body
    )


def gpu_pod(
    name: str,
    template: str,
    scheduler: str = "default-scheduler",
    labels: dict[str, str] | None = None,
    priority_class: str | None = None,
    cpu: str = "100m",
    node_name: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
        "containers": [
            {
                "name": "main",
                "image": "registry.invalid/rose/fake:1",
                "resources": {"requests": {"cpu": cpu}, "claims": [{"name": "gpu"}]},
            }
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    if node_name:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node_name}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
    }


def pod_claim(api: Any, ns: str, pod_name: str) -> dict[str, Any] | None:
    """The ResourceClaim generated for the pod's ``gpu`` claim, once it exists."""
    from kubernetes import client

    pod = client.CoreV1Api(api).read_namespaced_pod(pod_name, ns)
    for st in pod.status.resource_claim_statuses or []:
        if st.name == "gpu" and st.resource_claim_name:
            obj: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
                "resource.k8s.io", "v1", ns, "resourceclaims", st.resource_claim_name
            )
            return obj
    return None


def allocated_claim(api: Any, ns: str, pod_name: str) -> dict[str, Any] | None:
    """The pod's ``gpu`` claim once the scheduler has allocated it and reserved it for the pod."""
    claim = pod_claim(api, ns, pod_name)
    status = (claim or {}).get("status") or {}
    return claim if status.get("allocation") and status.get("reservedFor") else None


def driver_slices(api: Any, node: str, driver: str = names.DRIVER_NAME) -> list[dict[str, Any]]:
    """The ResourceSlices ``driver`` publishes for ``node``."""
    from kubernetes import client

    items: list[dict[str, Any]] = client.CustomObjectsApi(api).list_cluster_custom_object(
        "resource.k8s.io", "v1", "resourceslices", field_selector=f"spec.driver={driver},spec.nodeName={node}"
    )["items"]
    return items


def report_container_resources(api: Any, ns: str, pod_name: str, timeout: float = 60.0) -> dict[str, Any]:
    """Play the kubelet's report of the resources its containers run with: copy each container's
    spec resources into ``status.containerStatuses[].resources`` (and ``allocatedResources``).

    A kubelet with in-place resize reports them (and again once it has actuated a resize); KWOK
    does not, and the API server refuses ``pods/resize`` for a running container without them
    ("Pod running on node without support for resize"). Waits until the pod has container
    statuses; returns the pod as JSON after the update.
    """
    from kubernetes import client

    core = client.CoreV1Api(api)

    def statuses() -> tuple[Any, list[dict[str, Any]]] | None:
        p = core.read_namespaced_pod(pod_name, ns)
        st = api.sanitize_for_serialization(p.status.container_statuses or [])
        return (p, st) if st else None

    p, sts = wait_for(f"container statuses of {ns}/{pod_name}", statuses, timeout=timeout)
    spec = {c.name: api.sanitize_for_serialization(c.resources) or {} for c in p.spec.containers}
    for st in sts:
        res = {k: v for k, v in (spec.get(st["name"]) or {}).items() if k in ("requests", "limits")}
        st["resources"] = res
        st["allocatedResources"] = dict(res.get("requests") or {})
    out: dict[str, Any] = api.sanitize_for_serialization(
        core.patch_namespaced_pod_status(pod_name, ns, {"status": {"containerStatuses": sts}})
    )
    return out

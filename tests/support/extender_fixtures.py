"""Builders of raw Kubernetes objects and extender request bodies for the extender's tests."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from rose_common import names, slices
from rose_common.forecast_api import ForecastPoint, ForecastResponse
from scheduler_extender.cache import ClusterCache

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


class Recorder:
    """Test double for the API-server suspender (the e2e tier uses the real one): the UIDs of the
    pods whose suspension would be requested."""

    def __init__(self) -> None:
        self.uids: list[str] = []

    def request(self, pod: Any, reason: str, preemptor: Any = None) -> None:
        self.uids.append(pod.uid)


def node(name: str, pool: str, host_mem_free: int | None = None) -> dict[str, Any]:
    ann = {} if host_mem_free is None else {names.ANNOTATION_HOST_MEM_FREE: str(host_mem_free)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {names.LABEL_POOL: pool, names.LABEL_GPU_NODE: "true"},
            "annotations": ann,
        },
    }


def slice_for(node_name: str, gpus: int, generation: int = 1) -> dict[str, Any]:
    return slices.resource_slice(node_name, slices.simulated_gpus(node_name, gpus), generation)


def claim(ns: str, name: str, node_name: str, devices: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": ns, "name": name},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": names.DRIVER_NAME, "pool": node_name, "device": d} for d in devices
                    ]
                }
            }
        },
    }


def pod(
    name: str,
    uid: str,
    *,
    ns: str = "default",
    node_name: str | None = None,
    job: str | None = None,
    serving: bool = False,
    annotations: dict[str, str] | None = None,
    priority: int = 0,
) -> dict[str, Any]:
    labels: dict[str, str] = {}
    if job:
        labels[names.LABEL_JOB] = job
    if serving:
        labels[names.LABEL_ROLE] = names.ROLE_SERVING
    spec: dict[str, Any] = {
        "schedulerName": names.SCHEDULER_NAME,
        "priority": priority,
        "containers": [{"name": "main", "image": "registry.invalid/x:1"}],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}],
    }
    if node_name:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": uid,
            "labels": labels,
            "annotations": annotations or {},
        },
        "spec": spec,
        "status": {"phase": "Running" if node_name else "Pending"},
    }


def forecast(
    pool: str, demands: dict[int, float], capacity_quantile: str = "0.9", generated_at: datetime | None = None
) -> ForecastResponse:
    """A ForecastResponse with the given upper-quantile demand per horizon (seconds), generated at
    ``generated_at`` (default ``T0``; a reply an extender server reads on its wall clock needs now:
    its horizons count from then)."""
    at = generated_at or T0
    return ForecastResponse(
        pool=pool,
        model_version="test",
        generated_at=at,
        last_observation_at=at,
        data_age_seconds=0.0,
        stale=False,
        current=None,
        points=[
            ForecastPoint(
                horizon_seconds=h,
                timestamp=at,
                quantiles={"0.5": d / 2, capacity_quantile: d},
            )
            for h, d in sorted(demands.items())
        ],
    )


def cluster_cache(
    pools: dict[str, list[str]],
    gpus: int = 4,
    host_mem_free: int | None = 10**12,
    objects: list[tuple[str, dict[str, Any]]] | None = None,
) -> ClusterCache:
    """A cache with the given pools → nodes, ``gpus`` per node, plus extra (kind, object) pairs."""
    cache = ClusterCache()
    for pool, node_names in pools.items():
        for n in node_names:
            cache.apply("Node", "ADDED", node(n, pool, host_mem_free))
            cache.apply("ResourceSlice", "ADDED", slice_for(n, gpus))
    for kind, obj in objects or []:
        cache.apply(kind, "ADDED", obj)
    for kind in ("Node", "Pod", "ResourceClaim", "ResourceSlice"):
        cache.mark_synced(kind)
    return cache


def args_body(pod_obj: dict[str, Any], node_names: list[str]) -> bytes:
    """What kube-scheduler sends with nodeCacheCapable true."""
    return json.dumps({"Pod": pod_obj, "Nodes": None, "NodeNames": node_names}).encode()


def preempt_body(pod_obj: dict[str, Any], victims: dict[str, list[str]]) -> bytes:
    return json.dumps(
        {
            "Pod": pod_obj,
            "NodeNameToVictims": None,
            "NodeNameToMetaVictims": {
                n: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0} for n, uids in victims.items()
            },
        }
    ).encode()


def share_slice(node_name: str, gpus: int, memory_bytes: int = 80 * 1024**3) -> dict[str, Any]:
    """A node's slice as ``rose driver --gpu-shares`` publishes it (serving, lendable, share per GPU)."""
    return slices.resource_slice(
        node_name, slices.simulated_gpus(node_name, gpus, memory_bytes=memory_bytes), 1, shares=True
    )


def share_claim(
    ns: str,
    name: str,
    memory: str,
    compute: str,
    allocated: list[tuple[str, str, int, int]] | None = None,
) -> dict[str, Any]:
    """A ResourceClaim for one GPU share (DeviceClass share.gpu.rose.io); ``allocated``: (node,
    device, memory bytes, compute %) results as the scheduler writes them (``consumedCapacity``)."""
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": ns, "name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": names.DEVICE_CLASS_SHARE,
                            "count": 1,
                            "capacity": {"requests": {"memory": memory, "compute": compute}},
                        },
                    }
                ]
            }
        },
    }
    if allocated:
        obj["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": names.DRIVER_NAME,
                            "pool": n,
                            "device": d,
                            "consumedCapacity": {"memory": str(m), "compute": str(c)},
                        }
                        for n, d, m, c in allocated
                    ]
                }
            }
        }
    return obj


def share_cache(
    pools: dict[str, list[str]], gpus: int = 2, objects: list[tuple[str, dict[str, Any]]] | None = None
) -> ClusterCache:
    """:func:`cluster_cache` with share-publishing slices (80 GiB GPUs)."""
    cache = ClusterCache()
    for pool, node_names in pools.items():
        for n in node_names:
            cache.apply("Node", "ADDED", node(n, pool, 10**12))
            cache.apply("ResourceSlice", "ADDED", share_slice(n, gpus))
    for kind, obj in objects or []:
        cache.apply(kind, "ADDED", obj)
    for kind in ("Node", "Pod", "ResourceClaim", "ResourceSlice"):
        cache.mark_synced(kind)
    return cache


def share_pod(name: str, uid: str, claim_name: str, *, ns: str = "default", job: str = "j") -> dict[str, Any]:
    """A pending RL worker whose template-generated claim (``status.resourceClaimStatuses``) is ``claim_name``."""
    obj = pod(name, uid, ns=ns, job=job)
    obj["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "rl-share"}]
    obj["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": claim_name}]
    return obj

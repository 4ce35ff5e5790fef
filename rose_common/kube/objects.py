"""Typed views of the raw Kubernetes objects the components read (plain JSON dicts).

The TypedDicts name the fields ROSE reads (``total=False``: the API server omits empty fields);
the helpers read metadata from any raw object without ``(obj.get("metadata") or {}).get(...)``
chains, tolerating absent or malformed parts (a missing map reads as empty). Pure, no I/O.
"""

from collections.abc import Mapping
from typing import Any, TypedDict


class OwnerReference(TypedDict, total=False):
    apiVersion: str
    kind: str
    name: str
    uid: str
    controller: bool


class ObjectMeta(TypedDict, total=False):
    name: str
    namespace: str
    uid: str
    resourceVersion: str
    generation: int
    labels: dict[str, str]
    annotations: dict[str, str]
    ownerReferences: list[OwnerReference]
    deletionTimestamp: str
    creationTimestamp: str


class Container(TypedDict, total=False):
    name: str
    resources: dict[str, Any]
    resizePolicy: list[dict[str, Any]]


class PodSpec(TypedDict, total=False):
    nodeName: str
    schedulerName: str
    priority: int
    containers: list[Container]
    initContainers: list[Container]
    resourceClaims: list[dict[str, Any]]
    resources: dict[str, Any]


class PodStatus(TypedDict, total=False):
    phase: str
    qosClass: str
    resourceClaimStatuses: list[dict[str, Any]]


class Pod(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: PodSpec
    status: PodStatus


class Node(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: dict[str, Any]
    status: dict[str, Any]


class ResourceClaim(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: dict[str, Any]
    status: dict[str, Any]  # allocation, reservedFor


class ResourceSlice(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: dict[str, Any]  # driver, nodeName, pool, devices


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The object's ``metadata`` (empty when absent or not a map)."""
    return _map((obj or {}).get("metadata"))


def spec(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The object's ``spec`` (empty when absent or not a map)."""
    return _map((obj or {}).get("spec"))


def status(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The object's ``status`` (empty when absent or not a map)."""
    return _map((obj or {}).get("status"))


def annotations(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    return _map(meta(obj).get("annotations"))


def labels(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    return _map(meta(obj).get("labels"))


def _text(obj: Mapping[str, Any] | None, key: str) -> str:
    value = meta(obj).get(key)
    return "" if value is None else str(value)


def name(obj: Mapping[str, Any] | None) -> str:
    return _text(obj, "name")


def namespace(obj: Mapping[str, Any] | None) -> str:
    return _text(obj, "namespace")


def uid(obj: Mapping[str, Any] | None) -> str:
    return _text(obj, "uid")


def resource_version(obj: Mapping[str, Any] | None) -> str:
    """``metadata.resourceVersion`` of an object or a list ("" when absent)."""
    return _text(obj, "resourceVersion")


def deleting(obj: Mapping[str, Any] | None) -> bool:
    """True once the object has a ``deletionTimestamp``."""
    return bool(meta(obj).get("deletionTimestamp"))


def namespaced_name(obj: Mapping[str, Any] | None) -> str:
    """``namespace/name`` (just ``name`` for a cluster-scoped object)."""
    ns = namespace(obj)
    return f"{ns}/{name(obj)}" if ns else name(obj)


def items(doc: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The ``items`` of a list response (only the ones that are objects)."""
    raw = (doc or {}).get("items")
    return [i for i in raw if isinstance(i, dict)] if isinstance(raw, list) else []

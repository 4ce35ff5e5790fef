"""Wire types of the kube-scheduler HTTP extender API (kube-scheduler extender/v1 types.go).

The Go structs have no json tags, so the keys on the wire are the Go field names (``Pod``,
``NodeNames``, ``FailedNodes``, ``Host``, ``Score``...). Go decodes case-insensitively; we accept
exactly what kube-scheduler sends and reply in the exact casing. Nested Kubernetes objects use
normal camelCase JSON; only the fields the extender reads are modelled, the rest is ignored.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, RootModel
from typing_extensions import TypedDict

MIN_EXTENDER_PRIORITY = 0
MAX_EXTENDER_PRIORITY = 10

# Bounds that keep a hostile body from costing unbounded memory or CPU, sized to the largest
# legitimate call: kube-scheduler never sends more names than the cluster has nodes (5,000 is the
# largest supported cluster), a node never runs more pods than kubelet's --max-pods (110 by
# default, a few hundred at most), and DefaultPreemption proposes at most all nodes as candidates.
MAX_NODES = 5_000
MAX_VICTIMS_PER_NODE = 1_000
MAX_VICTIMS_PER_CALL = 50_000
MAX_POD_BYTES = 1_572_864  # etcd's request limit (1.5 MiB): no stored pod is larger
MAX_NODE_NAME = 253  # a DNS subdomain
_NAME_ENTRY = MAX_NODE_NAME + 8  # a quoted, escaped-free name plus separators
_META_NODE_ENTRY = MAX_NODE_NAME + 48  # "name":{"Pods":[...],"NumPDBViolations":N},
_META_VICTIM = 56  # {"UID":"<36-char uid>"}, with slack


def max_body_bytes() -> int:
    """The largest body a legitimate nodeCacheCapable call can have: the pod plus, for filter and
    prioritize, ``MAX_NODES`` names, or, for preempt, ``MAX_NODES`` candidate nodes with
    ``MAX_VICTIMS_PER_CALL`` victims in all (~5 MiB). Without nodeCacheCapable kube-scheduler sends
    whole Node and victim Pod objects; those deployments must raise ``--max-body-bytes``."""
    filter_call = MAX_NODES * _NAME_ENTRY
    preempt_call = MAX_NODES * _META_NODE_ENTRY + MAX_VICTIMS_PER_CALL * _META_VICTIM
    return MAX_POD_BYTES + max(filter_call, preempt_call) + 4096


class _K8s(BaseModel):
    """Kubernetes objects: camelCase keys, unknown keys ignored (the API grows)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)


class OwnerReference(_K8s):
    api_version: str = Field(default="", alias="apiVersion")
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool | None = None


class ObjectMeta(_K8s):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    owner_references: list[OwnerReference] | None = Field(default=None, alias="ownerReferences")


class PodResourceClaim(_K8s):
    name: str = ""
    resource_claim_name: str | None = Field(default=None, alias="resourceClaimName")
    resource_claim_template_name: str | None = Field(default=None, alias="resourceClaimTemplateName")


class PodSpec(_K8s):
    node_name: str | None = Field(default=None, alias="nodeName")
    scheduler_name: str | None = Field(default=None, alias="schedulerName")
    priority: int | None = None
    termination_grace_period_seconds: int | None = Field(default=None, alias="terminationGracePeriodSeconds")
    resource_claims: list[PodResourceClaim] | None = Field(default=None, alias="resourceClaims")


class ResourceClaimStatus(_K8s):
    name: str = ""
    resource_claim_name: str | None = Field(default=None, alias="resourceClaimName")


class PodStatus(_K8s):
    resource_claim_statuses: list[ResourceClaimStatus] | None = Field(default=None, alias="resourceClaimStatuses")


class V1Pod(_K8s):
    """A v1.Pod as kube-scheduler serialises it; only what the policy reads."""

    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: PodSpec = Field(default_factory=PodSpec)
    status: PodStatus = Field(default_factory=PodStatus)


class NodeList(BaseModel):
    """v1.NodeList (only with nodeCacheCapable false). Items are kept verbatim to echo them back."""

    model_config = ConfigDict(extra="ignore")

    metadata: dict[str, Any] | None = None
    items: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_NODES)


class _Go(BaseModel):
    """Extender structs: Go field names, no tags. Unknown keys are ignored like Go's decoder."""

    model_config = ConfigDict(extra="ignore")


class ExtenderArgs(_Go):
    """Filter and prioritize request."""

    Pod: V1Pod
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = Field(default=None, max_length=MAX_NODES)


class ExtenderFilterResult(_Go):
    """Filter reply. ``NodeNames`` must be a subset of the request's names."""

    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] = Field(default_factory=dict)
    FailedAndUnresolvableNodes: dict[str, str] = Field(default_factory=dict)
    Error: str = ""


class HostPriority(_Go):
    Host: str
    Score: int = Field(ge=MIN_EXTENDER_PRIORITY, le=MAX_EXTENDER_PRIORITY)


class HostPriorityList(RootModel[list[HostPriority]]):
    """Prioritize reply: a bare JSON array, never wrapped in an object."""


class MetaPod(TypedDict):
    """``{"UID": ...}``. MetaPod and MetaVictims are pydantic-validated TypedDicts rather than
    models: a preempt call at 5,000 nodes carries ~500 of them, and plain dicts validate ~3x
    faster than model instances."""

    UID: str


class MetaVictims(TypedDict, total=False):
    Pods: Annotated[list[MetaPod] | None, Field(max_length=MAX_VICTIMS_PER_NODE)]
    NumPDBViolations: int


class Victims(_Go):
    Pods: list[V1Pod] | None = Field(default=None, max_length=MAX_VICTIMS_PER_NODE)
    NumPDBViolations: int = 0


class ExtenderPreemptionArgs(_Go):
    """Preempt request: full victims without nodeCacheCapable, UIDs only with it."""

    Pod: V1Pod
    NodeNameToVictims: dict[str, Victims] | None = Field(default=None, max_length=MAX_NODES)
    NodeNameToMetaVictims: dict[str, MetaVictims] | None = Field(default=None, max_length=MAX_NODES)


class ExtenderPreemptionResult(_Go):
    NodeNameToMetaVictims: dict[str, MetaVictims] = Field(default_factory=dict)


class ExtenderBindingArgs(_Go):
    """Bind request (the extender does not implement bind; modelled for completeness of the contract)."""

    PodName: str
    PodNamespace: str
    PodUID: str
    Node: str


class ExtenderBindingResult(_Go):
    Error: str = ""

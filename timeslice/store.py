"""A group's durable record: one coordination.k8s.io/v1 Lease, and the store Protocol.

I/O boundary: none. :func:`to_lease` and :func:`from_lease` map a :class:`~timeslice.state.Group`
to and from a Lease object (pure): ``holderIdentity`` the holder, ``leaseDurationSeconds`` the
lease TTL (rounded up; the exact value in an annotation), ``renewTime`` the last renew,
``leaseTransitions`` the fencing token; the resident job, the switching flag and the queue live
in ``rose.io/timeslice-*`` annotations. A :class:`Store` saves a record only over the version it
read (compare-and-swap). :class:`MemoryStore` is the explicit in-process store with the API
server's semantics (a ``resourceVersion`` per write, a conflict on a stale one), used outside
Kubernetes and by the tests; ``timeslice.kube.LeaseStore`` is the API server one.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import threading
from typing import Any, Final, Protocol

from rose_common.timefmt import parse_rfc3339, rfc3339
from rose_common.timeslice_lease import (
    A_GRANTED,
    A_GROUP,
    A_MAX_HOLD,
    A_NAMESPACE,
    A_RESIDENT,
    A_SWITCHING,
    A_TTL,
    LABEL_GROUP,
    lease_name,
)
from timeslice.state import Group, Waiter, split_key

# what readers see (the group, the resident, the switching flag, the TTL, the label) is the shared
# contract in rose_common.timeslice_lease; these are the orchestrator's own
ANNOTATION_PREFIX: Final = "rose.io/timeslice-"
A_PREVIOUS: Final = ANNOTATION_PREFIX + "previous"
A_QUEUE: Final = ANNOTATION_PREFIX + "queue"
A_ROLE: Final = ANNOTATION_PREFIX + "holder-role"
A_SWITCH_DEADLINE: Final = ANNOTATION_PREFIX + "switch-deadline"
A_HOLD_ENDED: Final = ANNOTATION_PREFIX + "hold-ended"


class Store(Protocol):
    def load(self, group: str) -> tuple[Group | None, str]:
        """The group's record and its version ((None, "") when there is none)."""
        ...

    def save(self, g: Group, version: str) -> str | None:
        """Write ``g`` over ``version`` ("" = create); the new version, or None on a conflict."""
        ...

    def groups(self) -> list[str]: ...


def lease_of(key: str) -> str:
    """The Lease name of the group with key ``namespace/name`` (or ``name``)."""
    ns, name = split_key(key)
    return lease_name(name, ns)


def _waiter_json(w: Waiter) -> dict[str, Any]:
    return {"job": w.job, "role": w.role, "since": w.since, "priority": w.priority, "orphanUntil": w.orphan_until}


def to_lease(g: Group, namespace: str) -> dict[str, Any]:
    """The Lease object of ``g`` (no resourceVersion)."""
    spec: dict[str, Any] = {"leaseDurationSeconds": max(1, math.ceil(g.lease_ttl_s)), "leaseTransitions": g.token}
    if g.holder:
        spec["holderIdentity"] = g.holder
    if g.renewed:
        spec["renewTime"] = rfc3339(dt.datetime.fromtimestamp(g.renewed, dt.UTC), micros=True)
    ns, name = split_key(g.name)
    ann = {
        A_GROUP: name,
        A_NAMESPACE: ns,
        A_MAX_HOLD: repr(g.max_hold_s),
        A_GRANTED: repr(g.granted),
        A_HOLD_ENDED: g.hold_ended,
        A_RESIDENT: g.resident,
        A_PREVIOUS: g.previous,
        A_SWITCHING: "true" if g.switching else "false",
        A_SWITCH_DEADLINE: repr(g.switch_deadline),
        A_TTL: repr(g.lease_ttl_s),
        A_ROLE: g.holder_role,
        A_QUEUE: json.dumps([_waiter_json(w) for w in g.waiters], separators=(",", ":")),
    }
    meta = {"name": lease_name(name, ns), "namespace": namespace, "labels": {LABEL_GROUP: name}, "annotations": ann}
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}


def from_lease(doc: dict[str, Any]) -> Group:
    """The group of a Lease written by :func:`to_lease`; ValueError naming what is wrong otherwise."""
    meta = doc.get("metadata") or {}
    ann = meta.get("annotations") or {}
    spec = doc.get("spec") or {}
    bare = ann.get(A_GROUP)
    name = f"{ann[A_NAMESPACE]}/{bare}" if bare and ann.get(A_NAMESPACE) else bare
    if not name:
        raise ValueError(f"Lease {meta.get('name')!r} has no {A_GROUP} annotation: not a timeslice group")
    try:
        queue = json.loads(ann.get(A_QUEUE) or "[]")
        waiters = tuple(
            Waiter(
                str(w["job"]),
                str(w.get("role", "")),
                float(w["since"]),
                int(w.get("priority", 0)),
                True,
                float(w.get("orphanUntil", 0.0)),
            )
            for w in queue
        )
        ttl = float(ann.get(A_TTL) or spec.get("leaseDurationSeconds") or 10)
        renewed = parse_rfc3339(spec["renewTime"]).timestamp() if spec.get("renewTime") else 0.0
        switch_deadline = float(ann.get(A_SWITCH_DEADLINE) or 0.0)
        max_hold = float(ann.get(A_MAX_HOLD) or 0.0)
        granted = float(ann.get(A_GRANTED) or renewed)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"Lease {meta.get('name')!r} of group {name!r} is unreadable: {e}") from None
    return Group(
        name=str(name),
        lease_ttl_s=ttl,
        holder=str(spec.get("holderIdentity") or ""),
        holder_role=str(ann.get(A_ROLE) or ""),
        token=int(spec.get("leaseTransitions") or 0),
        renewed=renewed,
        resident=str(ann.get(A_RESIDENT) or ""),
        previous=str(ann.get(A_PREVIOUS) or ""),
        switching=ann.get(A_SWITCHING) == "true",
        switch_deadline=switch_deadline,
        waiters=waiters,
        max_hold_s=max_hold,
        granted=granted,
        hold_ended=str(ann.get(A_HOLD_ENDED) or ""),
    )


class MemoryStore:
    """Leases in process memory with the API server's compare-and-swap (explicit; no Kubernetes)."""

    def __init__(self, namespace: str = "default") -> None:
        self.namespace = namespace
        self._docs: dict[str, tuple[dict[str, Any], str]] = {}
        self._rv = 0
        self._lock = threading.Lock()

    def load(self, group: str) -> tuple[Group | None, str]:
        with self._lock:
            hit = self._docs.get(lease_of(group))
        if hit is None:
            return None, ""
        return from_lease(json.loads(json.dumps(hit[0]))), hit[1]

    def save(self, g: Group, version: str) -> str | None:
        name = lease_of(g.name)
        with self._lock:
            current = self._docs.get(name)
            if (current[1] if current else "") != version:
                return None
            self._rv += 1
            rv = str(self._rv)
            self._docs[name] = (to_lease(g, self.namespace), rv)
            return rv

    def groups(self) -> list[str]:
        with self._lock:
            return sorted(from_lease(doc).name for doc, _ in self._docs.values())

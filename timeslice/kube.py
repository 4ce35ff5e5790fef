"""The orchestrator's only module that talks to the API server.

I/O boundary: HTTP requests to the API server through :class:`rose_common.kube.client.Raw`.
:class:`LeaseStore` keeps one coordination.k8s.io/v1 Lease per group (the codec is
:mod:`timeslice.store`, pure): a create, or a replace carrying the resourceVersion read, so a
write over a newer record is refused (compare-and-swap) and the orchestrator decides again.
:class:`LeaseLock` reads and writes the leader-election Lease; the decision is
:func:`rose_common.leader.decide` (pure). :class:`TokenReviewer` asks the API server who a
ServiceAccount token belongs to (a TokenReview). :class:`PodMembers` finds a job's worker pods of
a group in the job's namespace (whether it may take a place, and its priority).
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import quote

from rose_common import names
from rose_common.kube import objects
from rose_common.kube.client import Raw
from rose_common.kube.errors import Conflict, NotFound
from rose_common.leader import LeaseRecord
from rose_common.timeslice_lease import A_GROUP, LABEL_GROUP
from timeslice.identity import Unauthenticated
from timeslice.members import pod_priority
from timeslice.state import Group
from timeslice.store import from_lease, lease_of, to_lease

LEASE_API: Final = "/apis/coordination.k8s.io/v1"


def _leases(namespace: str) -> str:
    return f"{LEASE_API}/namespaces/{quote(namespace, safe='')}/leases"


class LeaseStore:
    """The groups' Leases in one namespace, written with compare-and-swap."""

    def __init__(self, raw: Raw, namespace: str) -> None:
        self.raw = raw
        self.namespace = namespace
        self.path = _leases(namespace)

    def load(self, group: str) -> tuple[Group | None, str]:
        try:
            doc = self.raw.json("GET", f"{self.path}/{lease_of(group)}")
        except NotFound:
            return None, ""
        return from_lease(doc), objects.resource_version(doc)

    def save(self, g: Group, version: str) -> str | None:
        body = to_lease(g, self.namespace)
        try:
            if version:
                body["metadata"]["resourceVersion"] = version
                doc = self.raw.json("PUT", f"{self.path}/{lease_of(g.name)}", body=body)
            else:
                doc = self.raw.json("POST", self.path, body=body)
        except Conflict:  # a newer write (or a create that lost the race: AlreadyExists is a 409 too)
            return None
        return objects.resource_version(doc)

    def groups(self) -> list[str]:
        doc = self.raw.json("GET", self.path, query={"labelSelector": LABEL_GROUP})
        return sorted(from_lease(item).name for item in objects.items(doc) if objects.annotations(item).get(A_GROUP))


class LeaseLock:
    """Reads and writes the leader-election Lease."""

    def __init__(self, raw: Raw, namespace: str, name: str) -> None:
        self.raw = raw
        self.namespace = namespace
        self.name = name
        self.path = _leases(namespace)

    def get(self) -> tuple[LeaseRecord | None, str]:
        try:
            doc = self.raw.json("GET", f"{self.path}/{quote(self.name, safe='')}")
        except NotFound:
            return None, ""
        return LeaseRecord.from_spec(dict(objects.spec(doc))), objects.resource_version(doc)

    def write(self, record: LeaseRecord, resource_version: str) -> bool:
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": record.to_spec(),
        }
        try:
            if resource_version:
                body["metadata"]["resourceVersion"] = resource_version
                self.raw.json("PUT", f"{self.path}/{quote(self.name, safe='')}", body=body)
            else:
                self.raw.json("POST", self.path, body=body)
        except Conflict:
            return False
        return True


class TokenReviewer:
    """A TokenReview per call: the token's username, or Unauthenticated."""

    def __init__(self, raw: Raw, audiences: list[str]) -> None:
        self.raw = raw
        self.audiences = audiences

    def __call__(self, token: str) -> str:
        spec: dict[str, Any] = {"token": token}
        if self.audiences:
            spec["audiences"] = self.audiences
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
        status = self.raw.json("POST", "/apis/authentication.k8s.io/v1/tokenreviews", body=body).get("status") or {}
        if not status.get("authenticated"):
            raise Unauthenticated(f"the API server refused the token: {status.get('error') or 'not authenticated'}")
        return str((status.get("user") or {}).get("username") or "")


class PodMembers:
    """``timeslice.members.Members`` over the API server: the job's worker pods of the group, listed
    in the job's own namespace; their ``spec.priority`` (the request's priority is ignored)."""

    def __init__(self, raw: Raw) -> None:
        self.raw = raw

    def priority(self, namespace: str, job: str, group: str, hint: int) -> int:
        selector = f"{names.LABEL_JOB}={job},{names.LABEL_TIMESLICE_GROUP}={group}"
        doc = self.raw.json(
            "GET", f"/api/v1/namespaces/{quote(namespace, safe='')}/pods", query={"labelSelector": selector}
        )
        return pod_priority(list(objects.items(doc)), namespace, job, group)

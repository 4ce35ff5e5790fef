"""Which jobs may take a place in a group, and at what priority: never what the request says.

I/O boundary: none (the Kubernetes lookup is ``timeslice.kube.PodMembers``). An Acquire names a
job ``namespace/name`` and a group; before the job takes a slot (a waiter, a group record), a
:class:`Members` source confirms the job is real and a member of the group, and gives its
priority. On Kubernetes that is the job's worker pods in its own namespace (labels
``rose.io/elastic-rl-job=<name>`` and ``rose.io/timeslice-group=<group>``, which the controller
sets from the ElasticRLJob's ``spec.timesliceGroup``), and the priority is their ``spec.priority``,
which the API server resolves from the pods' ``priorityClassName`` (a PriorityClass: an
administrator's object). :class:`RequestPriority` is the explicit stand-in without Kubernetes
(``--store memory``, only with ``--insecure``): every job is a member and the request's priority is
a hint. Either way the priority is clamped to ``±max_priority`` levels (:func:`clamp`), so no value
outranks more than ``max_priority x --aging`` seconds of waiting.
"""

from __future__ import annotations

from typing import Protocol


class NotMember(Exception):
    """The job has no worker of the group in its namespace (PERMISSION_DENIED)."""


class Members(Protocol):
    def priority(self, namespace: str, job: str, group: str, hint: int) -> int:
        """The priority of job ``namespace/job`` in group ``group`` (its bare name); NotMember when the
        job is not a member. ``hint`` is the request's priority, which a trustworthy source ignores."""
        ...


class RequestPriority:
    """Explicit, for use without Kubernetes: every job is a member, at the request's priority."""

    def priority(self, namespace: str, job: str, group: str, hint: int) -> int:
        return hint


def clamp(priority: int, max_priority: int) -> int:
    return max(-max_priority, min(max_priority, priority))


def pod_priority(pods: list[dict[str, object]], namespace: str, job: str, group: str) -> int:
    """The highest ``spec.priority`` of the job's live worker pods of the group; NotMember when none."""
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]  # type: ignore[attr-defined]
    if not live:
        raise NotMember(
            f"job {namespace}/{job} has no pod in namespace {namespace!r} labelled rose.io/elastic-rl-job={job} and"
            f" rose.io/timeslice-group={group}: only the workers of an ElasticRLJob whose spec.timesliceGroup is"
            f" {group!r} may acquire the group (create the job first, and send its name as namespace/name)"
        )
    return max(int((p.get("spec") or {}).get("priority") or 0) for p in live)  # type: ignore[attr-defined]

"""Time-slice groups: who of a group's member jobs is resident, as the job's status says it.

I/O boundary: none (pure). The orchestrator's group Lease (``rose_common.timeslice_lease``, read
by an informer in ``kube.py``) is the source of truth; the controller only reflects it and never
writes it. :func:`member_state` maps a member job (``namespace/name``) and its group's Lease to
``Resident`` (its state is on the group's devices: it holds the group, or yielded and nobody took
over, lazy eviction), ``Switching`` (a hand-over to it is in flight), ``Waiting`` (another job is
resident) or ``NoGrant`` (no Lease yet: nobody has acquired the group). :func:`reflect` puts that
in the status: the ``Resident`` condition (reason = the state; ``lastTransitionTime`` only on a
change, with an Event) and ``fencingToken``.

The single owner of ``rose.io/suspend-request``: the orchestrator's hand-over for the workers of a
job in a group, the controller for every other worker (:func:`owns_suspend_requests`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from elastic_controller.status import EventSpec
from rose_common.elasticrljob import Condition, ElasticRLJob, ElasticRLJobStatus
from rose_common.timeslice_lease import GroupLease

MemberState = Literal["Resident", "Switching", "Waiting", "NoGrant"]
CONDITION = "Resident"


@dataclass(frozen=True)
class Membership:
    state: MemberState
    message: str
    token: int | None


def owns_suspend_requests(job: ElasticRLJob) -> bool:
    """Whether the controller may write ``rose.io/suspend-request`` on the job's workers."""
    return job.spec.timeslice_group is None


def member_state(job_key: str, group: str, lease: GroupLease | None, now: float) -> Membership:
    """Where member ``job_key`` of ``group`` stands by the orchestrator's Lease (None: no Lease)."""
    if lease is None:
        return Membership("NoGrant", f"group {group}: no job has acquired it yet", None)
    holds = "holds the group" if lease.holds(job_key, now) else "yielded; nobody took over (lazy eviction)"
    if lease.switching and lease.holder == job_key:
        return Membership(
            "Switching",
            f"group {group}: hand-over to {job_key} in flight (fencing token "
            f"{lease.token}, from {lease.resident or 'nobody'})",
            lease.token,
        )
    if lease.resident == job_key and not lease.switching:
        return Membership(
            "Resident", f"group {group}: {job_key} is resident and {holds} (fencing token {lease.token})", lease.token
        )
    who = lease.holder if lease.switching else lease.resident
    return Membership(
        "Waiting",
        f"group {group}: {who or 'nobody'} is resident (fencing token {lease.token}); "
        f"{job_key} is suspended or waits for its Acquire",
        lease.token,
    )


def _condition(prev: list[Condition], m: Membership, gen: int, now: datetime) -> tuple[Condition, EventSpec | None]:
    before = next((c for c in prev if c.type == CONDITION), None)
    status = "True" if m.state == "Resident" else "False"
    changed = before is None or before.status != status or before.reason != m.state
    since = now if changed or before is None else before.last_transition_time
    cond = Condition.model_validate(
        {
            "type": CONDITION,
            "status": status,
            "reason": m.state,
            "message": m.message,
            "lastTransitionTime": since,
            "observedGeneration": gen,
        }
    )
    event = EventSpec(f"Timeslice{m.state}", m.message) if changed else None
    return cond, event


def reflect(
    job: ElasticRLJob, status: ElasticRLJobStatus, lease: GroupLease | None, now: datetime
) -> tuple[ElasticRLJobStatus, list[EventSpec]]:
    """``status`` with the job's ``Resident`` condition and ``fencingToken`` (unchanged for a job in no group)."""
    group = job.spec.timeslice_group
    if group is None:
        return status, []
    m = member_state(f"{job.namespace}/{job.name}", group, lease, now.timestamp())
    prev = (job.status.conditions if job.status else None) or []
    cond, event = _condition(prev, m, job.generation, now)
    others = [c for c in status.conditions or [] if c.type != CONDITION]
    out = status.model_copy(update={"conditions": [*others, cond], "fencing_token": m.token})
    return out, [event] if event else []

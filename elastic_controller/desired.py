"""The reconcile's desired state: (spec, observed workers, the planner's target) -> actions.

I/O boundary: none. :func:`desired` is a pure function; ``now`` is an argument. The reconciler
carries out the :class:`Desired` it returns through ``kube.py`` (create, delete with a UID
precondition, patch the ``rose.io/suspend-request`` annotation) and writes the status from
``elastic_controller.status``. Creating a worker by its fixed name is idempotent: a retry after a
crash gets a conflict, never a duplicate pod.

A job with ``spec.timesliceGroup`` (see ``elastic_controller.groups``): its new workers use the
group's shared ResourceClaims (``claims``, ensured before the pods) instead of a template of
its own; its status carries the ``Resident`` condition and ``fencingToken`` read from the
orchestrator's group Lease (``lease``); and the controller writes no ``rose.io/suspend-request``
on its workers, which the orchestrator's hand-over owns: a planned suspend or resume of such a
worker becomes the Event ``SuspendLeftToOrchestrator`` instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from elastic_controller.groups import owns_suspend_requests, reflect
from elastic_controller.observe import ObservedWorker
from elastic_controller.planner import JobTarget
from elastic_controller.status import EventSpec, compute_status
from elastic_controller.workers import (
    CONTROLLER,
    claim_template,
    dedicated,
    lent_roles,
    shared_claim,
    trainer_service,
    worker_index,
    worker_pod,
)
from rose_common.elasticrljob import ElasticRLJob, ElasticRLJobStatus, Role
from rose_common.timefmt import rfc3339
from rose_common.timeslice_lease import GroupLease


@dataclass(frozen=True)
class PodRef:
    name: str
    uid: str  # precondition: a recreated pod with the same name is never touched


@dataclass(frozen=True)
class SuspendRequest:
    pod: PodRef
    value: str  # JSON {"by", "reason", "graceSeconds", "at"}, the format the DRA driver reads


@dataclass(frozen=True)
class Desired:
    claim_template: dict[str, Any] | None  # None for a job in a time-slice group (it uses ``claims``)
    status: ElasticRLJobStatus
    create: tuple[dict[str, Any], ...] = ()
    delete: tuple[PodRef, ...] = ()
    set_requests: tuple[SuspendRequest, ...] = ()
    clear_requests: tuple[PodRef, ...] = ()
    events: tuple[EventSpec, ...] = ()
    claims: tuple[dict[str, Any], ...] = ()  # the group's shared ResourceClaims the new workers use
    templates: tuple[dict[str, Any], ...] = ()  # a job with roles: one claim template per lent role
    service: dict[str, Any] | None = None  # a job with roles: the trainer's headless Service


def suspend_request(reason: str, grace_seconds: int, now: datetime) -> str:
    doc = {"by": CONTROLLER, "reason": reason, "graceSeconds": grace_seconds, "at": rfc3339(now)}
    return json.dumps(doc, separators=(",", ":"))


def _free_indexes(observed: list[ObservedWorker], n: int, role: Role | None = None) -> list[int]:
    used = {w.index for w in observed if w.role == role}
    out: list[int] = []
    i = 0
    while len(out) < n:
        if i not in used:
            out.append(i)
        i += 1
    return out


def _event(reason_text: str) -> EventSpec:
    reason, _, message = reason_text.partition(": ")
    return EventSpec(reason, message or reason_text)


def _requests(
    job: ElasticRLJob, by_name: dict[str, ObservedWorker], target: JobTarget, now: datetime
) -> tuple[tuple[SuspendRequest, ...], tuple[PodRef, ...]]:
    grace = job.spec.graceful_shutdown_period
    sets = tuple(
        SuspendRequest(PodRef(w.name, w.uid), suspend_request(f"planned reclaim of {w.name}", grace, now))
        for w in (by_name[n] for n in target.suspend if n in by_name)
        if w.request_by is None and not w.lost
    )
    clears = tuple(PodRef(w.name, w.uid) for w in (by_name[n] for n in target.resume if n in by_name) if w.ours)
    return sets, clears


EVENT_BLOCKED_REPLACED = "BlockedWorkerReplaced"


def _replaced(w: ObservedWorker) -> EventSpec:
    """A worker serving blocked before it ever ran, deleted to be recreated on a free GPU."""
    message = (
        f"{w.name}: {w.serving_held}; it never ran (its claim was never prepared, the driver wrote no "
        "suspend state and the workload reported nothing): deleted, recreated on a GPU serving does not hold"
    )
    return EventSpec(EVENT_BLOCKED_REPLACED, message, "Warning")


def _left_to_orchestrator(job: ElasticRLJob, target: JobTarget) -> tuple[EventSpec, ...]:
    n = len(target.suspend) + len(target.resume)
    if owns_suspend_requests(job) or n == 0:
        return ()
    message = (
        f"{n} planned suspend/resume of workers in time-slice group {job.spec.timeslice_group} not "
        "written: its orchestrator owns their rose.io/suspend-request"
    )
    return (EventSpec("SuspendLeftToOrchestrator", message),)


def desired(
    job: ElasticRLJob,
    observed: list[ObservedWorker],
    target: JobTarget | None,
    now: datetime,
    lease: GroupLease | None = None,
) -> Desired:
    """What to change so the job's pods match ``target`` (None: the planner has not spoken; keep);
    ``lease``: the orchestrator's Lease of the job's time-slice group, when it has one."""
    status, transitions = compute_status(job, observed, target, job.status, now)
    status, grouped = reflect(job, status, lease, now)
    transitions = [*transitions, *grouped]
    lost = tuple(PodRef(w.name, w.uid) for w in observed if w.lost and not w.deleting)
    transitions += [_replaced(w) for w in observed if w.replace_blocked and not w.deleting]
    if job.spec.roles is not None:
        return _desired_roles(job, observed, target, now, status, tuple(transitions), lost)
    template = claim_template(job) if job.spec.timeslice_group is None else None
    if target is None:
        return Desired(template, status, delete=lost, events=tuple(transitions))
    by_name = {w.name: w for w in observed}
    removed = tuple(
        PodRef(w.name, w.uid) for w in (by_name[n] for n in target.remove if n in by_name) if not w.deleting
    )
    state_bytes = job.spec.state_bytes_per_worker
    slots = zip(_free_indexes(observed, len(target.add)), target.add, strict=True)
    create = tuple(worker_pod(job, i, pool, state_bytes, share=target.share) for i, pool in slots)
    sets, clears = _requests(job, by_name, target, now) if owns_suspend_requests(job) else ((), ())
    delete = tuple(dict.fromkeys(lost + removed))
    events = tuple(transitions) + tuple(_event(r) for r in target.reasons) + _left_to_orchestrator(job, target)
    claims = () if template is not None else tuple(shared_claim(job, _index(job, b)) for b in create)
    return Desired(template, status, create, delete, sets, clears, events, claims)


def _dedicated_trainers(job: ElasticRLJob, observed: list[ObservedWorker]) -> tuple[dict[str, Any], ...]:
    """A dedicated trainer's missing workers: all ``workers`` of them run, never planned."""
    if job.spec.roles is None or not dedicated(job, "trainer"):
        return ()
    have = {w.index for w in observed if w.role == "trainer"}
    return tuple(
        worker_pod(job, i, None, None, "trainer") for i in range(job.spec.roles.trainer.workers) if i not in have
    )


def _desired_roles(
    job: ElasticRLJob,
    observed: list[ObservedWorker],
    target: JobTarget | None,
    now: datetime,
    status: ElasticRLJobStatus,
    transitions: tuple[EventSpec, ...],
    lost: tuple[PodRef, ...],
) -> Desired:
    """A job with ``spec.roles``: ``target`` is the roles' targets joined (``planner.merge_roles``);
    each new worker is created in its role (``add_roles``), with its role's template, claim
    template, index and environment; the trainer's headless Service is kept in place."""
    templates = tuple(claim_template(job, r) for r in lent_roles(job))
    service = trainer_service(job)
    trainers = _dedicated_trainers(job, observed)
    if target is None:
        return Desired(
            None, status, create=trainers, delete=lost, events=transitions, templates=templates, service=service
        )
    by_name = {w.name: w for w in observed}
    removed = tuple(
        PodRef(w.name, w.uid) for w in (by_name[n] for n in target.remove if n in by_name) if not w.deleting
    )
    create = list(trainers)
    for role in ("trainer", "rollout"):
        pools = [p for p, r in zip(target.add, target.add_roles, strict=True) if r == role]
        create += [
            worker_pod(job, i, pool, None, role)
            for i, pool in zip(_free_indexes(observed, len(pools), role), pools, strict=True)
        ]
    sets, clears = _requests(job, by_name, target, now)
    events = transitions + tuple(_event(r) for r in target.reasons)
    return Desired(
        None,
        status,
        tuple(create),
        tuple(dict.fromkeys(lost + removed)),
        sets,
        clears,
        events,
        templates=templates,
        service=service,
    )


def _index(job: ElasticRLJob, pod: dict[str, Any]) -> int:
    i = worker_index(job.name, pod["metadata"]["name"])
    assert i is not None  # worker_pod names every pod <job>-w<index>
    return i

"""The reconcile's desired state: (spec, observed workers, the planner's target) -> actions.

I/O boundary: none. :func:`desired` is a pure function; ``now`` is an argument. The reconciler
carries out the :class:`Desired` it returns through ``kube.py`` (create, delete with a UID
precondition, patch the ``rose.io/suspend-request`` annotation) and writes the status from
``elastic_controller.status``. Creating a worker by its fixed name is idempotent: a retry after a
crash gets a conflict, never a duplicate pod.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from elastic_controller.observe import ObservedWorker
from elastic_controller.planner import JobTarget
from elastic_controller.status import EventSpec, compute_status
from elastic_controller.workers import CONTROLLER, claim_template, worker_pod
from rose_common.elasticrljob import ElasticRLJob, ElasticRLJobStatus


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
    claim_template: dict[str, Any]
    status: ElasticRLJobStatus
    create: tuple[dict[str, Any], ...] = ()
    delete: tuple[PodRef, ...] = ()
    set_requests: tuple[SuspendRequest, ...] = ()
    clear_requests: tuple[PodRef, ...] = ()
    events: tuple[EventSpec, ...] = ()


def suspend_request(reason: str, grace_seconds: int, now: datetime) -> str:
    doc = {"by": CONTROLLER, "reason": reason, "graceSeconds": grace_seconds, "at": now.strftime("%Y-%m-%dT%H:%M:%SZ")}
    return json.dumps(doc, separators=(",", ":"))


def _free_indexes(observed: list[ObservedWorker], n: int) -> list[int]:
    used = {w.index for w in observed}
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


def _requests(job: ElasticRLJob, by_name: dict[str, ObservedWorker], target: JobTarget,
              now: datetime) -> tuple[tuple[SuspendRequest, ...], tuple[PodRef, ...]]:  # fmt: skip
    grace = job.spec.graceful_shutdown_period
    sets = tuple(
        SuspendRequest(PodRef(w.name, w.uid), suspend_request(f"planned reclaim of {w.name}", grace, now))
        for w in (by_name[n] for n in target.suspend if n in by_name)
        if w.request_by is None and not w.lost
    )
    clears = tuple(PodRef(w.name, w.uid) for w in (by_name[n] for n in target.resume if n in by_name) if w.ours)
    return sets, clears


def desired(job: ElasticRLJob, observed: list[ObservedWorker], target: JobTarget | None, now: datetime) -> Desired:
    """What to change so the job's pods match ``target`` (None: the planner has not spoken; keep)."""
    status, transitions = compute_status(job, observed, target, job.status, now)
    lost = tuple(PodRef(w.name, w.uid) for w in observed if w.lost and not w.deleting)
    if target is None:
        return Desired(claim_template(job), status, delete=lost, events=tuple(transitions))
    by_name = {w.name: w for w in observed}
    removed = tuple(PodRef(w.name, w.uid) for w in (by_name[n] for n in target.remove if n in by_name)
                    if not w.deleting)  # fmt: skip
    state_bytes = job.spec.state_bytes_per_worker
    create = tuple(
        worker_pod(job, i, pool, state_bytes) for i, pool in zip(_free_indexes(observed, len(target.add)),
                                                                  target.add, strict=True)
    )  # fmt: skip
    sets, clears = _requests(job, by_name, target, now)
    delete = tuple(dict.fromkeys(lost + removed))
    events = tuple(transitions) + tuple(_event(r) for r in target.reasons)
    return Desired(claim_template(job), status, create, delete, sets, clears, events)

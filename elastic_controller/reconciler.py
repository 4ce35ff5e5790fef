"""Carry out one :class:`~elastic_controller.desired.Desired` through a small API Protocol.

I/O boundary: every call goes through :class:`JobApi`, which ``kube.py`` implements against the
API server (create → 409 is success, delete and patches carry the pod's UID as a precondition);
unit tests use a recording fake. No client import, no threads, no clock. Each action is
independent and idempotent, so a controller killed between two calls converges on the next
reconcile; a failure of one action does not stop the others, and all failures are returned.
The actions go in ordered groups (status, claim template, creates, deletes, suspend requests,
Events); the calls of one group are handed to a :data:`RunAll` together, which the controller
runs on a bounded thread pool (:func:`run_serially` by default).

The status is written under the job's ``resourceVersion`` as the informer showed it (optimistic
concurrency): a status computed from a stale view of the job (``suspendCount`` is the previous
count plus this transition) is refused with :class:`StatusConflict`, and then nothing else of
that :class:`Desired` is carried out: it was computed from the same stale view. The controller
requeues the key and computes again from a fresh one. Without it, two writes computed from two
views made ``status.suspendCount`` go back from 29 to 28 (docs/bench/soak.md, T5).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from elastic_controller.desired import Desired, PodRef
from elastic_controller.status import EventSpec
from rose_common.elasticrljob import ElasticRLJob, ElasticRLJobStatus


class JobApi(Protocol):
    def ensure_claim_template(self, body: dict[str, Any]) -> None: ...
    def ensure_claim(self, body: dict[str, Any]) -> None: ...
    def ensure_service(self, body: dict[str, Any]) -> None: ...
    def create_pod(self, body: dict[str, Any]) -> None: ...
    def delete_pod(self, namespace: str, pod: PodRef) -> None: ...
    def set_suspend_request(self, namespace: str, pod: PodRef, value: str | None) -> None: ...
    def patch_status(self, job: ElasticRLJob, status: ElasticRLJobStatus) -> None: ...
    def record_event(self, job: ElasticRLJob, event: EventSpec) -> None: ...


class StatusConflict(Exception):
    """The status write was refused: the job changed since the view the status was computed from."""


@dataclass(frozen=True)
class Failure:
    action: str
    target: str
    error: str
    conflict: bool = False  # a StatusConflict: the rest of the reconcile was not tried


Step = tuple[str, str, Callable[[], None]]
RunAll = Callable[[list[Callable[[], None]]], list[Exception | None]]  # each call's error, or None


def run_serially(calls: list[Callable[[], None]]) -> list[Exception | None]:
    """Each call in turn; an ``Exception`` is returned in its place, anything else propagates."""
    out: list[Exception | None] = []
    for call in calls:
        try:
            call()
            out.append(None)
        except Exception as e:  # the reconcile is retried as a whole; keep the others going
            out.append(e)
    return out


def _steps(api: JobApi, job: ElasticRLJob, d: Desired) -> list[list[Step]]:
    """The actions in groups; a group starts when the one before it has ended."""
    ns = job.namespace
    groups: list[list[Step]] = []
    if d.status != job.status:  # status first (see converge); an unchanged status is not written again
        groups.append([("patch_status", job.name, partial(api.patch_status, job, d.status))])
    if d.create and d.claim_template is not None:  # the template is only read when a pod is created
        groups.append([("ensure_claim_template", job.name, partial(api.ensure_claim_template, d.claim_template))])
    if d.create:  # a job with roles: each lent role's template
        groups.append(
            [
                ("ensure_claim_template", t["metadata"]["name"], partial(api.ensure_claim_template, t))
                for t in d.templates
            ]
        )
    if d.create and d.service is not None:  # the trainer's headless Service, before its pods
        groups.append([("ensure_service", d.service["metadata"]["name"], partial(api.ensure_service, d.service))])
    groups.append([("ensure_claim", c["metadata"]["name"], partial(api.ensure_claim, c)) for c in d.claims])
    groups.append([("create_pod", b["metadata"]["name"], partial(api.create_pod, b)) for b in d.create])
    groups.append([("delete_pod", p.name, partial(api.delete_pod, ns, p)) for p in d.delete])
    requests: list[Step] = [
        ("set_suspend_request", r.pod.name, partial(api.set_suspend_request, ns, r.pod, r.value))
        for r in d.set_requests
    ]
    requests += [
        ("clear_suspend_request", p.name, partial(api.set_suspend_request, ns, p, None)) for p in d.clear_requests
    ]
    groups.append(requests)
    groups.append([("record_event", e.reason, partial(api.record_event, job, e)) for e in d.events])
    return [g for g in groups if g]


def converge(api: JobApi, job: ElasticRLJob, d: Desired, run: RunAll = run_serially) -> list[Failure]:
    """Status first, then pods, then requests, then Events; every action is tried once.

    A status refused as stale (:class:`StatusConflict`) ends the pass: it returns that one
    failure, marked ``conflict``, and the caller computes again from a fresh view.

    The status goes first because it carries what the next reconcile cannot see again: a
    shrink's ``lastShrinkTime`` (the dwell's start). A controller killed after writing its
    suspend requests but before the status would leave the dwell unstarted (the restarted
    planner sees the workers already suspending and decides no shrink to stamp); killed after
    the status and before the requests, the restarted planner decides the same reclaim again."""
    failures: list[Failure] = []
    for group in _steps(api, job, d):
        errors = run([call for _, _, call in group])
        failures += [
            Failure(action, target, repr(e), isinstance(e, StatusConflict))
            for (action, target, _), e in zip(group, errors, strict=True)
            if e is not None
        ]
        if any(f.conflict for f in failures):
            return failures  # a stale view: the rest was computed from it too
    return failures

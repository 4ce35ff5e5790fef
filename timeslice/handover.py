"""The collective hand-over of a time-slice group: all-or-nothing across the group's nodes.

I/O boundary: the API server, through a :class:`PodApi` (:class:`RawPods` over
:class:`rose_common.kube.client.Raw`); the nodes are reached only through their DRA drivers'
``rose.io/suspend-request`` path (``dra_driver/podwatch.py``), which reports progress in
``rose.io/suspend-state``. The steps are planned by pure functions (:func:`plan`, :func:`progress`).

A switch from ``out_job`` to ``in_job`` at fencing token N is a two-phase protocol with one
deadline (epoch seconds, as the orchestrator's clock):

1. *suspend*: every worker pod of ``out_job`` in the group, on every node, gets the suspend
   request and ``rose.io/fencing-token: "<namespace>/<group>:N"`` (the group's key: a node keeps
   the last token per key, so two namespaces' groups of one name never fence each other); wait
   until all report ``Suspended``;
2. *restore*: every worker pod of ``in_job`` gets its request cleared (same token); wait until
   all report ``Running``.

If either phase misses the deadline (a node failed, is down, or refused the token), the switch is
rolled back within ``rollback_timeout_s``: ``in_job`` suspended again everywhere and ``out_job``
resumed everywhere, so no NCCL job is left with some ranks resumed and others not. The result
names the pods (and nodes) that did not make it.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from rose_common import names
from rose_common.kube import objects
from rose_common.timefmt import rfc3339

log = logging.getLogger("timeslice.handover")

RUNNING = str(names.SuspendState.RUNNING)
SUSPENDED = str(names.SuspendState.SUSPENDED)


class HandoverError(ValueError):
    """A switch that cannot be planned (bad job name, no workers); the message says what to fix."""


@dataclass(frozen=True)
class HandoverResult:
    ok: bool
    error: str = ""
    suspend_s: float = 0.0
    restore_s: float = 0.0
    rolled_back: bool = False
    failed_pods: tuple[str, ...] = ()  # "namespace/name@node" that missed the deadline
    bytes_moved: int = 0  # the state suspended plus the state restored (the workers' state-bytes annotations)
    suspended_bytes: int = 0  # out_job's state the nodes now hold in host memory


class Handover(Protocol):
    def switch(self, group: str, token: int, out_job: str | None, in_job: str, deadline: float) -> HandoverResult:
        """Suspend ``out_job`` on every node of the group, then restore ``in_job``; all or nothing."""
        ...


# ---------------------------------------------------------------------------------------- pure
@dataclass(frozen=True)
class PodPatch:
    namespace: str
    name: str
    annotations: dict[str, str | None]  # None: remove

    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Step:
    """One phase: the patches to write, then the state every patched pod must report."""

    patches: tuple[PodPatch, ...]
    want: str  # RUNNING | SUSPENDED


@dataclass(frozen=True)
class Plan:
    suspend: Step
    restore: Step
    rollback: tuple[Step, Step]  # re-suspend in_job, then resume out_job


def split_job(job: str) -> tuple[str, str]:
    """``(namespace, name)`` of ``"namespace/name"``; HandoverError for anything else."""
    ns, sep, name = job.partition("/")
    if not sep or not ns or not name or "/" in name:
        raise HandoverError(
            f"job {job!r} is not 'namespace/name' of an ElasticRLJob: the Kubernetes hand-over needs one"
            " (use the orchestrator's NoopHandover for jobs outside Kubernetes)"
        )
    return ns, name


def workers_of(pods: Iterable[dict[str, Any]], job: str) -> list[dict[str, Any]]:
    """The job's worker pods (namespace and ``rose.io/elastic-rl-job`` label), not being deleted."""
    ns, name = split_job(job)
    return [
        p
        for p in pods
        if objects.namespace(p) == ns and objects.labels(p).get(names.LABEL_JOB) == name and not objects.deleting(p)
    ]


def state_bytes(pods: Iterable[dict[str, Any]]) -> int:
    """The device state of ``pods``: each worker's reported size (``rose.io/reported-state-bytes``),
    else the controller's estimate (``rose.io/state-bytes``), else 0."""
    total = 0
    for p in pods:
        ann = objects.annotations(p)
        raw = ann.get(names.ANNOTATION_REPORTED_STATE_BYTES) or ann.get(names.ANNOTATION_STATE_BYTES) or "0"
        total += int(raw) if raw.isdigit() else 0
    return total


def suspend_request(token: int, at: str) -> str:
    return json.dumps(
        {"by": names.SUSPEND_BY_TIMESLICE, "reason": f"time-slice hand-over {token}", "at": at}, sort_keys=True
    )


def _patches(pods: list[dict[str, Any]], group: str, token: int, request: str | None) -> tuple[PodPatch, ...]:
    ann = {names.ANNOTATION_SUSPEND_REQUEST: request, names.ANNOTATION_FENCING_TOKEN: names.fencing_token(group, token)}
    return tuple(PodPatch(objects.namespace(p), objects.name(p), dict(ann)) for p in pods)


def plan(pods: list[dict[str, Any]], group: str, token: int, out_job: str | None, in_job: str, at: str) -> Plan:
    """The steps of switching ``group`` from ``out_job`` (None: nothing resident) to ``in_job``."""
    ins = workers_of(pods, in_job)
    if not ins:
        raise HandoverError(
            f"no worker pods of {in_job} carry {names.LABEL_TIMESLICE_GROUP}={group.rpartition('/')[2]}: label the"
            " job's workers"
            " (ElasticRLJob spec.timesliceGroup) before it acquires the group"
        )
    outs = workers_of(pods, out_job) if out_job else []
    req = suspend_request(token, at)
    suspend_out = Step(_patches(outs, group, token, req), SUSPENDED)
    resume_out = Step(_patches(outs, group, token, None), RUNNING)
    return Plan(
        suspend=suspend_out,
        restore=Step(_patches(ins, group, token, None), RUNNING),
        rollback=(Step(_patches(ins, group, token, req), SUSPENDED), resume_out),
    )


def progress(step: Step, pods: dict[str, dict[str, Any]]) -> list[str]:
    """The step's pods that have not reached its state yet (``namespace/name@node``), given the
    current pods by ``namespace/name``; a pod that is gone counts as not there."""
    missing = []
    for p in step.patches:
        pod = pods.get(p.key())
        state = objects.annotations(pod).get(names.ANNOTATION_SUSPEND_STATE, RUNNING) if pod else None
        if state != step.want:
            node = str((pod or {}).get("spec", {}).get("nodeName", "?"))
            missing.append(f"{p.key()}@{node}")
    return missing


# ---------------------------------------------------------------------------------------- I/O
class PodApi(Protocol):
    def list(self, group: str) -> tuple[list[dict[str, Any]], str]:
        """The group's pods (every namespace) and the list's resourceVersion."""
        ...

    def watch(self, group: str, resource_version: str, timeout_s: int) -> Iterable[tuple[str, dict[str, Any]]]: ...

    def patch(self, patch: PodPatch) -> None: ...


class RawPods:
    """:class:`PodApi` over :class:`rose_common.kube.client.Raw` (plain JSON). ``group`` is the group's
    key ``namespace/name``: its pods are those of its namespace labelled with its name (a group
    outside any namespace, only without Kubernetes tenancy: every namespace)."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    @staticmethod
    def _path(group: str) -> str:
        ns = group.rpartition("/")[0]
        return f"/api/v1/namespaces/{ns}/pods" if ns else "/api/v1/pods"

    @staticmethod
    def _selector(group: str) -> dict[str, str]:
        return {"labelSelector": f"{names.LABEL_TIMESLICE_GROUP}={group.rpartition('/')[2]}"}

    def list(self, group: str) -> tuple[list[dict[str, Any]], str]:
        doc = self.raw.json("GET", self._path(group), query=self._selector(group))
        return list(doc.get("items", [])), str(doc.get("metadata", {}).get("resourceVersion", ""))

    def watch(self, group: str, resource_version: str, timeout_s: int) -> Iterable[tuple[str, dict[str, Any]]]:
        q = dict(self._selector(group), resourceVersion=resource_version, allowWatchBookmarks="true")
        return self.raw.watch(self._path(group), q, timeout_s)  # type: ignore[no-any-return]

    def patch(self, patch: PodPatch) -> None:
        self.raw.json(
            "PATCH",
            f"/api/v1/namespaces/{patch.namespace}/pods/{patch.name}",
            body={"metadata": {"annotations": patch.annotations}},
            content_type="application/merge-patch+json",
        )


@dataclass
class KubeHandover:
    """The two-phase hand-over through the API server (see the module docstring)."""

    pods: PodApi
    rollback_timeout_s: float = 60.0
    clock: Callable[[], float] = time.time
    cache: dict[str, dict[str, Any]] = field(default_factory=dict)
    rv: str = ""

    def switch(self, group: str, token: int, out_job: str | None, in_job: str, deadline: float) -> HandoverResult:
        try:
            items, self.rv = self.pods.list(group)
            at = rfc3339(datetime.datetime.fromtimestamp(self.clock(), datetime.UTC))
            steps = plan(items, group, token, out_job, in_job, at)
        except HandoverError as e:
            return HandoverResult(False, str(e))
        self.cache = {objects.namespaced_name(p): p for p in items}
        t0 = self.clock()
        missing = self._run(group, steps.suspend, deadline)
        t1 = self.clock()
        if not missing:
            missing = self._run(group, steps.restore, deadline)
            if not missing:
                out_b = state_bytes(workers_of(items, out_job)) if out_job else 0
                in_b = state_bytes(workers_of(items, in_job))
                return HandoverResult(
                    True,
                    suspend_s=t1 - t0,
                    restore_s=self.clock() - t1,
                    bytes_moved=out_b + in_b,
                    suspended_bytes=out_b,
                )
        return self._roll_back(group, token, steps, missing, t1 - t0)

    def _roll_back(self, group: str, token: int, steps: Plan, missing: list[str], suspend_s: float) -> HandoverResult:
        log.warning("hand-over failed, rolling back", extra={"group": group, "token": token, "missing": missing})
        end = self.clock() + self.rollback_timeout_s
        left = self._run(group, steps.rollback[0], end) + self._run(group, steps.rollback[1], end)
        error = f"hand-over {token} of group {group} missed its deadline on {', '.join(missing)}; rolled back" + (
            f", but these did not roll back in {self.rollback_timeout_s:g}s: {', '.join(left)}" if left else ""
        )
        return HandoverResult(False, error, suspend_s=suspend_s, rolled_back=not left, failed_pods=tuple(missing))

    def _run(self, group: str, step: Step, deadline: float) -> list[str]:
        """Write the step's patches and wait (on the watch, no polling) until every pod reports the
        step's state or the deadline passes; returns the pods that did not."""
        for p in step.patches:
            try:
                self.pods.patch(p)
            except Exception as e:  # a pod gone or the API refusing: that pod misses the step
                log.warning("hand-over patch failed", extra={"pod": p.key(), "err": repr(e)})
        missing = progress(step, self.cache)
        while missing and self.clock() < deadline:
            missing = self._watch(group, step, deadline)
        return missing

    def _watch(self, group: str, step: Step, deadline: float) -> list[str]:
        """Follow the group's pods until the step is done, the deadline passes or the watch ends."""
        try:
            timeout = max(1, math.ceil(deadline - self.clock()))
            for kind, obj in self.pods.watch(group, self.rv, timeout):
                self.rv = objects.resource_version(obj) or self.rv
                if kind == "DELETED":
                    self.cache.pop(objects.namespaced_name(obj), None)
                elif kind != "BOOKMARK":
                    self.cache[objects.namespaced_name(obj)] = obj
                missing = progress(step, self.cache)
                if not missing or self.clock() >= deadline:
                    return missing
        except Exception as e:  # 410 Gone, a dropped connection: list afresh
            log.info("hand-over watch restarted", extra={"group": group, "err": repr(e)})
            items, self.rv = self.pods.list(group)
            self.cache = {objects.namespaced_name(p): p for p in items}
        return progress(step, self.cache)

"""What the controller sees of a worker Pod, and how the planner sees that worker.

I/O boundary: none. Pure functions of a raw Pod dict (as the informer delivers it) to
:class:`ObservedWorker`, and of that to the planner's :class:`~elastic_controller.planner.Worker`;
of an ElasticRLJob to the planner's :class:`~elastic_controller.planner.Job`.
A suspend request names its owner (``by``); only this controller's own requests are its to clear.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from elastic_controller.planner import Job, Worker, WorkerState
from elastic_controller.workers import CONTROLLER, worker_index
from rose_common import names
from rose_common.elasticrljob import ElasticRLJob

PCIE_BYTES_PER_SECOND: Final = 25e9  # a conservative pinned-memory PCIe rate (SUSPEND.md: ~55 GB/s Gen5)

# Values of rose.io/suspend-state (written by the DRA driver).
SUSPENDED: Final = "Suspended"
SUSPENDING: Final = "Suspending"
RESUMING: Final = "Resuming"
EVICTED: Final = "CheckpointedEvicted"


@dataclass(frozen=True)
class ObservedWorker:
    name: str
    uid: str
    index: int
    phase: str  # the Pod's status.phase
    node: str | None
    pool: str | None  # from the pod's nodeSelector (the planner pins it) or None
    deleting: bool = False
    request_by: str | None = None  # owner of rose.io/suspend-request, "" if unreadable
    suspend_state: str | None = None

    @property
    def lost(self) -> bool:
        """Gone for good: finished, failed, being deleted, or evicted to its checkpoint."""
        return self.deleting or self.phase in ("Failed", "Succeeded") or self.suspend_state == EVICTED

    @property
    def ours(self) -> bool:
        return self.request_by == CONTROLLER


def _request_owner(raw: str | None) -> str | None:
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return ""
    return str(doc.get("by", "")) if isinstance(doc, dict) else ""


def planner_job(job: ElasticRLJob, state_bytes: int | None = None, seconds_to_safe_point: float = 0.0) -> Job:
    """The planner's view of a job: bounds and priority from the spec, costs from the workload's
    reports (``state_bytes`` overrides ``spec.stateBytesPerWorker``), dwell from ``lastShrinkTime``."""
    s = job.spec
    size = state_bytes if state_bytes is not None else (s.state_bytes_per_worker or 0)
    shrunk = job.status.last_shrink_time if job.status is not None else None
    return Job(
        key=f"{job.namespace}/{job.name}",
        min_gpus=s.min_gpus,
        max_gpus=s.max_gpus,
        gpus_per_worker=s.gpus_per_worker,
        priority=s.priority,
        state_bytes=size,
        seconds_to_safe_point=seconds_to_safe_point,
        grace_s=float(s.graceful_shutdown_period),
        suspend_s=size / PCIE_BYTES_PER_SECOND,
        min_useful_run_s=float(s.min_useful_run_seconds),
        last_shrink_at=shrunk.timestamp() if shrunk is not None else None,
    )


def observe(job: str, pod: dict[str, Any], node_pool: str | None = None) -> ObservedWorker | None:
    """The worker a Pod is, or None when the pod is not one of ``job``'s workers by name.

    ``node_pool`` is the pool label of the pod's node, for a pod the planner did not pin."""
    meta = pod.get("metadata") or {}
    index = worker_index(job, str(meta.get("name", "")))
    if index is None or (meta.get("labels") or {}).get(names.LABEL_JOB) != job:
        return None
    spec, ann = pod.get("spec") or {}, meta.get("annotations") or {}
    return ObservedWorker(
        name=str(meta["name"]),
        uid=str(meta.get("uid", "")),
        index=index,
        phase=str((pod.get("status") or {}).get("phase", "Pending")),
        node=spec.get("nodeName"),
        pool=(spec.get("nodeSelector") or {}).get(names.LABEL_POOL) or node_pool,
        deleting=bool(meta.get("deletionTimestamp")),
        request_by=_request_owner(ann.get(names.ANNOTATION_SUSPEND_REQUEST)),
        suspend_state=ann.get(names.ANNOTATION_SUSPEND_STATE),
    )


def planner_state(w: ObservedWorker) -> WorkerState:
    if w.suspend_state == SUSPENDED:
        return "suspended"
    if w.request_by is not None or w.suspend_state == SUSPENDING:
        return "suspending"
    if w.suspend_state == RESUMING:
        return "resuming"
    return "active" if w.phase == "Running" else "pending"


def to_planner(job_key: str, w: ObservedWorker) -> Worker | None:
    """The planner's view; a lost worker holds nothing and is not planned for."""
    return None if w.lost else Worker(w.name, job_key, planner_state(w), w.pool)

"""What the controller sees of a worker Pod, and how the planner sees that worker.

I/O boundary: none. Pure functions of a raw Pod dict (as the informer delivers it) to
:class:`ObservedWorker`, and of that to the planner's :class:`~elastic_controller.planner.Worker`;
of an ElasticRLJob to the planner's :class:`~elastic_controller.planner.Job`.
A suspend request names its owner (``by``); only this controller's own requests are its to clear.
What the workers report through the node agent (the driver's ``rose.io/workload-phase``,
``rose.io/seconds-to-safe-point``, ``rose.io/reported-state-bytes``, ``rose.io/reported-min-gpus``,
``rose.io/reported-min-host-memory-bytes``) combines into one
:class:`WorkloadReport` per job (:func:`workload_report`) for the status and the planner; the job's
world ("active/total", :func:`world_value`) is what the controller writes as ``rose.io/world``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Final

from elastic_controller.planner import Job, Worker, WorkerState
from elastic_controller.workers import CONTROLLER, worker_index
from rose_common import names
from rose_common.elasticrljob import ElasticRLJob

_PHASE_RE: Final = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")  # the CRD's status.workloadPhase
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
    world: str | None = None  # rose.io/world as written last
    workload_phase: str | None = None  # the workload's reports (through the node agent and driver)
    seconds_to_safe_point: float | None = None
    reported_state_bytes: int | None = None
    reported_min_gpus: int | None = None  # the least it can run with, per worker
    reported_min_host_memory: int | None = None  # bytes

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


def _number(raw: str | None) -> float | None:
    """A finite number >= 0 from an annotation, or None (absent or unreadable: not reported)."""
    try:
        v = float(raw) if raw is not None else math.nan
    except ValueError:
        return None
    return v if math.isfinite(v) and v >= 0 else None


@dataclass(frozen=True)
class WorkloadReport:
    """A job's workers' reports combined (None: no worker reported it)."""

    phase: str | None = None
    seconds_to_safe_point: float | None = None
    state_bytes: int | None = None
    min_gpus: int | None = None
    min_host_memory_bytes: int | None = None


def _largest(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def workload_report(observed: list[ObservedWorker]) -> WorkloadReport:
    """The phase of the lowest-index active worker that reports one; the most seconds to a safe
    point among active workers (the gang reaches its safe point with its slowest); the largest
    state bytes among live workers (the planner's cost is per worker); the largest minimum
    resources (GPUs per worker, host memory bytes) among live workers (each worker needs them)."""
    live = sorted((w for w in observed if not w.lost), key=lambda w: w.index)
    active = [w for w in live if planner_state(w) == "active"]
    phase = next((w.workload_phase for w in active if w.workload_phase), None)
    secs = [w.seconds_to_safe_point for w in active if w.seconds_to_safe_point is not None]
    sizes = [w.reported_state_bytes for w in live if w.reported_state_bytes is not None]
    return WorkloadReport(phase, max(secs) if secs else None, max(sizes) if sizes else None,
                          _largest([w.reported_min_gpus for w in live]),
                          _largest([w.reported_min_host_memory for w in live]))  # fmt: skip


def world_value(observed: list[ObservedWorker]) -> str | None:
    """``"active/total"`` over the job's live workers, or None when it has none."""
    live = [w for w in observed if not w.lost]
    if not live:
        return None
    return f"{sum(1 for w in live if planner_state(w) == 'active')}/{len(live)}"


def world_updates(observed: list[ObservedWorker]) -> list[ObservedWorker]:
    """The live workers whose ``rose.io/world`` differs from the job's world now; a pending worker
    (no process yet) gets it when it runs, which changes the world anyway. Writing every
    intermediate world on pods still starting doubled the annotation writes of a job's grow
    (``benchmarks/controller_scale.py``)."""
    value = world_value(observed)
    return [w for w in observed if not w.lost and value is not None and w.world != value
            and planner_state(w) != "pending"]  # fmt: skip


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
        world=ann.get(names.ANNOTATION_WORLD),
        workload_phase=_phase(ann.get(names.ANNOTATION_WORKLOAD_PHASE)),
        seconds_to_safe_point=_number(ann.get(names.ANNOTATION_SECONDS_TO_SAFE_POINT)),
        reported_state_bytes=_int(ann.get(names.ANNOTATION_REPORTED_STATE_BYTES)),
        reported_min_gpus=_int(ann.get(names.ANNOTATION_REPORTED_MIN_GPUS)),
        reported_min_host_memory=_int(ann.get(names.ANNOTATION_REPORTED_MIN_HOST_MEMORY)),
    )


def _phase(raw: str | None) -> str | None:
    return raw if raw is not None and _PHASE_RE.match(raw) else None


def _int(raw: str | None) -> int | None:
    v = _number(raw)
    return int(v) if v is not None and v == int(v) else None


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

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

What a pod says about itself is a hint, never authority (issue 22 §4-§6): the reports are bounded
by what the spec justifies (:func:`planner_job`: state bytes by ``gpusPerWorker`` x
:data:`DEVICE_MEMORY_MAX_BYTES`, seconds to a safe point by the grace period; :func:`workload_report`:
the minimums), and ``rose.io/suspend-state`` can only make the planner more conservative
(:func:`holding_state`): a worker holds its GPU unless a suspend request asked the driver to take it.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from dataclasses import dataclass, replace
from typing import Any, Final

from elastic_controller.planner import Job, Worker, WorkerState, role_key
from elastic_controller.workers import CLAIM_NAME, CONTROLLER, dedicated, worker_role_index
from rose_common import extender_names, names, slices
from rose_common.elasticrljob import DEVICE_MEMORY_MAX_BYTES as DEVICE_MEMORY_MAX
from rose_common.elasticrljob import MAX_GPUS_PER_WORKER, ElasticRLJob, ElasticRLJobSpec, Role
from rose_common.timefmt import parse_rfc3339

_PHASE_RE: Final = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")  # the CRD's status.workloadPhase
PCIE_BYTES_PER_SECOND: Final = 25e9  # a conservative pinned-memory PCIe rate (SUSPEND.md: ~55 GB/s Gen5)
DEVICE_MEMORY_MAX_BYTES: Final = DEVICE_MEMORY_MAX  # the most one GPU holds (the CRD bounds the spec the same way)
HOST_MEMORY_MAX_BYTES: Final = 1 << 46  # 64 TiB: no node has more host memory for one worker

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
    pod_priority: int | None = None  # spec.priority, resolved by the API server from the PriorityClass
    role: Role | None = None  # "trainer" / "rollout" (a job with spec.roles, from the name), else None
    unschedulable_since: str | None = None  # PodScheduled=False, reason Unschedulable: its lastTransitionTime
    # that condition's message carries the ROSE extender's serving-forecast refusal (the scheduler's word)
    forecast_refused: bool = False
    schedule_retry: str | None = None  # rose.io/schedule-retry: when the controller last nudged the scheduler
    claim: str | None = None  # the name of its lent ResourceClaim (a template's generated claim, or a shared one)
    fenced: bool = False  # carries rose.io/fencing-token: a time-slice hand-over involved it
    # set by the controller from the API server (serving_blocks): where serving holds its claim's GPU
    serving_held: str = ""
    replace_blocked: bool = False  # serving holds its claim's GPU and it never ran: delete, recreate elsewhere

    @property
    def lost(self) -> bool:
        """Gone for good: finished, failed, being deleted, evicted to its checkpoint, or blocked by
        serving before it ever ran (:func:`with_serving`: recreated elsewhere)."""
        return (
            self.deleting
            or self.phase in ("Failed", "Succeeded")
            or self.suspend_state == EVICTED
            or self.replace_blocked
        )

    @property
    def ran(self) -> bool:
        """Whether the pod shows that its workload ran on its claim: the driver wrote its
        ``rose.io/suspend-state`` (it does so only for a prepared occupant), the workload reported
        through the driver's node agent, or a time-slice hand-over fenced it. A worker with none of
        these may still be judged blocked only while its claim is not prepared (:func:`serving_blocks`)."""
        return bool(
            self.suspend_state
            or self.workload_phase
            or self.reported_state_bytes is not None
            or self.seconds_to_safe_point is not None
            or self.fenced
        )

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


def _capped(value: float | None, cap: float) -> float | None:
    return None if value is None else min(value, cap)


def workload_report(
    observed: list[ObservedWorker], spec: ElasticRLJobSpec | None = None, device_memory: int | None = None
) -> WorkloadReport:
    """The phase of the lowest-index active worker that reports one; the most seconds to a safe
    point among active workers (the gang reaches its safe point with its slowest); the largest
    state bytes among live workers (the planner's cost is per worker); the largest minimum
    resources (GPUs per worker, host memory bytes) among live workers (each worker needs them).

    With the job's ``spec``, every value is bounded by what the spec justifies: seconds to a safe
    point by the grace period (the driver acts at the deadline whatever the workload says), state
    bytes by the device memory of the worker's GPUs (``device_memory``: the cluster's largest
    lendable GPU, from the driver's ResourceSlices; at most :data:`DEVICE_MEMORY_MAX_BYTES`),
    minimum GPUs by the most a worker may have (a minimum above ``gpusPerWorker`` is worth
    showing: the job asks for too few), host memory by :data:`HOST_MEMORY_MAX_BYTES`."""
    live = sorted((w for w in observed if not w.lost), key=lambda w: w.index)
    active = [w for w in live if planner_state(w) == "active"]
    phase = next((w.workload_phase for w in active if w.workload_phase), None)
    secs = [w.seconds_to_safe_point for w in active if w.seconds_to_safe_point is not None]
    sizes = [w.reported_state_bytes for w in live if w.reported_state_bytes is not None]
    rep = WorkloadReport(
        phase,
        max(secs) if secs else None,
        max(sizes) if sizes else None,
        _largest([w.reported_min_gpus for w in live]),
        _largest([w.reported_min_host_memory for w in live]),
    )
    if spec is None:
        return rep
    roles = {w.role for w in live} or {None}
    bound = max(state_bytes_bound(spec, device_memory, r) for r in roles)
    return WorkloadReport(
        rep.phase,
        _capped(rep.seconds_to_safe_point, float(spec.graceful_shutdown_period)),
        _int_capped(rep.state_bytes, bound),
        _int_capped(rep.min_gpus, MAX_GPUS_PER_WORKER),
        _int_capped(rep.min_host_memory_bytes, HOST_MEMORY_MAX_BYTES),
    )


def _int_capped(value: int | None, cap: int) -> int | None:
    return None if value is None else min(value, cap)


def state_bytes_bound(spec: ElasticRLJobSpec, device_memory: int | None = None, role: Role | None = None) -> int:
    """The most device state a worker (of ``role``) can have: its GPUs' memory (``device_memory``
    per GPU when the driver publishes it, never above :data:`DEVICE_MEMORY_MAX_BYTES`)."""
    per_gpu = min(device_memory, DEVICE_MEMORY_MAX_BYTES) if device_memory else DEVICE_MEMORY_MAX_BYTES
    return spec.role_gpus_per_worker(role) * per_gpu


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
    return [
        w for w in observed if not w.lost and value is not None and w.world != value and planner_state(w) != "pending"
    ]


def role_world_updates(observed: list[ObservedWorker]) -> list[tuple[ObservedWorker, str]]:
    """(worker, world) for each stale live worker, the world counted within its role: a trainer's
    world is the trainer's workers, a rollout's the rollouts' (a job without roles: all of them).
    A rollout joining or leaving does not change the trainer's world (its global batch)."""
    out: list[tuple[ObservedWorker, str]] = []
    for role in sorted({w.role for w in observed}, key=str):
        mine = [w for w in observed if w.role == role]
        value = world_value(mine)
        out += [(w, value) for w in world_updates(mine) if value is not None]
    return out


# A share as large as a whole GPU (compute 100, or memory of the whole GPU) is planned just below
# one: the planner's shares are fractions below 1, and such a share still holds its GPU alone.
MAX_PLANNED_SHARE: Final = 0.999


def job_share(spec: ElasticRLJobSpec, gpu_memory: int | None) -> float:
    """The fraction of one GPU each worker of a job with ``spec.gpuShare`` holds (0: whole GPUs):
    the request rounded up to the driver's steps, then the larger of memory ÷ ``gpu_memory`` (the
    smallest lendable GPU's; unknown: the memory is not counted) and compute ÷ 100
    (``rose_common.slices.share_fraction``, the extender's definition), at most
    :data:`MAX_PLANNED_SHARE`."""
    if spec.gpu_share is None:
        return 0.0
    memory, compute = slices.share_step_up(spec.gpu_share.memory_bytes, spec.gpu_share.compute)
    return round(min(MAX_PLANNED_SHARE, slices.share_fraction(memory, compute, gpu_memory or 0)), 6)


def planner_job(
    job: ElasticRLJob,
    state_bytes: int | None = None,
    seconds_to_safe_point: float = 0.0,
    class_priority: int = 0,
    device_memory: int | None = None,
    share_memory: int | None = None,
) -> Job:
    """The planner's view of a job: bounds from the spec, costs from the workload's reports
    (``state_bytes`` overrides ``spec.stateBytesPerWorker``; both bounded by the worker's device
    memory, the seconds to a safe point by the grace period), dwell from ``lastShrinkTime``;
    ``class_priority`` from its pods (:func:`class_priority`), ``spec.priority`` only as the
    tenant's hint among its own namespace's jobs; with ``spec.gpuShare`` each worker's fraction of
    a GPU (:func:`job_share` of ``share_memory``, the smallest lendable GPU's memory)."""
    out = _planner_job(job, None, state_bytes, seconds_to_safe_point, class_priority, device_memory)
    share = job_share(job.spec, share_memory)
    return replace(out, share=share) if share > 0 else out


def role_planner_jobs(
    job: ElasticRLJob, observed: list[ObservedWorker], class_priority: int = 0, device_memory: int | None = None
) -> list[Job]:
    """The planner's jobs of an ElasticRLJob with ``spec.roles``: ``<key>#trainer`` (min = max, a
    fixed gang; left out when its placement is Dedicated: never planned) and ``<key>#rollout``
    (requires the lent trainer; its reclaim by removal when ``reclaim: Remove``). Each role's
    costs come from its own workers' reports; ``class_priority`` is the whole job's (its lowest),
    so the job's rollouts are always cheaper than its trainer."""
    out = []
    for role in ("trainer", "rollout"):
        if dedicated(job, role):
            continue
        rep = workload_report([w for w in observed if w.role == role], job.spec, device_memory)
        out.append(
            _planner_job(job, role, rep.state_bytes, rep.seconds_to_safe_point or 0.0, class_priority, device_memory)
        )
    return out


def _planner_job(
    job: ElasticRLJob,
    role: Role | None,
    state_bytes: int | None,
    seconds_to_safe_point: float,
    class_priority: int,
    device_memory: int | None,
) -> Job:
    s = job.spec
    size = min(
        state_bytes if state_bytes is not None else (s.role_state_bytes(role) or 0),
        state_bytes_bound(s, device_memory, role),
    )
    seconds_to_safe_point = min(max(0.0, seconds_to_safe_point), float(s.graceful_shutdown_period))
    shrunk = job.status.last_shrink_time if job.status is not None else None
    gpw = s.role_gpus_per_worker(role)
    key = f"{job.namespace}/{job.name}"
    lo, hi, requires, remove = s.min_gpus_total, s.max_gpus_total, None, False
    if s.roles is not None and role == "trainer":
        lo = hi = s.roles.trainer.workers * gpw
    elif s.roles is not None:
        lo, hi = s.roles.rollout.min_workers * gpw, s.roles.rollout.max_workers * gpw
        requires = None if dedicated(job, "trainer") else role_key(key, "trainer")
        remove = s.roles.rollout.reclaim == "Remove"
    return Job(
        key=role_key(key, role),
        min_gpus=lo,
        max_gpus=hi,
        gpus_per_worker=gpw,
        priority=s.priority,
        state_bytes=size,
        seconds_to_safe_point=seconds_to_safe_point,
        grace_s=float(s.graceful_shutdown_period),
        suspend_s=size / PCIE_BYTES_PER_SECOND,
        min_useful_run_s=float(s.min_useful_run_seconds),
        last_shrink_at=shrunk.timestamp() if shrunk is not None else None,
        class_priority=class_priority,
        role=role,
        requires=requires,
        remove_on_shrink=remove,
    )


def class_priority(observed: list[ObservedWorker]) -> int:
    """The job's priority among tenants: the lowest ``spec.priority`` of its live pods, which the
    API server's Priority admission sets from the PriorityClass (a pod cannot choose the number;
    which classes a namespace may use is the cluster admin's ResourceQuota / policy). 0 when no pod
    says (a job without pods has nothing to reclaim)."""
    known = [w.pod_priority for w in observed if not w.lost and w.pod_priority is not None]
    return min(known) if known else 0


def observe(job: str, pod: dict[str, Any], node_pool: str | None = None) -> ObservedWorker | None:
    """The worker a Pod is, or None when the pod is not one of ``job``'s workers by name.

    ``node_pool`` is the pool label of the pod's node, for a pod the planner did not pin."""
    meta = pod.get("metadata") or {}
    parsed = worker_role_index(job, str(meta.get("name", "")))
    if parsed is None or (meta.get("labels") or {}).get(names.LABEL_JOB) != job:
        return None
    role, index = parsed
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
        pod_priority=spec.get("priority") if isinstance(spec.get("priority"), int) else None,
        role=role,
        unschedulable_since=_unschedulable_since(pod),
        forecast_refused=_forecast_refused(pod),
        schedule_retry=ann.get(names.ANNOTATION_SCHEDULE_RETRY),
        claim=lent_claim(pod),
        fenced=names.ANNOTATION_FENCING_TOKEN in ann,
    )


def lent_claim(pod: dict[str, Any]) -> str | None:
    """The name of the worker's lent ResourceClaim: the shared claim it names, or the claim the
    API server generated from its template (``status.resourceClaimStatuses``); None before that."""
    for rc in (pod.get("spec") or {}).get("resourceClaims") or []:
        if rc.get("name") == CLAIM_NAME and rc.get("resourceClaimName"):
            return str(rc["resourceClaimName"])
    for st in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if st.get("name") == CLAIM_NAME and st.get("resourceClaimName"):
            return str(st["resourceClaimName"])
    return None


Device = tuple[str, str]  # (the driver's pool: its node, device name) as a claim's allocation names it


@dataclass(frozen=True)
class ServingBlock:
    """Serving holds the GPU a worker's lent claim is allocated on (:func:`serving_blocks`)."""

    where: str  # the claim, device and node, for the Events and the condition
    prepared: bool  # the claim is prepared there (it ran; the driver suspends it for serving), or unknown
    since: float = 0.0  # when the controller first saw it (epoch seconds)


def serving_blocks(
    w: ObservedWorker,
    allocation: tuple[Device, ...] | None,
    held: frozenset[Device],
    lent_gpus: frozenset[int] | None,
) -> ServingBlock | None:
    """Whether serving holds the GPU of the worker's claim (pure): the claim is allocated
    (``allocation``, from its ``status.allocation``) on a device whose ResourceSlice entry carries
    the ``rose.io/serving-holds`` taint (``held``: the driver publishes it from serving's allocation
    on, and only the driver writes its slices). Such a worker holds no lendable GPU until serving
    leaves, whatever its pod says. ``prepared``: the GPU is among the node's prepared lent GPUs the
    driver publishes (``rose.io/lent-gpus``, ``lent_gpus``; None: the node publishes none, counted
    as prepared so nothing is judged never-run): a claim prepared before serving came is suspended
    by the driver inside serving's prepare; one never prepared is refused at prepare for as long as
    serving stays (``LentPrepareRefused``)."""
    if w.lost or not w.node or allocation is None:
        return None
    for pool, device in allocation:
        if (pool, device) not in held or pool != w.node:
            continue
        try:
            index = slices.parse_device_name(device)[0]
        except ValueError:
            continue
        prepared = lent_gpus is None or index in lent_gpus
        state = "prepared there: suspended for serving" if prepared else "never prepared there"
        return ServingBlock(f"claim {w.claim} on {device} of {pool}, held by serving ({state})", prepared)
    return None


def with_serving(
    observed: list[ObservedWorker], blocked: dict[str, ServingBlock], grouped: bool, now: float, grace_s: float
) -> list[ObservedWorker]:
    """The workers with what serving blocks (pure; ``blocked``: pod UID → its block, ``since`` the
    first time it was seen). Each such worker waits (``serving_held``: the planner's ``waiting``,
    the status's suspended). One of its own claim (not ``grouped``: a time-slice group's shared
    claim would go from every member, with the suspended members' state) whose claim was never
    prepared there, that never ran (:attr:`ObservedWorker.ran`), blocked for ``grace_s`` (the driver
    republishes its prepared GPUs every few seconds: a claim prepared just before serving came may
    not show yet) is replaced (``replace_blocked``: deleted by UID, recreated, and the scheduler's
    DRA filter skips the tainted device); one that ran is never deleted."""
    out = []
    for w in observed:
        b = blocked.get(w.uid)
        if b is None:
            out.append(w)
            continue
        replace_it = not grouped and not b.prepared and not w.ran and now - b.since >= grace_s
        out.append(replace(w, serving_held=b.where, replace_blocked=replace_it))
    return out


def _unschedulable(pod: dict[str, Any]) -> dict[str, Any] | None:
    """kube-scheduler's PodScheduled=False condition with reason Unschedulable, if the pod has one."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
            return dict(c)
    return None


def _unschedulable_since(pod: dict[str, Any]) -> str | None:
    c = _unschedulable(pod)
    return None if c is None else str(c.get("lastTransitionTime") or "") or None


def _forecast_refused(pod: dict[str, Any]) -> bool:
    """The Unschedulable condition names the ROSE extender's serving-forecast refusal (its filter
    reason, copied into the message for the nodes it failed)."""
    c = _unschedulable(pod)
    return c is not None and extender_names.REFUSAL_SERVING_FORECAST in str(c.get("message") or "")


def refused_since(w: ObservedWorker) -> float | None:
    """Since when (epoch s) the scheduler has kept an unbound worker Unschedulable with the extender's
    serving-forecast refusal (the condition's lastTransitionTime); None when it does not, or unreadable."""
    if w.node or not w.forecast_refused or not w.unschedulable_since:
        return None
    since = _parse_time(w.unschedulable_since)
    return None if since is None else since.timestamp()


def schedule_retries(observed: list[ObservedWorker], now: dt.datetime, after_s: float) -> list[ObservedWorker]:
    """The workers to nudge back into kube-scheduler's queue (pure): unbound, not being deleted,
    Unschedulable for at least ``after_s`` and not nudged within the last ``after_s``. A pod an
    extender refused (a stale forecast, an extender restart) waits in the scheduler's
    unschedulable queue until some cluster event or the scheduler's 5-minute flush; an update of
    the pod itself re-queues it at once. Bounded: one update per pod per ``after_s``."""
    out: list[ObservedWorker] = []
    for w in observed:
        if w.node or w.deleting or w.unschedulable_since is None:
            continue
        since = _parse_time(w.unschedulable_since)
        last = _parse_time(w.schedule_retry) if w.schedule_retry else None
        if since is None or (now - since).total_seconds() < after_s:
            continue
        if last is not None and (now - last).total_seconds() < after_s:
            continue
        out.append(w)
    return out


def _parse_time(raw: str) -> dt.datetime | None:
    try:
        return parse_rfc3339(raw)
    except ValueError:
        return None


def _phase(raw: str | None) -> str | None:
    return raw if raw is not None and _PHASE_RE.match(raw) else None


def _int(raw: str | None) -> int | None:
    v = _number(raw)
    return int(v) if v is not None and v == int(v) else None


def planner_state(w: ObservedWorker) -> WorkerState:
    if w.suspend_state == SUSPENDED or w.serving_held:  # serving holds its GPU: it runs nowhere
        return "suspended"
    if w.request_by is not None or w.suspend_state == SUSPENDING:
        return "suspending"
    if w.suspend_state == RESUMING:
        return "resuming"
    return "active" if w.phase == "Running" else "pending"


def holding_state(w: ObservedWorker) -> WorkerState:
    """The state the planner counts a worker in: :func:`planner_state`, except that
    ``rose.io/suspend-state`` alone never releases a GPU. The driver suspends an occupant only
    when asked (a ``rose.io/suspend-request``, by this controller, the extender or the time-slice
    orchestrator) or when a serving claim is prepared on its GPU; the pod annotation is all the
    API server shows of either, and a tenant may write it on its own pod (issue 22 §6). So a
    worker with no request counts as holding its GPU whatever the annotation says: a forged
    ``Suspended`` cannot make the planner lend that GPU twice or skip its reclaim. The price is
    conservative: a worker the driver suspended for a serving pod (no request) counts as lent
    until the serving pod leaves, so the planner may give back one GPU more than needed."""
    if w.serving_held:  # from the API server's slices, claims and node facts: not the pod's to forge
        return "waiting"
    state = planner_state(w)
    if w.request_by is None and state in ("suspended", "suspending"):
        return "active" if w.phase == "Running" else "pending"
    return state


def handed(w: ObservedWorker, grouped: bool) -> bool:
    """Whether ``w``, a worker of a job in a time-slice group (``grouped``), is suspended by its
    orchestrator's hand-over (its ``rose.io/suspend-request`` is the orchestrator's) on a shared
    claim serving does not hold (pure): the group still holds that GPU (planner ``Worker.handed``).
    A forged owner on a pod only makes the planner count one GPU more as lent (conservative)."""
    return grouped and w.request_by == names.SUSPEND_BY_TIMESLICE and w.claim is not None and not w.serving_held


def to_planner(job_key: str, w: ObservedWorker, grouped: bool = False) -> Worker | None:
    """The planner's view (:func:`holding_state`); a lost worker holds nothing and is not planned for.
    Its lent claim (``namespace/name``) lets the planner count a time-slice group's shared claim once
    among the GPUs taken for new workers (``rose_common.lending``); a member of a time-slice group
    (``grouped``) parked by its orchestrator's hand-over is marked :func:`handed`."""
    if w.lost:
        return None
    claim = f"{job_key.partition('/')[0]}/{w.claim}" if w.claim else None
    state = holding_state(w)
    bound = state != "pending" or bool(w.node)
    refused = None if bound else refused_since(w)
    return Worker(w.name, role_key(job_key, w.role), state, w.pool, claim, bound=bound, handed=handed(w, grouped),
                  refused_since=refused)  # fmt: skip

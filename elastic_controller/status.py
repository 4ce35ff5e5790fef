"""The ElasticRLJob status: phase, counts, conditions, and an Event for every transition.

I/O boundary: none. :func:`compute_status` is a pure function of the job, its observed workers,
the planner's target, the previous status and ``now``. A condition keeps its
``lastTransitionTime`` unless its status changes; ``suspendCount`` counts whole-gang suspends
(a gang stays ``Suspended`` while it resumes, so a resume that fails is not counted as another);
``totalSuspendedSeconds`` grows by each suspended stretch when the job leaves ``Suspended``;
``workloadPhase``, ``secondsToSafePoint``, ``stateBytes``, ``minGPUsPerWorker`` and
``minHostMemoryBytes`` are the workers' reports combined
(:func:`~elastic_controller.observe.workload_report`), absent until a worker reports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from elastic_controller.observe import ObservedWorker, planner_state, workload_report
from elastic_controller.planner import JobTarget
from rose_common.elasticrljob import Condition, ConditionType, ElasticRLJob, ElasticRLJobStatus, Phase


@dataclass(frozen=True)
class EventSpec:
    reason: str
    message: str
    type: str = "Normal"  # or "Warning"


@dataclass(frozen=True)
class _Counts:
    active: int
    suspended: int
    suspending: int
    resuming: int
    lost: int


def _gpus(job: ElasticRLJob, observed: list[ObservedWorker], state: str) -> int:
    """GPUs of the job's live workers in ``state``, each by its role's ``gpusPerWorker``."""
    return sum(job.spec.role_gpus_per_worker(w.role) for w in observed if not w.lost and planner_state(w) == state)


def _dedicated_gpus(job: ElasticRLJob) -> int:
    r = job.spec.roles
    return r.trainer.workers * r.trainer.gpus_per_worker if r is not None and r.trainer.placement == "Dedicated" else 0


def _roles_status(
    job: ElasticRLJob, observed: list[ObservedWorker], target: JobTarget | None, prev: ElasticRLJobStatus
) -> dict[str, Any] | None:
    """``status.roles`` of a job with roles: per role, the workers the plan holds (a dedicated
    trainer: all of them), the active and the suspended ones."""
    roles = job.spec.roles
    if roles is None:
        return None
    wanted = dict(target.role_workers) if target is not None else {}
    out: dict[str, Any] = {}
    for role in ("trainer", "rollout"):
        mine = [planner_state(w) for w in observed if w.role == role and not w.lost]
        before = getattr(prev.roles, role, None) if prev.roles is not None else None
        if role == "trainer" and roles.trainer.placement == "Dedicated":
            desired_workers = roles.trainer.workers
        else:
            desired_workers = wanted.get(role, before.desired_workers if before is not None else None) or 0
        out[role] = {
            "desiredWorkers": desired_workers,
            "activeWorkers": mine.count("active"),
            "suspendedWorkers": mine.count("suspended"),
        }
    return out


def _count(observed: list[ObservedWorker]) -> _Counts:
    live = [w for w in observed if not w.lost]
    states = [planner_state(w) for w in live]
    return _Counts(
        states.count("active"),
        states.count("suspended"),
        states.count("suspending"),
        states.count("resuming"),
        len(observed) - len(live),
    )


def _phase(job: ElasticRLJob, c: _Counts, target_gpus: int, active_gpus: int) -> Phase:
    if c.resuming:
        return "Resuming"
    if c.active == 0 and c.suspending:
        return "Suspending"
    if c.active == 0 and c.suspended:
        return "Suspended"
    if c.active == 0 and target_gpus == 0:
        return "Pending"
    return "Running" if active_gpus == target_gpus else "Scaling"


def _suspended(c: _Counts, was_suspended: bool) -> tuple[bool, str]:
    """The ``Suspended`` condition: no worker active and some suspended; a gang that was suspended
    stays so while its workers are resuming, until one is active again. A resume the driver
    attempts and fails (``ResumeFailed``: it writes ``Resuming``, then ``Suspended`` again; its repair
    loop retries every few seconds) is not a new suspend: each such attempt counted one in
    ``suspendCount`` and made a ``NotSuspended``/``Suspended`` Event pair (soak T5, 29 "suspends")."""
    parked = c.suspended + (c.resuming if was_suspended else 0)
    message = f"{c.suspended} workers suspended in host memory"
    if was_suspended and c.resuming:
        message += f", {c.resuming} resuming"
    return c.active == 0 and parked > 0, message


def _wanted(
    c: _Counts, phase: Phase, target_gpus: int, active: int, share: float = 0.0, was_suspended: bool = False
) -> dict[ConditionType, tuple[bool, str]]:
    if share > 0:  # a job of GPU shares: counted in workers, each holding a share
        each = f"workers with a {share:g} GPU share each"
        ready, scaling = (
            f"{active} of {target_gpus} target {each} active",
            f"{active} {each} active, target {target_gpus}",
        )
    else:
        ready, scaling = f"{active} of {target_gpus} target GPUs active", f"{active} GPUs active, target {target_gpus}"
    return {
        "Ready": (phase == "Running", ready),
        "Scaling": (active != target_gpus, scaling),
        "Suspended": _suspended(c, was_suspended),
        "Degraded": (c.lost > 0, f"{c.lost} workers lost (failed, evicted or deleted); they are recreated"),
    }


def _conditions(
    prev: list[Condition], wanted: dict[ConditionType, tuple[bool, str]], gen: int, now: datetime
) -> tuple[list[Condition], list[EventSpec]]:
    old = {c.type: c for c in prev}
    out: list[Condition] = []
    events: list[EventSpec] = []
    for kind, (true, message) in wanted.items():
        status = "True" if true else "False"
        before = old.get(kind)
        changed = before is None or before.status != status
        since = now if changed or before is None else before.last_transition_time
        out.append(
            Condition.model_validate(
                {
                    "type": kind,
                    "status": status,
                    "reason": kind if true else f"Not{kind}",
                    "message": message,
                    "lastTransitionTime": since,
                    "observedGeneration": gen,
                }
            )
        )
        if changed and (before is not None or true):
            warn = kind in ("Degraded", SERVING_HOLDS) and true
            events.append(EventSpec(kind if true else f"Not{kind}", message, "Warning" if warn else "Normal"))
    return out, events


@dataclass(frozen=True)
class _Shares:
    share: float  # each worker's fraction of a GPU, as planned (0: not planned yet)
    active: float  # the fractions the active workers hold
    target: float  # the fractions the plan wants active

    @property
    def target_workers(self) -> int:
        return round(self.target / self.share) if self.share > 0 else 0

    def fields(self) -> dict[str, float]:
        return {"gpuShare": self.share, "activeShareGPUs": self.active, "targetShareGPUs": self.target}


def _share_status(job: ElasticRLJob, c: _Counts, target: JobTarget | None, prev: ElasticRLJobStatus) -> _Shares | None:
    """A job with ``spec.gpuShare``: its share per worker and the fractions held and wanted (the
    planner's; before its first target, the last status's)."""
    if job.spec.gpu_share is None:
        return None
    share = target.share if target is not None and target.share > 0 else (prev.gpu_share or 0.0)
    wanted = target.active_share if target is not None else (prev.target_share_gpus or 0.0)
    return _Shares(share, round(share * c.active, 6), round(wanted, 6))


def _was(prev: ElasticRLJobStatus, kind: ConditionType) -> Condition | None:
    return next((c for c in prev.conditions or [] if c.type == kind and c.status == "True"), None)


SERVING_HOLDS: Final[ConditionType] = "ServingHoldsGPU"


def _serving_holds(observed: list[ObservedWorker]) -> tuple[bool, str]:
    """The ``ServingHoldsGPU`` condition (shown once it has been True): workers whose lent claim is
    allocated on a GPU serving holds, never prepared there (``observe.serving_blocks``). A
    time-slice group's waits for serving to leave; a worker of its own claim that never ran is
    recreated elsewhere."""
    held = [w for w in observed if w.serving_held and not w.deleting]
    if not held:
        return False, "no worker's claim is on a GPU serving holds"
    parts = [
        f"{w.name}: {w.serving_held}; {'recreated elsewhere' if w.replace_blocked else 'waits until serving leaves'}"
        for w in sorted(held, key=lambda w: w.name)
    ]
    return True, "; ".join(parts)


def compute_status(
    job: ElasticRLJob,
    observed: list[ObservedWorker],
    target: JobTarget | None,
    prev: ElasticRLJobStatus | None,
    now: datetime,
) -> tuple[ElasticRLJobStatus, list[EventSpec]]:
    """The next status and the Events of its transitions."""
    prev = prev or ElasticRLJobStatus()
    c = _count(observed)
    active_gpus, suspended_gpus = _gpus(job, observed, "active"), _gpus(job, observed, "suspended")
    # a dedicated trainer is not planned: its GPUs are wanted whatever the plan says
    target_gpus = target.active_gpus + _dedicated_gpus(job) if target is not None else (prev.target_gpus or 0)
    roles = _roles_status(job, observed, target, prev)
    shares = _share_status(job, c, target, prev)
    # a job of GPU shares holds no whole GPU: its phase and conditions count workers
    active, wanted = (c.active, shares.target_workers) if shares is not None else (active_gpus, target_gpus)
    if shares is not None:
        active_gpus = suspended_gpus = target_gpus = 0
    phase = _phase(job, c, wanted, active)
    was_suspended = _was(prev, "Suspended")
    want = _wanted(c, phase, wanted, active, shares.share if shares is not None else 0.0, was_suspended is not None)
    held = _serving_holds(observed)
    if held[0] or any(x.type == SERVING_HOLDS for x in prev.conditions or []):
        want[SERVING_HOLDS] = held
    conditions, events = _conditions(prev.conditions or [], want, job.generation, now)
    is_suspended = any(x.type == "Suspended" and x.status == "True" for x in conditions)
    total = prev.total_suspended_seconds or 0.0
    if was_suspended is not None and not is_suspended and was_suspended.last_transition_time is not None:
        total += max(0.0, (now - was_suspended.last_transition_time).total_seconds())
    count = (prev.suspend_count or 0) + (1 if is_suspended and was_suspended is None else 0)
    if prev.phase != phase:
        events.insert(0, EventSpec(phase, f"phase {prev.phase or 'None'} -> {phase}"))
    shrink = now if target is not None and target.shrinks else prev.last_shrink_time
    rep = workload_report(observed, job.spec)  # bounded by what the spec justifies
    status = ElasticRLJobStatus.model_validate(
        {
            "phase": phase,
            "activeWorkers": c.active,
            "suspendedWorkers": c.suspended,
            "activeGPUs": active_gpus,
            "suspendedGPUs": suspended_gpus,
            "targetGPUs": target_gpus,
            "lastSafePoint": prev.last_safe_point,
            "lastShrinkTime": shrink,
            "suspendCount": count,
            "totalSuspendedSeconds": total,
            "observedGeneration": job.generation,
            "conditions": conditions,
            "workloadPhase": rep.phase,
            "secondsToSafePoint": rep.seconds_to_safe_point,
            "stateBytes": rep.state_bytes,
            "minGPUsPerWorker": rep.min_gpus,
            "minHostMemoryBytes": rep.min_host_memory_bytes,
            "roles": roles,
            **(shares.fields() if shares is not None else {}),
        }
    )
    return status, events

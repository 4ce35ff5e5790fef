"""The ElasticRLJob controller: informer caches, a keyed work queue, the plan loop, leader election.

I/O boundary: none of its own. The API server is reached only through ``kube.py`` (passed in
as a ``JobApi``, an inventory callable and a lease lock); forecasts through a
:class:`rose_common.forecast_client.ForecastCache`; the clock is an argument. The decisions are
the pure modules': ``planner.plan`` (targets), ``desired.desired`` (actions), ``leader.decide``
(the lease); ``reconciler.converge`` carries actions out.

- **Caches.** The informers' handlers keep the jobs and each job's worker pods (selected by
  label on the server), each pod also as the worker it is (``observe.observe``, once per event),
  and queue the job's key ``namespace/name`` on every change. A job is validated into its model
  once per object the informer delivers.
- **Reconcile** (level-triggered, one worker per key at a time): observe the job's pods, take
  the planner's pending target for the job (once: a target is a set of one-shot actions), compute
  the desired state and converge; a failed action requeues the key with backoff. The status is
  written under the resourceVersion of the job it was computed from; a refusal (the informer's
  copy was stale) stops the pass, puts the target back, counts
  ``rose_controller_status_conflicts_total`` and requeues the key.
- **Plan loop** every ``plan_interval_s``: the pools' capacities and forecasts, every job and
  worker → :func:`elastic_controller.planner.plan`; each job's target is stored, its
  ``status.targetGPUs`` written through the reconcile; the job is queued when its target differs
  from the one last queued, and every job once per ``resync_s`` (level-triggered). A job whose last
  creates or deletes the informer has not yet shown is left out of that round's targets
  (its pods would be planned twice).
- **Stale forecasts freeze lending.** A pool without a fresh forecast (the cache's max age
  passed, the predictor unreachable or refusing) is planned ``frozen``: no grants and no planned
  reclaims there; serving still wins at the driver's prepare. ``rose_controller_forecast_stale{pool}``
  is 1 meanwhile, and each job with workers in the pool gets a Warning Event ``ForecastStale``
  when it freezes (``ForecastFresh`` when it thaws). Reclaiming everything instead would hand
  any client that can starve the predictor every lent GPU of the cluster (issue 22 §5).
- **Planner off** (``ControllerSettings.planned = False``, ``--planner=off``): reactive only,
  the comparison baseline. The planner's reclaims are dropped from the targets
  (:func:`without_reclaims`); grow, resume, ``maxGPUs`` and whole-gang rules stay. GPUs go back
  only when serving arrives: the driver suspends the occupant inside the serving claim's prepare.
- **Leader election.** Only the replica holding the Lease reconciles and plans; it stops as soon
  as a renewal fails.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol

from pydantic import ValidationError

from elastic_controller import leader, pools, taints
from elastic_controller.desired import Desired, PodRef, desired
from elastic_controller.metrics import PHASES, ControllerMetrics
from elastic_controller.observe import (
    EVICTED,
    ObservedWorker,
    ServingBlock,
    class_priority,
    observe,
    planner_job,
    planner_state,
    role_planner_jobs,
    role_world_updates,
    schedule_retries,
    serving_blocks,
    to_planner,
    with_serving,
    workload_report,
)
from elastic_controller.planner import (
    ROLE_SEP,
    Forecast,
    Job,
    JobTarget,
    Plan,
    PlanInput,
    Pool,
    Settings,
    Worker,
    merge_roles,
    plan,
    role_key,
    without_reclaims,
)
from elastic_controller.reconciler import Failure, JobApi, RunAll, converge, run_serially
from elastic_controller.status import EventSpec
from elastic_controller.workers import CONTROLLER, claim_template_name
from rose_common import names
from rose_common.elasticrljob import ElasticRLJob
from rose_common.informer import ADDED, DELETED
from rose_common.kube import objects
from rose_common.timefmt import rfc3339
from rose_common.timeslice_lease import GroupLease
from rose_common.workqueue import WorkQueue

log = logging.getLogger("elastic_controller")

Inventory = Callable[[], Mapping[str, int]]  # physical GPUs per pool


class ControllerApi(JobApi, Protocol):
    def delete_claim_template(self, namespace: str, name: str, owner_uid: str) -> None: ...
    def annotate_pod(self, namespace: str, pod: PodRef, annotations: dict[str, str]) -> None: ...


class TaintRuleApi(Protocol):
    """The DeviceTaintRules the controller owns (``kube.KubeTaintRules``)."""

    def list(self) -> list[dict[str, Any]]: ...
    def create(self, body: dict[str, Any]) -> None: ...
    def delete(self, name: str) -> None: ...


class Forecasts(Protocol):
    def get(self, pool: str) -> Forecast | None: ...


class Lease(Protocol):
    def get(self) -> tuple[leader.LeaseRecord | None, str]: ...
    def write(self, record: leader.LeaseRecord, resource_version: str) -> bool: ...


@dataclass(frozen=True)
class ControllerSettings:
    plan_interval_s: float = 10.0
    dwell_s: float = 300.0
    expectation_timeout_s: float = 30.0
    identity: str = CONTROLLER
    lease_duration_s: int = 15
    lease_renew_s: float = 5.0
    planned: bool = True  # False: reactive only, the planner's reclaims are dropped
    resync_s: float = 30.0  # every job queued at least this often, its target changed or not
    write_concurrency: int = 1  # API calls of one reconcile's group in flight together (all reconciles)
    # The planner's intent as device taints (issue 27 §2, elastic_controller/taints.py): a pool whose
    # forecast leaves nothing to lend within this lead (and its occupants' own) gets its lendable
    # devices tainted NoSchedule. < 0: off.
    taint_lead_s: float = 60.0
    # a worker pod Unschedulable this long is nudged back into kube-scheduler's queue (observe.schedule_retries)
    schedule_retry_s: float = 15.0
    # a granted worker the scheduler keeps refusing for serving's forecast (the extender's reason in its
    # PodScheduled condition) this long is removed, and its job gets no new worker in that pool for the
    # cool-down (planner._refused; issue 25, group soak g7)
    refused_after_s: float = 60.0
    refused_cooldown_s: float = 300.0
    # a worker of its own claim blocked by serving this long (and that never ran) is replaced
    # (observe.with_serving): the driver republishes its prepared GPUs every 5 s
    blocked_grace_s: float = 15.0

    def __post_init__(self) -> None:
        if self.plan_interval_s <= 0:
            raise ValueError(f"plan interval must be > 0 seconds, got {self.plan_interval_s}")
        if self.write_concurrency < 1:
            raise ValueError(f"write concurrency must be >= 1, got {self.write_concurrency}")
        if self.resync_s <= 0:
            raise ValueError(f"resync period must be > 0 seconds, got {self.resync_s}")
        if self.refused_after_s <= 0 or self.refused_cooldown_s < 0:
            raise ValueError(
                "--refused-after must be > 0 and --refused-cooldown >= 0 seconds, got "
                f"{self.refused_after_s} and {self.refused_cooldown_s}"
            )
        if not 0 < self.lease_renew_s < self.lease_duration_s:
            raise ValueError(
                "lease renew period must be > 0 and shorter than the lease duration "
                f"({self.lease_renew_s} vs {self.lease_duration_s} s)"
            )


@dataclass
class _Expect:
    present: set[str] = field(default_factory=set)  # pod names created, not yet seen
    gone: set[str] = field(default_factory=set)  # pod UIDs deleted, still seen alive
    deadline: float = 0.0


def _job_key(obj: dict[str, Any]) -> str:
    return f"{objects.namespace(obj)}/{objects.name(obj)}"


def _uids(observed: list[ObservedWorker]) -> frozenset[str]:
    return frozenset(w.uid for w in observed)


def _pod_job_key(pod: dict[str, Any]) -> str | None:
    job = objects.labels(pod).get(names.LABEL_JOB)
    return f"{objects.namespace(pod)}/{job}" if job else None


def _observe(key: str, pod: dict[str, Any]) -> ObservedWorker | None:
    return observe(key.partition("/")[2], pod)


def reclaim_kind(old: dict[str, Any] | None, new: dict[str, Any]) -> str | None:
    """``unplanned`` when another owner's suspend request appears (not the time-slice orchestrator's
    hand-over), ``fallback`` when the driver reports a checkpoint-and-evict; None otherwise (pure)."""
    ann, before = objects.annotations(new), objects.annotations(old)
    state = ann.get(names.ANNOTATION_SUSPEND_STATE)
    if state == EVICTED and before.get(names.ANNOTATION_SUSPEND_STATE) != EVICTED:
        return "fallback"
    req = ann.get(names.ANNOTATION_SUSPEND_REQUEST)
    if req is not None and req != before.get(names.ANNOTATION_SUSPEND_REQUEST) and f'"{CONTROLLER}"' not in req:
        token = names.ANNOTATION_FENCING_TOKEN
        if ann.get(token) is not None and ann.get(token) != before.get(token):
            return None  # a time-slice hand-over (it writes a newer fencing token with its request): not a reclaim
        return "unplanned"
    return None


def _attempt(call: Callable[[], None]) -> Exception | None:
    return run_serially([call])[0]


class ParallelCalls:
    """A :data:`~elastic_controller.reconciler.RunAll` on one pool of ``threads`` shared by every
    reconcile: a job's suspend requests (and its creates, deletes, world annotations) are in
    flight together, and all reconciles together never have more than ``threads`` of them. One
    after another, 200 jobs' requests took 15 s after a forecast change
    (``benchmarks/controller_scale.py``)."""

    def __init__(self, threads: int) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="api-writes")

    def __call__(self, calls: list[Callable[[], None]]) -> list[Exception | None]:
        if len(calls) < 2:
            return run_serially(calls)
        futures: list[Future[Exception | None]] = []
        for i, call in enumerate(calls):
            try:
                futures.append(self._pool.submit(_attempt, call))
            except RuntimeError:  # the interpreter is exiting (the pool takes no more): the rest in this thread
                return [f.result() for f in futures] + run_serially(calls[i:])
        return [f.result() for f in futures]


class Controller:
    def __init__(
        self,
        api: ControllerApi,
        forecasts: Forecasts,
        inventory: Inventory,
        metrics: ControllerMetrics,
        settings: ControllerSettings | None = None,
        lease: Lease | None = None,
        clock: Callable[[], dt.datetime] | None = None,
    ) -> None:
        self.api = api
        self.forecasts = forecasts
        self.inventory = inventory
        self.metrics = metrics
        self.settings = settings or ControllerSettings()
        self.lease = lease
        self._clock = clock or (lambda: dt.datetime.now(dt.UTC))
        self.queue: WorkQueue[str] = WorkQueue("elasticrljobs")
        self._lock = threading.Lock()
        self._jobs: dict[str, dict[str, Any]] = {}
        self._pods: dict[str, dict[str, dict[str, Any]]] = {}
        # job key → (the planner's target, the UIDs of the workers it was planned for)
        self._targets: dict[str, tuple[JobTarget, frozenset[str]]] = {}
        self._cooldowns: dict[tuple[str, str], float] = {}  # (planner job key, pool) → until (planner._refused)
        self._expect: dict[str, _Expect] = {}
        self._deleted: dict[str, str] = {}  # job key → UID of the job deleted, until its pods are gone
        self._bad: dict[str, str] = {}  # job key → the resourceVersion already reported invalid
        self._workers: dict[str, dict[str, ObservedWorker | None]] = {}  # job key → pod name → observe()
        self._parsed: dict[str, tuple[dict[str, Any], ElasticRLJob]] = {}  # job key → (raw, model)
        self._queued_targets: dict[str, JobTarget] = {}  # job key → the target last queued
        self._next_resync = 0.0  # monotonic time of the next plan round that queues every job
        w = self.settings.write_concurrency
        self._run: RunAll = ParallelCalls(w) if w > 1 else run_serially
        self.is_leader = lease is None
        self.stop = threading.Event()
        self.last_plan: Plan | None = None
        self.group_lease: Callable[[str, str], GroupLease | None] = lambda group, ns: None  # kube.GroupLeases.get
        self._stale: set[str] = set()  # pools planned frozen last round (no fresh forecast)
        self._role_series: set[tuple[str, str]] = set()  # (job, role) with rose_controller_role_workers series
        self.device_memory: Callable[[], int | None] = lambda: None  # kube.InventoryStore.device_memory
        # kube.InventoryStore.smallest_device_memory: a GPU share's memory fraction is of it
        self.share_memory: Callable[[], int | None] = lambda: None
        # the planner's intent as device taints (issue 27 §2): None, or settings.taint_lead_s < 0: off
        self.taint_rules: TaintRuleApi | None = None
        self.lendable_devices: Callable[[], dict[str, list[tuple[str, str]]]] = dict  # kube.InventoryStore's
        self._tainted: dict[str, bool] = {}  # pool → tainted, as last decided (log and metric on change)
        # what serving blocks (observe.serving_blocks): the API server's slices, claims and node facts
        self.serving_held: Callable[[], frozenset[tuple[str, str]]] = frozenset  # kube.InventoryStore's
        self.lent_gpus: Callable[[str], frozenset[int] | None] = lambda node: None  # kube.InventoryStore's
        self.claims: Callable[[str, str], tuple[tuple[str, str], ...] | None] | None = None  # ClaimAllocations.get
        self._blocked: dict[str, ServingBlock] = {}  # pod UID → where serving holds its claim's GPU, since when
        self._replaced: dict[str, None] = {}  # UIDs of blocked workers deleted (counted once), oldest first
        metrics.leader.set(1 if self.is_leader else 0)
        metrics.queue_depth.set_function(lambda: len(self.queue))
        metrics.queue_idle.set_function(lambda: 1 if self.queue.idle() else 0)

    # ------------------------------------------------------------------ informer handlers
    def on_job_list(self, items: list[dict[str, Any]]) -> None:
        with self._lock:
            old = self._jobs
            self._jobs = {_job_key(o): o for o in items}
            for key in set(old) - set(self._jobs):
                self._deleted[key] = objects.uid(old[key])
        for key in set(old) | set(self._jobs):
            self.queue.add(key)

    def on_job_event(self, event_type: str, obj: dict[str, Any]) -> None:
        key = _job_key(obj)
        with self._lock:
            if event_type == DELETED:
                self._jobs.pop(key, None)
                self._targets.pop(key, None)
                self._parsed.pop(key, None)
                self._deleted[key] = objects.uid(obj)
            else:
                self._jobs[key] = obj
                self._deleted.pop(key, None)
        self.queue.add(key)

    def on_pod_list(self, items: list[dict[str, Any]]) -> None:
        by_job: dict[str, dict[str, dict[str, Any]]] = {}
        workers: dict[str, dict[str, ObservedWorker | None]] = {}
        for pod in items:
            key = _pod_job_key(pod)
            if key is not None:
                by_job.setdefault(key, {})[objects.name(pod)] = pod
                workers.setdefault(key, {})[objects.name(pod)] = _observe(key, pod)
        with self._lock:
            old = set(self._pods)
            self._pods, self._workers = by_job, workers
            for key in list(self._expect):
                self._settle(key)
        for key in old | set(by_job):
            self.queue.add(key)

    def on_pod_event(self, event_type: str, pod: dict[str, Any]) -> None:
        key = _pod_job_key(pod)
        if key is None:
            return
        name = objects.name(pod)
        worker = _observe(key, pod) if event_type != DELETED else None
        with self._lock:
            pods, workers = self._pods.setdefault(key, {}), self._workers.setdefault(key, {})
            old = pods.get(name)
            if event_type == DELETED:
                pods.pop(name, None)
                workers.pop(name, None)
            else:
                pods[name], workers[name] = pod, worker
            self._settle(key)
        kind = reclaim_kind(old, pod) if event_type != DELETED else None
        if kind is not None:
            self.metrics.reclaims.labels(kind).inc()
        if event_type in (ADDED, DELETED) or old != pod:
            self.queue.add(key)

    def _settle(self, key: str) -> None:
        """Drop the job's expectation once the cache shows its creates and deletes (lock held)."""
        e = self._expect.get(key)
        if e is None:
            return
        pods = self._pods.get(key, {})
        e.present -= set(pods)
        alive = {objects.uid(p) for p in pods.values() if not objects.deleting(p)}
        e.gone &= alive
        if not e.present and not e.gone:
            del self._expect[key]

    def on_group_change(self, group: str) -> None:
        """A time-slice group's Lease changed: requeue its member jobs (their Resident condition)."""
        with self._lock:
            keys = [k for k, j in self._jobs.items() if objects.spec(j).get("timesliceGroup") == group]
        for key in keys:
            self.queue.add(key)

    # ------------------------------------------------------------------ reconcile
    def _snapshot(self, key: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        with self._lock:
            return self._jobs.get(key), list(self._pods.get(key, {}).values())

    def _observed(self, key: str) -> list[ObservedWorker]:
        """The job's workers as the informer handlers observed them (each pod once per event)."""
        with self._lock:
            return self._observed_locked(key)

    def _observed_locked(self, key: str) -> list[ObservedWorker]:
        out = [w for w in self._workers.get(key, {}).values() if w is not None]
        if not self._blocked or not out:
            return out
        grouped = objects.spec(self._jobs.get(key) or {}).get("timesliceGroup") is not None
        return with_serving(out, self._blocked, grouped, self._clock().timestamp(), self.settings.blocked_grace_s)

    def observe_serving(self) -> None:
        """Which workers serving blocks (``observe.serving_blocks``): only workers on a node where
        a lendable device is tainted ``rose.io/serving-holds`` have their claim read (cached), so a
        cluster where serving holds no lent GPU costs no request. A worker blocked since an earlier
        round keeps its first time (the grace of :func:`with_serving`)."""
        held = self.serving_held()
        nodes = {pool for pool, _ in held}
        now = self._clock().timestamp()
        with self._lock:
            workers = [
                (key, w)
                for key, ws in self._workers.items()
                for w in ws.values()
                if w is not None and w.node in nodes and w.claim and not w.lost
            ]
            before = dict(self._blocked)
        found: dict[str, ServingBlock] = {}
        for key, w in workers:
            try:
                allocation = self.claims(key.partition("/")[0], str(w.claim)) if self.claims is not None else None
            except Exception as e:  # judged again next round; a known block stays meanwhile
                log.warning("claim allocation not read", extra={"job": key, "claim": w.claim, "err": repr(e)})
                if w.uid in before:
                    found[w.uid] = before[w.uid]
                continue
            b = serving_blocks(w, allocation, held, self.lent_gpus(str(w.node)))
            if b is None:
                continue
            found[w.uid] = replace(b, since=before[w.uid].since if w.uid in before else now)
            if w.uid not in before:
                log.info("worker blocked by serving", extra={"job": key, "pod": w.name, "where": b.where})
        self.metrics.serving_held.set(len(found))
        with self._lock:
            self._blocked = found

    def _take_target(self, key: str, observed: list[ObservedWorker]) -> JobTarget | None:
        """The planner's pending target for the job, if it was planned for the workers observed now.
        A plan reads a snapshot; a reconcile that created or deleted workers after that snapshot
        (the planner and the work queue run in their own threads) left the target stale: applied,
        its adds came on top of the workers just created (a job of 2 got workers w2 and w3, and a
        time-slice group shared claims it never used). A stale target is dropped, counted and the
        next plan round, a second later, plans for the workers as they are."""
        with self._lock:
            stored = self._targets.pop(key, None)
        if stored is None:
            return None
        target, basis = stored
        if basis == _uids(observed):
            return target
        self.metrics.stale_targets.inc()
        log.info("planner target dropped: the workers changed since it was planned", extra={"job": key})
        return None

    def _parse(self, key: str, raw: dict[str, Any]) -> ElasticRLJob | None:
        """The job's model; validated once per object the informer delivers (not per plan round)."""
        cached = self._parsed.get(key)
        if cached is not None and cached[0] is raw:
            return cached[1]
        try:
            job = ElasticRLJob.model_validate(raw)
            self._parsed[key] = (raw, job)
            return job
        except ValidationError as e:
            rv = objects.resource_version(raw)
            if self._bad.get(key) != rv:
                self._bad[key] = rv
                log.warning("invalid elasticrljob skipped", extra={"job": key, "err": str(e)[:500]})
                self._warn_invalid(raw, e)
            return None

    def _warn_invalid(self, raw: dict[str, Any], err: ValidationError) -> None:
        """A Warning Event on a job the models refuse (once per resourceVersion), naming the fields."""
        if not self.is_leader:
            return
        fields = "; ".join(f"{'.'.join(str(x) for x in d['loc'])}: {d['msg']}" for d in err.errors()[:5])
        stub = ElasticRLJob.model_construct(metadata=dict(objects.meta(raw)))
        event = EventSpec("InvalidSpec", f"not reconciled until fixed: {fields}", "Warning")
        try:
            self.api.record_event(stub, event)
        except Exception as e:  # the log above already says it
            log.warning("event not recorded", extra={"job": _job_key(raw), "err": repr(e)})

    def reconcile(self, key: str) -> None:
        """One level-triggered pass over job ``key`` (the work queue's handler)."""
        if not self.is_leader:
            return
        raw, pods = self._snapshot(key)
        if raw is None:
            self._clean_up(key, pods)
            return
        if objects.deleting(raw):
            return  # the garbage collector removes what the job owns
        job = self._parse(key, raw)
        if job is None:
            return
        start = time.monotonic()
        observed = self._observed(key)
        target = self._take_target(key, observed)
        group = job.spec.timeslice_group
        d = desired(job, observed, target, self._clock(), self.group_lease(group, job.namespace) if group else None)
        failures = converge(self.api, job, d, self._run)
        if any(f.conflict for f in failures):
            self._on_status_conflict(key, job, target, observed)
            return
        self._count_replaced(key, observed, failures)
        failures += self._write_world(job, observed) + self._retry_unschedulable(job, observed)
        self._expect_changes(key, d)
        self.metrics.reconcile_latency.observe(time.monotonic() - start)
        if failures:
            self.metrics.reconciles.labels("error").inc()
            delay = self.queue.requeue(key)
            log.warning(
                "reconcile failed",
                extra={
                    "job": key,
                    "retryInSeconds": delay,
                    "err": "; ".join(f"{f.action} {f.target}: {f.error}" for f in failures)[:1000],
                },
            )
            return
        self.metrics.reconciles.labels("ok").inc()
        self.queue.forget(key)

    def _count_replaced(self, key: str, observed: list[ObservedWorker], failures: list[Failure]) -> None:
        """``rose_controller_blocked_workers_replaced_total``: workers serving blocked before they
        ran, whose delete went through (the planner adds them back)."""
        failed = {f.target for f in failures if f.action == "delete_pod"}
        for w in observed:
            if w.replace_blocked and not w.deleting and w.name not in failed and w.uid not in self._replaced:
                self._replaced[w.uid] = None
                while len(self._replaced) > 1024:  # the oldest first: a deleted pod's UID never comes back
                    del self._replaced[next(iter(self._replaced))]
                self.metrics.blocked_replaced.inc()
                log.info("blocked worker replaced", extra={"job": key, "pod": w.name, "where": w.serving_held})

    def _on_status_conflict(
        self, key: str, job: ElasticRLJob, target: JobTarget | None, observed: list[ObservedWorker]
    ) -> None:
        """The status was refused as computed from a stale view of the job (another write landed
        since the informer's copy): nothing else was done; the planner's target goes back unless a
        newer one came meanwhile, and the key is requeued with backoff (the informer's delivery
        of the newer job queues it sooner)."""
        if target is not None:
            with self._lock:
                self._targets.setdefault(key, (target, _uids(observed)))  # still for the workers it was checked against
        self.metrics.status_conflicts.inc()
        self.metrics.reconciles.labels("conflict").inc()
        delay = self.queue.requeue(key)
        log.info(
            "status write conflicted: requeued",
            extra={"job": key, "resourceVersion": job.resource_version, "retryInSeconds": delay},
        )

    def _write_world(self, job: ElasticRLJob, observed: list[ObservedWorker]) -> list[Failure]:
        """``rose.io/world`` ("active/total") on each live worker whose value is stale: the node
        agent pushes it to the workload (rose_sdk ``on_world_change``)."""
        stale = role_world_updates(observed)  # per role: a job without roles has one
        errors = self._run(
            [
                partial(self.api.annotate_pod, job.namespace, PodRef(w.name, w.uid), {names.ANNOTATION_WORLD: value})
                for w, value in stale
            ]
        )
        # a failure is retried with the reconcile
        return [
            Failure("annotate_world", w.name, repr(e)) for (w, _), e in zip(stale, errors, strict=True) if e is not None
        ]

    def _retry_unschedulable(self, job: ElasticRLJob, observed: list[ObservedWorker]) -> list[Failure]:
        """Workers the scheduler left Unschedulable for ``schedule_retry_s`` get ``rose.io/schedule-retry``
        (now): the pod update puts them back into kube-scheduler's queue. An extender's refusal made
        on a forecast that has changed since is no cluster event, so without it they would wait for
        an unrelated one or the scheduler's 5-minute flush (counted; the job's next resync re-checks)."""
        now = self._clock()
        due = schedule_retries(observed, now, self.settings.schedule_retry_s)
        stamp = rfc3339(now)
        errors = self._run(
            [
                partial(
                    self.api.annotate_pod,
                    job.namespace,
                    PodRef(w.name, w.uid),
                    {names.ANNOTATION_SCHEDULE_RETRY: stamp},
                )
                for w in due
            ]
        )
        for w, e in zip(due, errors, strict=True):
            self.metrics.schedule_retries.labels("error" if e else "ok").inc()
            if e is None:
                log.info(
                    "unschedulable worker requeued",
                    extra={"job": f"{job.namespace}/{job.name}", "pod": w.name, "since": w.unschedulable_since},
                )
        return [Failure("schedule_retry", w.name, repr(e)) for w, e in zip(due, errors, strict=True) if e is not None]

    def _clean_up(self, key: str, pods: list[dict[str, Any]]) -> None:
        """A deleted job: delete its workers and claim template now, not only when the garbage
        collector gets to them (it may not yet watch a newly installed CRD); UID-guarded."""
        with self._lock:
            self._targets.pop(key, None)
            uid = self._deleted.get(key)
        if not uid:
            return
        ns, _, name = key.partition("/")
        owned = [p for p in pods if any(o.get("uid") == uid for o in objects.meta(p).get("ownerReferences") or [])]
        for p in owned:
            if not objects.deleting(p):
                self.api.delete_pod(ns, PodRef(objects.name(p), objects.uid(p)))
        self.api.delete_claim_template(ns, claim_template_name(name), uid)
        if owned:
            log.info("deleted job's workers removed", extra={"job": key, "pods": len(owned)})
        else:
            with self._lock:
                self._deleted.pop(key, None)

    def _expect_changes(self, key: str, d: Desired) -> None:
        if not d.create and not d.delete:
            return
        deadline = time.monotonic() + self.settings.expectation_timeout_s
        with self._lock:
            self._expect[key] = _Expect({objects.name(b) for b in d.create}, {p.uid for p in d.delete}, deadline)
            self._settle(key)

    # ------------------------------------------------------------------ plan
    def _pools(self, now: float) -> tuple[Pool, ...]:
        """Each pool's capacity and forecast; one without a fresh forecast is frozen (no grants, no
        planned reclaims), not read as infinite need (that reclaimed every lent GPU: issue 22 §5)."""
        out = []
        for name, capacity in sorted(self.inventory().items()):
            self.metrics.pool_capacity.labels(name).set(capacity)
            forecast = self.forecasts.get(name)
            if forecast is None:
                self.metrics.forecast_missing.inc()
            self.metrics.forecast_stale.labels(name).set(1 if forecast is None else 0)
            out.append(Pool(name, capacity, forecast or pools.no_forecast(now), frozen=forecast is None))
        return tuple(out)

    def _report_stale(self, inp: PlanInput) -> None:
        """A Warning Event ``ForecastStale`` on the jobs with workers in a pool that froze this round,
        ``ForecastFresh`` when it thaws (once per change, not per round)."""
        stale = {p.name for p in inp.pools if p.frozen}
        froze, thawed = stale - self._stale, self._stale - stale
        self._stale = stale
        if not froze and not thawed:
            return
        for name in sorted(froze):
            log.warning("no fresh forecast: lending frozen", extra={"pool": name})
        by_pool: dict[str, set[str]] = {}
        for w in inp.workers:
            if w.pool is not None:
                by_pool.setdefault(w.pool, set()).add(w.job)
        events = [
            (
                k,
                EventSpec(
                    "ForecastStale",
                    f"pool {p} has no fresh forecast: lending there is frozen (no "
                    "grants, no planned reclaims); serving still wins at the driver",
                    "Warning",
                ),
            )
            for p in sorted(froze)
            for k in sorted(by_pool.get(p, ()))
        ]
        events += [
            (k, EventSpec("ForecastFresh", f"pool {p} has a fresh forecast again: planning resumed"))
            for p in sorted(thawed)
            for k in sorted(by_pool.get(p, ()))
        ]
        for key, event in events:
            with self._lock:
                raw = self._jobs.get(key)
            job = self._parse(key, raw) if raw is not None else None
            if job is None:
                continue
            try:
                self.api.record_event(job, event)
            except Exception as e:  # the gauge and the log line already say it
                log.warning("event not recorded", extra={"job": key, "err": repr(e)})

    def plan_input(self, now: dt.datetime) -> tuple[PlanInput, set[str]]:
        """The planner's input from the caches, and the keys whose targets must wait (expectations)."""
        t = now.timestamp()
        with self._lock:
            jobs = dict(self._jobs)
            observed_by_job = {k: self._observed_locked(k) for k in self._workers}
            mono = time.monotonic()
            waiting = {k for k, e in self._expect.items() if e.deadline > mono}
        pj, workers = [], []
        memory = self.device_memory()  # the largest lendable GPU's memory: bounds reported state bytes
        share_memory = self.share_memory()
        for key, raw in sorted(jobs.items()):
            job = None if objects.deleting(raw) else self._parse(key, raw)
            if job is None:
                continue
            observed = observed_by_job.get(key, [])
            if job.spec.roles is not None:  # the trainer and the rollouts, planned as two jobs
                mine = role_planner_jobs(job, observed, class_priority(observed), memory)
                pj += mine
                planned = {j.key for j in mine}
                workers += [pw for pw in (to_planner(key, w) for w in observed) if pw is not None and pw.job in planned]
                continue
            rep = workload_report(observed, job.spec, memory)  # the workers' own reports, bounded
            pj.append(
                planner_job(
                    job,
                    rep.state_bytes,
                    rep.seconds_to_safe_point or 0.0,
                    class_priority(observed),
                    memory,
                    share_memory,
                )
            )
            grouped = job.spec.timeslice_group is not None
            workers += [pw for pw in (to_planner(key, w, grouped) for w in observed) if pw is not None]
        c = self.settings
        settings = Settings(c.dwell_s, c.plan_interval_s, c.refused_after_s, c.refused_cooldown_s)
        with self._lock:
            self._cooldowns = {k: until for k, until in self._cooldowns.items() if until > t}
            cooldowns = tuple((job, pool, until) for (job, pool), until in sorted(self._cooldowns.items()))
        return PlanInput(t, self._pools(t), tuple(pj), tuple(workers), settings, cooldowns), waiting

    def plan_once(self) -> Plan | None:
        if not self.is_leader:
            return None
        self.observe_serving()
        with self._lock:  # taken before the snapshot the plan reads: see _take_target
            basis = {k: _uids(self._observed_locked(k)) for k in self._workers}
        inp, waiting = self.plan_input(self._clock())
        start = time.monotonic()
        result = plan(inp)
        if not self.settings.planned:
            result = without_reclaims(
                result, {j.key: j.gpus_per_worker for j in inp.jobs}, {j.key: j.share for j in inp.jobs if j.share > 0}
            )
        self.metrics.plan_latency.observe(time.monotonic() - start)
        for r in result.reclaims:
            self.metrics.reclaims.labels("planned").inc(len(r.workers))
        self._cool_down(inp, result)
        for key in self._store_targets(merge_roles(result.targets, inp.jobs), waiting, basis):
            self.queue.add(key)
        self._gauges(inp.workers)
        for pool, n in result.claimed.items():
            self.metrics.pool_claimed.labels(pool).set(n)
        self._role_gauges(inp.jobs, result)
        self._report_stale(inp)
        self._taint(inp, result)
        self.last_plan = result
        return result

    def _cool_down(self, inp: PlanInput, result: Plan) -> None:
        """Start the cool-down of each (job, pool) whose worker the plan removed because the scheduler
        kept refusing it there for serving's forecast (kept in memory: a restarted controller starts
        without, and at worst grants there once more, removed again after the bound)."""
        until = inp.now + inp.settings.refused_cooldown_s
        for job, pool in result.refused:
            self.metrics.forecast_refused.labels(pool).inc()
            log.info("refused worker removed", extra={"job": job, "pool": pool, "coolDownUntil": until})
            with self._lock:
                self._cooldowns[(job, pool)] = until

    def _taint(self, inp: PlanInput, result: Plan) -> None:
        """Make the owned DeviceTaintRules match :func:`taints.decide` (failures: logged, counted,
        retried next plan round)."""
        if self.taint_rules is None or self.settings.taint_lead_s < 0:
            return
        decisions = taints.decide(inp, result, self.settings.taint_lead_s)
        for pool, d in sorted(decisions.items()):
            self.metrics.pool_tainted.labels(pool).set(1 if d.taint else 0)
            if self._tainted.get(pool) != d.taint:
                if d.taint:
                    log.info("pool reclaim taint set", extra={"pool": pool, "why": d.reason})
                else:
                    log.info("pool reclaim taint cleared", extra={"pool": pool, "why": d.reason})
                self._tainted[pool] = d.taint
        try:
            existing = self.taint_rules.list()
        except Exception as e:
            log.warning("listing device taint rules failed", extra={"err": repr(e)})
            return
        create, delete = taints.diff(existing, taints.desired_rules(decisions, self.lendable_devices()), decisions)
        for action, items in (("create", create), ("delete", delete)):
            for item in items:
                try:
                    if isinstance(item, dict):
                        self.taint_rules.create(item)
                    else:
                        self.taint_rules.delete(item)
                    self.metrics.taint_rules.labels(action, "ok").inc()
                except Exception as e:
                    self.metrics.taint_rules.labels(action, "error").inc()
                    log.warning("device taint rule write failed", extra={"action": action, "err": repr(e)})

    def _store_targets(
        self, targets: dict[str, JobTarget], waiting: set[str], basis: dict[str, frozenset[str]]
    ) -> list[str]:
        """Store every target (a reconcile takes it), and return the keys to queue: those whose
        target differs from the one last queued, those waiting on their expectations, and every
        key once per ``resync_s``. Queueing all 200 jobs of a plan round made 200 no-op
        reconciles per second in ``benchmarks/controller_scale.py``, ahead of the jobs that had
        suspend requests to write."""
        mono = time.monotonic()
        resync = mono >= self._next_resync
        if resync:
            self._next_resync = mono + self.settings.resync_s
        out = []
        with self._lock:
            for key, target in targets.items():
                if key in waiting:
                    out.append(key)
                    continue
                self._targets[key] = (target, basis.get(key, frozenset()))
                if resync or self._queued_targets.get(key) != target:
                    self._queued_targets[key] = target
                    out.append(key)
            for key in set(self._queued_targets) - set(targets):
                del self._queued_targets[key]
        return out

    def _gauges(self, workers: tuple[Worker, ...]) -> None:
        with self._lock:
            jobs = list(self._jobs.values())
        phases = [str(objects.status(j).get("phase") or "Pending") for j in jobs]
        for phase in PHASES:
            self.metrics.jobs.labels(phase).set(phases.count(phase))
        per_job: dict[tuple[str, str], int] = {}
        per_pool: dict[tuple[str, str], int] = {}
        gpw = {_job_key(j): int(objects.spec(j).get("gpusPerWorker") or 1) for j in jobs}
        for j in jobs:  # a job with roles: its workers are planned as <key>#<role>, each role its own size
            for role, r in (objects.spec(j).get("roles") or {}).items():
                gpw[role_key(_job_key(j), str(role))] = int((r or {}).get("gpusPerWorker") or 1)
        for w in workers:
            state = "suspended" if w.state == "suspended" else "active"
            n, key = gpw.get(w.job, 1), w.job.partition(ROLE_SEP)[0]
            per_job[(key, state)] = per_job.get((key, state), 0) + n
            per_pool[(w.pool or "", state)] = per_pool.get((w.pool or "", state), 0) + n
        for key in (k for k in gpw if ROLE_SEP not in k):
            for state in ("active", "suspended"):
                self.metrics.job_gpus.labels(key, state).set(per_job.get((key, state), 0))
        for (pool, state), n in per_pool.items():
            self.metrics.pool_gpus.labels(pool, state).set(n)

    def _role_gauges(self, jobs: tuple[Job, ...], result: Plan) -> None:
        """``rose_controller_role_workers{job, role, state}`` of the jobs with roles: the workers
        each role holds (``active``, ``suspended``) and those the plan wants (``desired``)."""
        with self._lock:
            observed = {k: [w for w in v.values() if w is not None] for k, v in self._workers.items()}
        seen: set[tuple[str, str]] = set()
        for j in jobs:
            if j.role is None:
                continue
            mine = [w for w in observed.get(j.owner, []) if w.role == j.role and not w.lost]
            states = [planner_state(w) for w in mine]
            t = result.targets.get(j.key)
            desired_n = t.active_gpus // j.gpus_per_worker if t is not None else 0
            for state, n in (
                ("active", states.count("active")),
                ("suspended", states.count("suspended")),
                ("desired", desired_n),
            ):
                self.metrics.role_workers.labels(j.owner, j.role, state).set(n)
            seen.add((j.owner, j.role))
        for job, role in self._role_series - seen:  # a job deleted or its roles changed: its series go
            for state in ("active", "suspended", "desired"):
                self.metrics.role_workers.remove(job, role, state)
        self._role_series = seen

    def plan_loop(self) -> None:
        while not self.stop.is_set():
            try:
                self.plan_once()
            except Exception as e:  # the next round retries; the error is visible in the log
                log.exception("plan failed", extra={"err": repr(e)})
            self.stop.wait(self.settings.plan_interval_s)
        self.withdraw_taints()

    def withdraw_taints(self) -> None:
        """On an orderly stop the leader withdraws its reclaim taints: they are the running
        planner's intent, and a stopped planner's would keep new lent claims off those GPUs until
        another leader re-decides (a crashed one's stay until then; the next leader reconciles
        them). A standby never touches the leader's rules."""
        if self.taint_rules is None or not self.is_leader:
            return
        try:
            names_ = [objects.name(r) for r in self.taint_rules.list()]
        except Exception as e:
            log.warning("listing device taint rules to withdraw failed", extra={"err": repr(e)})
            return
        for name in names_:
            try:
                self.taint_rules.delete(name)
                self.metrics.taint_rules.labels("delete", "ok").inc()
            except Exception as e:
                self.metrics.taint_rules.labels("delete", "error").inc()
                log.warning("device taint rule write failed", extra={"action": "delete", "err": repr(e)})
        if names_:
            log.info("reclaim taints withdrawn on stop", extra={"rules": len(names_)})

    # ------------------------------------------------------------------ leader election
    def elect_once(self) -> bool:
        if self.lease is None:
            return True
        was = self.is_leader
        try:
            record, rv = self.lease.get()
            d = leader.decide(record, self.settings.identity, self._clock(), self.settings.lease_duration_s)
            lead = d.leader and (d.write is None or self.lease.write(d.write, rv))
        except Exception as e:
            log.warning("lease renewal failed", extra={"err": repr(e)})
            lead, d = False, None
        self.is_leader = lead
        self.metrics.leader.set(1 if lead else 0)
        if lead != was:
            reason = d.reason if d is not None else "lease unreachable"
            log.info("leadership changed", extra={"leader": lead, "identity": self.settings.identity, "reason": reason})
            if lead:
                with self._lock:
                    keys = list(self._jobs)
                for key in keys:
                    self.queue.add(key)
        return lead

    def elect_loop(self) -> None:
        while not self.stop.is_set():
            self.elect_once()
            self.stop.wait(self.settings.lease_renew_s)

    # ------------------------------------------------------------------ observed state for tests and gauges
    def observed(self, key: str) -> list[ObservedWorker]:
        return self._observed(key)

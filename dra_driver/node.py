"""The node driver core: prepare / unprepare, serving wins, suspend requests, crash recovery.

Plain data in, plain data out: the API server is reached only through the :class:`ClaimSource`
and :class:`Notifier` protocols (implemented in :mod:`dra_driver.kube`), the GPUs' state only
through the :class:`~dra_driver.engine_api.SuspendEngine`. Every operation runs under one
process lock and the node's file lock, so calls are serialized and two driver instances never
write the checkpoint at once. Every step that changes the world is recorded first
(``...Started``), then done, then recorded as done, so :meth:`NodeDriver.recover` can roll back
or complete whatever a crash interrupted.
"""

from __future__ import annotations

import concurrent.futures
import copy
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from filelock import FileLock, Timeout

from dra_driver import binding, cdi, evictions, fencing, mps, refusals, shares
from dra_driver.checkpoint import CheckpointFile, crash_point
from dra_driver.claims import ClaimError, ClaimRef, PodRef, PreparedDevice, reserved_pods, validate_claim
from dra_driver.discovery import GpuDevice
from dra_driver.enforce import (
    METHOD_CUDA_CHECKPOINT,
    METHOD_KILL,
    METHOD_NONE,
    Enforcer,
    EnforceResult,
    returned_phase,
)
from dra_driver.engine_api import (
    Abandoner,
    ClaimBinder,
    CopyWatcher,
    FallbackWatcher,
    PodScopedEngine,
    SuspendEngine,
    SuspendReason,
    SuspendResult,
)
from dra_driver.metrics import DriverMetrics
from dra_driver.state import (
    CHECKPOINTED_EVICTED,
    ENFORCED_EVICTED,
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    RESUME_STARTED,
    SUSPEND_FAILED,
    SUSPEND_STARTED,
    SUSPENDED,
    UNPREPARE_STARTED,
    ClaimRecord,
    NodeStateData,
    Suspension,
)
from dra_driver.suspend.devicewatch import Observation, Target, resident_bytes
from rose_common import names
from rose_common.kube import objects
from rose_common.slices import parse_device_name, share_fraction
from rose_common.workqueue import Backoff

log = logging.getLogger("rose.driver")

REQUEST_HOLDER_PREFIX = "request/"
# A serving claim the scheduler allocated on a GPU with a lent occupant holds that occupant from its
# allocation on (the binding-condition path, dra_driver/binding.py) until its prepare takes the hold
# over under the claim's own UID, or its allocation goes away.
BINDING_HOLDER_PREFIX = "binding/"
# Pod-visible suspend states (annotation rose.io/suspend-state): rose_common.names.SuspendState
POD_SUSPENDING = names.SuspendState.SUSPENDING
POD_SUSPENDED = names.SuspendState.SUSPENDED
POD_RESUMING = names.SuspendState.RESUMING
POD_RUNNING = names.SuspendState.RUNNING
POD_CHECKPOINTED_EVICTED = names.SuspendState.CHECKPOINTED_EVICTED

# Events of the enforced reclaim (ARCHITECTURE §9: serving wins in two phases)
EVENT_RECLAIM_ENFORCED = "ReclaimEnforced"  # the driver freed the GPU itself at the deadline
EVENT_RECLAIM_NOT_FREED = "ReclaimNotFreed"  # still occupied after enforcement: serving not prepared
EVENT_SERVING_ON_OCCUPIED = "ServingOnOccupiedDevice"  # the operator's override let serving in anyway
EVENT_SHARE_OVER_LIMIT = "ShareOverLimit"  # a share holds more device memory than its claim consumed
EVENT_MPS_DAEMON_FAILED = "MpsDaemonFailed"  # a share's GPU has no MPS daemon: the prepare is refused
ENGINE_THREADS_MIN = 4  # the engine pool's floor (two per GPU above it)
BACKEND_ENFORCED_CHECKPOINT = "cuda-checkpoint-enforced"  # Suspension.backend: restore its pids on resume
_EVICTED = (CHECKPOINTED_EVICTED, ENFORCED_EVICTED)


class ClaimNotFoundError(LookupError):
    """The API server has no such ResourceClaim."""


class ClaimSource(Protocol):
    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The claim as JSON; raises :class:`ClaimNotFoundError` when it does not exist."""
        ...

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...


class Notifier(Protocol):
    def suspend_state(self, pod: PodRef, state: str, message: str) -> None:
        """Record ``rose.io/suspend-state`` on the pod."""
        ...

    def event(self, pod: PodRef, reason: str, message: str, warning: bool) -> None: ...


class WorkloadSockets(Protocol):
    """The node agent's per-claim workload sockets (``dra_driver.agent.server.ClaimSockets``)."""

    def open_claim(self, claim_uid: str, pods: list[PodRef], max_state_bytes: int) -> Path:
        """Serve the claim's own socket for exactly ``pods``; returns the directory holding it."""
        ...

    def close_claim(self, claim_uid: str) -> None: ...


class SpillDirs(Protocol):
    """The disk tier's per-claim spill directories (``dra_driver.suspend.spill.SpillStore``)."""

    def open_claim(self, claim_uid: str) -> Path:
        """Create the claim's spill directory (idempotent); returns its host path."""
        ...

    def close_claim(self, claim_uid: str) -> bool:
        """Remove it unless it holds a verified spill; True when it is gone."""
        ...

    def claims(self) -> list[str]: ...


class NullNotifier:
    """Tells nobody: for runs without an API server (state-machine tests)."""

    def suspend_state(self, pod: PodRef, state: str, message: str) -> None:
        return None

    def event(self, pod: PodRef, reason: str, message: str, warning: bool) -> None:
        return None


@dataclass(frozen=True)
class PrepareOutcome:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class NodeDriver:
    def __init__(
        self,
        *,
        node_name: str,
        gpus: list[GpuDevice],
        cdi_dir: Path,
        state_dir: Path,
        claims: ClaimSource,
        engine: SuspendEngine | None,
        notifier: Notifier,
        boot_id: str,
        metrics: DriverMetrics | None = None,
        default_grace_seconds: float = 30.0,
        grace_slack_seconds: float = 5.0,
        lock_timeout_seconds: float = 30.0,
        driver_name: str = names.DRIVER_NAME,
        copy_wait_limit_seconds: float = 300.0,
        workload_sockets: WorkloadSockets | None = None,
        spill_dirs: SpillDirs | None = None,
        enforcer: Enforcer | None = None,
        allow_serving_on_occupied_device: bool = False,
        resume_backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
        mps_daemons: mps.MpsDaemons | None = None,
    ) -> None:
        self.node_name, self.driver_name = node_name, driver_name
        self.gpus = {g.info.index: g for g in gpus}
        self.gpu_uuids = {g.info.index: g.info.uuid for g in gpus}
        self.simulated = all(g.simulated for g in gpus)
        self.mps = real_gpus_only(mps_daemons, self.simulated)  # GPU shares: one MPS daemon per shared GPU
        self.cdi_dir, self.state_dir, self.claims = cdi_dir, state_dir, claims
        self.engine, self.notifier, self.boot_id = engine, notifier, boot_id
        self.metrics = metrics or DriverMetrics(sorted(self.gpus))
        self.default_grace, self.grace_slack = default_grace_seconds, grace_slack_seconds
        self.copy_wait_limit, self.workload_sockets = copy_wait_limit_seconds, workload_sockets
        self.spill_dirs = spill_dirs  # None without a disk tier
        # None: no observation (state-machine tests only); every real driver observes (cli.build)
        self.enforcer = enforcer
        self.allow_serving_on_occupied = allow_serving_on_occupied_device
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        cdi_dir.mkdir(parents=True, exist_ok=True)
        self._ckpt = CheckpointFile(state_dir / "checkpoint.json")
        self._flock = FileLock(str(state_dir / "checkpoint.lock"), timeout=lock_timeout_seconds)
        self._mu = threading.Lock()
        self._data = NodeStateData(boot_id=boot_id)
        # Serving prepares wait for their occupants' reclaim with the node lock released, so a hung
        # occupant on one GPU does not hold up other claims' prepares (ARCHITECTURE §9): the claims
        # being prepared that way, and the occupants whose reclaim runs unlocked.
        self._preparing: set[str] = set()
        self._reclaiming: set[str] = set()
        # Share claims last observed holding more device memory than their limit (one Event per crossing)
        self._over_limit: set[str] = set()
        # Serving claims allocated here with ROSE's binding conditions and not prepared yet: claim
        # UID -> its GPUs. No lent claim is prepared on those GPUs meanwhile. In memory only: the
        # claim watch rebuilds it from the API after a restart (sync_bindings).
        self._binding: dict[str, frozenset[int]] = {}
        self._binding_fractions: dict[str, tuple[binding.Fraction, ...]] = {}  # their servingshare results
        # The claim UIDs with a binding hold or kept GPUs, behind a lock of its own: the claim watch
        # asks for every claim event, and must not wait for the node lock (held through a suspend).
        self._bmu = threading.Lock()
        self._binding_uids: set[str] = set()
        # Lent claims refused because serving holds their GPU, already told (refusals.py)
        self._refused = refusals.RefusalBook()
        self._rmu = threading.Lock()
        # Engine calls wait for workloads (a grace period, a fallback checkpoint): two per GPU, so a
        # hung occupant on one GPU never queues an honest occupant's suspend on another behind it;
        # the waits of an occupant the driver stopped end at once (engine_api.Abandoner).
        workers = max(ENGINE_THREADS_MIN, 2 * len(self.gpus) + 2)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="engine")
        self._init_hooks()
        # unheld failed resumes: occupant UID -> (failures, next try), see _resume_failed
        self.resume_backoff, self._clock = resume_backoff or Backoff(initial_s=2.0, max_s=60.0), clock
        self._resume_retry: dict[str, tuple[int, float]] = {}

    def _init_hooks(self) -> None:
        """What the driver's neighbours (the pod watcher, the slice publisher) plug in; none at first."""
        # The time-slice groups with a pod on this node (the pod watcher's view): their fences are
        # never dropped to make room in the bounded book (dra_driver/fencing.py).
        self.fence_groups_in_use: Callable[[], Collection[str]] = frozenset
        # Called (without the node lock) with the pods of a lent claim this driver has just prepared,
        # before the prepare returns to the kubelet: the pod watcher acts on the suspend requests they
        # already carry (PodWatcher.recheck; soak g6). Lent claims prepared since the last call: uid -> pods.
        self.on_lent_prepared: Callable[[list[PodRef]], None] = lambda pods: None
        self._fresh_lent: dict[str, list[PodRef]] = {}
        # Hears the GPUs serving holds here (serving_held) after every locked section, under the node
        # lock (so it must not block): the slice publisher taints their lendable devices.
        self.on_serving_holds: Callable[[frozenset[int]], None] | None = None
        # GPU shares: called with lent_held's (in shares, lent whole, serving fractions) after every locked section
        self.on_lent_holds: Callable[[frozenset[int], frozenset[int], frozenset[int]], None] | None = None

    # ------------------------------------------------------------------ plumbing
    @contextmanager
    def _locked(self) -> Iterator[NodeStateData]:
        with self._mu, self._flock:
            data, stale = self._ckpt.load(self.boot_id)
            if stale:
                log.warning("checkpoint from a previous boot discarded", extra={"node": self.node_name})
                self._data = data
                self._save()
            self._data = data
            try:
                yield data
            finally:
                self._update_gauges()

    def _save(self) -> None:
        self._ckpt.save(self._data)

    def snapshot(self) -> NodeStateData:
        with self._locked() as data:
            return data.copy()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _update_gauges(self) -> None:
        d = self._data
        for idx, gpu in self.gpus.items():
            resident = "none"
            for rec in d.claims.values():
                for dev in rec.devices:
                    if dev.gpu_index != idx:
                        continue
                    if dev.role in names.SERVING_ROLES:
                        resident = "serving"
                    elif resident == "none" and rec.uid not in d.suspensions:
                        resident = "lent"
            self.metrics.set_residency(idx, resident, running_lent(d, idx, gpu.info.memory_bytes))
        usage = shares.share_usage(dev for rec in d.claims.values() for dev in rec.devices)
        for idx in self.gpus:
            n, mem, compute = usage.get(idx, (0, 0, 0))
            self.metrics.share_claims.labels(str(idx)).set(n)
            self.metrics.share_memory_bytes.labels(str(idx)).set(mem)
            self.metrics.share_compute_percent.labels(str(idx)).set(compute)
        held = [s for s in d.suspensions.values() if s.state == SUSPENDED]
        self.metrics.suspended_occupants.set(len(held))
        self.metrics.suspended_bytes.set(sum(s.bytes_moved for s in held))
        if self.on_serving_holds is not None:
            self.on_serving_holds(serving_held(d, self._binding))
        if self.on_lent_holds is not None:
            self.on_lent_holds(*lent_held(d))

    def _notify(self, pods: list[PodRef], state: str, message: str, reason: str = "", warning: bool = False) -> None:
        for p in pods:
            try:
                self.notifier.suspend_state(p, state, message)
                if reason:
                    self.notifier.event(p, reason, message, warning)
            except Exception as e:  # the API being down must not block serving
                log.warning("notify failed", extra={"pod": f"{p.namespace}/{p.name}", "err": str(e)})

    # ------------------------------------------------------------------ public API
    def recover(self) -> None:
        """Roll back or complete whatever a crash interrupted; safe to run any number of times."""
        with self._locked() as data:
            if self.mps is not None:
                self.mps.adopt()  # a daemon already answering on a GPU's pipe directory is not started twice
            for rec in list(data.claims.values()):
                if rec.state in (PREPARE_STARTED, UNPREPARE_STARTED):
                    log.info("recovery: finishing interrupted claim", extra={"claim": rec.uid, "state": rec.state})
                    cdi.delete_spec(self.cdi_dir, rec.uid)
                    self._drop_claim(rec)
            for s in list(data.suspensions.values()):
                s.held_by = [
                    h
                    for h in s.held_by
                    if h.startswith((REQUEST_HOLDER_PREFIX, BINDING_HOLDER_PREFIX)) or h in data.claims
                ]
                owner = data.claims.get(s.claim_uid)
                if owner is None:
                    del data.suspensions[s.claim_uid]
                    self._save()
                elif not s.held_by:
                    self._resume(owner, s)
                elif s.state in (SUSPEND_STARTED, RESUME_STARTED):
                    self._suspend(owner, s)
            for rec in data.claims.values():  # PrepareCompleted: make sure its CDI spec exists
                cdi.write_spec(self.cdi_dir, rec.uid, self._spec(rec))
                self._bind(rec)
            for uid in cdi.list_specs(self.cdi_dir):
                if uid not in data.claims:
                    cdi.delete_spec(self.cdi_dir, uid)
            self._mps_sync(restart=True)
            for uid in self.spill_dirs.claims() if self.spill_dirs is not None else []:
                if uid not in data.claims:  # unprepared while the driver was down
                    self._close_spill_dir(uid)

    def _lock_busy(self, op: str, ref: ClaimRef, e: Timeout) -> str:
        log.warning("node state lock busy", extra={"claim": ref.key(), "op": op, "lock": str(e.lock_file)})
        return (
            f"{op} of {ref.key()}: the node state lock {e.lock_file} stayed held past the lock timeout"
            " (another driver instance on this node, or a stuck operation); the kubelet retries"
        )

    def prepare(self, refs: list[ClaimRef]) -> dict[str, PrepareOutcome]:
        """Per-claim outcomes; never raises (a busy node lock is a per-claim error; the kubelet
        retries). Each claim takes the node lock itself (:meth:`_prepare_claim`)."""
        out: dict[str, PrepareOutcome] = {}
        for ref in refs:
            t0 = time.monotonic()
            try:
                devices = self._prepare_claim(ref)
                self._lent_prepared(ref)
                out[ref.uid] = PrepareOutcome(devices=devices)
                self.metrics.prepare_total.labels("ok").inc()
                with self._rmu:
                    self._refused.forget(ref.uid)
            except Timeout as e:
                out[ref.uid] = PrepareOutcome(error=self._lock_busy("prepare", ref, e))
                self.metrics.prepare_total.labels("error").inc()
            except refusals.ServingHoldsError as e:
                out[ref.uid] = PrepareOutcome(error=str(e))
                self.metrics.prepare_total.labels("error").inc()
                self._serving_holds_refusal(ref, e)
            except ClaimError as e:
                out[ref.uid] = PrepareOutcome(error=str(e))
                self.metrics.prepare_total.labels("error").inc()
                log.warning("prepare refused", extra={"claim": ref.key(), "err": str(e)})
            except Exception as e:
                out[ref.uid] = PrepareOutcome(error=f"prepare of {ref.key()} failed: {e!r}")
                self.metrics.prepare_total.labels("error").inc()
                log.exception("prepare failed", extra={"claim": ref.key(), "err": repr(e)})
            self.metrics.prepare_seconds.observe(time.monotonic() - t0)
        return out

    def _lent_prepared(self, ref: ClaimRef) -> None:
        """A lent claim prepared by this call: its pods' standing suspend requests are acted on now,
        before the kubelet may start them. A request written while the claim was not prepared here
        (refused: ``no-claim``, e.g. a time-slice group's shared claim refused while serving held its
        GPU) brings no pod event again, so without this a member its orchestrator had parked would
        run on the shared claim beside the holder (soak g6)."""
        pods = self._fresh_lent.pop(ref.uid, None)
        if not pods:
            return
        try:
            self.on_lent_prepared(pods)
        except Exception as e:  # the prepare stands; the pods' next events are acted on as ever
            log.warning("standing suspend requests not checked", extra={"claim": ref.key(), "err": repr(e)})

    def _serving_holds_refusal(self, ref: ClaimRef, e: refusals.ServingHoldsError) -> None:
        """A lent claim refused because serving holds its GPU: counted every time, logged, and told
        on its pods once per serving claim (the kubelet's retries add no Events; refusals.py)."""
        self.metrics.lent_prepare_refused_total.inc()
        log.warning("prepare refused: serving holds the gpu", extra={"claim": ref.key(), "gpu": e.gpu, "err": str(e)})
        with self._rmu:
            first = self._refused.first(ref.uid, e.serving)
        if not first:
            return
        msg = refusals.event_message(ref.key(), self.node_name, e)
        for p in e.pods:
            try:
                self.notifier.event(p, refusals.EVENT_LENT_PREPARE_REFUSED, msg, True)
            except Exception as err:  # the API being down must not block the kubelet's call
                log.warning("notify failed", extra={"pod": f"{p.namespace}/{p.name}", "err": str(err)})

    def unprepare(self, refs: list[ClaimRef]) -> dict[str, str]:
        """Per-claim errors ('' = done); never raises, like :meth:`prepare`."""
        with self._rmu:
            for r in refs:
                self._refused.forget(r.uid)
        try:
            return self._unprepare_locked(refs)
        except Timeout as e:
            self.metrics.unprepare_total.labels("error").inc()
            return {r.uid: self._lock_busy("unprepare", r, e) for r in refs}

    def _unprepare_locked(self, refs: list[ClaimRef]) -> dict[str, str]:
        out: dict[str, str] = {}
        with self._locked():
            for ref in refs:
                t0 = time.monotonic()
                try:
                    self._unprepare_one(ref)
                    out[ref.uid] = ""
                    self.metrics.unprepare_total.labels("ok").inc()
                except Exception as e:
                    out[ref.uid] = f"unprepare of {ref.key()} failed: {e!r}"
                    self.metrics.unprepare_total.labels("error").inc()
                    log.exception("unprepare failed", extra={"claim": ref.key(), "err": repr(e)})
                self.metrics.unprepare_seconds.observe(time.monotonic() - t0)
            self._mps_sync()  # the last share of a GPU gone: its daemon stops
        return out

    def request_suspend(self, pod: PodRef, grace_seconds: float | None) -> str:
        """Act on a pod's ``rose.io/suspend-request``: suspend its lent claims. Returns the pod state."""
        holder = REQUEST_HOLDER_PREFIX + pod.uid
        with self._locked() as data:
            recs = self._lent_claims_of_member(pod)
            if not recs:
                self.metrics.suspend_requests_total.labels("error").inc()
                return ""
            states = []
            for rec in recs:
                s = self._hold(rec, holder, grace_seconds)
                states.append(s.state)
            self.metrics.suspend_requests_total.labels("ok").inc()
            del data
            if CHECKPOINTED_EVICTED in states:
                return POD_CHECKPOINTED_EVICTED
            return POD_SUSPENDED if all(s == SUSPENDED for s in states) else ""

    def admit_fence(self, raw: str, pods: list[PodRef], source: str = "pod") -> fencing.Verdict:
        """Judge a hand-over's ``rose.io/fencing-token`` against the last one this node saw for its
        group (kept in the checkpoint, so a restart does not forget it). A stale one is refused:
        a warning Event on ``pods`` and ``rose_driver_fencing_rejections``. ValueError: malformed
        (also a group that is no time-slice group name, a token past 2^63-1). The book is bounded
        (``fencing.MAX_GROUPS``; groups with a pod on this node, ``fence_groups_in_use``, are kept)."""
        with self._locked() as data:
            if pods and not any(self._lent_claims_of_member(p) for p in pods):
                # only a pod with a lent claim here is part of a hand-over on this node: another
                # pod's annotation must not move the node's fence (it would refuse real hand-overs)
                group, token = fencing.parse(raw)
                v = fencing.Verdict(False, group, token, data.fences.get(group, 0), fencing.NO_CLAIM)
            else:
                before = dict(data.fences)
                v = fencing.admit(data.fences, raw, self.fence_groups_in_use())
                if data.fences != before:  # the order alone is not saved (the checkpoint sorts it)
                    self._save()
        if v.dropped:
            log.info("fence book full: least recent groups forgotten", extra={"group": v.group, "dropped": v.dropped})
        if not v.ok:
            self.metrics.fencing_rejections_total.labels(source).inc()
            log.warning(
                "fencing token refused",
                extra={"group": v.group, "token": v.token, "last": v.last, "reason": v.reason},
            )
            for p in pods:
                self._event(p, names.EVENT_FENCING_REJECTED, v.message())
        return v

    def _event(self, pod: PodRef, reason: str, message: str) -> None:
        try:
            self.notifier.event(pod, reason, message, True)
        except Exception as e:  # the API being down must not block the node
            log.warning("event failed", extra={"pod": f"{pod.namespace}/{pod.name}", "err": str(e)})

    def cancel_suspend(self, pod: PodRef) -> str:
        """The pod's suspend request was withdrawn: release its hold (resume if nobody else holds)."""
        holder = REQUEST_HOLDER_PREFIX + pod.uid
        with self._locked():
            recs = self._lent_claims_of(pod.uid)
            for rec in recs:
                self._release(rec.uid, holder)
            return POD_RUNNING if recs else ""

    def reconcile(self) -> None:
        """Periodic repair: retry resumes nobody holds any more (e.g. the engine did not know the
        workload yet after a restart; after repeated failures with a growing delay, up to
        ``resume_backoff.max_s``: ``_resume_due``) and re-suspend held occupants the engine reports running, or
        whose device the driver observes occupied again (then enforced if need be). Suspends that
        failed (``SuspendFailed``) are retried here only when the device is observed occupied: a
        blind retry would block the node's prepare calls for up to a grace period; the next serving
        prepare retries them."""
        with self._locked() as data:
            for uid in set(self._resume_retry) - set(data.suspensions):
                del self._resume_retry[uid]
            for s in list(data.suspensions.values()):
                owner = data.claims.get(s.claim_uid)
                if owner is None or owner.state != PREPARE_COMPLETED or s.claim_uid in self._reclaiming:
                    continue
                if not s.held_by:
                    if self._resume_due(s.claim_uid):
                        self._resume(owner, s)
                elif self._engine_disagrees(s) or (
                    s.state in (SUSPENDED, SUSPEND_FAILED, *_EVICTED) and self._observe(owner, s) is not None
                ):
                    self._suspend(owner, s)  # re-occupied while held: reclaim again (enforced if need be)
            self._check_share_limits()
            if self.mps is not None and self.mps.due(self._clock()):
                self._mps_sync(restart=True)

    def _check_share_limits(self) -> None:
        """Under the lock (the repair loop): observe each running share claim's device memory (the
        simulated device-memory file; NVML's processes on a GPU node, where MPS also refuses the
        allocation) against the memory its allocation consumed. A share over its limit gets one
        Warning Event ``ShareOverLimit`` per crossing, is counted in
        ``rose_driver_share_over_limit_total`` and shown in ``rose_driver_shares_over_limit``."""
        if self.enforcer is None:
            return
        limits: dict[str, int] = {}
        resident: dict[str, int] = {}
        recs: dict[str, ClaimRecord] = {}
        for rec in self._data.claims.values():
            limit = sum(d.memory_bytes for d in rec.devices if d.role == names.ROLE_SHARE)
            if limit <= 0 or rec.state != PREPARE_COMPLETED or rec.uid in self._data.suspensions:
                continue
            try:
                obs = self.enforcer.observe(self._target(rec))
            except Exception as e:
                log.warning("observing a share failed", extra={"claim": rec.uid, "err": repr(e)})
                continue
            limits[rec.uid], recs[rec.uid] = limit, rec
            resident[rec.uid] = resident_bytes(obs, self.enforcer.watch.allowance_bytes)
        over = shares.over_limit(resident, limits)
        for uid, (held, limit) in sorted(over.items()):
            if uid in self._over_limit:
                continue
            rec = recs[uid]
            self.metrics.share_over_limit_total.inc()
            log.warning("share over its memory limit", extra={"claim": uid, "resident": held, "limit": limit})
            self._events(
                list(rec.pods),
                EVENT_SHARE_OVER_LIMIT,
                f"share claim {rec.namespace}/{rec.name} holds {held} B of device memory, over the {limit} B "
                "its allocation consumed (CUDA MPS refuses such allocations on a GPU node)",
            )
        self._over_limit = set(over)
        self.metrics.shares_over_limit.set(len(over))

    def lent_claim_pods(self) -> dict[str, tuple[PodRef, ...]]:
        """The pods of each recorded lent claim (its ``status.reservedFor`` from the API server):
        where the suspend engine's Events about its occupants go. Read without the node lock (the
        engine reports while the lock is held); a copy of the claims is taken first."""
        recs = list(self._data.claims.values())
        return {r.uid: tuple(r.pods) for r in recs if names.LENT_ROLES & r.roles()}

    def held_pods(self) -> set[str]:
        """Pod UIDs with a suspend request this node is holding."""
        with self._locked() as data:
            return {
                h[len(REQUEST_HOLDER_PREFIX) :]
                for s in data.suspensions.values()
                for h in s.held_by
                if h.startswith(REQUEST_HOLDER_PREFIX)
            }

    # ------------------------------------------------------------------ binding conditions
    def free_for_binding(
        self, d: binding.Demand, started: Callable[[list[str]], None] | None = None
    ) -> binding.Outcome:
        """Serving waits in the scheduler: the scheduler allocated serving claim
        ``d`` on this node's GPUs and holds its pod in PreBind. Hold every lent occupant of those
        GPUs under ``binding/<claim UID>`` and reclaim it exactly as a serving prepare would (the
        cooperative suspend, then the enforcement at the deadline; without the node lock while it
        waits), then observe: freed, or not and what is still there. ``started`` hears the
        occupants being reclaimed (an Event on the waiting pod). The hold stays until the claim is
        prepared (:meth:`_take_over_binding`) or deallocated (:meth:`release_binding`)."""
        t0 = time.monotonic()
        holder = BINDING_HOLDER_PREFIX + d.claim_uid
        with self._locked() as data:
            if d.claim_uid in data.claims:  # prepared already: its prepare gated it
                return binding.Outcome(True, binding.REASON_FREED, "the claim is prepared on this node")
            self._binding[d.claim_uid] = frozenset(d.gpus)
            self._binding_fractions[d.claim_uid] = d.fractions
            with self._bmu:
                self._binding_uids.add(d.claim_uid)
            occupants = self._binding_occupants(d)
            pendings = [p for o in occupants if (p := self._hold_begin(o, holder, None, t0)) is not None]
        if not occupants:
            return binding.Outcome(True, binding.REASON_NO_OCCUPANT, "no lent occupant on the GPU", 0.0)
        if started is not None:
            started([f"{o.namespace}/{o.name}" for o in occupants])
        try:
            ran = self._suspend_all(pendings)
            with self._locked():
                for p, r in zip(pendings, ran, strict=True):
                    self._suspend_record(p, r)
        finally:
            with self._mu:
                self._reclaiming.difference_update(p.occupant.uid for p in pendings)
        self._await_reclaims({o.uid for o in occupants}, t0)
        with self._locked():
            return self._binding_verdict(d, time.monotonic() - t0)

    def _await_reclaims(self, uids: set[str], t0: float) -> None:
        """Wait (unlocked) while another path (a prepare, the repair loop) still reclaims one of
        ``uids``: its outcome, not a half-done device, is what the verdict must observe."""
        with self._mu:
            graces = [r.grace_seconds for r in self._data.claims.values() if r.uid in uids]
        bound = max([self.default_grace, *graces]) + self.grace_slack
        if self.enforcer is not None:
            bound += 2 * self.enforcer.timeout
        while time.monotonic() - t0 < bound + self.copy_wait_limit:
            with self._mu:
                if not (uids & self._reclaiming):
                    return
            time.sleep(0.05)

    def _binding_verdict(self, d: binding.Demand, seconds: float) -> binding.Outcome:
        """Under the lock, after the reclaim: freed when no occupant's state is observed on the GPUs."""
        if d.claim_uid not in self._binding and d.claim_uid not in self._data.claims:
            return binding.Outcome(False, binding.REASON_NOT_FREED, "the claim was deallocated while its GPU was freed")
        refused, overridden = self._occupied(d.key(), "bound to", self._binding_occupants(d))
        if refused:
            return binding.Outcome(
                False, binding.REASON_NOT_FREED, f"still occupied after the enforcement: {refused}", seconds
            )
        if overridden:
            return binding.Outcome(True, binding.REASON_OVERRIDE, f"device still holds {overridden}", seconds)
        return binding.Outcome(True, binding.REASON_FREED, f"lent occupants reclaimed in {seconds:.3f}s", seconds)

    def _binding_occupants(self, d: binding.Demand) -> list[ClaimRecord]:
        """Under the lock: the lent claims serving claim ``d`` (allocated, being bound) reclaims,
        as its prepare would (:meth:`_occupants_of`): every one on the GPUs of its whole serving
        devices; where it takes a fraction, those that no longer fit beside serving's fractions."""
        fraction_gpus = {i for i, role in map(parse_device_name, d.devices) if role == names.ROLE_SERVING_SHARE}
        out = self._lent_on(set(d.gpus) - fraction_gpus)
        for g in sorted(fraction_gpus):
            out += [o for o in self._fraction_occupants(g, d.claim_uid, bound=True) if o not in out]
        return out

    def release_binding(self, claim_uid: str) -> None:
        """The claim's allocation went away before a prepare (the scheduler failed the binding or
        timed out, the pod was deleted): release its holds, resuming occupants nobody else holds."""
        holder = BINDING_HOLDER_PREFIX + claim_uid
        with self._locked() as data:
            self._binding.pop(claim_uid, None)
            self._binding_fractions.pop(claim_uid, None)
            with self._bmu:
                self._binding_uids.discard(claim_uid)
            for s in list(data.suspensions.values()):
                if holder not in s.held_by:
                    continue
                log.info("binding hold released", extra={"claim": claim_uid, "occupant": s.claim_uid})
                if s.claim_uid in self._reclaiming:  # its reclaim still runs: the repair loop resumes it after
                    s.held_by.remove(holder)
                    self._save()
                else:
                    self._release(s.claim_uid, holder)

    def sync_bindings(self, allocated: dict[str, frozenset[int]]) -> None:
        """The claim watch's full view (a relist, a restart): ``allocated`` maps every claim UID
        allocated here with ROSE's binding conditions to its GPUs. Claims not prepared yet keep
        their GPUs from lent prepares; binding holds of claims not in it are released."""
        with self._locked() as data:
            held = {
                h[len(BINDING_HOLDER_PREFIX) :]
                for s in data.suspensions.values()
                for h in s.held_by
                if h.startswith(BINDING_HOLDER_PREFIX)
            }
            for uid, gpus in allocated.items():
                if uid not in data.claims:
                    self._binding[uid] = gpus
            with self._bmu:
                self._binding_uids |= held | set(self._binding)
            gone = (held | set(self._binding)) - set(allocated)
        for uid in sorted(gone):
            self.release_binding(uid)

    def binding_claims(self) -> set[str]:
        """Claim UIDs with a binding hold or GPUs kept for them (cheap: neither the node lock nor
        a disk read; may name a claim whose hold is gone: releasing it again does nothing)."""
        with self._bmu:
            return set(self._binding_uids)

    # ------------------------------------------------------------------ prepare / unprepare
    def _spec(self, rec: ClaimRecord) -> dict[str, Any]:
        """The claim's CDI spec; for a lent claim this opens its workload socket (mounted by the spec)."""
        minors = {i: g.minor for i, g in self.gpus.items()}
        sock = self._open_socket(rec)
        env = self.enforcer.watch.provision(rec.uid) if sock is not None and self.enforcer is not None else {}
        env = {**env, **shares.mps_env(rec.devices)}  # a share's MPS limits (what a GPU node's MPS enforces)
        return cdi.build_spec(
            rec.uid,
            rec.devices,
            minors,
            self.simulated,
            agent_socket_dir=sock,
            extra_env=env,
            mps_root=self.mps.root if self.mps is not None else None,
            spill_dir=self._open_spill_dir(rec) if sock is not None else None,
        )

    def _open_spill_dir(self, rec: ClaimRecord) -> Path | None:
        """The claim's spill directory for its CDI spec; None without a disk tier, or when it cannot
        be made (the claim still prepares: its workload's spills are then refused, ``SpillFailed``)."""
        if self.spill_dirs is None:
            return None
        try:
            return self.spill_dirs.open_claim(rec.uid)
        except Exception as e:
            log.warning("creating the claim's spill directory failed", extra={"claim": rec.uid, "err": repr(e)})
            return None

    def _close_spill_dir(self, claim_uid: str) -> None:
        if self.spill_dirs is None:
            return
        try:
            gone = self.spill_dirs.close_claim(claim_uid)
        except Exception as e:
            log.warning("removing the claim's spill directory failed", extra={"claim": claim_uid, "err": repr(e)})
            return
        if not gone:  # a suspended workload's verified spill: it goes when restored or its pod is forgotten
            log.info("claim spill directory kept: it holds spilled state", extra={"claim": claim_uid})

    def _open_socket(self, rec: ClaimRecord) -> Path | None:
        if self.workload_sockets is None or not (names.LENT_ROLES & rec.roles()):
            return None
        memory = sum(d.memory_bytes for d in rec.devices if d.role == names.ROLE_SHARE) + sum(
            self.gpus[i].info.memory_bytes
            for i in {d.gpu_index for d in rec.devices if d.role != names.ROLE_SHARE}
            if i in self.gpus
        )  # a share's state is at most its memory limit
        return self.workload_sockets.open_claim(rec.uid, list(rec.pods), memory)

    def _close_socket(self, claim_uid: str) -> None:
        if self.workload_sockets is None:
            return
        try:
            self.workload_sockets.close_claim(claim_uid)
        except Exception as e:
            log.warning("closing the claim's workload socket failed", extra={"claim": claim_uid, "err": repr(e)})

    def _lent_claims_of(self, pod_uid: str) -> list[ClaimRecord]:
        return [
            r
            for r in self._data.claims.values()
            if r.state == PREPARE_COMPLETED
            and bool(names.LENT_ROLES & r.roles())
            and any(p.uid == pod_uid for p in r.pods)
        ]

    def _lent_claims_of_member(self, pod: PodRef) -> list[ClaimRecord]:
        """Under the lock: :meth:`_lent_claims_of`, and on a miss the prepared lent claims of the
        pod's namespace read again from the API, their pods taken afresh from ``reservedFor``
        (soak finding T6: a time-slice group member scheduled after its shared claim was prepared
        is reserved in the claim, but the kubelet does not prepare a prepared claim again, so the
        record from the first prepare never had it). Pods are added, never dropped; a claim that
        cannot be read keeps its pods."""
        recs = self._lent_claims_of(pod.uid)
        if recs:
            return recs
        changed = False
        for rec in list(self._data.claims.values()):
            if rec.state != PREPARE_COMPLETED or rec.namespace != pod.namespace or not names.LENT_ROLES & rec.roles():
                continue
            key = f"{rec.namespace}/{rec.name}"
            try:
                claim = self.claims.get_claim(rec.namespace, rec.name)
            except Exception as e:
                log.warning("reading a prepared claim's pods failed", extra={"claim": key, "err": repr(e)})
                continue
            new = [p for p in reserved_pods(claim, rec.namespace) if p not in rec.pods]
            if objects.uid(claim) == rec.uid and new:  # added, never dropped (a hold may name a pod)
                log.info("prepared claim's pods added", extra={"claim": key, "pods": [p.name for p in new]})
                rec.pods, changed = [*rec.pods, *new], True
        if changed:
            self._save()
        return self._lent_claims_of(pod.uid)

    def _grace_of(self, pods: list[PodRef]) -> float:
        for p in pods:
            try:
                pod = self.claims.get_pod(p.namespace, p.name)
            except Exception as e:
                log.warning(
                    "reading pod for grace period failed",
                    extra={"pod": f"{p.namespace}/{p.name}", "err": str(e)},
                )
                continue
            raw = objects.annotations(pod).get(names.ANNOTATION_GRACE)
            if raw is None:
                continue
            try:
                g = float(raw)
            except ValueError:
                log.warning("bad grace annotation", extra={"pod": f"{p.namespace}/{p.name}", "value": raw})
                continue
            if g >= 0:
                return g
        return self.default_grace

    def _prepare_claim(self, ref: ClaimRef) -> tuple[PreparedDevice, ...]:
        """Prepare one claim: under the node lock, record it and start its occupants' reclaim (a
        serving claim); without the lock, wait for that reclaim (the cooperative phase, then the
        enforcement: up to grace + the enforcement bound), so a hung occupant on one GPU holds up
        no other claim's prepare; under the lock again, record the outcome, refuse serving onto an
        occupied device, write the CDI spec and complete."""
        with self._locked():
            if ref.uid in self._preparing:
                raise ClaimError(
                    f"ResourceClaim {ref.key()}: a prepare of it is already in progress; the kubelet retries"
                )
            begun = self._prepare_begin(ref)
            if not isinstance(begun, Reclaims):
                return begun
            self._preparing.add(ref.uid)
        try:
            ran = self._suspend_all(begun.pendings)
            with self._locked():
                for p, r in zip(begun.pendings, ran, strict=True):
                    self._suspend_record(p, r)
                return self._prepare_finish(ref, begun.t0)
        finally:
            self._preparing.discard(ref.uid)
            self._reclaiming.difference_update(p.occupant.uid for p in begun.pendings)

    def _check_devices_free(
        self, ref: ClaimRef, devices: Sequence[PreparedDevice], pods: Sequence[PodRef] = ()
    ) -> None:
        """Under the lock: refuse (ClaimError, the kubelet retries) a device another claim has
        prepared, and a lent claim on a GPU a serving claim holds or is being bound to
        (:class:`refusals.ServingHoldsError`, told on ``pods``, the lent claim's)."""
        data = self._data
        others = [(f"{o.namespace}/{o.name}", d) for o in data.claims.values() if o.uid != ref.uid for d in o.devices]
        for dev in devices:
            gpu = self.gpus.get(dev.gpu_index)
            why = shares.share_conflict(dev, others, gpu.info.memory_bytes if gpu is not None else 0)
            if why is not None:
                self.metrics.share_refused_total.inc()
                raise ClaimError(f"ResourceClaim {ref.key()}: {why}")
            for other in data.claims.values():
                if dev.role in names.SHARE_ROLES:
                    break  # a shareable device is prepared for many claims (accounted above)
                if other.uid != ref.uid and any(d.device == dev.device for d in other.devices):
                    raise ClaimError(
                        f"ResourceClaim {ref.key()}: device {dev.device} is already prepared for claim "
                        f"{other.namespace}/{other.name} ({other.uid}); unprepare that claim first"
                    )
            if dev.role in names.LENT_ROLES:
                for other in data.claims.values():
                    if other.uid != ref.uid and any(
                        d.gpu_index == dev.gpu_index and d.role == names.ROLE_SERVING for d in other.devices
                    ):
                        raise refusals.ServingHoldsError(
                            f"ResourceClaim {ref.key()}: GPU {dev.gpu_index} ({dev.gpu_uuid}) is held by "
                            f"serving claim {other.namespace}/{other.name}; serving wins, so this lent "
                            "claim can be prepared only after the serving claim is unprepared (the kubelet "
                            "retries)",
                            dev.gpu_index,
                            f"{other.namespace}/{other.name}",
                            pods,
                        )
                for other_uid, gpus in self._binding.items():
                    if other_uid != ref.uid and dev.gpu_index in gpus:
                        raise refusals.ServingHoldsError(
                            f"ResourceClaim {ref.key()}: GPU {dev.gpu_index} ({dev.gpu_uuid}) is allocated to serving"
                            f" claim {other_uid}, which the scheduler is binding; serving wins, so this lent claim"
                            " can be prepared only after that claim is unprepared or deallocated (the kubelet retries)",
                            dev.gpu_index,
                            other_uid,
                            pods,
                        )

    def _prepare_begin(self, ref: ClaimRef) -> tuple[PreparedDevice, ...] | Reclaims:
        """Under the lock: the prepared devices when there is nothing to wait for (idempotent, or
        not a serving claim, or no occupant to reclaim: then the claim is completed here too); else
        the reclaims to run without the lock, and when serving's need began."""
        data = self._data
        rec = data.claims.get(ref.uid)
        if rec is not None and rec.state == PREPARE_COMPLETED:
            return tuple(rec.devices)  # idempotent: the kubelet repeats calls
        if rec is not None:  # a leftover of an interrupted call: roll it back first
            cdi.delete_spec(self.cdi_dir, rec.uid)
            self._drop_claim(rec)
        try:
            claim = self.claims.get_claim(ref.namespace, ref.name)
        except ClaimNotFoundError as e:
            raise ClaimError(
                f"ResourceClaim {ref.key()} (uid {ref.uid}) not found in the API: it was deleted or never existed"
            ) from e
        except Exception as e:
            raise ClaimError(f"reading ResourceClaim {ref.key()} from the API failed: {e}") from e
        valid = validate_claim(claim, ref, self.driver_name, self.node_name, self.gpu_uuids)
        self._check_devices_free(ref, valid.devices, valid.pods)
        grace = (
            self._grace_of(list(valid.pods))
            if any(d.role in names.LENT_ROLES for d in valid.devices)
            else self.default_grace
        )
        rec = ClaimRecord(
            uid=ref.uid,
            namespace=ref.namespace,
            name=ref.name,
            state=PREPARE_STARTED,
            devices=list(valid.devices),
            pods=list(valid.pods),
            grace_seconds=grace,
        )
        data.claims[ref.uid] = rec
        self._take_over_binding(rec.uid)
        self._save()
        crash_point("prepare-started")
        t0 = time.monotonic()
        pendings = [p for o in self._occupants_of(rec) if (p := self._hold_begin(o, rec.uid, None, t0)) is not None]
        if pendings:
            return Reclaims(pendings, t0)
        return self._prepare_finish(ref, t0)

    def _occupants_of(self, rec: ClaimRecord) -> list[ClaimRecord]:
        """The prepared lent claims serving claim ``rec`` reclaims (none for a lent claim): all on
        the GPUs of its whole serving devices; on a GPU where it takes a fraction, the whole-GPU lent
        claims and the RL shares that do not fit beside serving's fractions there
        (``shares.reclaim_for_serving``)."""
        whole = {d.gpu_index for d in rec.devices if d.role == names.ROLE_SERVING}
        out = self._lent_on(whole, rec.uid)
        for g in sorted({d.gpu_index for d in rec.devices if d.role == names.ROLE_SERVING_SHARE} - whole):
            out += [o for o in self._fraction_occupants(g, rec.uid) if o not in out]
        return out

    def _fraction_occupants(self, g: int, but: str, bound: bool = False) -> list[ClaimRecord]:
        """Under the lock: the lent claims on GPU ``g`` that serving's fractions there reclaim
        (``shares.reclaim_for_serving``): those of every recorded claim, the serving claim ``but``
        included, and with ``bound`` (a binding's reclaim) those of every claim allocated there and
        being bound too. A prepare counts only recorded ones: it takes a hold only on what its own
        fraction displaces, so a share resumes as soon as what remains fits again."""
        serving: list[shares.Capacity] = [
            d
            for o in self._data.claims.values()
            for d in o.devices
            if d.gpu_index == g and d.role == names.ROLE_SERVING_SHARE
        ]
        if bound:
            serving += [f for fs in self._binding_fractions.values() for f in fs if f.gpu == g]
        lent = {o.uid: o for o in self._lent_on({g}, but)}
        pairs = [(uid, d) for uid, o in lent.items() for d in o.devices if d.gpu_index == g]
        gpu = self.gpus.get(g)
        picked = shares.reclaim_for_serving(gpu.info.memory_bytes if gpu is not None else 0, serving, pairs)
        return [lent[uid] for uid in picked]

    def _lent_on(self, gpus: Collection[int], but: str = "") -> list[ClaimRecord]:
        """The prepared lent claims (other than ``but``) on any of ``gpus``."""
        return [
            o
            for o in list(self._data.claims.values())
            if gpus
            and o.uid != but
            and o.state == PREPARE_COMPLETED
            and any(d.role in names.LENT_ROLES and d.gpu_index in gpus for d in o.devices)
        ]

    def _take_over_binding(self, claim_uid: str) -> None:
        """A serving claim is being prepared: the holds its allocation took (binding conditions)
        become the claim's own, so its unprepare releases them; under the lock."""
        self._binding.pop(claim_uid, None)
        self._binding_fractions.pop(claim_uid, None)
        with self._bmu:
            self._binding_uids.discard(claim_uid)
        holder = BINDING_HOLDER_PREFIX + claim_uid
        for s in self._data.suspensions.values():
            if holder in s.held_by:
                s.held_by = [claim_uid if h == holder else h for h in s.held_by]
                if s.held_by.count(claim_uid) > 1:
                    s.held_by = list(dict.fromkeys(s.held_by))

    def _prepare_finish(self, ref: ClaimRef, t0: float) -> tuple[PreparedDevice, ...]:
        """Under the lock, after the occupants' reclaim: gate, CDI spec, completed."""
        rec = self._data.claims.get(ref.uid)
        if rec is None or rec.state != PREPARE_STARTED:
            raise ClaimError(f"ResourceClaim {ref.key()}: unprepared while its prepare waited; the kubelet retries")
        occupants = self._occupants_of(rec)
        if any(d.role in names.SERVING_ROLES for d in rec.devices):
            self.metrics.serving_wait_seconds.observe(time.monotonic() - t0)
            self._gate_serving(ref, occupants)
        self._mps_prepare(ref, rec)
        cdi.write_spec(self.cdi_dir, rec.uid, self._spec(rec))
        crash_point("prepare-cdi-written")
        rec.state = PREPARE_COMPLETED
        self._save()
        crash_point("prepare-completed")
        self._bind(rec)
        if names.LENT_ROLES & rec.roles():
            self._fresh_lent[rec.uid] = list(rec.pods)
        log.info(
            "claim prepared",
            extra={"claim": ref.key(), "uid": ref.uid, "devices": [d.device for d in rec.devices]},
        )
        return tuple(rec.devices)

    def _mps_prepare(self, ref: ClaimRef, rec: ClaimRecord) -> None:
        """Under the lock, before the CDI spec: a claim with a share device gets its GPU's MPS daemon
        (started or adopted); a whole-GPU lent claim gets a GPU without one (an idle daemon is
        stopped first). A daemon that cannot be started or stopped refuses the prepare (the kubelet
        retries; a warning Event on the claim's pods): a share is never prepared without its limits."""
        if self.mps is None:
            return
        try:
            for gpu in mps.blocking_whole_lent(rec.devices, self.mps.running()):
                self.mps.stop(gpu)
            self.mps.ensure(mps.share_gpus(rec.devices))
        except mps.MpsError as e:
            log.warning("prepare refused: mps daemon", extra={"claim": ref.key(), "err": str(e)})
            self._events(rec.pods, EVENT_MPS_DAEMON_FAILED, f"claim {ref.key()} not prepared: {e}")
            raise ClaimError(f"ResourceClaim {ref.key()}: {e}; the kubelet retries") from None

    def _mps_sync(self, restart: bool = False) -> None:
        """Under the lock: stop the MPS daemons no recorded claim's share needs any more; with
        ``restart`` (recovery, the repair loop) also start again the daemon of a GPU whose prepared
        shares lost theirs. Failures are logged and counted, never raised: the next pass retries."""
        if self.mps is None:
            return
        claims = list(self._data.claims.values())
        if restart:
            prepared = mps.share_gpus(d for r in claims if r.state == PREPARE_COMPLETED for d in r.devices)
            for gpu in sorted(prepared):
                try:
                    self.mps.ensure([gpu])
                except mps.MpsError as e:
                    log.warning("mps daemon restart failed", extra={"gpu": gpu, "err": str(e)})
        self.mps.sync(mps.share_gpus(d for r in claims for d in r.devices))

    def _gate_serving(self, ref: ClaimRef, occupants: list[ClaimRecord]) -> None:
        """A serving claim is never prepared while a lent occupant's state is observed on the
        device, unless the operator's override allows it (counted, and an Event on the occupant)."""
        refused, _ = self._occupied(ref.key(), "prepared on", occupants)
        if refused:
            raise ClaimError(
                f"ResourceClaim {ref.key()}: serving is not prepared onto an occupied device: {refused};"
                " the kubelet retries (each retry reclaims again)"
            )

    def _occupied(self, serving: str, verb: str, occupants: list[ClaimRecord]) -> tuple[str, str]:
        """The serving gate both paths share (the binding's verdict and the prepare): what still
        occupies the GPUs, as ``(refused, overridden)``. ``refused`` names the first lent occupant
        whose state is observed on them (counted as a refusal); with the operator's override
        (--allow-serving-on-occupied-device) nothing is refused, and each occupied one is counted,
        gets an Event, and the last is named in ``overridden``. Empty strings: observed free."""
        overridden = ""
        for occupant in occupants:
            obs = self._observe(occupant)
            if obs is None:
                continue
            what = f"lent claim {occupant.namespace}/{occupant.name} ({occupant.uid}): {obs}"
            if not self.allow_serving_on_occupied:
                self.metrics.serving_refused_occupied_total.inc()
                return what, ""
            self.metrics.serving_on_occupied_total.inc()
            self._events(
                occupant.pods,
                EVENT_SERVING_ON_OCCUPIED,
                f"serving claim {serving} {verb} a device still holding {what} (--allow-serving-on-occupied-device)",
            )
            overridden = what
        return "", overridden

    def _target(self, occupant: ClaimRecord) -> Target:
        return Target(
            occupant.uid,
            tuple(sorted({d.gpu_index for d in occupant.devices})),
            tuple(p.uid for p in occupant.pods),
        )

    def _observe(self, occupant: ClaimRecord, s: Suspension | None = None) -> str | None:
        """None when the occupant's device is observed free (or nothing observes: no enforcer, or a
        hold the claim-wide observation cannot judge: ``observable``); else what is still there."""
        if self.enforcer is None or (s is not None and not observable(occupant, s)):
            return None
        try:
            obs = self.enforcer.observe(self._target(occupant))
        except Exception as e:  # an observation that fails is not a free device
            return f"observation failed: {e!r}"
        return None if self.enforcer.is_free(obs) else obs.describe(self.enforcer.watch.allowance_bytes)

    def _events(self, pods: list[PodRef], reason: str, message: str) -> None:
        for p in pods:
            self._event(p, reason, message)

    def _bind(self, rec: ClaimRecord) -> None:
        """Tell an engine that wants it which pods use a lent claim."""
        if not isinstance(self.engine, ClaimBinder) or not (names.LENT_ROLES & rec.roles()):
            return
        for p in rec.pods:
            try:
                self.engine.bind_claim(rec.uid, p.uid)
            except Exception as e:
                log.warning(
                    "bind_claim failed", extra={"claim": rec.uid, "pod": f"{p.namespace}/{p.name}", "err": repr(e)}
                )

    def _unprepare_one(self, ref: ClaimRef) -> None:
        rec = self._data.claims.get(ref.uid)
        if rec is None:  # not prepared here (or already unprepared): not an error
            cdi.delete_spec(self.cdi_dir, ref.uid)
            self._close_socket(ref.uid)
            self._close_spill_dir(ref.uid)
            return
        rec.state = UNPREPARE_STARTED
        self._save()
        crash_point("unprepare-started")
        cdi.delete_spec(self.cdi_dir, rec.uid)
        crash_point("unprepare-cdi-removed")
        self._drop_claim(rec)
        log.info("claim unprepared", extra={"claim": ref.key(), "uid": ref.uid})

    def _drop_claim(self, rec: ClaimRecord) -> None:
        """Release what the claim holds (resuming occupants), forget it; the CDI spec is gone."""
        data = self._data
        for s in list(data.suspensions.values()):
            if rec.uid in s.held_by:
                self._release(s.claim_uid, rec.uid)
        if rec.uid in data.suspensions:  # a lent claim going away while suspended
            del data.suspensions[rec.uid]
        data.claims.pop(rec.uid, None)
        self._save()
        if self.enforcer is not None and bool(names.LENT_ROLES & rec.roles()):
            self.enforcer.watch.forget(rec.uid)
        self._close_socket(rec.uid)
        self._close_spill_dir(rec.uid)
        crash_point("unprepare-completed")

    # ------------------------------------------------------------------ suspend / resume
    def _run_engine(
        self, fn: str, claim_uid: str, timeout: float, *args: float, pods: list[str] | None = None
    ) -> SuspendResult:
        assert self.engine is not None
        t0 = time.monotonic()
        if pods is not None and isinstance(self.engine, PodScopedEngine):  # some pods of a shared claim
            fut = self._pool.submit(getattr(self.engine, f"{fn}_pods"), claim_uid, pods, *args)
        else:
            fut = self._pool.submit(getattr(self.engine, fn), claim_uid, *args)
        try:
            res: SuspendResult = fut.result(timeout=timeout)
            return res
        except concurrent.futures.TimeoutError:
            late = self._await_started_copy(fut, claim_uid) if fn == "suspend" else None
            if late is None and fn == "suspend":
                late = self._await_fallback_checkpoint(fut, claim_uid)
            if late is not None:
                return late
            return SuspendResult(
                False,
                "none",
                0,
                time.monotonic() - t0,
                None,
                f"suspend engine did not finish {fn} within {timeout:.1f}s",
                SuspendReason.ENGINE_TIMEOUT,
            )
        except Exception as e:
            return SuspendResult(
                False, "none", 0, time.monotonic() - t0, None, f"suspend engine {fn} raised {e!r}", SuspendReason.FAILED
            )

    def _await_started_copy(
        self, fut: concurrent.futures.Future[SuspendResult], claim_uid: str
    ) -> SuspendResult | None:
        """Serving must not start on a GPU whose memory is still being copied off. When the engine
        reports an uninterruptible copy running (cuda-checkpoint's checkpoint call takes no
        timeout), wait for it — up to ``copy_wait_limit`` more seconds, measured in
        ``rose_driver_suspend_copy_wait_seconds``. None: no copy runs, give up now."""
        engine = self.engine
        if not isinstance(engine, CopyWatcher):
            return None
        try:
            running = engine.copy_in_progress(claim_uid)
        except Exception as e:
            log.warning("copy_in_progress failed", extra={"claim": claim_uid, "err": repr(e)})
            return None
        if not running:
            return None
        log.warning("grace period over with a device copy running; serving waits for it", extra={"claim": claim_uid})
        t0 = time.monotonic()
        try:
            res: SuspendResult = fut.result(timeout=self.copy_wait_limit)
        except concurrent.futures.TimeoutError:
            res = SuspendResult(
                False,
                "none",
                0,
                time.monotonic() - t0,
                None,
                f"the device-to-host copy that had started was still running {self.copy_wait_limit:.0f}s after the"
                " grace period; serving proceeds and may find the GPU's memory not yet free",
                SuspendReason.ENGINE_TIMEOUT,
            )
        except Exception as e:
            res = SuspendResult(False, "none", 0, 0.0, None, f"suspend engine raised {e!r}", SuspendReason.FAILED)
        waited = time.monotonic() - t0
        self.metrics.suspend_copy_wait_seconds.observe(waited)
        return replace(res, message=f"{res.message} (serving waited {waited:.3f}s for the copy that had started)")

    def _await_fallback_checkpoint(
        self, fut: concurrent.futures.Future[SuspendResult], claim_uid: str
    ) -> SuspendResult | None:
        """The engine asked the workload for its durable checkpoint (the fallback) and it has not
        answered yet: give it up to ``--enforce-timeout-seconds`` more before the enforcement kills
        the process, so an honest workload's checkpoint in progress is not lost. None: none in flight."""
        engine, enforcer = self.engine, self.enforcer
        if enforcer is None or not isinstance(engine, FallbackWatcher):
            return None
        try:
            if not engine.fallback_in_progress(claim_uid):
                return None
        except Exception as e:
            log.warning("fallback_in_progress failed", extra={"claim": claim_uid, "err": repr(e)})
            return None
        log.warning("grace period over with a durable checkpoint requested; waiting for it", extra={"claim": claim_uid})
        try:
            res: SuspendResult = fut.result(timeout=enforcer.timeout)
        except concurrent.futures.TimeoutError:
            return None
        except Exception as e:
            return SuspendResult(False, "none", 0, 0.0, None, f"suspend engine raised {e!r}", SuspendReason.FAILED)
        return res

    def _hold(
        self, occupant: ClaimRecord, holder: str, grace: float | None, need_t0: float | None = None
    ) -> Suspension:
        data = self._data
        s = data.suspensions.get(occupant.uid)
        if s is None:
            s = Suspension(claim_uid=occupant.uid, state=SUSPEND_STARTED, held_by=[holder])
            data.suspensions[occupant.uid] = s
        elif holder not in s.held_by:
            s.held_by.append(holder)
        p = self._hold_begin_locked(occupant, s, grace, need_t0)
        if p is not None:
            self._suspend_record(p, self._suspend_run(p))
        return self._data.suspensions.get(occupant.uid, s)

    def _hold_begin(
        self, occupant: ClaimRecord, holder: str, grace: float | None, need_t0: float | None = None
    ) -> PendingSuspend | None:
        """Add ``holder`` to the occupant's hold; the reclaim to run (None: nothing to do now)."""
        data = self._data
        s = data.suspensions.get(occupant.uid)
        if s is None:
            s = Suspension(claim_uid=occupant.uid, state=SUSPEND_STARTED, held_by=[holder])
            data.suspensions[occupant.uid] = s
        elif holder not in s.held_by:
            s.held_by.append(holder)
        return self._hold_begin_locked(occupant, s, grace, need_t0)

    def _hold_begin_locked(
        self, occupant: ClaimRecord, s: Suspension, grace: float | None, need_t0: float | None
    ) -> PendingSuspend | None:
        if occupant.uid in self._reclaiming:  # a reclaim of it runs now: it records the outcome
            self._save()
            return None
        done = s.state in _EVICTED or (s.state == SUSPENDED and not self._engine_disagrees(s))
        if done and self._observe(occupant, s) is None:  # recorded done, and observed free: nothing to do
            self._save()
            return None
        return self._suspend_begin(occupant, s, grace, need_t0)

    def _engine_disagrees(self, s: Suspension) -> bool:
        """Recorded suspended, but the engine reports its workload (the held pods of a shared claim)
        running, and the driver did not checkpoint it itself: then the engine's view of that process
        does not count."""
        if s.state != SUSPENDED or s.backend == BACKEND_ENFORCED_CHECKPOINT:
            return False
        owner = self._data.claims.get(s.claim_uid)
        return self._engine_says_running(s.claim_uid, None if owner is None else self._targets(owner, s.held_by))

    def _engine_says_running(self, claim_uid: str, pods: list[str] | None = None) -> bool:
        """The engine (restarted since, its workload re-registered as running) disagrees with our
        record, for ``pods`` of the claim (None: any of its pods)."""
        if self.engine is None:
            return False
        try:
            if pods is not None and isinstance(self.engine, PodScopedEngine):
                return self.engine.pods_state(claim_uid, pods) == "running"
            return self.engine.occupant_state(claim_uid) == "running"
        except Exception:
            return False

    def _targets(self, occupant: ClaimRecord, held_by: list[str]) -> list[str] | None:
        """The pods of a claim its holders keep suspended. None, the whole claim: a serving claim
        holds it, or it has one pod, or the engine acts on whole claims only. Else (a claim shared
        by a time-slice group's members) only the pods whose own suspend request holds it."""
        if len(occupant.pods) <= 1 or not isinstance(self.engine, PodScopedEngine):
            return None
        if any(not h.startswith(REQUEST_HOLDER_PREFIX) for h in held_by):
            return None
        return [p.uid for p in occupant.pods if REQUEST_HOLDER_PREFIX + p.uid in held_by]

    @staticmethod
    def _pods_of(occupant: ClaimRecord, targets: list[str] | None) -> list[PodRef]:
        return [p for p in occupant.pods if targets is None or p.uid in targets]

    def _suspend(
        self, occupant: ClaimRecord, s: Suspension, grace: float | None = None, need_t0: float | None = None
    ) -> None:
        """Reclaim the occupant's GPU in two phases: the engine's cooperative suspend (with its
        checkpoint-and-evict fallback) within the grace period, then — unless the device is then
        observed free — the driver's enforcement (``dra_driver.enforce``). All under the caller's
        lock; a serving prepare runs the middle part (:meth:`_suspend_run`) without it."""
        p = self._suspend_begin(occupant, s, grace, need_t0)
        self._suspend_record(p, self._suspend_run(p))

    def _suspend_begin(
        self, occupant: ClaimRecord, s: Suspension, grace: float | None, need_t0: float | None
    ) -> PendingSuspend:
        """Under the lock: record the suspend as started and say so; what the run needs."""
        t0 = time.monotonic() if need_t0 is None else need_t0
        grace_s = occupant.grace_seconds if grace is None else grace
        s.state = SUSPEND_STARTED
        self._save()
        crash_point("suspend-started")
        targets = self._targets(occupant, s.held_by)
        pods = self._pods_of(occupant, targets)
        self._notify(pods, POD_SUSPENDING, f"suspending lent GPU workload (grace {grace_s:g}s), held by {s.held_by}")
        self._reclaiming.add(occupant.uid)
        return PendingSuspend(copy.deepcopy(occupant), targets, grace_s, t0, observable(occupant, s))

    def _suspend_all(self, pendings: Sequence[PendingSuspend]) -> list[RanSuspend]:
        """Run the reclaims of several occupants at once, without the node lock: the shares of one
        GPU (or the occupants of a multi-GPU serving claim) are reclaimed together, so serving waits
        for one occupant's bound, not for their sum. Each engine call still takes a thread of the
        engine pool; occupants beyond its free threads queue there."""
        if len(pendings) <= 1:
            return [self._suspend_run(p) for p in pendings]
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(pendings), thread_name_prefix="reclaim") as ex:
            return list(ex.map(self._suspend_run, pendings))

    def _suspend_run(self, p: PendingSuspend) -> RanSuspend:
        """The waiting part, safe without the node lock (it reads only ``p``): the engine's
        cooperative suspend, then the enforcement when the device is not observed free."""
        try:
            res = self._engine_suspend(p.occupant, p.grace_s, p.targets)
        except Exception as e:  # _run_engine reports its own failures; anything else is one too
            res = SuspendResult(False, "none", 0, 0.0, None, f"suspend raised {e!r}", SuspendReason.FAILED)
        enforced = self._enforce(p.occupant, p.observable, res)
        if enforced is not None:
            self._report_evictions(res, enforced)
        if enforced is not None and enforced.method == METHOD_KILL and isinstance(self.engine, Abandoner):
            try:  # its processes are stopped: no ack will come, free the engine's threads
                self.engine.abandon(p.occupant.uid)
            except Exception:
                log.exception("abandon failed", extra={"claim": p.occupant.uid})
        return RanSuspend(res, enforced)

    def _suspend_record(self, p: PendingSuspend, ran: RanSuspend) -> None:
        """Under the lock: record what the run did (nothing when the claim went away meanwhile)."""
        self._reclaiming.discard(p.occupant.uid)
        occupant, s = self._data.claims.get(p.occupant.uid), self._data.suspensions.get(p.occupant.uid)
        if occupant is None or s is None:
            log.info("occupant gone while its suspend ran", extra={"claim": p.occupant.uid})
            return
        res, enforced, t0 = ran.res, ran.enforced, p.t0
        crash_point("suspend-engine-returned")
        s.backend, s.bytes_moved, s.message = res.backend, res.bytes_moved, res.message
        if enforced is None or enforced.method == METHOD_NONE:
            outcome = self._record_engine_result(occupant, s, res, enforced)
        else:
            outcome = self._record_enforced(occupant, s, res, enforced)
        if enforced is not None and enforced.free:
            self.metrics.gpu_returned_seconds.labels(returned_phase(res, enforced.method)).observe(
                time.monotonic() - t0
            )
        self.metrics.occupant_suspend_total.labels(outcome).inc()
        log.info(
            "occupant suspend done",
            extra={"claim": occupant.uid, "state": s.state, "backend": s.backend, "seconds": res.seconds},
        )
        self._save()
        crash_point("suspend-completed")

    def _engine_suspend(self, occupant: ClaimRecord, grace_s: float, targets: list[str] | None) -> SuspendResult:
        if self.engine is None:
            return SuspendResult(
                False,
                "none",
                0,
                0.0,
                None,
                "no suspend engine configured (--suspend-engine=none)",
                SuspendReason.NO_ENGINE,
            )
        return self._run_engine("suspend", occupant.uid, grace_s + self.grace_slack, grace_s, pods=targets)

    def _enforce(self, occupant: ClaimRecord, can_observe: bool, res: SuspendResult) -> EnforceResult | None:
        """Observe the device; enforce when it is not free. None: nothing observes (no enforcer, or
        a hold the claim-wide observation cannot judge: ``observable``)."""
        if self.enforcer is None or not can_observe:
            return None
        why = enforcement_cause(res)
        try:
            return self.enforcer.enforce(self._target(occupant), occupant.pods, why, checkpoint=res.fallback is None)
        except Exception as e:  # an enforcement that fails leaves the device not observed free
            log.exception("enforcement failed", extra={"claim": occupant.uid})
            return EnforceResult(False, METHOD_KILL, (), (), Observation(source="error"), f"enforcement failed: {e!r}")

    def _report_evictions(self, res: SuspendResult, e: EnforceResult) -> None:
        """Each pod the enforcement evicted (the driver's claim records: reservedFor) gets its
        ``LentWorkloadEvicted`` Event and count now, whether or not the claim is still recorded when
        the run is. After a confirmed durable checkpoint the engine's evictor already reported it."""
        if res.ok and res.fallback is not None:
            return
        why = enforcement_cause(res)
        for pod in e.evicted:
            evictions.report_eviction(self.notifier, self.metrics.count_lent_eviction, pod, why, saved=False)

    def _record_engine_result(
        self, occupant: ClaimRecord, s: Suspension, res: SuspendResult, seen: EnforceResult | None
    ) -> str:
        """The device is observed free without the driver acting (or nothing observes): the
        engine's result decides the record. Returns the outcome label."""
        pods = self._pods_of(occupant, self._targets(occupant, s.held_by))
        if res.ok and res.fallback is None:
            s.state = SUSPENDED
            msg = f"suspended into host memory via {res.backend}: {res.bytes_moved} bytes in {res.seconds:.3f}s"
            self._notify(pods, POD_SUSPENDED, msg, "Suspended")
            return "suspended"
        if res.ok:  # checkpoint confirmed, pod evicted
            s.state = CHECKPOINTED_EVICTED
            msg = f"suspend fell back to {res.fallback}: {res.message}"
            self._notify(pods, POD_CHECKPOINTED_EVICTED, msg, "SuspendFallback", warning=True)
            return "checkpoint_evict"
        s.state = SUSPEND_FAILED
        tail = "serving proceeds" if seen is None else "the device is observed free, serving proceeds"
        self._notify(pods, POD_SUSPENDING, f"suspend failed, {tail}: {res.message}", "SuspendFailed", warning=True)
        return "timeout" if res.timed_out else "failed"

    def _record_enforced(self, occupant: ClaimRecord, s: Suspension, res: SuspendResult, e: EnforceResult) -> str:
        """The driver acted at the deadline: record what it did and what the workload lost."""
        pods = list(occupant.pods)
        self.metrics.reclaim_enforced_total.labels(e.method, "freed" if e.free else "not_freed").inc()
        cause = f"the device was not observed free after the cooperative phase ({enforcement_cause(res)})"
        if not e.free:
            s.state, s.message = SUSPEND_FAILED, f"{cause}; enforcement ({e.method}) did not free it: {e.message}"
            self._notify(pods, POD_SUSPENDING, s.message + "; serving is not prepared", EVENT_RECLAIM_NOT_FREED, True)
            return "failed"
        if e.method == METHOD_CUDA_CHECKPOINT:
            s.state, s.backend, s.pids = SUSPENDED, BACKEND_ENFORCED_CHECKPOINT, list(e.pids)
            s.message = (
                f"{cause}; the driver checkpointed PIDs {list(e.pids)} with cuda-checkpoint: state kept in host memory"
            )
            self._notify(pods, POD_SUSPENDED, s.message, EVENT_RECLAIM_ENFORCED, True)
            return "enforced"
        evicted = ", ".join(f"{p.namespace}/{p.name}" for p in e.evicted) or "none (no evictor)"
        if res.ok and res.fallback is not None:
            s.state = CHECKPOINTED_EVICTED
            s.message = (
                f"durable checkpoint confirmed ({res.message}); the driver stopped the pod's processes on the"
                f" device ({e.message}) so serving does not wait for the eviction: nothing lost"
            )
            self._notify(pods, POD_CHECKPOINTED_EVICTED, s.message, "SuspendFallback", warning=True)
            return "checkpoint_evict"
        s.state = ENFORCED_EVICTED
        s.message = (
            f"{cause}; at the deadline the driver killed the workload's processes on the device ({e.message})"
            f" and evicted {evicted}: the workload lost what it had not checkpointed durably, because it did"
            " not free the device within its grace period"
        )
        self._events(pods, EVENT_RECLAIM_ENFORCED, s.message)
        return "enforced"

    def _restore_enforced(self, s: Suspension) -> SuspendResult:
        """Resume what the driver checkpointed itself: restore and unlock its PIDs."""
        ck = self.enforcer.checkpointer if self.enforcer is not None else None
        if ck is None:
            return SuspendResult(
                False, "none", 0, 0.0, None, "cuda-checkpoint is not enabled to restore", SuspendReason.FAILED
            )
        errors = [f"{pid}: {e}" for pid in s.pids if (e := ck.restore_pid(pid))]
        if errors:
            return SuspendResult(False, METHOD_CUDA_CHECKPOINT, 0, 0.0, None, "; ".join(errors), SuspendReason.FAILED)
        return SuspendResult(True, METHOD_CUDA_CHECKPOINT, s.bytes_moved, 0.0, None, f"restored PIDs {s.pids}")

    def _release(self, occupant_uid: str, holder: str) -> None:
        data = self._data
        s = data.suspensions.get(occupant_uid)
        if s is None or holder not in s.held_by:
            return
        occupant = data.claims.get(occupant_uid)
        before = None if occupant is None else self._targets(occupant, s.held_by)
        s.held_by.remove(holder)
        if s.held_by and occupant is not None:
            self._resume_released(occupant, s, before)
        if s.held_by or occupant is None:
            self._save()
            return
        self._resume(occupant, s, before)

    def _resume_released(self, occupant: ClaimRecord, s: Suspension, before: list[str] | None) -> None:
        """Others still hold the claim, but maybe not every pod the released holder held (a shared
        claim: serving left while a member's own request still parks it): resume the rest."""
        after = self._targets(occupant, s.held_by)
        if after is None or s.state != SUSPENDED:
            return
        dropped = [p.uid for p in occupant.pods if (before is None or p.uid in before) and p.uid not in after]
        if not dropped:
            return
        pods = self._pods_of(occupant, dropped)
        self._notify(pods, POD_RESUMING, "resuming lent GPU workload")
        assert self.engine is not None
        self._report_resume(pods, self._engine_resume(occupant, dropped))

    def _engine_resume(self, occupant: ClaimRecord, targets: list[str] | None) -> SuspendResult:
        return self._run_engine("resume", occupant.uid, occupant.grace_seconds + 60.0, pods=targets)

    def _report_resume(self, pods: list[PodRef], res: SuspendResult, note: str = "") -> None:
        """The resume's metric and Event (and the pods' suspend state); ``note`` ends a failure's message."""
        if res.ok:
            self.metrics.occupant_resume_total.labels("ok").inc()
            self._notify(pods, POD_RUNNING, f"resumed via {res.backend} in {res.seconds:.3f}s", "Resumed")
        else:
            self.metrics.occupant_resume_total.labels("error").inc()
            self._notify(pods, POD_SUSPENDED, f"resume failed: {res.message}{note}", "ResumeFailed", warning=True)

    def _resume_due(self, occupant_uid: str) -> bool:
        """Whether the repair loop may try this occupant's failed resume again (its backoff passed)."""
        retry = self._resume_retry.get(occupant_uid)
        return retry is None or self._clock() >= retry[1]

    def _resume_failed(self, occupant_uid: str, message: str) -> str:
        """Count a failed resume and schedule the repair loop's next try; the note for its Event.
        The occupant stays recorded (nobody holds it: its workload gone, or not registered again
        yet). Retrying on every repair pass (2 s) flipped the pod's suspend state Resuming ->
        Suspended with a ResumeFailed Event each time, forever (docs/bench/soak.md, T5). In memory
        only: a restarted driver tries again at once."""
        failures = self._resume_retry.get(occupant_uid, (0, 0.0))[0] + 1
        # the first retry at the next repair pass, as before; then the backoff's delays
        delay = self.resume_backoff.delay(failures - 1) if failures > 1 else 0.0
        self._resume_retry[occupant_uid] = (failures, self._clock() + delay)
        log.warning(
            "resume failed: retry backed off",
            extra={"claim": occupant_uid, "failures": failures, "retryInSeconds": delay, "err": message},
        )
        when = f"in {delay:g}s" if delay > 0 else "at the next repair pass"
        return f"; retried {when} (failure {failures})"

    def _resume(self, occupant: ClaimRecord, s: Suspension, targets: list[str] | None = None) -> None:
        data = self._data
        if s.state in _EVICTED:  # nothing left on this node to resume
            del data.suspensions[occupant.uid]
            self._save()
            return
        s.state = RESUME_STARTED
        self._save()
        crash_point("resume-started")
        pods = self._pods_of(occupant, targets)
        self._notify(pods, POD_RESUMING, "resuming lent GPU workload")
        if s.backend == BACKEND_ENFORCED_CHECKPOINT:
            res = self._restore_enforced(s)
        elif self.engine is None:
            res = SuspendResult(True, "none", 0, 0.0, None, "no suspend engine configured")
        else:
            res = self._engine_resume(occupant, targets)
        crash_point("resume-engine-returned")
        note = ""
        if res.ok:
            del data.suspensions[occupant.uid]
            self._resume_retry.pop(occupant.uid, None)
        else:  # stays recorded (nobody holds it): the repair loop retries the resume, backing off
            s.state, s.message = SUSPENDED, res.message
            note = self._resume_failed(occupant.uid, res.message)
        self._report_resume(pods, res, note)
        self._save()


@dataclass(frozen=True)
class PendingSuspend:
    """A started reclaim of one occupant: what its run needs (a copy: the run holds no lock)."""

    occupant: ClaimRecord
    targets: list[str] | None
    grace_s: float
    t0: float  # when serving's need began (rose_driver_gpu_returned_seconds)
    observable: bool


@dataclass(frozen=True)
class Reclaims:
    """A serving prepare's occupants to reclaim without the node lock, and when its need began."""

    pendings: list[PendingSuspend]
    t0: float


@dataclass(frozen=True)
class RanSuspend:
    res: SuspendResult
    enforced: EnforceResult | None


def real_gpus_only(daemons: mps.MpsDaemons | None, simulated: bool) -> mps.MpsDaemons | None:
    """The MPS daemon manager, refused on simulated GPUs (it is never chosen silently there)."""
    if daemons is not None and simulated:
        raise ValueError("MPS daemons run only on real GPUs (--gpu-backend nvml), not on simulated ones")
    return daemons


def lent_held(data: NodeStateData) -> tuple[frozenset[int], frozenset[int], frozenset[int]]:
    """Pure: the GPU indices in shares (RL's or serving's fractions: no whole lendable claim lands
    there), those lent whole, and those with serving's fractions (no whole serving claim lands there),
    by any recorded claim (being prepared, prepared, being unprepared)."""
    roles = [(d.gpu_index, d.role) for rec in data.claims.values() for d in rec.devices]
    return (
        frozenset(i for i, r in roles if r in names.SHARE_ROLES),
        frozenset(i for i, r in roles if r == names.ROLE_LENDABLE),
        frozenset(i for i, r in roles if r == names.ROLE_SERVING_SHARE),
    )


def running_lent(data: NodeStateData, gpu: int, gpu_memory: int) -> float:
    """Pure: how much of GPU ``gpu`` running (not suspended) RL work holds: 1 when a lendable claim
    runs there, else the fraction its running RL shares hold (``slices.share_fraction``, at most 1)."""
    running = [
        dev
        for rec in data.claims.values()
        if rec.uid not in data.suspensions
        for dev in rec.devices
        if dev.gpu_index == gpu and dev.role in names.LENT_ROLES
    ]
    if any(dev.role == names.ROLE_LENDABLE for dev in running):
        return 1.0
    memory = sum(dev.memory_bytes for dev in running)
    compute = sum(dev.compute_percent for dev in running)
    return min(1.0, share_fraction(memory, compute, gpu_memory)) if running else 0.0


def serving_held(data: NodeStateData, binding: Mapping[str, frozenset[int]]) -> frozenset[int]:
    """Pure: the GPU indices serving holds on this node: a serving device of a recorded claim (being
    prepared, prepared, being unprepared) or of a claim allocated and being bound (``binding``)."""
    held = {d.gpu_index for rec in data.claims.values() for d in rec.devices if d.role == names.ROLE_SERVING}
    return frozenset(held.union(*binding.values()))


def enforcement_cause(res: SuspendResult) -> str:
    """Pure: why the cooperative phase did not (provably) free the device, for the Event."""
    if res.ok and res.fallback is None:
        return f"the workload acknowledged the suspend ({res.backend}), which the driver does not take on its word"
    if res.ok:
        return f"the {res.fallback} fallback was confirmed"
    return f"cooperative suspend failed ({res.reason}): {res.message}"


def observable(occupant: ClaimRecord, s: Suspension) -> bool:
    """Pure: can the claim-wide observation judge this hold? Yes when serving holds the GPU (every
    occupant must leave it) or the claim has one pod. A suspend request for one pod of a shared
    (time-slice) claim is not: the other pods may use the device legitimately, and the simulated
    file cannot tell whose bytes it holds — that hold is left to the engine's result."""
    return len(occupant.pods) <= 1 or any(not h.startswith(REQUEST_HOLDER_PREFIX) for h in s.held_by)

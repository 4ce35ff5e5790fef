"""The node's suspend engine: picks a backend, enforces the host-memory budget, takes the fallback.

``NodeSuspendEngine`` implements ``dra_driver.engine_api.SuspendEngine`` (by claim UID) and the
pod-level operations the NodeControl service exposes. Invariants:

* idempotent: suspending a suspended occupant or resuming a running one moves nothing, ``ok=True``;
* one operation at a time per workload (a per-workload lock);
* a suspend that would not fit the host-memory budget is refused before anything moves, and the
  workload takes the fallback: an atomic durable checkpoint, then eviction, with an Event;
* suspended state is never released: a failed resume leaves the workload Suspended (state intact
  in host memory) and says so; the budget is released only after a successful resume;
* the fallback evicts only a pod from the driver's claim records (the workload's ``ClaimScope``),
  and only after the checkpoint file named in the ack exists and its sha256 verifies;
* state sizes a workload reports are unverified: they count in the budget only up to its claim's
  device memory (the scope's bound), and not at all without a scope;
* layered memory: with a disk tier (``spill.SpillStore``), a suspend that does not fit the DRAM
  budget first spills the least recently suspended DRAM copies the backend can hand over; the
  fallback runs only when both tiers are full. A DRAM copy is dropped only after its disk copy is
  written, fsynced and verified; a resume reads it back verified, and a bad checksum never resumes:
  the workload falls back to its durable checkpoint.
* a cooperative workload keeps its DRAM copy in its own process: to spill it, the engine creates
  the file (``SpillStore.hand_over``), the SDK writes it, the engine verifies it from disk
  (``SpillStore.adopt``) and only then tells the SDK to free its copy; the state counts as spilled
  (its DRAM charge moves to the disk tier) only when the process's resident memory fell
  accordingly. A workload that does not answer in ``spill_timeout_seconds`` is not spilled. The
  file is in the workload's claim's spill directory where its claim has one (mounted into the
  claim's containers by its CDI spec), and the commands name it as the process sees it.

I/O boundary: the backends, the evictor, the event sink, and reading the checkpoint file.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from dra_driver.engine_api import SuspendReason, SuspendResult
from dra_driver.suspend.budget import HostMemoryBudget
from dra_driver.suspend.cooperative import CooperativeBackend, spill_freed
from dra_driver.suspend.events import (
    REASON_FALLBACK_CHECKPOINT,
    REASON_FALLBACK_FAILED,
    REASON_RESUME_FAILED,
    REASON_RESUMED,
    REASON_SPILL_CORRUPT,
    REASON_SPILL_FAILED,
    REASON_SPILL_NOT_FREED,
    REASON_SPILLED,
    REASON_SUSPEND_FAILED,
    REASON_SUSPENDED,
    EngineEvent,
    EventSink,
    EventType,
    LogEventSink,
)
from dra_driver.suspend.metrics import SuspendMetrics
from dra_driver.suspend.model import (
    BACKEND_COOPERATIVE,
    BACKEND_SIMULATED,
    BACKENDS,
    FALLBACK_CHECKPOINT_EVICT,
    STATE_CHECKPOINTED_EVICTED,
    STATE_RESUMING,
    STATE_RUNNING,
    STATE_SUSPENDED,
    STATE_SUSPENDING,
    Ack,
    BackendOutcome,
    CommandKind,
    OpContext,
    OperationRecord,
    Registration,
    stand_in_pod_uid,
)
from dra_driver.suspend.registry import (
    MAX_STATE_BYTES,
    ClaimScope,
    RegistrationError,
    RegistrationRefused,
    TrustedPod,
    Workload,
    WorkloadRegistry,
)
from dra_driver.suspend.spill import (
    SUFFIX,
    TIER_DISK,
    TIER_DRAM,
    TMP_SUFFIX,
    HostCopy,
    Resident,
    SpillCorrupt,
    SpillError,
    SpillStore,
    plan_spill,
    spill_error_kind,
    workload_views,
)
from dra_driver.suspend.verify import CheckpointVerifier, Verdict, VerifyRequest

log = logging.getLogger("rose.suspend")

_MAX_OPERATIONS = 1024
_NO_SESSION = "no current registration for pod {!r} with this session on this socket; register again"


class Backend(Protocol):
    """A way to move a workload's state. Optional capabilities, looked up by name:
    ``device_bytes(w) -> int | None`` (what its process holds on the GPU now, charged to the
    budget when larger than the registered size) and ``copy_started(w) -> float | None`` (the
    monotonic start of an uninterruptible device-to-host copy running now)."""

    name: str

    def suspend(self, w: Workload, deadline_monotonic: float, op: OpContext) -> BackendOutcome: ...

    def resume(self, w: Workload, deadline_monotonic: float, op: OpContext) -> BackendOutcome: ...


class Evictor(Protocol):
    """Evicts a pod from the driver's claim records (with a UID precondition) after its durable
    checkpoint is verified (the driver's API module)."""

    def evict(self, pod: TrustedPod, reason: str) -> None: ...


class UnknownOccupantError(LookupError):
    """No registered workload for a claim or pod UID on this node."""


@dataclass(frozen=True)
class EngineConfig:
    host_memory_budget_bytes: int
    # Enabled backends in order of preference; a workload gets the first one it supports.
    backends: tuple[str, ...] = (BACKEND_COOPERATIVE,)
    checkpoint_timeout_seconds: float = 60.0
    resume_timeout_seconds: float = 120.0
    # With the simulated backend enabled and this > 0, a claim with no registered workload is
    # treated as a simulated occupant of this many bytes (end-to-end tests on KWOK nodes).
    simulated_occupant_bytes: int = 0
    node_name: str = ""
    # The disk tier of suspended state (layered memory): a local directory and its byte budget.
    # "" / 0: no disk tier (a full DRAM budget takes the checkpoint-and-evict fallback at once).
    spill_dir: str = ""
    spill_budget_bytes: int = 0
    # How long a cooperative workload has to write its spill file, and again to free its host copy.
    spill_timeout_seconds: float = 30.0

    def __post_init__(self) -> None:
        unknown = [b for b in self.backends if b not in BACKENDS]
        if unknown:
            raise ValueError(f"unknown suspend backend(s) {unknown}; choose from {', '.join(BACKENDS)}")
        if not self.backends:
            raise ValueError(f"enable at least one suspend backend ({', '.join(BACKENDS)})")
        if self.host_memory_budget_bytes < 0:
            raise ValueError("host memory budget must be >= 0 bytes")
        if self.checkpoint_timeout_seconds <= 0 or self.resume_timeout_seconds <= 0:
            raise ValueError("checkpoint and resume timeouts must be > 0 seconds")
        if self.simulated_occupant_bytes < 0:
            raise ValueError("simulated occupant bytes must be >= 0")
        self._check_spill()

    def _check_spill(self) -> None:
        if self.spill_timeout_seconds <= 0:
            raise ValueError(f"spill timeout must be > 0 seconds, got {self.spill_timeout_seconds}")
        if self.spill_budget_bytes < 0:
            raise ValueError(f"spill budget must be >= 0 bytes, got {self.spill_budget_bytes}")
        if self.spill_dir and not self.spill_dir.startswith("/"):
            raise ValueError(f"spill directory must be an absolute path, got {self.spill_dir!r}")
        if self.spill_budget_bytes > 0 and not self.spill_dir:
            raise ValueError("a spill budget needs a spill directory (--spill-dir)")
        if self.spill_dir and self.spill_budget_bytes == 0:
            raise ValueError(f"spill directory {self.spill_dir} needs a budget > 0 (--spill-budget-bytes)")


def choose_backend(supported: Iterable[str], enabled: Sequence[str]) -> str | None:
    """Pure: the first enabled backend (in the operator's order) that the workload supports."""
    s = set(supported)
    for b in enabled:
        if b in s:
            return b
    return None


def host_bytes_needed(registered_bytes: int, measured_device_bytes: int | None) -> int:
    """Pure: host memory a suspend will take — the larger of what the workload registered and what
    its process was measured to hold on the GPU (the driver copies every allocation: the caching
    allocator's reserve, the CUDA context, library workspaces)."""
    if measured_device_bytes is None or measured_device_bytes < 0:
        return registered_bytes
    return max(registered_bytes, measured_device_bytes)


_FALLBACK_REASON_OF = {
    "deadline_exceeded": SuspendReason.DEADLINE_EXCEEDED,
    "unsupported_workload": SuspendReason.UNSUPPORTED,
}


def fallback_failure_reason(why: str) -> SuspendReason:
    """Pure: the result reason of a suspend whose fallback could not be completed."""
    return _FALLBACK_REASON_OF.get(why, SuspendReason.FAILED)


def unverified_bytes_counted(state_bytes: int, scope: ClaimScope | None) -> int:
    """Pure: how much of a size a workload reported (unverified) counts in the host budget: at
    most its claim's device memory (a process cannot have offloaded more than it held on the
    claim's GPUs); nothing without a claim scope (a shared socket: no bound to justify)."""
    if scope is None or scope.max_state_bytes <= 0:
        return 0
    return max(0, min(state_bytes, scope.max_state_bytes))


def _claim_of(scope: ClaimScope | None) -> str | None:
    return None if scope is None else scope.claim_uid


def occupant_state_of(state: str) -> str:
    """Pure: the engine_api view of a workload state — is its state resident on the GPU?"""
    if state in (STATE_RUNNING, STATE_SUSPENDING, STATE_RESUMING):
        return "running"
    if state in (STATE_SUSPENDED, STATE_CHECKPOINTED_EVICTED):
        return "suspended"
    return "unknown"


def _stand_in(claim_uid: str) -> str:
    """The pod UID of a claim's one simulated occupant (a claim of one pod, or of none bound)."""
    return stand_in_pod_uid(claim_uid)


def _pods_note(pod_uids: Sequence[str] | None) -> str:
    return "" if pod_uids is None else f" (pods {sorted(pod_uids)})"


def combine_results(results: Sequence[tuple[str, SuspendResult]]) -> SuspendResult:
    """Pure: one result for an operation on several workloads of one claim. ok when all are;
    the fallback only when every one of them took it (then nothing is left to resume); the reason
    of the first failure; bytes summed; the longest duration."""
    ok = all(r.ok for _, r in results)
    fallbacks = {r.fallback for _, r in results}
    fallback = next(iter(fallbacks)) if ok and len(fallbacks) == 1 else None
    failed = [r for _, r in results if not r.ok]
    reason = failed[0].reason if failed else SuspendReason.FALLBACK if fallback else SuspendReason.DONE
    return SuspendResult(
        ok=ok,
        backend=",".join(sorted({r.backend for _, r in results})),
        bytes_moved=sum(r.bytes_moved for _, r in results),
        seconds=max(r.seconds for _, r in results),
        fallback=fallback,
        message="; ".join(f"pod {uid}: {r.message}" for uid, r in results),
        reason=reason,
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


def _unreachable(pid: int | None, path: Path) -> str:
    return (
        f"its process (pid {pid}) cannot reach the spill file {path.name} under any path it was looked up by"
        " (is the claim's spill directory mounted into its container?)"
    )


class NodeSuspendEngine:
    def __init__(
        self,
        config: EngineConfig,
        backends: Mapping[str, Backend],
        *,
        registry: WorkloadRegistry | None = None,
        events: EventSink | None = None,
        metrics: SuspendMetrics | None = None,
        evictor: Evictor | None = None,
        verifier: CheckpointVerifier | None = None,
        spill: SpillStore | None = None,
    ) -> None:
        missing = [b for b in config.backends if b not in backends]
        if missing:
            raise ValueError(f"backend instance(s) missing for enabled backend(s) {missing}")
        self.config = config
        self._backends = dict(backends)
        self.registry = registry if registry is not None else WorkloadRegistry()
        self._events = events if events is not None else LogEventSink()
        self.metrics = metrics if metrics is not None else SuspendMetrics()
        self._evictor = evictor
        self.verifier = verifier if verifier is not None else CheckpointVerifier()
        self.budget = HostMemoryBudget(config.host_memory_budget_bytes)
        self.metrics.host_budget_bytes.set(config.host_memory_budget_bytes)
        self._ops: collections.OrderedDict[str, OperationRecord] = collections.OrderedDict()
        self._ledger_freed: set[str] = set()  # claims whose simulated occupant the driver evicted
        self._checkpointing: set[str] = set()  # pods asked for their fallback checkpoint, no answer yet
        self._ops_lock = threading.Lock()
        # Layered memory: the disk tier, the order workloads were suspended in (least recently
        # suspended spills first), and which suspended states are on disk now.
        self.spill = spill
        self._seq = itertools.count()
        self._suspended_seq: dict[str, int] = {}
        self._on_disk: set[str] = set()
        # Cooperative: a verified disk copy exists but the process did not free its DRAM copy
        # (or did not say so in time): still charged to DRAM, the disk copy kept as a spare.
        self._not_freed: set[str] = set()
        self.metrics.host_state_budget_bytes.labels(TIER_DRAM).set(config.host_memory_budget_bytes)
        self.metrics.host_state_budget_bytes.labels(TIER_DISK).set(spill.capacity_bytes if spill else 0)
        if spill is not None:
            self._on_disk = set(spill.recover(self._any_host_copy()))
            if self._on_disk:
                log.info("spilled state found on disk", extra={"pods": sorted(self._on_disk)})
        self._refresh_gauges()

    def backend(self, name: str) -> Backend | None:
        """An enabled backend by name (the driver's enforcement uses cuda-checkpoint by PID)."""
        return self._backends.get(name) if name in self.config.backends else None

    # ------------------------------------------------------------------ registration

    def register(self, reg: Registration, scope: ClaimScope | None = None) -> Workload:
        """Validate and record a workload (raises RegistrationError saying what to fix).

        ``scope``: the claim whose socket the registration came on (None: a shared socket)."""
        w = self.registry.register(reg, scope=scope)
        reg = w.reg
        if reg.current_state == STATE_SUSPENDED:
            # Re-registration after an agent restart: the state is parked in the workload's host
            # memory; account for it (bounded: unverified) and remember how to bring it back.
            w.suspended_by = BACKEND_COOPERATIVE if BACKEND_COOPERATIVE in reg.backends else None
            holder = self._holder_of(reg.pod_uid)
            if holder is not None and holder in reg.backends:  # its state is in this engine's tiers
                w.suspended_by = holder
            w.host_bytes_held = unverified_bytes_counted(reg.state_bytes, scope)
            if reg.pod_uid in self._on_disk:  # its state is in the disk tier, not in DRAM
                self.budget.release(reg.pod_uid)
            else:
                self.budget.force(reg.pod_uid, w.host_bytes_held)
        else:
            self.budget.release(reg.pod_uid)
        self._refresh_gauges()
        log.info(
            "workload registered",
            extra={
                "pod": reg.pod_ref,
                "podUID": reg.pod_uid,
                "pid": reg.pid,
                "stateBytes": reg.state_bytes,
                "backends": sorted(reg.backends),
                "state": reg.current_state,
            },
        )
        return w

    def bind_claim(self, claim_uid: str, pod_uid: str) -> None:
        """Tell the engine which pod uses a claim (when the workload did not say so itself)."""
        self.registry.bind_claim(claim_uid, pod_uid)

    def forget(self, pod_uid: str) -> None:
        """The pod is gone: drop it and anything it held."""
        self.registry.remove(pod_uid)
        self.budget.release(pod_uid)
        self._suspended_seq.pop(pod_uid, None)
        if pod_uid in self._on_disk and self.spill is not None:
            self.spill.remove(pod_uid)
            self._on_disk.discard(pod_uid)
        self._not_freed.discard(pod_uid)
        gone = getattr(self._any_host_copy(), "forget", None)
        if gone is not None:
            gone(pod_uid)
        self._refresh_gauges()

    def _refresh_gauges(self) -> None:
        self.metrics.host_held_bytes.set(self.budget.held_bytes())
        self.metrics.host_state_bytes.labels(TIER_DRAM).set(self.budget.held_bytes())
        self.metrics.host_state_bytes.labels(TIER_DISK).set(self.spill.held_bytes() if self.spill else 0)
        self.metrics.workloads.set(len(self.registry.all()))

    def tier_usage(self) -> dict[str, tuple[int, int]]:
        """(budget, held) bytes of each tier of suspended state (node facts, Status)."""
        disk = (self.spill.capacity_bytes, self.spill.held_bytes()) if self.spill is not None else (0, 0)
        return {TIER_DRAM: (self.budget.capacity_bytes, self.budget.held_bytes()), TIER_DISK: disk}

    def tier_of(self, pod_uid: str) -> str | None:
        """Where a suspended workload's state is: "dram", "disk", or None (not held)."""
        if pod_uid in self._on_disk and pod_uid not in self._not_freed:
            return TIER_DISK
        return TIER_DRAM if self.budget.held_bytes(pod_uid) > 0 else None

    # ------------------------------------------------------------------ engine_api.SuspendEngine

    def _simulating(self) -> bool:
        return BACKEND_SIMULATED in self.config.backends and self.config.simulated_occupant_bytes > 0

    def _simulated(self, claim_uid: str, pod_uid: str) -> Workload:
        reg = Registration(
            pod_uid=pod_uid,
            pid=1,
            state_bytes=self.config.simulated_occupant_bytes,
            backends=frozenset({BACKEND_SIMULATED}),
            claim_uids=frozenset({claim_uid}),
        )
        w = self.registry.register(reg, simulated=True)
        self._refresh_gauges()
        return w

    def _bound(self, claim_uid: str) -> list[str]:
        """The claim's pods (from the driver's binding and its socket's registrations)."""
        return [p for p in self.registry.pods_for_claim(claim_uid) if p != _stand_in(claim_uid)]

    def _members(self, claim_uid: str, pods: Sequence[str] | None, *, create_simulated: bool) -> list[Workload]:
        """The workloads a claim operation acts on: every pod registered on the claim (``pods``
        None: the whole claim, as when serving takes its GPU), or only ``pods`` (a hold on some
        pods of a shared claim: a time-slice hand-over parks one member job). With the simulated
        backend, a pod without a workload is a simulated occupant of its own (a claim of one pod,
        or of none bound: one occupant for the claim, as before)."""
        stand_in = _stand_in(claim_uid)
        bound = self._bound(claim_uid)
        wanted = [*bound, stand_in] if pods is None else list(pods)
        found = {p: w for p in wanted if (w := self.registry.get(p)) is not None}
        if any(not w.simulated for w in found.values()):  # a real workload registered: no stand-in
            found.pop(stand_in, None)
        if create_simulated and self._simulating() and claim_uid not in self._ledger_freed:
            if pods is not None or len(bound) > 1:
                for p in wanted:
                    if p not in found and p != stand_in:
                        found[p] = self._simulated(claim_uid, p)
            elif not found:
                return [self._simulated(claim_uid, stand_in)]
        return [found[p] for p in wanted if p in found]

    def _occupant(self, claim_uid: str, *, create_simulated: bool) -> Workload | None:
        """The claim's last-bound registered workload (a claim of one pod: its workload)."""
        ws = self._members(claim_uid, None, create_simulated=create_simulated)
        return ws[-1] if ws else None

    def suspend(self, claim_uid: str, grace_seconds: float) -> SuspendResult:
        """Suspend every workload registered on the claim (each its own operation, in parallel)."""
        return self.suspend_pods(claim_uid, None, grace_seconds)

    def suspend_pods(self, claim_uid: str, pod_uids: Sequence[str] | None, grace_seconds: float) -> SuspendResult:
        """engine_api.PodScopedEngine: suspend only ``pod_uids`` of the claim (None: all of them)."""
        ws = self._members(claim_uid, pod_uids, create_simulated=True)
        if not ws:
            return SuspendResult(
                False,
                "none",
                0,
                0.0,
                None,
                f"no workload registered for claim {claim_uid}{_pods_note(pod_uids)} on this node: the workload"
                " must register with the node agent (rose_sdk) or the driver must bind_claim() it",
                SuspendReason.NO_WORKLOAD,
            )
        return self._on_members(ws, "suspend", grace_seconds, f"claim {claim_uid} reclaimed")

    def resume(self, claim_uid: str) -> SuspendResult:
        return self.resume_pods(claim_uid, None)

    def resume_pods(self, claim_uid: str, pod_uids: Sequence[str] | None) -> SuspendResult:
        """engine_api.PodScopedEngine: resume only ``pod_uids`` of the claim (None: all of them).
        Of several, a member evicted by the checkpoint fallback is left alone (nothing to resume)."""
        ws = self._members(claim_uid, pod_uids, create_simulated=False)
        if len(ws) > 1:
            ws = [w for w in ws if w.state != STATE_CHECKPOINTED_EVICTED] or ws[:1]
        if not ws:
            return SuspendResult(
                False,
                "none",
                0,
                0.0,
                None,
                f"no workload registered for claim {claim_uid}{_pods_note(pod_uids)}",
                SuspendReason.NO_WORKLOAD,
            )
        return self._on_members(ws, "resume", 0.0, f"claim {claim_uid} given back")

    def _on_members(self, ws: list[Workload], kind: CommandKind, grace: float, reason: str) -> SuspendResult:
        """One operation per workload, in parallel (one grace period for all), then one result."""
        if len(ws) == 1:
            return self._result(self._run(ws[0], kind, grace, reason))
        recs: dict[str, OperationRecord] = {}

        def one(w: Workload) -> None:
            recs[w.pod_uid] = self._run(w, kind, grace, reason)

        threads = [threading.Thread(target=one, args=(w,), name=f"rose-{kind}-{w.pod_uid[:8]}") for w in ws]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return combine_results([(w.pod_uid, self._result(recs[w.pod_uid])) for w in ws])

    def occupant_state(self, claim_uid: str) -> str:
        return self.pods_state(claim_uid, None)

    def pods_state(self, claim_uid: str, pod_uids: Sequence[str] | None) -> str:
        """engine_api.PodScopedEngine: "running" when any of them has its state on the GPU,
        "suspended" when all are off it, "unknown" when none is registered."""
        # simulated: a member of a shared claim without a workload yet is a stand-in whose state is on the GPU
        shared = pod_uids is not None or len(self._bound(claim_uid)) > 1
        members = self._members(claim_uid, pod_uids, create_simulated=shared and self._simulating())
        states = {occupant_state_of(w.state) for w in members}
        if "running" in states:
            return "running"
        return "suspended" if states == {"suspended"} else "unknown"

    def simulated_resident_bytes(self, claim_uid: str) -> int:
        """The driver's ledger of a claim's process-less simulated occupant (``devicewatch``): its
        size while resident, 0 once the simulated backend moved it or the driver evicted it. Only the
        driver moves these bytes, so the ledger is an observation, not a report."""
        if not self._simulating() or claim_uid in self._ledger_freed:
            return 0
        ws = self._members(claim_uid, None, create_simulated=False)
        if not ws:  # no workload: the simulated occupant a suspend would stand in for
            return self.config.simulated_occupant_bytes
        off = (STATE_SUSPENDED, STATE_CHECKPOINTED_EVICTED)
        return sum(w.reg.state_bytes for w in ws if w.simulated and w.state not in off)

    def free_simulated(self, claim_uid: str) -> None:
        """The driver evicted a claim's simulated occupant: its ledger bytes are gone."""
        self._ledger_freed.add(claim_uid)
        for w in self._members(claim_uid, None, create_simulated=False):
            if w.simulated:
                self.forget(w.pod_uid)

    def abandon(self, claim_uid: str) -> None:
        """engine_api.Abandoner: the driver stopped the processes of the claim's occupants (the
        enforced reclaim): no acknowledgement will come from them, so the engine's waits for one
        (a cooperative command, the fallback's checkpoint) end now and free their threads."""
        for w in self._members(claim_uid, None, create_simulated=False):
            w.abandon()

    def fallback_in_progress(self, claim_uid: str) -> bool:
        """engine_api.FallbackWatcher: the claim's occupant was asked for its durable checkpoint and
        has not answered yet."""
        return any(w.pod_uid in self._checkpointing for w in self._members(claim_uid, None, create_simulated=False))

    def copy_in_progress(self, claim_uid: str) -> bool:
        """engine_api.CopyWatcher: an uninterruptible device-to-host copy of a claim's occupant runs."""
        for w in self._members(claim_uid, None, create_simulated=False):
            for b in self._backends.values():
                started = getattr(b, "copy_started", None)
                if started is not None and started(w) is not None:
                    return True
        return False

    @staticmethod
    def _result(rec: OperationRecord) -> SuspendResult:
        return SuspendResult(
            ok=rec.state == "succeeded",
            backend=rec.backend or "none",
            bytes_moved=rec.bytes_moved,
            seconds=rec.duration_seconds,
            fallback=rec.fallback,
            message=rec.message,
            reason=rec.reason,
        )

    # ------------------------------------------------------------------ pod-level (NodeControl)

    def suspend_pod(
        self, pod_uid: str, grace_seconds: float, reason: str = "", *, wait: bool = True
    ) -> OperationRecord:
        w = self._require(pod_uid)
        return self._start(w, "suspend", grace_seconds, reason or "NodeControl.Suspend", wait)

    def resume_pod(self, pod_uid: str, *, wait: bool = True) -> OperationRecord:
        w = self._require(pod_uid)
        return self._start(w, "resume", 0.0, "NodeControl.Resume", wait)

    def operation(self, operation_id: str) -> OperationRecord | None:
        with self._ops_lock:
            rec = self._ops.get(operation_id)
            return None if rec is None else replace(rec)

    def operations(self, pod_uid: str = "") -> list[OperationRecord]:
        with self._ops_lock:
            return [replace(r) for r in self._ops.values() if not pod_uid or r.pod_uid == pod_uid]

    def _require(self, pod_uid: str) -> Workload:
        w = self.registry.get(pod_uid)
        if w is None:
            raise UnknownOccupantError(
                f"no workload with pod UID {pod_uid!r} is registered with this node's agent"
                " (check the UID with `kubectl get pod -o jsonpath={.metadata.uid}` and the node)"
            )
        return w

    def _new_record(self, w: Workload, kind: CommandKind) -> OperationRecord:
        rec = OperationRecord(id=uuid.uuid4().hex, pod_uid=w.pod_uid, kind=kind, started_unix_ms=_now_ms())
        with self._ops_lock:
            self._ops[rec.id] = rec
            while len(self._ops) > _MAX_OPERATIONS:
                self._ops.popitem(last=False)
        return rec

    def _start(self, w: Workload, kind: CommandKind, grace: float, reason: str, wait: bool) -> OperationRecord:
        rec = self._new_record(w, kind)
        if wait:
            self._execute(w, rec, grace, reason)
            return replace(rec)
        snapshot = replace(rec)
        threading.Thread(
            target=self._execute, args=(w, rec, grace, reason), name=f"rose-op-{rec.id[:8]}", daemon=True
        ).start()
        return snapshot

    def _run(self, w: Workload, kind: CommandKind, grace: float, reason: str) -> OperationRecord:
        rec = self._new_record(w, kind)
        self._execute(w, rec, grace, reason)
        return replace(rec)

    def _execute(self, w: Workload, rec: OperationRecord, grace: float, reason: str) -> None:
        t0 = time.monotonic()
        try:
            with w.op_lock:
                # Re-read the current registration (a re-register may have replaced the session).
                cur = self.registry.get(w.pod_uid) or w
                rec.state = "running"
                if rec.kind == "suspend":
                    self._do_suspend(cur, rec, grace, reason, t0)
                else:
                    self._do_resume(cur, rec)
        except Exception as e:  # a bug or an I/O error must end the operation, never hang it
            log.exception("operation failed", extra={"podUID": w.pod_uid, "op": rec.id})
            rec.state, rec.message, rec.reason = "failed", f"internal error: {e!r}", SuspendReason.FAILED
        finally:
            rec.duration_seconds = time.monotonic() - t0
            rec.finished_unix_ms = _now_ms()
            self._refresh_gauges()

    # ------------------------------------------------------------------ suspend / resume

    def _event(self, w: Workload, reason: str, message: str, type_: EventType) -> None:
        self._events.record(EngineEvent(w.pod_uid, w.reg.pod_namespace, w.reg.pod_name, reason, message, type_))

    def _do_suspend(self, w: Workload, rec: OperationRecord, grace: float, reason: str, t0: float) -> None:
        if grace < 0:
            raise ValueError(f"grace_seconds must be >= 0, got {grace}")
        if self._already_suspended(w, rec):
            return
        admitted = self._admit(w, rec)
        if admitted is None:
            return
        name, need = admitted
        self.registry.set_state(w, STATE_SUSPENDING)
        op = OpContext(rec.id, grace, reason)
        out = self._backend_suspend(name, w, t0 + grace, op)
        alt = self._alternative(w, name) if out.unsupported else None
        if alt is not None:
            self._event(
                w, REASON_SUSPEND_FAILED, f"{name} cannot suspend this workload, trying {alt}: {out.message}", "Warning"
            )
            name = rec.backend = alt
            out = self._backend_suspend(name, w, t0 + grace, op)
        if out.ok:
            self._record_suspended(w, rec, name, out, need, time.monotonic() - t0, reason)
            return
        self.budget.release(w.pod_uid)
        self.registry.set_state(w, STATE_RUNNING)
        self._event(w, REASON_SUSPEND_FAILED, f"{name} suspend failed: {out.message}", "Warning")
        why = "unsupported_workload" if out.unsupported else "deadline_exceeded" if out.timed_out else "backend_failed"
        self._fallback(w, rec, why, out.message)

    def _already_suspended(self, w: Workload, rec: OperationRecord) -> bool:
        """Idempotence: a workload this engine suspended (or checkpointed-and-evicted) moves nothing.
        One that only *registered* as SUSPENDED still gets the command: its word is a hint."""
        if w.state == STATE_SUSPENDED and w.engine_suspended:
            rec.state, rec.backend = "succeeded", w.suspended_by or ""
            rec.message = "already suspended; nothing moved"
            return True
        if w.state == STATE_CHECKPOINTED_EVICTED:
            rec.state, rec.fallback, rec.reason = "succeeded", FALLBACK_CHECKPOINT_EVICT, SuspendReason.FALLBACK
            rec.message = "already checkpointed for eviction; nothing moved"
            return True
        return False

    def _admit(self, w: Workload, rec: OperationRecord) -> tuple[str, int] | None:
        """Choose the backend and reserve the host memory the suspend will take; None: the fallback
        was taken instead (no usable backend, or the budget cannot hold it)."""
        name = BACKEND_SIMULATED if w.simulated else choose_backend(w.reg.backends, self.config.backends)
        if name is None:
            self._fallback(
                w,
                rec,
                "no_backend",
                f"none of the workload's backends {sorted(w.reg.backends)} is enabled on this node"
                f" ({', '.join(self.config.backends)})",
            )
            return None
        rec.backend = name
        measured = self._measure(name, w)
        need = host_bytes_needed(w.reg.state_bytes, measured)
        if not self.budget.try_reserve(w.pod_uid, need):
            spill_note = self._make_room(w, need)
            if not spill_note and self.budget.try_reserve(w.pod_uid, need):
                return name, need
            disk = "" if self.spill is None else f"; disk {self.spill.held_bytes()} of {self.spill.capacity_bytes} B"
            self._fallback(
                w,
                rec,
                "host_memory_budget",
                f"suspend refused: {need} B of state does not fit the host-memory budget"
                f" ({self.budget.held_bytes()} of {self.budget.capacity_bytes} B held{disk}; registered"
                f" {w.reg.state_bytes} B, measured on the GPU {'n/a' if measured is None else f'{measured} B'})"
                f"{spill_note}",
            )
            return None
        return name, need

    def _holder_of(self, pod_uid: str) -> str | None:
        """The backend whose DRAM copy, or whose spilled copy on disk, holds a pod's state."""
        for name, b in self._backends.items():
            copy = getattr(b, "host_copy", None)
            if copy is not None and (pod_uid in self._on_disk or copy.host_bytes(pod_uid) is not None):
                return name
        return None

    def _any_host_copy(self) -> HostCopy | None:
        for b in self._backends.values():
            copy = getattr(b, "host_copy", None)
            if copy is not None:
                return copy  # type: ignore[no-any-return]
        return None

    def _host_copy(self, w: Workload) -> HostCopy | None:
        """The DRAM copy of a suspended workload's state, where its backend can hand it over."""
        b = self._backends.get(w.suspended_by or "")
        return getattr(b, "host_copy", None)

    def _make_room(self, w: Workload, need: int) -> str:
        """Spill DRAM copies, least recently suspended first, until ``need`` fits the DRAM budget.
        Returns "" when it fits now, else why not (for the fallback's message)."""
        if self.spill is None:
            return "; no disk tier (--spill-dir) to spill to"
        resident = [
            Resident(o.pod_uid, self.budget.held_bytes(o.pod_uid), self._suspended_seq.get(o.pod_uid, -1))
            for o in self.registry.all()
            if o.pod_uid != w.pod_uid
            and o.state == STATE_SUSPENDED
            and o.pod_uid not in self._on_disk
            and self.budget.held_bytes(o.pod_uid) > 0
            and self._spillable(o)
        ]
        plan = plan_spill(resident, need, self.budget.capacity_bytes, self.budget.held_bytes(), self.spill.free_bytes())
        if plan is None and not resident:
            return (
                "; no suspended state in DRAM can spill to the disk tier (only the simulated backend's DRAM"
                " copy and a connected cooperative workload's can; cuda-checkpoint keeps it in the process)"
            )
        if plan is None:
            return (
                f"; both tiers full: spilling the {len(resident)} spillable suspended state(s) cannot make"
                f" room (disk tier {self.spill.free_bytes()} of {self.spill.capacity_bytes} B free)"
            )
        for pod in plan:
            o = self.registry.get(pod)
            if o is None or not o.op_lock.acquire(blocking=False):
                return f"; could not spill pod {pod}: it is busy or gone"
            try:
                err = self.spill_workload(o)
            finally:
                o.op_lock.release()
            if err:
                return f"; {err}"
        return ""

    def spill_workload(self, o: Workload) -> str:
        """Move one suspended workload's DRAM copy to the disk tier (its op lock held). Returns ""
        on success, else why not (its DRAM copy is then untouched)."""
        assert self.spill is not None
        copy = self._host_copy(o)
        coop = self._backends.get(BACKEND_COOPERATIVE)
        if (
            copy is None
            and o.suspended_by == BACKEND_COOPERATIVE
            and isinstance(coop, CooperativeBackend)
            and o.state == STATE_SUSPENDED
            and o.pod_uid not in self._on_disk
        ):
            return self._spill_cooperative(o, coop)
        if copy is None or o.state != STATE_SUSPENDED or o.pod_uid in self._on_disk:
            return f"pod {o.pod_uid} has no DRAM copy to spill"
        held = self.budget.held_bytes(o.pod_uid)
        t0 = time.monotonic()
        try:
            n = self.spill.spill(o.pod_uid, copy, held)
        except SpillError as e:
            kind = spill_error_kind(e)
            self.metrics.spills.labels("to_disk", kind).inc()
            msg = f"spill of its suspended state to {self.spill.root} failed ({kind}): {e}; kept in host memory"
            self._event(o, REASON_SPILL_FAILED, msg, "Warning")
            return f"pod {o.pod_uid}: {msg}"
        secs = time.monotonic() - t0
        self._on_disk.add(o.pod_uid)
        self.budget.release(o.pod_uid)
        self.metrics.spills.labels("to_disk", "ok").inc()
        self.metrics.spill_seconds.labels("to_disk").observe(secs)
        self._refresh_gauges()
        self._event(
            o,
            REASON_SPILLED,
            f"suspended state spilled from host memory to disk: {n} B in {secs:.3f}s"
            f" ({n / max(secs, 1e-9) / 1e9:.2f} GB/s, written, fsynced and verified before the DRAM copy was dropped)",
            "Normal",
        )
        return ""

    def _spillable(self, o: Workload) -> bool:
        """Can the disk tier take this suspended workload's DRAM copy: its backend hands the copy
        over (simulated), or it is a connected cooperative workload (its SDK writes the file)."""
        copy = self._host_copy(o)
        if copy is not None:
            return copy.host_bytes(o.pod_uid) is not None
        return (
            o.suspended_by == BACKEND_COOPERATIVE
            and isinstance(self._backends.get(BACKEND_COOPERATIVE), CooperativeBackend)
            and o.connected
            and o.pod_uid not in self._not_freed
        )

    def _spill_failed(self, o: Workload, result: str, msg: str) -> str:
        self.metrics.spills.labels("to_disk", result).inc()
        self._event(o, REASON_SPILL_FAILED, msg, "Warning")
        return f"pod {o.pod_uid}: {msg}"

    def _spill_cooperative(self, o: Workload, coop: CooperativeBackend) -> str:
        """Spill a cooperative workload's host copy (its op lock held): the driver creates the
        file, the SDK writes and fsyncs it, the driver verifies it from disk, then the SDK frees
        its copy; counted as spilled only when its process's resident memory fell. Returns "" on
        success, else why not (its DRAM charge is then unchanged)."""
        assert self.spill is not None
        held = self.budget.held_bytes(o.pod_uid)
        expect = o.offloaded_bytes or o.reg.state_bytes
        proc = coop.process(o)
        if proc is None:
            return self._spill_failed(
                o, "failed", "its process cannot be found on this node; not spilled, kept in host memory"
            )
        pid, uid, gid = proc
        t0 = time.monotonic()
        try:
            h = self.spill.hand_over(o.pod_uid, uid, gid, o.scope.claim_uid if o.scope is not None else "")
        except SpillError as e:
            return self._spill_failed(o, "failed", f"{e}; not spilled, kept in host memory")
        seen = self._workload_view(coop, pid, h.path)
        if seen is None:
            self.spill.abandon(h)
            return self._spill_failed(o, "failed", f"{_unreachable(pid, h.path)}; not spilled, kept in host memory")
        timeout = self.config.spill_timeout_seconds
        ack = coop.spill(o, seen, t0 + timeout, OpContext(uuid.uuid4().hex, timeout, "spill"))
        if ack is None or not ack.ok:
            self.spill.abandon(h)
            if ack is None:
                return self._spill_failed(
                    o, "no_answer", f"the workload did not write its spill file within {timeout}s; kept in host memory"
                )
            return self._spill_failed(o, "refused", f"the workload could not spill: {ack.message}; kept in host memory")
        try:
            n = self.spill.adopt(h, expect, held)
        except SpillError as e:
            kind = spill_error_kind(e)
            return self._spill_failed(
                o,
                kind,
                f"the workload's spill file failed the driver's verification ({kind}): {e}; not counted as"
                " spilled, kept in host memory",
            )
        rss_before = coop.rss_bytes(pid)
        ack = coop.commit_spill(
            o,
            seen[: -len(TMP_SUFFIX)] + SUFFIX,
            time.monotonic() + timeout,
            OpContext(uuid.uuid4().hex, timeout, "spill"),
        )
        rss_after = coop.rss_bytes(pid)
        self._on_disk.add(o.pod_uid)  # a verified copy is on disk: a resume reads it if the process freed its own
        secs = time.monotonic() - t0
        if ack is None or not ack.ok or not spill_freed(rss_before, rss_after, n):
            self._not_freed.add(o.pod_uid)
            fell = "n/a" if rss_before is None or rss_after is None else f"{rss_before - rss_after} B"
            said = "no answer" if ack is None else "ok" if ack.ok else f"refused: {ack.message}"
            msg = (
                f"the workload wrote a verified spill file ({n} B) but did not free its host copy (it said:"
                f" {said}; its resident memory fell by {fell}, at least {n // 2} B expected): not counted as"
                f" spilled, its {held} B stay charged to host memory; the disk copy is kept as a spare"
            )
            self.metrics.spills.labels("to_disk", "not_freed").inc()
            self._refresh_gauges()
            self._event(o, REASON_SPILL_NOT_FREED, msg, "Warning")
            return f"pod {o.pod_uid}: {msg}"
        self.budget.release(o.pod_uid)
        self.metrics.spills.labels("to_disk", "ok").inc()
        self.metrics.spill_seconds.labels("to_disk").observe(secs)
        self._refresh_gauges()
        self._event(
            o,
            REASON_SPILLED,
            f"suspended state spilled from the workload's host memory to disk: {n} B in {secs:.3f}s (written and"
            " fsynced by the workload, verified from disk by the driver before the workload freed its copy;"
            f" its resident memory fell by {(rss_before or 0) - (rss_after or 0)} B)",
            "Normal",
        )
        return ""

    def _record_suspended(
        self, w: Workload, rec: OperationRecord, name: str, out: BackendOutcome, need: int, secs: float, reason: str
    ) -> None:
        held = max(out.bytes_moved, need)
        self.budget.force(w.pod_uid, held)
        self._suspended_seq[w.pod_uid] = next(self._seq)
        w.host_bytes_held, w.suspended_by = held, name
        w.offloaded_bytes = out.bytes_moved
        w.engine_suspended = True
        self.registry.set_state(w, STATE_SUSPENDED)
        rec.state, rec.bytes_moved, rec.message = "succeeded", out.bytes_moved, out.message
        self.metrics.suspend_seconds.labels(name).observe(secs)
        self.metrics.moved_bytes.labels(name, "to_host").inc(out.bytes_moved)
        self.metrics.operations.labels("suspend", name, "ok").inc()
        self._event(
            w,
            REASON_SUSPENDED,
            f"suspended into host memory by {name}: {out.bytes_moved} B in {secs:.3f}s ({reason})",
            "Normal",
        )

    def _backend_suspend(self, name: str, w: Workload, deadline: float, op: OpContext) -> BackendOutcome:
        try:
            return self._backends[name].suspend(w, deadline, op)
        except Exception as e:
            return BackendOutcome(False, 0, f"backend error: {e!r}")

    def _alternative(self, w: Workload, refused_by: str) -> str | None:
        """The next enabled backend the workload supports, after ``refused_by`` said it cannot move it."""
        return choose_backend(w.reg.backends - {refused_by}, [b for b in self.config.backends if b != refused_by])

    def _measure(self, name: str, w: Workload) -> int | None:
        """What the backend measures the workload's process to hold on the GPU (None: not measurable)."""
        probe = getattr(self._backends[name], "device_bytes", None)
        if probe is None:
            return None
        try:
            got = probe(w)
        except Exception as e:  # a probe failure must not block the suspend; the registered size is used
            log.warning("device memory probe failed", extra={"podUID": w.pod_uid, "err": repr(e)})
            return None
        return None if got is None else int(got)

    def _fallback(self, w: Workload, rec: OperationRecord, why: str, detail: str) -> None:
        """Atomic durable checkpoint, then eviction. Never evicts without a confirmed checkpoint."""
        self.metrics.fallbacks.labels(why).inc()
        self.metrics.operations.labels("suspend", rec.backend or "none", "fallback").inc()
        rec.fallback = FALLBACK_CHECKPOINT_EVICT
        rec.reason = fallback_failure_reason(why)  # until the fallback is confirmed
        coop = self._backends.get(BACKEND_COOPERATIVE)
        if BACKEND_COOPERATIVE not in w.reg.backends or not isinstance(coop, CooperativeBackend):
            rec.state = "failed"
            rec.message = (
                f"{detail}; fallback impossible: the workload has no SDK checkpoint channel (cooperative"
                " backend not supported or not enabled), so no durable checkpoint can be taken; the"
                " engine did not evict it"
            )
            self._event(w, REASON_FALLBACK_FAILED, rec.message, "Warning")
            return
        deadline = time.monotonic() + self.config.checkpoint_timeout_seconds
        self._checkpointing.add(w.pod_uid)
        try:
            ack = coop.checkpoint(w, deadline, OpContext(rec.id + "-ckpt", self.config.checkpoint_timeout_seconds, why))
        finally:
            self._checkpointing.discard(w.pod_uid)
        if ack is None or not ack.ok:
            why_not = (
                f"no acknowledgement within {self.config.checkpoint_timeout_seconds}s" if ack is None else ack.message
            )
            rec.state = "failed"
            rec.message = (
                f"{detail}; durable checkpoint not confirmed"
                f" ({why_not}); the engine did not evict the workload:"
                " evicting now loses its work since its last checkpoint"
            )
            self._event(w, REASON_FALLBACK_FAILED, rec.message, "Warning")
            return
        verdict = self._verify(w, ack)
        if not verdict.ok:
            rec.state = "failed"
            rec.message = f"{detail}; checkpoint not verified: {verdict.problem}; the engine did not evict the workload"
            self._event(w, REASON_FALLBACK_FAILED, rec.message, "Warning")
            return
        self.registry.set_state(w, STATE_CHECKPOINTED_EVICTED)
        rec.state, rec.checkpoint_path, rec.reason = "succeeded", ack.checkpoint_path, SuspendReason.FALLBACK
        pod = w.scope.pod(w.pod_uid) if w.scope is not None else None
        if self._evictor is None or pod is None:
            evicted = "the caller must evict the pod" + (
                "" if pod is not None else " (it registered without a claim scope: not in the driver's claim records)"
            )
        else:
            evicted = f"evicting pod {pod.namespace}/{pod.name} (uid {pod.uid})"
        rec.message = (
            f"{detail}; fallback: durable checkpoint {ack.checkpoint_path}"
            f" (sha256 {ack.checkpoint_sha256[:16]}… verified)"
            f" written in {ack.seconds:.3f}s; {evicted}"
        )
        self._event(w, REASON_FALLBACK_CHECKPOINT, rec.message, "Warning")
        if self._evictor is not None and pod is not None:
            self._evictor.evict(pod, rec.message)

    def _verify(self, w: Workload, ack: Ack) -> Verdict:
        """The ack's checkpoint, checked only inside the pod's own root and its job's checkpointPath
        (``verify.py``); off this thread, bounded. The detail goes to the log, never to an Event."""
        pod = w.scope.pod(w.pod_uid) if w.scope is not None else None
        req = VerifyRequest(
            pod_uid=pod.uid if pod is not None else "",
            namespace=pod.namespace if pod is not None else "",
            name=pod.name if pod is not None else "",
            reported_pid=w.reg.pid,
            path=ack.checkpoint_path,
            sha256=ack.checkpoint_sha256,
        )
        verdict = self.verifier.verify(req)
        if not verdict.ok:
            log.warning(
                "checkpoint not verified",
                extra={"podUID": w.pod_uid, "problem": str(verdict.problem), "err": verdict.detail},
            )
        return verdict

    def _resume_backend(self, w: Workload, rec: OperationRecord) -> str | None:
        """The backend that holds ``w``'s suspended state, or None with ``rec`` saying why not."""
        if w.state == STATE_RUNNING:
            rec.state, rec.message = "succeeded", "already running; nothing moved"
            return None
        if w.state == STATE_CHECKPOINTED_EVICTED:
            rec.state, rec.fallback, rec.reason = "failed", FALLBACK_CHECKPOINT_EVICT, SuspendReason.FALLBACK
            rec.message = "the workload took the checkpoint-evict fallback; restart it from its durable checkpoint"
            return None
        name = w.suspended_by
        if name is None or name not in self._backends:
            rec.state, rec.reason = "failed", SuspendReason.FAILED
            rec.message = (
                f"workload is {w.state} but its backend {name!r} is not enabled here; state kept in host memory"
            )
            return None
        return name

    def _bring_back_from_disk(self, w: Workload, rec: OperationRecord, name: str) -> str | None:
        """Before a resume: a spilled state back into DRAM, or the checked path of a cooperative
        workload's own spill file ("" when nothing is on disk); None when the resume cannot go on."""
        if w.pod_uid not in self._on_disk:
            return ""
        if self._host_copy(w) is None and name == BACKEND_COOPERATIVE:
            return self._check_cooperative_disk_copy(w, rec) or None
        return "" if self._restore_from_disk(w, rec) else None

    def _do_resume(self, w: Workload, rec: OperationRecord) -> None:
        name = self._resume_backend(w, rec)
        if name is None:
            return
        rec.backend = name
        t0 = time.monotonic()
        spill_path = self._bring_back_from_disk(w, rec, name)
        if spill_path is None:
            return
        self.registry.set_state(w, STATE_RESUMING)
        try:
            out = self._backends[name].resume(
                w, t0 + self.config.resume_timeout_seconds, OpContext(rec.id, 0.0, "resume", spill_path)
            )
        except Exception as e:
            out = BackendOutcome(False, 0, f"backend error: {e!r}")
        if not out.ok:
            # Never drop suspended state: it stays where it is, accounted, and the resume can be retried.
            self.registry.set_state(w, STATE_SUSPENDED)
            rec.state = "failed"
            rec.reason = SuspendReason.DEADLINE_EXCEEDED if out.timed_out else SuspendReason.FAILED
            rec.message = f"{name} resume failed: {out.message}; state kept in host memory, retry the resume"
            self.metrics.operations.labels("resume", name, "failed").inc()
            if spill_path and w.pod_uid not in self._not_freed:
                self.budget.release(w.pod_uid)  # its state is still on disk only
                self._refresh_gauges()
            self._event(w, REASON_RESUME_FAILED, rec.message, "Warning")
            return
        if spill_path:
            self._cooperative_restored(w, time.monotonic() - t0)
        self.budget.release(w.pod_uid)
        self._suspended_seq.pop(w.pod_uid, None)
        w.host_bytes_held, w.suspended_by, w.engine_suspended = 0, None, False
        self.registry.set_state(w, STATE_RUNNING)
        secs = time.monotonic() - t0
        rec.state, rec.bytes_moved, rec.message = "succeeded", out.bytes_moved, out.message
        self.metrics.resume_seconds.labels(name).observe(secs)
        self.metrics.moved_bytes.labels(name, "to_device").inc(out.bytes_moved)
        self.metrics.operations.labels("resume", name, "ok").inc()
        self._event(w, REASON_RESUMED, f"resumed by {name}: {out.bytes_moved} B in {secs:.3f}s", "Normal")

    def _restore_from_disk(self, w: Workload, rec: OperationRecord) -> bool:
        """Bring a spilled state back into DRAM before its backend resumes it. A bad checksum never
        resumes: the workload falls back to its durable checkpoint (evicted to restart from it).
        Another error keeps the disk copy for a retry. The DRAM budget takes it back even past
        its capacity: the state leaves DRAM for the GPU right after."""
        assert self.spill is not None
        copy = self._host_copy(w)
        if copy is None:
            rec.state, rec.reason = "failed", SuspendReason.FAILED
            rec.message = f"state of pod {w.pod_uid} is on disk but its backend cannot take it back; kept on disk"
            return False
        held = self.spill.held_bytes(w.pod_uid)
        t0 = time.monotonic()
        try:
            n = self.spill.restore(w.pod_uid, copy)
        except SpillCorrupt as e:
            self._on_disk.discard(w.pod_uid)
            self.metrics.spills.labels("to_dram", "corrupt").inc()
            self._corrupt_fallback(w, rec, str(e))
            return False
        except (SpillError, OSError) as e:
            self.metrics.spills.labels("to_dram", "failed").inc()
            rec.state, rec.reason = "failed", SuspendReason.FAILED
            rec.message = f"reading the spilled state back failed: {e}; state kept on disk, retry the resume"
            self._event(w, REASON_RESUME_FAILED, rec.message, "Warning")
            return False
        secs = time.monotonic() - t0
        self._on_disk.discard(w.pod_uid)
        self.budget.force(w.pod_uid, max(held, n))
        self.metrics.spills.labels("to_dram", "ok").inc()
        self.metrics.spill_seconds.labels("to_dram").observe(secs)
        self._refresh_gauges()
        log.info(
            "spilled state restored to host memory",
            extra={"podUID": w.pod_uid, "bytes": n, "seconds": round(secs, 3)},
        )
        return True

    def _check_cooperative_disk_copy(self, w: Workload, rec: OperationRecord) -> str:
        """Before a cooperative workload resumes from its spill file, the driver verifies it (a bad
        checksum never resumes: the durable-checkpoint fallback) and charges the DRAM budget again
        (the SDK reads the file into host memory on its way to the device). Returns the file's
        path, or "" when the resume cannot proceed (``rec`` says why)."""
        assert self.spill is not None
        try:
            n = self.spill.verify(w.pod_uid)
        except SpillCorrupt as e:
            self.spill.remove(w.pod_uid)
            self._on_disk.discard(w.pod_uid)
            self._not_freed.discard(w.pod_uid)
            self.metrics.spills.labels("to_dram", "corrupt").inc()
            self._corrupt_fallback(w, rec, str(e))
            return ""
        except (SpillError, OSError) as e:
            self.metrics.spills.labels("to_dram", "failed").inc()
            rec.state, rec.reason = "failed", SuspendReason.FAILED
            rec.message = f"reading the spilled state back failed: {e}; state kept on disk, retry the resume"
            self._event(w, REASON_RESUME_FAILED, rec.message, "Warning")
            return ""
        path = self.spill.path(w.pod_uid)
        coop = self._backends.get(BACKEND_COOPERATIVE)
        pid: int | None = None
        seen: str | None = str(path)
        if isinstance(coop, CooperativeBackend):
            proc = coop.process(w)
            pid = proc[0] if proc else None
            seen = self._workload_view(coop, pid, path)
        if seen is None:
            self.metrics.spills.labels("to_dram", "failed").inc()
            rec.state, rec.reason = "failed", SuspendReason.FAILED
            rec.message = f"{_unreachable(pid, path)}; state kept on disk, retry the resume"
            self._event(w, REASON_RESUME_FAILED, rec.message, "Warning")
            return ""
        self.budget.force(w.pod_uid, max(n, w.host_bytes_held))
        self._refresh_gauges()
        return seen

    def _workload_view(self, coop: CooperativeBackend, pid: int | None, path: Path) -> str | None:
        """The spill file ``path`` as the workload's process sees it (its claim's CDI mount in a
        container, the host path for a host process); None when it cannot reach it."""
        assert self.spill is not None
        return coop.view_of(pid, path, workload_views(path, self.spill.root))

    def _cooperative_restored(self, w: Workload, secs: float) -> None:
        """The workload read its spill file back and resumed: the disk copy goes."""
        assert self.spill is not None
        self.spill.remove(w.pod_uid)
        self._on_disk.discard(w.pod_uid)
        self._not_freed.discard(w.pod_uid)
        self.metrics.spills.labels("to_dram", "ok").inc()
        self.metrics.spill_seconds.labels("to_dram").observe(secs)

    def _corrupt_fallback(self, w: Workload, rec: OperationRecord, problem: str) -> None:
        """A spilled copy failed its checksum: nothing corrupt is resumed; the workload restarts
        from its durable checkpoint (its pod is evicted where the driver's claim records know it)."""
        self.budget.release(w.pod_uid)
        self._suspended_seq.pop(w.pod_uid, None)
        w.host_bytes_held = 0
        self.registry.set_state(w, STATE_CHECKPOINTED_EVICTED)
        rec.state, rec.fallback, rec.reason = "failed", FALLBACK_CHECKPOINT_EVICT, SuspendReason.FALLBACK
        pod = w.scope.pod(w.pod_uid) if w.scope is not None else None
        evicted = (
            f"evicting pod {pod.namespace}/{pod.name} (uid {pod.uid}) to restart from its durable checkpoint"
            if self._evictor is not None and pod is not None
            else "the caller must restart the pod from its durable checkpoint"
        )
        rec.message = (
            f"spilled state failed its checksum ({problem}); it was not resumed and the disk copy was"
            f" removed; falling back to the durable checkpoint: {evicted}"
        )
        self.metrics.fallbacks.labels("spill_corrupt").inc()
        self._event(w, REASON_SPILL_CORRUPT, rec.message, "Warning")
        if self._evictor is not None and pod is not None:
            self._evictor.evict(pod, rec.message)

    # ------------------------------------------------------------------ workload side (agent servicer)

    def update_state_bytes(
        self, pod_uid: str, session_id: str, state_bytes: int, scope: ClaimScope | None = None
    ) -> tuple[bool, str]:
        """The workload's state size changed; later suspends are admitted on the new size."""
        if state_bytes < 0 or state_bytes > MAX_STATE_BYTES:
            raise RegistrationError(f"state_bytes must be between 0 and {MAX_STATE_BYTES}, got {state_bytes}")
        w = self._session(pod_uid, session_id, scope)
        if w is None:
            return False, _NO_SESSION.format(pod_uid)
        if w.scope is not None and w.scope.max_state_bytes > 0 and state_bytes > w.scope.max_state_bytes:
            raise RegistrationRefused(
                f"state_bytes {state_bytes} exceeds the {w.scope.max_state_bytes} bytes of device memory"
                f" claim {w.scope.claim_uid} holds"
            )
        w.reg = replace(w.reg, state_bytes=state_bytes)
        return True, ""

    def acknowledge(self, pod_uid: str, session_id: str, ack: Ack, scope: ClaimScope | None = None) -> tuple[bool, str]:
        w = self._session(pod_uid, session_id, scope)
        if w is None:
            return False, _NO_SESSION.format(pod_uid)
        w.deliver_ack(ack)
        return True, ""

    def session(self, pod_uid: str, session_id: str, scope: ClaimScope | None = None) -> Workload | None:
        """The workload of a current session, only on the socket (claim scope) it registered on."""
        return self._session(pod_uid, session_id, scope)

    def _session(self, pod_uid: str, session_id: str, scope: ClaimScope | None) -> Workload | None:
        w = self.registry.session(pod_uid, session_id)
        if w is None or _claim_of(w.scope) != _claim_of(scope):
            return None
        return w

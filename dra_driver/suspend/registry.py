"""Workloads registered with the node agent, and the command channel to each of them.

The channel is a queue the WorkloadAgent.Commands stream drains, plus a table of acknowledgements
the engine waits on with a deadline. Commands survive a stream reconnect within one session.

Identity: a registration arriving on a claim's own socket carries a :class:`ClaimScope` — the
claim's pods as the driver's claim records list them (``status.reservedFor``), never as the
request says. A scoped registration must name one of those pods; its claim binding and its pod
namespace/name come from the scope. A pod registered through a scope cannot be re-registered
without it. Registrations are capped (``max_workloads``) and state sizes are bounded by the
scope's device memory. I/O boundary: none (in-memory tables).
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from dataclasses import dataclass, field, replace

from dra_driver.suspend.model import (
    BACKENDS,
    STATE_RUNNING,
    STATE_SUSPENDED,
    WORKLOAD_STATES,
    Ack,
    Command,
    Registration,
)

MAX_STATE_BYTES = 1 << 50  # 1 PiB: anything larger is a unit mistake
# Registrations one agent keeps: one per pod on the node's GPUs; 256 is far above any node's
# pod count on 8 GPUs and bounds the agent's memory (a registration costs ~8 KiB with its queue).
MAX_WORKLOADS = 256
_UID_MAX = 128


class RegistrationError(ValueError):
    """A malformed registration; the message names the field and what to fix."""


class RegistrationRefused(RegistrationError):
    """A well-formed registration the caller may not make (not its pod, or the agent is full)."""


class RegistryFull(RegistrationRefused):
    """The agent holds ``max_workloads`` registrations already."""


@dataclass(frozen=True)
class TrustedPod:
    """A pod as the driver's claim records name it (from the claim's ``status.reservedFor``)."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class ClaimScope:
    """What a connection on claim ``claim_uid``'s socket may act for."""

    claim_uid: str
    pods: tuple[TrustedPod, ...]
    max_state_bytes: int  # the claim's devices' memory: a workload cannot hold more on them

    def pod(self, pod_uid: str) -> TrustedPod | None:
        return next((p for p in self.pods if p.uid == pod_uid), None)


def scoped_registration(reg: Registration, scope: ClaimScope) -> Registration:
    """Pure: the registration as the scope allows it, or RegistrationRefused saying why."""
    pod = scope.pod(reg.pod_uid)
    if pod is None:
        raise RegistrationRefused(
            f"pod_uid {reg.pod_uid!r} is not a pod of claim {scope.claim_uid} (its reservedFor lists"
            f" {sorted(p.uid for p in scope.pods)}): register with your own pod's UID on your claim's socket"
        )
    if scope.max_state_bytes > 0 and reg.state_bytes > scope.max_state_bytes:
        raise RegistrationRefused(
            f"state_bytes {reg.state_bytes} exceeds the {scope.max_state_bytes} bytes of device memory"
            f" claim {scope.claim_uid} holds"
        )
    return replace(reg, pod_namespace=pod.namespace, pod_name=pod.name, claim_uids=frozenset({scope.claim_uid}))


def validate_registration(reg: Registration) -> None:
    """Pure check of a registration; raises RegistrationError saying what to fix."""
    problems: list[str] = []
    if not reg.pod_uid or len(reg.pod_uid) > _UID_MAX or any(c.isspace() for c in reg.pod_uid):
        problems.append(
            "pod_uid must be the pod's metadata.uid (non-empty, no spaces, at most 128 characters);"
            " pass it with the downward API (env ROSE_POD_UID from fieldRef metadata.uid)"
        )
    if reg.pid <= 0:
        problems.append(f"pid must be the workload's process id (> 0), got {reg.pid}")
    if reg.state_bytes < 0 or reg.state_bytes > MAX_STATE_BYTES:
        problems.append(f"state_bytes must be between 0 and {MAX_STATE_BYTES}, got {reg.state_bytes}")
    if not reg.backends:
        problems.append(f"supported_backends must name at least one of {', '.join(BACKENDS)}")
    unknown = sorted(b for b in reg.backends if b not in BACKENDS)
    if unknown:
        problems.append(f"unknown backend(s) {unknown}; supported: {', '.join(BACKENDS)}")
    if reg.current_state not in (STATE_RUNNING, STATE_SUSPENDED):
        problems.append(
            f"current_state must be {STATE_RUNNING} or {STATE_SUSPENDED} at registration, got {reg.current_state!r}"
        )
    for c in reg.claim_uids:
        if not c or len(c) > _UID_MAX:
            problems.append(f"claim_uids entries must be non-empty UIDs, got {c!r}")
    if problems:
        raise RegistrationError("invalid registration: " + "; ".join(problems))


@dataclass
class Workload:
    """A registered workload and its live state as the engine tracks it."""

    reg: Registration
    session_id: str
    state: str = STATE_RUNNING
    suspended_by: str | None = None
    host_bytes_held: int = 0
    streams_open: int = 0
    commands: queue.Queue[Command | None] = field(default_factory=queue.Queue)
    acks: dict[str, Ack] = field(default_factory=dict)
    cond: threading.Condition = field(default_factory=threading.Condition)
    op_lock: threading.Lock = field(default_factory=threading.Lock)
    simulated: bool = False  # a stand-in occupant of the explicit simulated backend
    # Suspended by this engine's own operation (not merely reported SUSPENDED at registration:
    # a registration's current_state is a hint; the engine still sends its command)
    engine_suspended: bool = False
    scope: ClaimScope | None = None  # set when it registered on its claim's socket
    # The driver stopped this workload's processes (enforcement) or its pod is gone: no ack will
    # come, so every wait for one ends now instead of holding an engine thread to its deadline.
    abandoned: bool = False
    # Bytes its last suspend moved into host memory (its ack): a cooperative spill must hold this many.
    offloaded_bytes: int = 0

    @property
    def pod_uid(self) -> str:
        return self.reg.pod_uid

    @property
    def connected(self) -> bool:
        return self.streams_open > 0

    def send(self, cmd: Command) -> None:
        self.commands.put(cmd)

    def deliver_ack(self, ack: Ack) -> None:
        with self.cond:
            self.acks[ack.operation_id] = ack
            self.cond.notify_all()

    def abandon(self) -> None:
        """No ack will come (its processes were stopped, or its pod is gone): end every wait."""
        with self.cond:
            self.abandoned = True
            self.cond.notify_all()

    def wait_ack(self, operation_id: str, deadline_monotonic: float) -> Ack | None:
        """Block until the ack for ``operation_id`` arrives, the deadline passes or the workload is
        abandoned (None for both)."""
        with self.cond:
            while operation_id not in self.acks:
                left = deadline_monotonic - time.monotonic()
                if left <= 0 or self.abandoned:
                    return None
                self.cond.wait(timeout=left)
            return self.acks.pop(operation_id)


class WorkloadRegistry:
    """Thread-safe table of workloads by pod UID, plus the claim → pods binding: a claim may be
    shared by several pods (a time-slice group's claim lists every member job's worker in its
    ``reservedFor``), each with its own workload and its own suspend / resume."""

    def __init__(self, max_workloads: int = MAX_WORKLOADS) -> None:
        self._lock = threading.Lock()
        self._by_pod: dict[str, Workload] = {}
        self._claims: dict[str, list[str]] = {}  # claim → its pods, in the order they were bound
        self._trusted: set[str] = set()  # claims bound by the driver or a scope: a body cannot join them
        self.max_workloads = max_workloads

    def _bind(self, claim_uid: str, pod_uid: str, *, trusted: bool) -> None:
        """Add ``pod_uid`` to the claim (lock held). The first trusted binding of a claim drops the
        pods only a registration body had named."""
        pods = self._claims.setdefault(claim_uid, [])
        if trusted and claim_uid not in self._trusted:
            self._trusted.add(claim_uid)
            pods.clear()
        if pod_uid not in pods:
            pods.append(pod_uid)

    def register(self, reg: Registration, *, simulated: bool = False, scope: ClaimScope | None = None) -> Workload:
        """Record a workload; RegistrationError when malformed, RegistrationRefused when not allowed."""
        validate_registration(reg)
        if scope is not None:
            reg = scoped_registration(reg, scope)
        with self._lock:
            old = self._by_pod.get(reg.pod_uid)
            if old is None and len(self._by_pod) >= self.max_workloads:
                raise RegistryFull(
                    f"this node agent already holds {self.max_workloads} registrations; refusing pod {reg.pod_uid!r}"
                )
            if old is not None and old.scope is not None and scope is None:
                raise RegistrationRefused(
                    f"pod {reg.pod_uid!r} registered on its claim's socket; re-register there, not on a shared socket"
                )
            w = Workload(reg=reg, session_id=uuid.uuid4().hex, state=reg.current_state, simulated=simulated)
            w.scope = scope
            if old is not None:
                # A re-registration (workload or agent restarted): keep the operation lock so an
                # operation in flight on the old session serialises with the new one, end old streams.
                w.op_lock = old.op_lock
                old.commands.put(None)
            self._by_pod[reg.pod_uid] = w
            for c in reg.claim_uids:
                if scope is not None or simulated:  # simulated: the engine's own stand-in
                    self._bind(c, reg.pod_uid, trusted=scope is not None)
                elif c not in self._trusted:
                    self._bind(c, reg.pod_uid, trusted=False)
            return w

    def bind_claim(self, claim_uid: str, pod_uid: str) -> None:
        """The driver's binding (from its claim records): a registration body cannot override it."""
        with self._lock:
            self._bind(claim_uid, pod_uid, trusted=True)

    def count(self) -> int:
        with self._lock:
            return len(self._by_pod)

    def pods_for_claim(self, claim_uid: str) -> list[str]:
        """Every pod bound to the claim, in binding order."""
        with self._lock:
            return list(self._claims.get(claim_uid, ()))

    def pod_for_claim(self, claim_uid: str) -> str | None:
        """The pod bound to the claim last (a claim of one pod: its pod)."""
        pods = self.pods_for_claim(claim_uid)
        return pods[-1] if pods else None

    def get(self, pod_uid: str) -> Workload | None:
        with self._lock:
            return self._by_pod.get(pod_uid)

    def session(self, pod_uid: str, session_id: str) -> Workload | None:
        """The workload only if ``session_id`` is its current session (stale sessions get None)."""
        with self._lock:
            w = self._by_pod.get(pod_uid)
            return w if w is not None and w.session_id == session_id else None

    def remove(self, pod_uid: str) -> Workload | None:
        with self._lock:
            w = self._by_pod.pop(pod_uid, None)
            for c, pods in list(self._claims.items()):
                if pod_uid in pods:
                    pods.remove(pod_uid)
                if not pods:
                    del self._claims[c]
                    self._trusted.discard(c)
        if w is not None:
            w.commands.put(None)
            w.abandon()
        return w

    def all(self) -> list[Workload]:
        with self._lock:
            return list(self._by_pod.values())

    def set_state(self, w: Workload, state: str) -> None:
        if state not in WORKLOAD_STATES:
            raise ValueError(f"unknown workload state {state!r}")
        w.state = state

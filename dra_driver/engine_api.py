"""The interface between the DRA driver and the suspend engine (``dra_driver/suspend/``).

The driver decides *when* a lent workload must leave its GPU (serving wins, or a
``rose.io/suspend-request`` annotation) and records that decision crash-safely; the engine
does the moving of device state. The driver re-drives calls after a crash, so an engine must be
idempotent: ``suspend`` of an already suspended occupant and ``resume`` of a running one return
``ok=True`` without moving anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable


class SuspendReason(StrEnum):
    """Why a suspend or resume ended as it did: the field decisions and metric labels read
    (never the message text, which is for people)."""

    DONE = "done"  # state moved (or already where it should be)
    FALLBACK = "fallback"  # the fallback was taken (see ``SuspendResult.fallback``)
    DEADLINE_EXCEEDED = "deadline_exceeded"  # the engine's backend missed the grace period
    ENGINE_TIMEOUT = "engine_timeout"  # the driver stopped waiting for the engine
    UNSUPPORTED = "unsupported"  # the workload cannot be suspended by the enabled backends
    NO_WORKLOAD = "no_workload"  # nothing registered for the claim
    NO_ENGINE = "no_engine"  # the driver runs without a suspend engine
    FAILED = "failed"  # any other failure; the message says what


@dataclass(frozen=True)
class SuspendResult:
    """Outcome of one suspend or resume.

    ``fallback`` is ``None`` when the state went to (or came back from) host memory; otherwise it
    names the fallback taken, e.g. ``"checkpoint-evict"`` (durable checkpoint, then eviction).
    """

    ok: bool
    backend: str
    bytes_moved: int
    seconds: float
    fallback: str | None
    message: str
    reason: SuspendReason = SuspendReason.DONE

    @property
    def timed_out(self) -> bool:
        return self.reason in (SuspendReason.DEADLINE_EXCEEDED, SuspendReason.ENGINE_TIMEOUT)


class SuspendEngine(Protocol):
    def suspend(self, claim_uid: str, grace_seconds: float) -> SuspendResult:
        """Block until the occupant of ``claim_uid`` is suspended or its fallback is done."""
        ...

    def resume(self, claim_uid: str) -> SuspendResult:
        """Block until the occupant of ``claim_uid`` runs again on its GPU."""
        ...

    def occupant_state(self, claim_uid: str) -> str:
        """``"running"``, ``"suspended"`` or ``"unknown"``."""
        ...


@runtime_checkable
class CopyWatcher(Protocol):
    """Optional engine capability: is a device-to-host copy that cannot be interrupted (e.g.
    ``cuCheckpointProcessCheckpoint``) running for the occupant of ``claim_uid``? The driver
    does not let serving start on a GPU whose memory is still being copied off."""

    def copy_in_progress(self, claim_uid: str) -> bool: ...


@runtime_checkable
class FallbackWatcher(Protocol):
    """Optional engine capability: has the engine asked the occupant of ``claim_uid`` for its
    durable checkpoint (the checkpoint-and-evict fallback) without an answer yet? The driver gives
    such a checkpoint the enforcement's bound before it stops the process."""

    def fallback_in_progress(self, claim_uid: str) -> bool: ...


@runtime_checkable
class PodScopedEngine(Protocol):
    """Optional engine capability: act on some pods of a claim only. A claim can be shared by
    several pods (a time-slice group's claim lists each member job's worker in ``reservedFor``),
    each with its own state; a suspend request on one of them (a time-slice hand-over parking it)
    must move that pod only, while ``suspend(claim)`` (serving takes the GPU) moves them all."""

    def suspend_pods(self, claim_uid: str, pod_uids: Sequence[str], grace_seconds: float) -> SuspendResult: ...

    def resume_pods(self, claim_uid: str, pod_uids: Sequence[str]) -> SuspendResult: ...

    def pods_state(self, claim_uid: str, pod_uids: Sequence[str]) -> str: ...


@runtime_checkable
class ClaimBinder(Protocol):
    """Optional engine capability: learn which pod uses a lent claim (from ``status.reservedFor``),
    for workloads that registered with the node agent by pod UID only."""

    def bind_claim(self, claim_uid: str, pod_uid: str) -> None: ...


@runtime_checkable
class PodForgetter(Protocol):
    """Optional engine capability: drop a deleted pod's workload and the host memory it held."""

    def forget(self, pod_uid: str) -> None: ...

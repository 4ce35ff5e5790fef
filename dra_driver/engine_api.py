"""The interface between the DRA driver and the suspend engine (``dra_driver/suspend/``).

The driver decides *when* a lent workload must leave its GPU (serving wins, or a
``rose.io/suspend-request`` annotation) and records that decision crash-safely; the engine
does the moving of device state. The driver re-drives calls after a crash, so an engine must be
idempotent: ``suspend`` of an already suspended occupant and ``resume`` of a running one return
``ok=True`` without moving anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


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
class ClaimBinder(Protocol):
    """Optional engine capability: learn which pod uses a lent claim (from ``status.reservedFor``),
    for workloads that registered with the node agent by pod UID only."""

    def bind_claim(self, claim_uid: str, pod_uid: str) -> None: ...


@runtime_checkable
class PodForgetter(Protocol):
    """Optional engine capability: drop a deleted pod's workload and the host memory it held."""

    def forget(self, pod_uid: str) -> None: ...

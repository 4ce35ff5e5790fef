"""The ``cooperative`` backend: the rose_sdk inside the workload moves its own tensors.

The engine pushes a command on the workload's stream with a wall-clock deadline; the SDK acts at
its next safe point (offload into reused pinned host buffers and free device memory, or the
reverse, or an atomic durable checkpoint) and acknowledges with the bytes it moved. The checkpoint
a ``CHECKPOINT`` ack names is only a hint: :mod:`dra_driver.suspend.verify` checks it.
I/O boundary: the workload's command queue.
"""

from __future__ import annotations

import time

from dra_driver.suspend.model import BACKEND_COOPERATIVE, Ack, BackendOutcome, Command, CommandKind, OpContext
from dra_driver.suspend.registry import Workload


def unix_ms_for(deadline_monotonic: float) -> int:
    """Convert a monotonic deadline into the wall-clock milliseconds a workload can compare with."""
    return int((time.time() + (deadline_monotonic - time.monotonic())) * 1000)


class CooperativeBackend:
    name = BACKEND_COOPERATIVE

    def _roundtrip(
        self, w: Workload, kind: CommandKind, deadline_monotonic: float, op: OpContext
    ) -> tuple[Ack | None, str]:
        note = "" if w.connected else " (its command stream is not connected now; the command waits for it)"
        w.send(
            Command(
                operation_id=op.operation_id,
                kind=kind,
                backend=self.name,
                deadline_unix_ms=unix_ms_for(deadline_monotonic),
                grace_seconds=op.grace_seconds,
                reason=op.reason,
            )
        )
        return w.wait_ack(op.operation_id, deadline_monotonic), note

    def suspend(self, w: Workload, deadline_monotonic: float, op: OpContext) -> BackendOutcome:
        ack, note = self._roundtrip(w, "suspend", deadline_monotonic, op)
        if ack is None:
            return BackendOutcome(
                False,
                0,
                f"workload did not acknowledge the suspend within its grace period{note}",
                timed_out=True,
            )
        if not ack.ok:
            return BackendOutcome(False, 0, f"workload refused or failed the suspend: {ack.message}")
        return BackendOutcome(True, ack.bytes_moved, ack.message or "offloaded to host memory")

    def resume(self, w: Workload, deadline_monotonic: float, op: OpContext) -> BackendOutcome:
        ack, note = self._roundtrip(w, "resume", deadline_monotonic, op)
        if ack is None:
            return BackendOutcome(False, 0, f"workload did not acknowledge the resume in time{note}", timed_out=True)
        if not ack.ok:
            return BackendOutcome(False, 0, f"workload failed the resume: {ack.message}")
        return BackendOutcome(True, ack.bytes_moved, ack.message or "restored to device memory")

    def checkpoint(self, w: Workload, deadline_monotonic: float, op: OpContext) -> Ack | None:
        """Ask for an atomic durable checkpoint; the ack carries its path and sha256, or None on timeout."""
        ack, _ = self._roundtrip(w, "checkpoint", deadline_monotonic, op)
        return ack

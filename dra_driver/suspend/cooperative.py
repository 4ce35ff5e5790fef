"""The ``cooperative`` backend: the rose_sdk inside the workload moves its own tensors.

The engine pushes a command on the workload's stream with a wall-clock deadline; the SDK acts at
its next safe point (offload into reused pinned host buffers and free device memory, or the
reverse, or an atomic durable checkpoint) and acknowledges with the bytes it moved. The checkpoint
a ``CHECKPOINT`` ack names is only a hint: :mod:`dra_driver.suspend.verify` checks it.

Spill (layered memory): the host copy of a suspended cooperative workload lives in its own
process, so the engine asks it to move it: ``spill`` names a file the driver created in its disk
tier, the SDK writes its host copy there (``rose_common.spillfmt``) and fsyncs; the engine then
verifies the file itself and only then sends ``spill-commit``: the SDK frees its host copy. The
engine checks that the process's resident memory (``/proc/<pid>/status``, the PID from the pod's
cgroup, :func:`pids.resolve_pid`) fell accordingly before it counts the state as spilled. The
path the commands name is the file as the workload's process sees it (:meth:`CooperativeBackend.
view_of`: its claim's CDI mount in a container, the host path for a host process), looked up
through ``/proc/<pid>/root``; it only says where to write: the driver checks the inode it created.
I/O boundary: the workload's command queue, ``/proc``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from dra_driver.suspend.model import BACKEND_COOPERATIVE, Ack, BackendOutcome, Command, CommandKind, OpContext
from dra_driver.suspend.pids import resolve_pid
from dra_driver.suspend.registry import Workload
from dra_driver.suspend.spill import NOT_THERE, pick_view

PidResolver = Callable[[str, int], int | None]


def rss_from_status(text: str) -> int | None:
    """Pure: the resident set size in bytes from the text of ``/proc/<pid>/status`` (None: absent)."""
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) * 1024
    return None


def spill_freed(rss_before: int | None, rss_after: int | None, payload_bytes: int) -> bool:
    """Pure: did the process free its host copy? Its resident memory must have fallen by at least
    half the spilled payload (the margin absorbs page granularity and allocator slack; a process
    that kept its copy frees ~nothing). Unmeasurable (None) is not freed."""
    if rss_before is None or rss_after is None:
        return False
    return rss_before - rss_after >= payload_bytes // 2


def unix_ms_for(deadline_monotonic: float) -> int:
    """Convert a monotonic deadline into the wall-clock milliseconds a workload can compare with."""
    return int((time.time() + (deadline_monotonic - time.monotonic())) * 1000)


class CooperativeBackend:
    name = BACKEND_COOPERATIVE

    def __init__(self, pid_resolver: PidResolver = resolve_pid, proc: Path = Path("/proc")) -> None:
        self._resolve = pid_resolver
        self._proc = proc

    def process(self, w: Workload) -> tuple[int, int, int] | None:
        """(pid, uid, gid) of the workload's process as the kernel knows it (its pod's cgroup,
        the owner of its ``/proc`` entry); None when it cannot be found."""
        pid = self._resolve(w.pod_uid, w.reg.pid)
        if pid is None:
            return None
        try:
            st = os.stat(self._proc / str(pid))
        except OSError:
            return None
        return pid, st.st_uid, st.st_gid

    def view_of(self, pid: int | None, host_path: Path, views: list[str]) -> str | None:
        """Which of ``views`` names ``host_path`` for process ``pid``: the one whose directory,
        looked up from the process's root (``/proc/<pid>/root``), is ``host_path``'s directory
        (:func:`spill.pick_view`). None when the process can reach none of them."""
        try:
            target = os.stat(host_path.parent)
        except OSError:
            return None  # the directory went meanwhile (its claim unprepared): nothing to reach
        root = self._proc / str(pid) / "root"
        seen: list[tuple[int, int] | None] = [None] * len(views)
        if pid is not None and os.access(root, os.X_OK):
            for i, v in enumerate(views):
                try:
                    st = os.stat(root / Path(v).parent.relative_to("/"))
                except OSError:
                    seen[i] = NOT_THERE
                else:
                    seen[i] = (st.st_dev, st.st_ino)
        return pick_view(views, (target.st_dev, target.st_ino), seen)

    def rss_bytes(self, pid: int) -> int | None:
        try:
            return rss_from_status((self._proc / str(pid) / "status").read_text())
        except OSError:
            return None

    def _roundtrip(
        self, w: Workload, kind: CommandKind, deadline_monotonic: float, op: OpContext, spill_path: str = ""
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
                spill_path=spill_path,
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
        ack, note = self._roundtrip(w, "resume", deadline_monotonic, op, op.spill_path)
        if ack is None:
            return BackendOutcome(False, 0, f"workload did not acknowledge the resume in time{note}", timed_out=True)
        if not ack.ok:
            return BackendOutcome(False, 0, f"workload failed the resume: {ack.message}")
        return BackendOutcome(True, ack.bytes_moved, ack.message or "restored to device memory")

    def checkpoint(self, w: Workload, deadline_monotonic: float, op: OpContext) -> Ack | None:
        """Ask for an atomic durable checkpoint; the ack carries its path and sha256, or None on timeout."""
        ack, _ = self._roundtrip(w, "checkpoint", deadline_monotonic, op)
        return ack

    def spill(self, w: Workload, path: str, deadline_monotonic: float, op: OpContext) -> Ack | None:
        """Ask the suspended workload to write its host copy to ``path`` (keeping the copy)."""
        ack, _ = self._roundtrip(w, "spill", deadline_monotonic, op, path)
        return ack

    def commit_spill(self, w: Workload, path: str, deadline_monotonic: float, op: OpContext) -> Ack | None:
        """The driver verified ``path``: tell the workload to free its host copy."""
        ack, _ = self._roundtrip(w, "spill-commit", deadline_monotonic, op, path)
        return ack

"""How the node driver reads a suspend result: by its reason field, and waiting for a started copy.

The engines here are explicit stand-ins for ``dra_driver.suspend.NodeSuspendEngine``: they answer
with a chosen ``SuspendResult`` (and, for the copy case, say a device-to-host copy is running).
"""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver.claims import ClaimRef
from dra_driver.engine_api import CopyWatcher, SuspendReason, SuspendResult
from dra_driver.state import SUSPEND_FAILED, SUSPENDED
from tests.support.driver_fixtures import NS, StaticClaims, make_claim, make_driver

L0 = make_claim("uid-l0", "l0", [("gpu", "gpu-0-lendable")], pod=("rl-0", "pod-rl-0"))
S0 = make_claim("uid-s0", "s0", [("gpu", "gpu-0-serving")], pod=("serve-0", "pod-serve-0"))


def ref(c: dict) -> ClaimRef:  # type: ignore[type-arg]
    return ClaimRef(NS, c["metadata"]["uid"], c["metadata"]["name"])


@dataclass
class AnsweringEngine:
    """Answers every suspend with ``answer``."""

    answer: SuspendResult

    def suspend(self, claim_uid: str, grace_seconds: float) -> SuspendResult:
        return self.answer

    def resume(self, claim_uid: str) -> SuspendResult:
        return SuspendResult(True, "stand-in", 0, 0.0, None, "ok")

    def occupant_state(self, claim_uid: str) -> str:
        return "running"


@dataclass
class SlowCopyEngine:
    """Its suspend takes ``copy_seconds`` (a checkpoint call that cannot be interrupted), during
    which ``copy_in_progress`` is true — like cuCheckpointProcessCheckpoint on a large process."""

    copy_seconds: float
    copying: threading.Event = field(default_factory=threading.Event)
    finished_at: list[float] = field(default_factory=list)

    def suspend(self, claim_uid: str, grace_seconds: float) -> SuspendResult:
        self.copying.set()
        time.sleep(self.copy_seconds)
        self.copying.clear()
        self.finished_at.append(time.monotonic())
        return SuspendResult(True, "cuda-checkpoint", 1 << 30, self.copy_seconds, None, "checkpointed")

    def resume(self, claim_uid: str) -> SuspendResult:
        return SuspendResult(True, "cuda-checkpoint", 1 << 30, 0.0, None, "restored")

    def occupant_state(self, claim_uid: str) -> str:
        return "running"

    def copy_in_progress(self, claim_uid: str) -> bool:
        return self.copying.is_set()


def _suspend_outcome(tmp: Path, answer: SuspendResult) -> tuple[float, float]:
    """(timeout, failed) counts of rose_driver_occupant_suspend after one failed suspend."""
    d = make_driver(tmp, StaticClaims([L0, S0]), AnsweringEngine(answer))
    try:
        d.prepare([ref(L0)])
        assert not d.prepare([ref(S0)])["uid-s0"].error
        assert d.snapshot().suspensions["uid-l0"].state == SUSPEND_FAILED
        m = d.metrics.occupant_suspend_total
        return m.labels("timeout")._value.get(), m.labels("failed")._value.get()
    finally:
        d.close()


def test_outcome_label_comes_from_the_reason_not_the_message(tmp_path: Path) -> None:
    # A failure whose *message* happens to say "within" is a failure, not a timeout ...
    failed = SuspendResult(
        False,
        "cooperative",
        0,
        0.1,
        "checkpoint-evict",
        "durable checkpoint not confirmed (no acknowledgement within 60.0s)",
        SuspendReason.FAILED,
    )
    timeouts, failures = _suspend_outcome(tmp_path / "a", failed)
    assert (timeouts, failures) == (0, 1)
    # ... and a lock that timed out (CUDA_ERROR_NOT_READY) is a timeout, whatever the text says.
    lock_timeout = SuspendResult(
        False, "cuda-checkpoint", 0, 7.0, None, "lock: CUDA_ERROR_NOT_READY (600)", SuspendReason.DEADLINE_EXCEEDED
    )
    timeouts, failures = _suspend_outcome(tmp_path / "b", lock_timeout)
    assert (timeouts, failures) == (1, 0)


def test_serving_waits_for_a_copy_that_has_started_and_the_wait_is_measured(tmp_path: Path) -> None:
    engine = SlowCopyEngine(copy_seconds=1.5)
    assert isinstance(engine, CopyWatcher)
    d = make_driver(tmp_path, StaticClaims([L0, S0]), engine, default_grace_seconds=0.2, grace_slack_seconds=0.1)
    try:
        d.prepare([ref(L0)])
        assert not d.prepare([ref(S0)])["uid-s0"].error
        prepared_at = time.monotonic()
        # the serving claim was prepared only after the copy had finished: its GPU memory is free
        assert engine.finished_at and engine.finished_at[0] <= prepared_at
        s = d.snapshot().suspensions["uid-l0"]
        assert s.state == SUSPENDED and "serving waited" in s.message
        h = d.metrics.suspend_copy_wait_seconds
        assert h._sum.get() >= 1.0  # the 1.5 s copy minus the 0.3 s already waited
        assert d.metrics.occupant_suspend_total.labels("suspended")._value.get() == 1
    finally:
        d.close()


def test_the_wait_for_a_started_copy_is_bounded(tmp_path: Path) -> None:
    engine = SlowCopyEngine(copy_seconds=2.0)
    d = make_driver(
        tmp_path,
        StaticClaims([L0, S0]),
        engine,
        default_grace_seconds=0.1,
        grace_slack_seconds=0.1,
        copy_wait_limit_seconds=0.3,
    )
    try:
        d.prepare([ref(L0)])
        t0 = time.monotonic()
        assert not d.prepare([ref(S0)])["uid-s0"].error
        assert time.monotonic() - t0 < 1.5
        s = d.snapshot().suspensions["uid-l0"]
        assert s.state == SUSPEND_FAILED and "still running" in s.message
        assert d.metrics.occupant_suspend_total.labels("timeout")._value.get() == 1
    finally:
        d.close()


class SlowCheckpointLibcuda:
    """libcuda at its ctypes boundary (explicit fake: no GPU here): the checkpoint call takes
    ``seconds``, as cuCheckpointProcessCheckpoint does for a large process."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.state = seconds, 0

    def cuInit(self, flags: int) -> int:
        return 0

    def cuDriverGetVersion(self, out: Any) -> int:
        ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = 12080
        return 0

    def cuCheckpointProcessGetState(self, pid: int, out: Any) -> int:
        ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = self.state
        return 0

    def cuCheckpointProcessLock(self, pid: int, args: Any) -> int:
        self.state = 1
        return 0

    def cuCheckpointProcessCheckpoint(self, pid: int, args: Any) -> int:
        time.sleep(self.seconds)
        self.state = 2
        return 0

    def cuCheckpointProcessRestore(self, pid: int, args: Any) -> int:
        self.state = 1
        return 0

    def cuCheckpointProcessUnlock(self, pid: int, args: Any) -> int:
        self.state = 0
        return 0


def test_real_engine_and_cuda_checkpoint_backend_make_serving_wait_for_the_copy(tmp_path: Path) -> None:
    from dra_driver.suspend.cuda_checkpoint import CudaCheckpointBackend, CudaDriver
    from dra_driver.suspend.engine import EngineConfig, NodeSuspendEngine
    from dra_driver.suspend.model import Registration
    from dra_driver.suspend.support import ProcessFacts

    lib = SlowCheckpointLibcuda(1.2)
    be = CudaCheckpointBackend(
        CudaDriver(lib), pid_resolver=lambda uid, pid: pid, process_facts=lambda p: ProcessFacts()
    )
    engine = NodeSuspendEngine(EngineConfig(1 << 40, backends=("cuda-checkpoint",)), {"cuda-checkpoint": be})
    engine.register(Registration("pod-rl-0", 4242, 1 << 30, frozenset({"cuda-checkpoint"})))
    d = make_driver(tmp_path, StaticClaims([L0, S0]), engine, default_grace_seconds=0.2, grace_slack_seconds=0.1)
    try:
        d.prepare([ref(L0)])  # binds claim uid-l0 to pod-rl-0 (status.reservedFor)
        assert not d.prepare([ref(S0)])["uid-s0"].error
        assert lib.state == 2  # checkpointed before serving's claim was prepared
        assert d.snapshot().suspensions["uid-l0"].state == SUSPENDED
        assert d.metrics.suspend_copy_wait_seconds._sum.get() > 0.5
    finally:
        d.close()

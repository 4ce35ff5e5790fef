"""benchmarks/gpu_suspend.py without a GPU: the goal verdict, the child protocol's timeouts, and
unlock after a failed checkpoint. The driver here is an explicit fake of ``CudaDriver`` and the
child a small Python process speaking the benchmark's line protocol (no GPU on this machine)."""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest

from benchmarks.gpu_suspend import ChildTimeout, bench_cuda_checkpoint, goal_verdict

FAKE_CHILD = [
    sys.executable,
    "-c",
    "import json, os, sys\n"
    "print(json.dumps({'ready': True, 'pid': os.getpid(), 'checksum': [1, 2]}), flush=True)\n"
    "for line in sys.stdin:\n"
    "    if line.strip() == 'verify': print(json.dumps({'checksum': [1, 2]}), flush=True)\n"
    "    elif line.strip() == 'exit': break\n",
]
STUCK_CHILD = [sys.executable, "-c", "import time; time.sleep(60)"]


class FakeDriver:
    """CudaDriver's calls, recorded; states as the driver's state machine (SUSPEND.md §1.2)."""

    def __init__(self, fail_checkpoint: bool = False) -> None:
        self.calls: list[str] = []
        self.state = 0
        self.fail_checkpoint = fail_checkpoint

    def lock(self, pid: int, timeout_ms: int) -> None:
        self.calls.append("lock")
        self.state = 1

    def checkpoint(self, pid: int) -> None:
        self.calls.append("checkpoint")
        if self.fail_checkpoint:
            raise RuntimeError("cuCheckpointProcessCheckpoint failed: CUDA_ERROR_NOT_SUPPORTED (801)")
        self.state = 2

    def restore(self, pid: int) -> None:
        self.calls.append("restore")
        self.state = 1

    def unlock(self, pid: int) -> None:
        self.calls.append("unlock")
        self.state = 0

    def get_state(self, pid: int) -> int:
        return self.state


class Probe:
    def process_device_bytes(self, pid: int) -> int:
        return 5 << 30


def _entry(gib: float, ratio: float, freed: bool = True, exact: bool = True) -> dict[str, Any]:
    r = {
        "suspend_gbps": 50.0 * ratio,
        "suspend_ratio_to_pinned_d2h": ratio,
        "resume_ratio_to_pinned_h2d": ratio,
        "device_memory_freed": freed,
        "bit_exact": exact,
    }
    return {"gib": gib, "cooperative": dict(r), "cuda_checkpoint": dict(r)}


def test_a_no_op_offload_never_meets_the_goal() -> None:
    noop = [_entry(8, float("inf"), freed=False), _entry(32, float("inf"), freed=False)]
    v = goal_verdict(noop)
    assert not v["met"] and not v["cooperative"]["met"]
    assert "8 GiB: device memory not freed" in v["cooperative"]["why_not"]
    assert goal_verdict([_entry(8, 0.9), _entry(32, 0.85)])["met"]
    v = goal_verdict([_entry(8, 0.6), _entry(32, 0.6)])  # enough for cuda-checkpoint, not for cooperative
    assert v["cuda_checkpoint"]["met"] and not v["cooperative"]["met"]
    assert not goal_verdict([_entry(1, 1.0)])["met"]  # nothing at 8 GiB or more: not judged, not met
    broken = _entry(8, 0.9)
    broken["cuda_checkpoint"] = {"error": "RuntimeError('lock')"}
    assert not goal_verdict([broken])["cuda_checkpoint"]["met"]


def test_cuda_checkpoint_cycle_reports_driver_bytes_and_copy_time() -> None:
    drv = FakeDriver()
    free = iter([10 << 30, 15 << 30, 10 << 30, 15 << 30])
    r = bench_cuda_checkpoint(4 << 30, 2, drv, probe=Probe(), child_cmd=FAKE_CHILD, free_bytes=lambda: next(free))
    assert drv.calls == ["lock", "checkpoint", "restore", "unlock"] * 2
    assert r["checkpointed"] and r["bit_exact"] and r["device_memory_freed"]
    assert r["driver_moved_bytes"] == 5 << 30 and r["checkpoint_seconds"] <= r["suspend_seconds"]


def test_a_failed_checkpoint_is_unlocked() -> None:
    drv = FakeDriver(fail_checkpoint=True)
    with pytest.raises(RuntimeError, match="NOT_SUPPORTED"):
        bench_cuda_checkpoint(1 << 20, 1, drv, child_cmd=FAKE_CHILD, free_bytes=lambda: 0)
    assert drv.calls == ["lock", "checkpoint", "unlock"] and drv.state == 0


def test_a_stuck_child_ends_the_size_instead_of_hanging_the_run() -> None:
    t0 = time.monotonic()
    with pytest.raises(ChildTimeout, match="sent nothing for 1s"):
        bench_cuda_checkpoint(1 << 20, 1, FakeDriver(), child_cmd=STUCK_CHILD, ready_timeout=1.0)
    assert time.monotonic() - t0 < 40  # 1 s read timeout, then the child is stopped

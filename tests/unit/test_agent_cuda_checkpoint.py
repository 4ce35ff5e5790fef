"""The cuda-checkpoint backend's ctypes layer, without a GPU: struct ABI, call order, clear errors.

The fake libcuda here is an explicit test double of the seven driver symbols (a GPU cannot run on
this machine); it follows the driver's documented state machine (SUSPEND.md §1.2).
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import pytest

from dra_driver.suspend.cuda_checkpoint import (
    CUcheckpointCheckpointArgs,
    CUcheckpointLockArgs,
    CUcheckpointUnlockArgs,
    CudaCheckpointBackend,
    CudaCheckpointUnavailable,
    CudaDriver,
)
from dra_driver.suspend.model import OpContext, Registration
from dra_driver.suspend.pids import resolve_pid
from dra_driver.suspend.registry import Workload

TIMEOUT = 909


class FakeLibcuda:
    """RUNNING(0) -lock-> LOCKED(1) -checkpoint-> CHECKPOINTED(2) -restore-> LOCKED -unlock-> RUNNING."""

    def __init__(self, version: int = 12080, fail: dict[str, int] | None = None) -> None:
        self.state = 0
        self.calls: list[str] = []
        self.version = version
        self.fail = fail or {}
        self.lock_timeout_ms = -1

    def _ret(self, name: str) -> int:
        self.calls.append(name)
        return self.fail.get(name, 0)

    def cuInit(self, flags: int) -> int:
        return self._ret("cuInit")

    def cuDriverGetVersion(self, out: Any) -> int:
        ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = self.version
        return self._ret("version")

    def cuCheckpointProcessGetState(self, pid: int, out: Any) -> int:
        ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = self.state
        return 0

    def cuCheckpointProcessLock(self, pid: int, args: Any) -> int:
        self.lock_timeout_ms = ctypes.cast(args, ctypes.POINTER(CUcheckpointLockArgs))[0].timeoutMs
        rc = self._ret("lock")
        if rc == 0:
            self.state = 1
        return rc

    def cuCheckpointProcessCheckpoint(self, pid: int, args: Any) -> int:
        rc = self._ret("checkpoint")
        if rc == 0:
            self.state = 2
        return rc

    def cuCheckpointProcessRestore(self, pid: int, args: Any) -> int:
        assert args is None  # NULL: same GPUs, no remap
        rc = self._ret("restore")
        if rc == 0:
            self.state = 1
        return rc

    def cuCheckpointProcessUnlock(self, pid: int, args: Any) -> int:
        rc = self._ret("unlock")
        if rc == 0:
            self.state = 0
        return rc


def same_pid(pod_uid: str, pid: int) -> int:
    return pid


def workload() -> Workload:
    return Workload(Registration("p", 1234, 8 << 30, frozenset({"cuda-checkpoint"})), "s")


def test_arg_structs_are_64_bytes_with_timeout_first() -> None:
    for s in (CUcheckpointLockArgs, CUcheckpointCheckpointArgs, CUcheckpointUnlockArgs):
        assert ctypes.sizeof(s) == 64
    assert CUcheckpointLockArgs.timeoutMs.offset == 0  # type: ignore[attr-defined]


def test_suspend_then_resume_calls_in_driver_order() -> None:
    lib = FakeLibcuda()
    be = CudaCheckpointBackend(CudaDriver(lib), pid_resolver=same_pid)
    import time

    out = be.suspend(workload(), time.monotonic() + 3.0, OpContext("op"))
    assert out.ok and out.bytes_moved == 8 << 30
    assert 2500 < lib.lock_timeout_ms <= 3000  # the grace period left, in ms
    assert be.process_state(1234) == "checkpointed"
    assert be.suspend(workload(), time.monotonic() + 3, OpContext("op")).bytes_moved == 0  # idempotent
    back = be.resume(workload(), time.monotonic() + 3, OpContext("op2"))
    assert back.ok and be.process_state(1234) == "running"
    assert lib.calls == ["cuInit", "version", "lock", "checkpoint", "restore", "unlock"]
    assert be.resume(workload(), 0, OpContext("op3")).bytes_moved == 0


def test_failed_checkpoint_unlocks_and_reports() -> None:
    lib = FakeLibcuda(fail={"checkpoint": 801})
    be = CudaCheckpointBackend(CudaDriver(lib), pid_resolver=same_pid)
    import time

    out = be.suspend(workload(), time.monotonic() + 3, OpContext("op"))
    assert not out.ok and "CUDA_ERROR_NOT_SUPPORTED (801)" in out.message and "unlocked" in out.message
    assert lib.calls[-2:] == ["checkpoint", "unlock"] and lib.state == 0


def test_lock_timeout_is_a_deadline_miss() -> None:
    lib = FakeLibcuda(fail={"lock": TIMEOUT})
    be = CudaCheckpointBackend(CudaDriver(lib), pid_resolver=same_pid)
    import time

    out = be.suspend(workload(), time.monotonic() + 1, OpContext("op"))
    assert not out.ok and out.timed_out and "CUDA_ERROR_TIMEOUT" in out.message


def test_missing_libcuda_is_a_clear_error() -> None:
    with pytest.raises(CudaCheckpointUnavailable, match="needs the NVIDIA driver's libcuda"):
        CudaDriver.load("libcuda-does-not-exist.so.1")


def test_old_driver_is_refused() -> None:
    class Old:
        def cuInit(self, flags: int) -> int:
            return 0

    with pytest.raises(CudaCheckpointUnavailable, match="r570 or newer"):
        CudaDriver(Old())
    with pytest.raises(CudaCheckpointUnavailable, match="12080"):
        CudaCheckpointBackend(CudaDriver(FakeLibcuda(version=12040)))


def fake_proc(root: Path, pid: int, nspid: list[int], cgroup: str) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    ids = "\t".join(map(str, nspid))
    (d / "status").write_text(f"Name:\tpython\nNSpid:\t{ids}\n")
    (d / "cgroup").write_text(cgroup)


def test_container_pid_is_mapped_to_the_host_pid(tmp_path: Path) -> None:
    uid = "0f1e2d3c-aaaa-bbbb-cccc-123456789abc"
    fake_proc(tmp_path, 7, [7, 1], "0::/kubepods/besteffort/podother/x\n")  # another pod's PID 1
    fake_proc(tmp_path, 4242, [4242, 1], f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri\n")
    fake_proc(tmp_path, 99, [99], "0::/user.slice\n")  # a process in the agent's own namespace
    (tmp_path / "self").mkdir()
    assert resolve_pid(uid, 1, tmp_path) == 4242
    assert resolve_pid("no-such-pod", 1, tmp_path) is None  # never guesses another pod's PID 1
    assert resolve_pid("no-such-pod", 99, tmp_path) is None  # a known pod UID never takes the PID as is
    assert resolve_pid("", 99, tmp_path) == 99  # no pod UID: a process of the agent's own namespace
    assert resolve_pid(uid, 5, tmp_path) is None


def test_unresolvable_pid_is_refused_not_guessed() -> None:
    lib = FakeLibcuda()
    be = CudaCheckpointBackend(CudaDriver(lib), pid_resolver=lambda uid, pid: None)
    import time

    out = be.suspend(workload(), time.monotonic() + 3, OpContext("op"))
    assert not out.ok and "needs hostPID" in out.message and "lock" not in lib.calls

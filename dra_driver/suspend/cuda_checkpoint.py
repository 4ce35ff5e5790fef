"""The ``cuda-checkpoint`` backend: the CUDA driver API's process checkpoint, by PID, via ctypes.

cuCheckpointProcessLock → cuCheckpointProcessCheckpoint suspends (device memory moves into host
memory the driver manages inside the target process, the process stays alive);
cuCheckpointProcessRestore → cuCheckpointProcessUnlock resumes it at the same virtual addresses
(SUSPEND.md §1.2). Needs driver r570+ (CUDA 12.8). The library is loaded and ``cuInit`` called once,
in the long-lived agent, so no call pays CUDA start-up (SUSPEND.md §1.3). The caller must see the
target's PID namespace (hostPID) and be root or hold CAP_SYS_PTRACE.

I/O boundary: libcuda (``CudaDriver``), libnvidia-ml (an optional ``DeviceMemoryProbe``) and
``/proc`` (PID resolution, ``support.read_process_facts``). Refusals and serialisation follow
``support.py``; while ``cuCheckpointProcessCheckpoint`` runs (it cannot be bounded or interrupted)
``copy_started`` reports it, so the driver does not start serving on memory still being copied.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from dra_driver.suspend.model import BACKEND_CUDA_CHECKPOINT, BackendOutcome, OpContext
from dra_driver.suspend.pids import resolve_pid
from dra_driver.suspend.registry import Workload
from dra_driver.suspend.support import ProcessFacts, job_key, read_process_facts, unsupported_reasons

log = logging.getLogger("rose.suspend")

# CUprocessState
PROCESS_STATE_RUNNING = 0
PROCESS_STATE_LOCKED = 1
PROCESS_STATE_CHECKPOINTED = 2
PROCESS_STATE_FAILED = 3
PROCESS_STATE_NAMES = {
    0: "running",
    1: "locked",
    2: "checkpointed",
    3: "failed",
    4: "checkpointing",
    5: "restoring",
}
MIN_DRIVER_API_VERSION = 12080  # CUDA 12.8 / driver r570

_CU_ERRORS = {
    0: "CUDA_SUCCESS",
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    304: "CUDA_ERROR_OPERATING_SYSTEM",
    401: "CUDA_ERROR_ILLEGAL_STATE",
    801: "CUDA_ERROR_NOT_SUPPORTED",
    600: "CUDA_ERROR_NOT_READY",
    802: "CUDA_ERROR_SYSTEM_NOT_READY",
    909: "CUDA_ERROR_TIMEOUT",
    999: "CUDA_ERROR_UNKNOWN",
}
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_TIMEOUT = 909
# cuCheckpointProcessLock returns CUDA_ERROR_NOT_READY when timeoutMs passes (the process stays
# RUNNING); 909 is read the same way in case a driver reports the generic timeout code.
LOCK_TIMEOUT_CODES = frozenset({CUDA_ERROR_NOT_READY, CUDA_ERROR_TIMEOUT})


class CUcheckpointLockArgs(ctypes.Structure):
    """64 bytes, zeroed; ``timeoutMs`` first (the Sphinx docs' order, not the alphabetical one)."""

    _fields_ = [
        ("timeoutMs", ctypes.c_uint),
        ("reserved0", ctypes.c_uint),
        ("reserved1", ctypes.c_uint64 * 7),
    ]


class CUcheckpointCheckpointArgs(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_uint64 * 8)]


class CUcheckpointUnlockArgs(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_uint64 * 8)]


class CudaCheckpointUnavailable(RuntimeError):
    """libcuda (or its checkpoint API) is missing; the message says what to install or choose."""


class CudaCheckpointError(RuntimeError):
    def __init__(self, call: str, pid: int, code: int) -> None:
        self.call, self.pid, self.code = call, pid, code
        super().__init__(f"{call}(pid={pid}) failed: {_CU_ERRORS.get(code, 'CUresult')} ({code})")


class CudaDriver:
    """Thin typed wrapper of the six checkpoint calls on one loaded libcuda (thread-safe per call)."""

    _SYMBOLS = (
        "cuInit",
        "cuDriverGetVersion",
        "cuCheckpointProcessLock",
        "cuCheckpointProcessCheckpoint",
        "cuCheckpointProcessRestore",
        "cuCheckpointProcessUnlock",
        "cuCheckpointProcessGetState",
    )

    def __init__(self, lib: Any) -> None:
        missing = [s for s in self._SYMBOLS if not hasattr(lib, s)]
        if missing:
            raise CudaCheckpointUnavailable(
                f"libcuda lacks {', '.join(missing)}: the cuda-checkpoint backend needs NVIDIA driver"
                " r570 or newer (CUDA 12.8 driver API); upgrade the driver or use --backends cooperative"
            )
        self._lib = lib
        self._init_lock = threading.Lock()
        self._initialised = False

    @classmethod
    def load(cls, path: str = "libcuda.so.1") -> CudaDriver:
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise CudaCheckpointUnavailable(
                f"cannot load {path} ({e}): the cuda-checkpoint backend needs the NVIDIA driver's libcuda"
                " on this node (mount it into the driver pod, e.g. via the NVIDIA container toolkit);"
                " without a GPU choose --backends cooperative or simulated"
            ) from e
        return cls(lib)

    def init(self) -> None:
        with self._init_lock:
            if self._initialised:
                return
            rc = int(self._lib.cuInit(0))
            if rc != 0:
                raise CudaCheckpointUnavailable(
                    f"cuInit failed: {_CU_ERRORS.get(rc, 'CUresult')} ({rc}): no usable NVIDIA GPU or driver is"
                    " visible to this process (run it with the NVIDIA runtime, NVIDIA_VISIBLE_DEVICES=all,"
                    " NVIDIA_DRIVER_CAPABILITIES=compute,utility), or choose --backends cooperative"
                )
            ver = ctypes.c_int(0)
            self._check("cuDriverGetVersion", 0, self._lib.cuDriverGetVersion(ctypes.byref(ver)))
            if ver.value < MIN_DRIVER_API_VERSION:
                raise CudaCheckpointUnavailable(
                    f"driver API version {ver.value} < {MIN_DRIVER_API_VERSION}: process checkpoint needs"
                    " driver r570+ (CUDA 12.8)"
                )
            self._initialised = True

    def driver_version(self) -> int:
        """cuDriverGetVersion, e.g. 12080 for CUDA 12.8."""
        ver = ctypes.c_int(0)
        self._check("cuDriverGetVersion", 0, self._lib.cuDriverGetVersion(ctypes.byref(ver)))
        return ver.value

    @staticmethod
    def _check(call: str, pid: int, code: int) -> None:
        if code != 0:
            raise CudaCheckpointError(call, pid, int(code))

    def get_state(self, pid: int) -> int:
        st = ctypes.c_int(-1)
        self._check("cuCheckpointProcessGetState", pid, self._lib.cuCheckpointProcessGetState(pid, ctypes.byref(st)))
        return st.value

    def lock(self, pid: int, timeout_ms: int) -> None:
        args = CUcheckpointLockArgs()
        ctypes.memset(ctypes.byref(args), 0, ctypes.sizeof(args))
        args.timeoutMs = max(0, timeout_ms)
        self._check("cuCheckpointProcessLock", pid, self._lib.cuCheckpointProcessLock(pid, ctypes.byref(args)))

    def checkpoint(self, pid: int) -> None:
        args = CUcheckpointCheckpointArgs()
        self._check(
            "cuCheckpointProcessCheckpoint",
            pid,
            self._lib.cuCheckpointProcessCheckpoint(pid, ctypes.byref(args)),
        )

    def restore(self, pid: int) -> None:
        # NULL args: restore on the same GPUs (no UUID remapping); avoids the restore-args ABI
        # differences between CUDA releases (SUSPEND.md §1.2).
        self._check("cuCheckpointProcessRestore", pid, self._lib.cuCheckpointProcessRestore(pid, None))

    def unlock(self, pid: int) -> None:
        args = CUcheckpointUnlockArgs()
        self._check("cuCheckpointProcessUnlock", pid, self._lib.cuCheckpointProcessUnlock(pid, ctypes.byref(args)))


class DeviceMemoryProbe(Protocol):
    def process_device_bytes(self, pid: int) -> int | None: ...


class CudaCheckpointBackend:
    """Suspend / resume a workload process by PID. Refuses workloads the driver cannot move,
    serialises calls per job, always unlocks on a failed checkpoint."""

    name = BACKEND_CUDA_CHECKPOINT

    def __init__(
        self,
        driver: CudaDriver,
        pid_resolver: Callable[[str, int], int | None] = resolve_pid,
        *,
        memory_probe: DeviceMemoryProbe | None = None,
        process_facts: Callable[[int], ProcessFacts] = read_process_facts,
    ) -> None:
        self._drv = driver
        self._drv.init()
        self._resolve = pid_resolver
        self._probe = memory_probe
        self._facts = process_facts
        self._guard = threading.Lock()
        self._job_locks: dict[str, threading.Lock] = {}
        self._copying: dict[str, float] = {}

    def _pid(self, w: Workload) -> int | None:
        return self._resolve(w.reg.pod_uid, w.reg.pid)

    def process_state(self, pid: int) -> str:
        try:
            return PROCESS_STATE_NAMES.get(self._drv.get_state(pid), "unknown")
        except CudaCheckpointError:
            return "unknown"

    # ------------------------------------------------------------------ optional engine capabilities

    def device_bytes(self, w: Workload) -> int | None:
        """What the workload's process holds on its GPUs now (NVML), or None when not measurable."""
        pid = self._pid(w)
        if pid is None or self._probe is None:
            return None
        return self._probe.process_device_bytes(pid)

    def copy_started(self, w: Workload) -> float | None:
        """Monotonic start of the checkpoint copy running now for ``w``, or None."""
        with self._guard:
            return self._copying.get(w.pod_uid)

    # ------------------------------------------------------------------ serialisation

    def _job_lock(self, key: str) -> threading.Lock:
        with self._guard:
            return self._job_locks.setdefault(key, threading.Lock())

    @contextmanager
    def _copy(self, w: Workload) -> Iterator[None]:
        with self._guard:
            self._copying[w.pod_uid] = time.monotonic()
        try:
            yield
        finally:
            with self._guard:
                self._copying.pop(w.pod_uid, None)

    # ------------------------------------------------------------------ suspend / resume

    def suspend(self, w: Workload, deadline_monotonic: float, op: OpContext) -> BackendOutcome:
        del op
        pid = self._pid(w)
        if pid is None:
            return BackendOutcome(False, 0, _no_pid(w))
        facts = self._facts(pid)
        if facts.unreadable:
            log.warning(
                "cannot check the process for unsupported features",
                extra={"pod": w.reg.pod_ref, "pid": pid, "unreadable": list(facts.unreadable)},
            )
        refused = unsupported_reasons(facts)
        if refused:
            return BackendOutcome(
                False, 0, f"cuda-checkpoint refuses pid {pid}: " + "; ".join(refused), unsupported=True
            )
        lock = self._job_lock(job_key(w.pod_uid, facts))
        if not lock.acquire(timeout=max(0.0, deadline_monotonic - time.monotonic())):
            return BackendOutcome(
                False,
                0,
                "another process of the same job was being checkpointed for the whole grace period",
                timed_out=True,
            )
        try:
            return self._suspend_locked(w, pid, deadline_monotonic)
        finally:
            lock.release()

    def _suspend_locked(self, w: Workload, pid: int, deadline_monotonic: float) -> BackendOutcome:
        try:
            st = self._drv.get_state(pid)
            if st == PROCESS_STATE_CHECKPOINTED:
                return BackendOutcome(True, 0, "process already checkpointed")
            measured = self._probe.process_device_bytes(pid) if self._probe is not None else None
            if st == PROCESS_STATE_RUNNING:
                left_ms = int((deadline_monotonic - time.monotonic()) * 1000)
                if left_ms <= 0:
                    return BackendOutcome(False, 0, "grace period already spent before lock", timed_out=True)
                try:
                    self._drv.lock(pid, left_ms)
                except CudaCheckpointError as e:
                    # On timeout the driver leaves the process RUNNING.
                    return BackendOutcome(False, 0, f"lock: {e}", timed_out=e.code in LOCK_TIMEOUT_CODES)
            with self._copy(w):
                err = self._checkpoint_or_unlock(pid)
            if err is not None:
                return BackendOutcome(False, 0, err)
        except CudaCheckpointError as e:
            return BackendOutcome(False, 0, str(e))
        if measured is None:
            return BackendOutcome(True, w.reg.state_bytes, "device memory checkpointed to host (registered size)")
        return BackendOutcome(True, measured, "device memory checkpointed to host (NVML-measured size)")

    def _checkpoint_or_unlock(self, pid: int) -> str | None:
        """Checkpoint a locked process; on failure unlock it so it keeps running. None = done."""
        try:
            self._drv.checkpoint(pid)
        except CudaCheckpointError as e:
            try:
                self._drv.unlock(pid)
            except CudaCheckpointError as e2:
                return f"checkpoint: {e}; unlock after failure: {e2}"
            return f"checkpoint: {e} (process unlocked, still running)"
        return None

    def resume(self, w: Workload, deadline_monotonic: float, op: OpContext) -> BackendOutcome:
        del op
        del deadline_monotonic  # restore cannot be bounded; it is awaited
        pid = self._pid(w)
        if pid is None:
            return BackendOutcome(False, 0, _no_pid(w))
        with self._job_lock(job_key(w.pod_uid, self._facts(pid))):
            try:
                st = self._drv.get_state(pid)
                if st == PROCESS_STATE_RUNNING:
                    return BackendOutcome(True, 0, "process already running")
                if st == PROCESS_STATE_CHECKPOINTED:
                    self._drv.restore(pid)
                self._drv.unlock(pid)
            except CudaCheckpointError as e:
                return BackendOutcome(False, 0, str(e))
        held = w.host_bytes_held or w.reg.state_bytes
        return BackendOutcome(True, held, "device memory restored")

    # ------------------------------------------------------------------ enforcement (observed host PIDs)

    def checkpoint_pid(self, pid: int, deadline_monotonic: float) -> str | None:
        """Lock and checkpoint a host PID the driver observed on a lent GPU (enforcement: no
        workload cooperation, no registration). None = checkpointed; else why not (still running)."""
        facts = self._facts(pid)
        refused = unsupported_reasons(facts)
        if refused:
            return f"cuda-checkpoint refuses pid {pid}: " + "; ".join(refused)
        try:
            if self._drv.get_state(pid) == PROCESS_STATE_CHECKPOINTED:
                return None
            left_ms = int((deadline_monotonic - time.monotonic()) * 1000)
            if left_ms <= 0:
                return "no time left to lock"
            self._drv.lock(pid, left_ms)
        except CudaCheckpointError as e:
            return f"lock: {e}"
        return self._checkpoint_or_unlock(pid)

    def restore_pid(self, pid: int) -> str | None:
        """Restore and unlock a PID checkpointed by :meth:`checkpoint_pid`; None = running again."""
        try:
            st = self._drv.get_state(pid)
            if st == PROCESS_STATE_RUNNING:
                return None
            if st == PROCESS_STATE_CHECKPOINTED:
                self._drv.restore(pid)
            self._drv.unlock(pid)
        except CudaCheckpointError as e:
            return str(e)
        return None


def _no_pid(w: Workload) -> str:
    return (
        f"cannot find pod {w.reg.pod_ref}'s process {w.reg.pid} in this agent's PID namespace: the agent needs"
        " hostPID (and /proc), and the process must belong to the pod's cgroup"
    )

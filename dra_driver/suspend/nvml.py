"""What a process really holds on the GPUs: NVML's per-process used memory, via ctypes.

I/O boundary: ``libnvidia-ml.so.1`` (loaded once, ``nvmlInit_v2`` once) and nothing else. The
cuda-checkpoint backend charges the host-memory budget with the larger of the bytes a workload
registered and this measurement, because the driver copies *every* device allocation of the
process (the caching allocator's reserve, the CUDA context, library workspaces), not only the
tensors the workload knows about. NVML reports PIDs in the host's PID namespace: the caller passes
the PID as the agent sees it (hostPID), the same one the checkpoint calls take.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_VALUE_NOT_AVAILABLE = (1 << 64) - 1  # usedGpuMemory when the driver cannot tell (no hostPID, WDDM)
_RETRIES = 4


class NvmlProcessInfo(ctypes.Structure):
    """``nvmlProcessInfo_t`` (= ``nvmlProcessInfo_v2_t``): 24 bytes, ``usedGpuMemory`` at offset 8."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class NvmlUnavailable(RuntimeError):
    """libnvidia-ml is missing or unusable; the message says what to mount or enable."""


class NvmlError(RuntimeError):
    def __init__(self, call: str, code: int) -> None:
        self.call, self.code = call, code
        super().__init__(f"{call} failed: NVML error {code}")


class NvmlMemoryProbe:
    """``process_device_bytes(pid)``: the sum over all GPUs of NVML's used memory of one process."""

    _SYMBOLS = ("nvmlInit_v2", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2")
    _LIST = ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2")

    def __init__(self, lib: Any) -> None:
        missing = [s for s in self._SYMBOLS if not hasattr(lib, s)]
        listing = next((s for s in self._LIST if hasattr(lib, s)), None)
        if missing or listing is None:
            raise NvmlUnavailable(
                f"libnvidia-ml lacks {', '.join(missing) or 'nvmlDeviceGetComputeRunningProcesses_v2/_v3'}:"
                " the NVIDIA driver is too old to report per-process GPU memory"
            )
        self._lib = lib
        self._list = getattr(lib, listing)
        self._lock = threading.Lock()
        rc = int(lib.nvmlInit_v2())
        if rc != NVML_SUCCESS:
            raise NvmlUnavailable(f"nvmlInit_v2 failed with NVML error {rc}: no usable NVIDIA driver on this node")

    @classmethod
    def load(cls, path: str = "libnvidia-ml.so.1") -> NvmlMemoryProbe:
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise NvmlUnavailable(
                f"cannot load {path} ({e}): the cuda-checkpoint backend measures each process's GPU memory"
                " with NVML; run the driver pod with the NVIDIA runtime and NVIDIA_DRIVER_CAPABILITIES"
                " including 'utility' (overlay manifests/overlays/nvidia)"
            ) from e
        return cls(lib)

    def _check(self, call: str, code: int) -> None:
        if code != NVML_SUCCESS:
            raise NvmlError(call, int(code))

    def _processes(self, handle: ctypes.c_void_p) -> list[NvmlProcessInfo]:
        count = ctypes.c_uint(0)
        rc = int(self._list(handle, ctypes.byref(count), None))
        for _ in range(_RETRIES):
            if rc == NVML_SUCCESS:
                return []
            if rc != NVML_ERROR_INSUFFICIENT_SIZE:
                break
            size = count.value + 8  # processes may start between the two calls
            buf = (NvmlProcessInfo * size)()
            count = ctypes.c_uint(size)
            rc = int(self._list(handle, ctypes.byref(count), buf))
            if rc == NVML_SUCCESS:
                return list(buf[: count.value])
        raise NvmlError("nvmlDeviceGetComputeRunningProcesses", rc)

    def gpu_processes(self, index: int) -> list[tuple[int, int | None]]:
        """``(host pid, used bytes or None when NVML cannot tell)`` of every compute process on GPU
        ``index`` (``devicewatch.GpuProcessLister``: what the driver observes on a lent GPU)."""
        with self._lock:
            handle = ctypes.c_void_p()
            self._check(
                "nvmlDeviceGetHandleByIndex_v2", self._lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle))
            )
            return [
                (int(p.pid), None if p.usedGpuMemory == NVML_VALUE_NOT_AVAILABLE else int(p.usedGpuMemory))
                for p in self._processes(handle)
            ]

    def process_device_bytes(self, pid: int) -> int | None:
        """Bytes ``pid`` holds on all GPUs; None when no GPU lists it or NVML cannot tell."""
        with self._lock:
            n = ctypes.c_uint(0)
            self._check("nvmlDeviceGetCount_v2", self._lib.nvmlDeviceGetCount_v2(ctypes.byref(n)))
            total, seen = 0, False
            for i in range(n.value):
                handle = ctypes.c_void_p()
                self._check(
                    "nvmlDeviceGetHandleByIndex_v2", self._lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle))
                )
                for p in self._processes(handle):
                    if p.pid != pid:
                        continue
                    if p.usedGpuMemory == NVML_VALUE_NOT_AVAILABLE:
                        return None
                    total, seen = total + int(p.usedGpuMemory), True
            return total if seen else None

"""libnvidia-ml's stand-in (a GPU cannot run on this machine): the NVML calls the driver's
memory probe makes, answered at their ctypes boundary from a fixed process table."""

from __future__ import annotations

import ctypes
from typing import Any


class FakeNvml:
    """libnvidia-ml at its ctypes boundary: two GPUs; pid 1234 holds 3 GiB on one and 1 GiB on the other."""

    def __init__(self) -> None:
        self.procs = {0: [(1234, 3 << 30), (99, 5 << 30)], 1: [(1234, 1 << 30)]}

    def nvmlInit_v2(self) -> int:
        return 0

    def nvmlDeviceGetCount_v2(self, out: Any) -> int:
        ctypes.cast(out, ctypes.POINTER(ctypes.c_uint))[0] = len(self.procs)
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, i: int, out: Any) -> int:
        ctypes.cast(out, ctypes.POINTER(ctypes.c_void_p))[0] = i + 1
        return 0

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count: Any, buf: Any) -> int:
        from dra_driver.suspend.nvml import NvmlProcessInfo

        procs = self.procs[handle.value - 1]
        n = ctypes.cast(count, ctypes.POINTER(ctypes.c_uint))
        if buf is None or n[0] < len(procs):
            n[0] = len(procs)
            return 7  # NVML_ERROR_INSUFFICIENT_SIZE
        arr = ctypes.cast(buf, ctypes.POINTER(NvmlProcessInfo))
        for i, (pid, used) in enumerate(procs):
            arr[i].pid, arr[i].usedGpuMemory = pid, used
        n[0] = len(procs)
        return 0

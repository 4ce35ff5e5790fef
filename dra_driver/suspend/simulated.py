"""The explicit ``simulated`` backend: no device, only sizes and host-link-bound timings.

Chosen by configuration only (``--backends simulated``), never as a silent fallback. A move of
``n`` bytes takes ``n / host_link_bytes_per_second`` seconds (PCIe Gen5 x16 ≈ 55 GB/s pinned).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from dra_driver.suspend.model import BACKEND_SIMULATED, BackendOutcome, OpContext
from dra_driver.suspend.registry import Workload

DEFAULT_HOST_LINK_BYTES_PER_SECOND = 55e9


def transfer_seconds(nbytes: int, bytes_per_second: float, fixed_seconds: float = 0.0) -> float:
    """Pure: modelled time to move ``nbytes`` over the host link."""
    if bytes_per_second <= 0:
        raise ValueError(f"host link bandwidth must be > 0 B/s, got {bytes_per_second}")
    return fixed_seconds + nbytes / bytes_per_second


class SimulatedBackend:
    name = BACKEND_SIMULATED

    def __init__(
        self,
        host_link_bytes_per_second: float = DEFAULT_HOST_LINK_BYTES_PER_SECOND,
        fixed_seconds: float = 0.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        transfer_seconds(0, host_link_bytes_per_second)  # validates
        self._bw = host_link_bytes_per_second
        self._fixed = fixed_seconds
        self._sleep = sleep

    def _move(self, w: Workload, deadline_monotonic: float, what: str) -> BackendOutcome:
        need = transfer_seconds(w.reg.state_bytes, self._bw, self._fixed)
        left = deadline_monotonic - time.monotonic()
        if need > left:
            self._sleep(max(0.0, left))
            return BackendOutcome(
                False,
                0,
                f"simulated {what} needs {need:.3f}s, more than the {left:.3f}s left",
                timed_out=True,
            )
        self._sleep(need)
        return BackendOutcome(True, w.reg.state_bytes, f"simulated {what} at {self._bw / 1e9:.1f} GB/s")

    def suspend(self, w: Workload, deadline_monotonic: float, op: OpContext) -> BackendOutcome:
        del op
        return self._move(w, deadline_monotonic, "suspend")

    def resume(self, w: Workload, deadline_monotonic: float, op: OpContext) -> BackendOutcome:
        del op
        return self._move(w, float("inf"), "resume")

"""The explicit ``simulated`` backend: no device, only sizes and host-link-bound timings.

Chosen by configuration only (``--backends simulated``), never as a silent fallback. A move of
``n`` bytes takes ``n / host_link_bytes_per_second`` seconds (PCIe Gen5 x16 ≈ 55 GB/s pinned).

With a :class:`SimulatedHostMemory` (the driver gives it one when a spill directory is configured)
the state is real bytes: the simulated device memory of a workload is ``<root>/device/<pod>``
(created with random bytes of its state size when absent), a suspend copies it to the DRAM copy
``<root>/dram/<pod>`` and overwrites the device file with 0xFF (the GPU's next tenant); a resume
copies it back. The DRAM copy is what the disk tier (``spill.py``) spills and restores.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from dra_driver.suspend.model import BACKEND_SIMULATED, BackendOutcome, OpContext
from dra_driver.suspend.registry import Workload

DEFAULT_HOST_LINK_BYTES_PER_SECOND = 55e9


def transfer_seconds(nbytes: int, bytes_per_second: float, fixed_seconds: float = 0.0) -> float:
    """Pure: modelled time to move ``nbytes`` over the host link."""
    if bytes_per_second <= 0:
        raise ValueError(f"host link bandwidth must be > 0 B/s, got {bytes_per_second}")
    return fixed_seconds + nbytes / bytes_per_second


_COPY_CHUNK = 8 << 20
NEXT_TENANT_BYTE = 0xFF


def _copy(src: Path, dst: Path) -> int:
    """Copy ``src`` to ``dst`` through a temp file and a rename (atomic for readers of ``dst``)."""
    tmp = dst.with_name(dst.name + ".tmp")
    n = 0
    with open(src, "rb") as fi, open(tmp, "wb") as fo:
        while b := fi.read(_COPY_CHUNK):
            fo.write(b)
            n += len(b)
    os.replace(tmp, dst)
    return n


def _overwrite(p: Path, byte: int) -> None:
    """The next tenant writes over the memory: every byte of ``p`` becomes ``byte``."""
    size = p.stat().st_size
    with open(p, "r+b") as f:
        for off in range(0, size, _COPY_CHUNK):
            f.write(bytes([byte]) * min(_COPY_CHUNK, size - off))


class SimulatedHostMemory:
    """Real bytes for the simulated backend: device memory and its DRAM copy as files under
    ``root`` (use a tmpfs such as /dev/shm: it is memory, and it outlives a driver crash as a
    workload's host memory would). Implements ``spill.HostCopy`` for the disk tier.

    ``copy_bytes`` > 0: the real bytes per workload are at most that (its state size is still what
    the backend reports, so the budgets charge it): a soak of 64 GiB occupants on a small disk."""

    def __init__(self, root: Path | str, copy_bytes: int = 0) -> None:
        if copy_bytes < 0:
            raise ValueError(f"simulated host copy bytes must be >= 0, got {copy_bytes}")
        self.root = Path(root)
        self.copy_bytes = copy_bytes
        self.device_dir = self.root / "device"
        self.dram_dir = self.root / "dram"
        for d in (self.device_dir, self.dram_dir):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        for stale in self.dram_dir.glob("*.tmp"):  # a copy a crash interrupted: never committed
            stale.unlink(missing_ok=True)

    def device(self, key: str) -> Path:
        return self.device_dir / key

    def dram(self, key: str) -> Path:
        return self.dram_dir / key

    def ensure_device(self, key: str, nbytes: int) -> None:
        """The occupant's device memory: random bytes of its state size (at most ``copy_bytes``
        when set) unless it exists."""
        p = self.device(key)
        if p.exists():
            return
        if self.copy_bytes:
            nbytes = min(nbytes, self.copy_bytes)
        tmp = p.with_name(p.name + ".tmp")
        with open(tmp, "wb") as f:
            for off in range(0, nbytes, _COPY_CHUNK):
                f.write(os.urandom(min(_COPY_CHUNK, nbytes - off)))
        os.replace(tmp, p)

    def offload(self, key: str, nbytes: int) -> int:
        """Device → DRAM, then the device memory is the next tenant's (overwritten)."""
        self.ensure_device(key, nbytes)
        n = _copy(self.device(key), self.dram(key))
        _overwrite(self.device(key), NEXT_TENANT_BYTE)
        return n

    def reload(self, key: str) -> int:
        """DRAM → device, then the DRAM copy is freed."""
        n = _copy(self.dram(key), self.device(key))
        self.drop_host(key)
        return n

    def forget(self, key: str) -> None:
        """The occupant is gone: its device memory and any DRAM copy with it."""
        for p in (self.device(key), self.dram(key)):
            p.unlink(missing_ok=True)

    # spill.HostCopy
    def host_bytes(self, key: str) -> int | None:
        try:
            return self.dram(key).stat().st_size
        except FileNotFoundError:
            return None

    def read_host(self, key: str, chunk_bytes: int) -> Iterator[bytes | memoryview]:
        with open(self.dram(key), "rb") as f:
            while b := f.read(chunk_bytes):
                yield b

    def drop_host(self, key: str) -> None:
        self.dram(key).unlink(missing_ok=True)

    def refill_host(self, key: str, chunks: Iterable[bytes]) -> int:
        p = self.dram(key)
        tmp = p.with_name(p.name + ".tmp")
        n = 0
        try:
            with open(tmp, "wb") as f:
                for c in chunks:
                    f.write(c)
                    n += len(c)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, p)
        return n


class SimulatedBackend:
    name = BACKEND_SIMULATED

    def __init__(
        self,
        host_link_bytes_per_second: float = DEFAULT_HOST_LINK_BYTES_PER_SECOND,
        fixed_seconds: float = 0.0,
        sleep: Callable[[float], None] = time.sleep,
        host: SimulatedHostMemory | None = None,
    ) -> None:
        transfer_seconds(0, host_link_bytes_per_second)  # validates
        self._bw = host_link_bytes_per_second
        self._fixed = fixed_seconds
        self._sleep = sleep
        # The DRAM copy the disk tier can spill (the engine looks this attribute up by name).
        self.host_copy = host

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
        if self.host_copy is not None:
            if what == "suspend":
                self.host_copy.offload(w.pod_uid, w.reg.state_bytes)
            else:
                self.host_copy.reload(w.pod_uid)
        return BackendOutcome(True, w.reg.state_bytes, f"simulated {what} at {self._bw / 1e9:.1f} GB/s")

    def suspend(self, w: Workload, deadline_monotonic: float, op: OpContext) -> BackendOutcome:
        del op
        return self._move(w, deadline_monotonic, "suspend")

    def resume(self, w: Workload, deadline_monotonic: float, op: OpContext) -> BackendOutcome:
        del op
        return self._move(w, float("inf"), "resume")

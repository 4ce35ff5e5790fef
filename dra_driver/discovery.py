"""GPU discovery: NVML on real machines, an explicit ``simulated`` backend elsewhere.

The backend is always chosen by the operator (``--gpu-backend``); there is no fallback from
one to the other. ``pynvml`` (package ``nvidia-ml-py``) is imported only when ``nvml`` is chosen.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from rose_common.slices import GpuInfo, simulated_gpus

BACKENDS = ("nvml", "simulated")


class DiscoveryError(RuntimeError):
    """GPU discovery failed; the message says what to fix."""


@dataclass(frozen=True)
class GpuDevice:
    """A discovered physical GPU plus what the driver needs beyond the slice shape."""

    info: GpuInfo
    minor: int  # /dev/nvidia<minor>
    host_link_gbps: float  # host <-> device bandwidth, GB/s per direction (planning figure)
    simulated: bool


@dataclass(frozen=True)
class SimulatedConfig:
    count: int = 8
    memory_bytes: int = 141 * 1024**3
    model: str = "NVIDIA H200 (simulated)"
    host_link_gbps: float = 55.0


def discover_simulated(node_name: str, cfg: SimulatedConfig) -> list[GpuDevice]:
    if cfg.count < 0 or cfg.count > 64:
        raise DiscoveryError(f"--simulated-gpus must be between 0 and 64, got {cfg.count}")
    if cfg.memory_bytes <= 0:
        raise DiscoveryError(f"simulated GPU memory must be > 0 bytes, got {cfg.memory_bytes}")
    if cfg.host_link_gbps <= 0:
        raise DiscoveryError(f"simulated host-link bandwidth must be > 0 GB/s, got {cfg.host_link_gbps}")
    infos = simulated_gpus(node_name, cfg.count, model=cfg.model, memory_bytes=cfg.memory_bytes)
    return [GpuDevice(info=g, minor=g.index, host_link_gbps=cfg.host_link_gbps, simulated=True) for g in infos]


def _pcie_gbps(nvml: Any, handle: Any) -> float:
    """Per-direction PCIe bandwidth from link generation and width (GB/s, after encoding)."""
    per_lane = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
    try:
        gen = int(nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle))
        width = int(nvml.nvmlDeviceGetCurrPcieLinkWidth(handle))
    except Exception:
        return 0.0
    return per_lane.get(gen, 0.0) * width


def discover_nvml() -> list[GpuDevice]:
    try:
        nvml: Any = importlib.import_module("pynvml")
    except ImportError as e:
        raise DiscoveryError(
            "--gpu-backend=nvml needs the NVML bindings: pip install 'rose[nvml]' (nvidia-ml-py); "
            "on a machine without NVIDIA GPUs use --gpu-backend=simulated explicitly"
        ) from e
    try:
        nvml.nvmlInit()
    except Exception as e:
        raise DiscoveryError(
            f"NVML init failed ({e}); is the NVIDIA driver installed and libnvidia-ml.so.1 visible "
            "to this container? On a machine without NVIDIA GPUs use --gpu-backend=simulated"
        ) from e
    try:
        out: list[GpuDevice] = []
        for i in range(int(nvml.nvmlDeviceGetCount())):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid = nvml.nvmlDeviceGetUUID(h)
            model = nvml.nvmlDeviceGetName(h)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            model = model.decode() if isinstance(model, bytes) else str(model)
            mem = int(nvml.nvmlDeviceGetMemoryInfo(h).total)
            minor = int(nvml.nvmlDeviceGetMinorNumber(h))
            info = GpuInfo(index=i, uuid=uuid, model=model, memory_bytes=mem)
            out.append(GpuDevice(info=info, minor=minor, host_link_gbps=_pcie_gbps(nvml, h), simulated=False))
        return out
    finally:
        nvml.nvmlShutdown()


def discover(backend: str, node_name: str, simulated: SimulatedConfig | None = None) -> list[GpuDevice]:
    if backend == "simulated":
        return discover_simulated(node_name, simulated or SimulatedConfig())
    if backend == "nvml":
        return discover_nvml()
    raise DiscoveryError(f"unknown --gpu-backend {backend!r}; choose one of {', '.join(BACKENDS)}")

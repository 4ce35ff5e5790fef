"""Builds a NodeSuspendEngine with the backends an operator enabled (and only those)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from dra_driver.suspend.cooperative import CooperativeBackend, PidResolver
from dra_driver.suspend.cuda_checkpoint import CudaCheckpointBackend, CudaCheckpointUnavailable, CudaDriver
from dra_driver.suspend.engine import Backend, EngineConfig, Evictor, NodeSuspendEngine
from dra_driver.suspend.events import EventSink
from dra_driver.suspend.metrics import SuspendMetrics
from dra_driver.suspend.model import BACKEND_COOPERATIVE, BACKEND_CUDA_CHECKPOINT, BACKEND_SIMULATED
from dra_driver.suspend.nvml import NvmlMemoryProbe, NvmlUnavailable
from dra_driver.suspend.pids import resolve_pid
from dra_driver.suspend.simulated import DEFAULT_HOST_LINK_BYTES_PER_SECOND, SimulatedBackend, SimulatedHostMemory
from dra_driver.suspend.spill import SpillStore
from dra_driver.suspend.verify import CheckpointVerifier


def build_engine(
    config: EngineConfig,
    *,
    simulated_host_link_bytes_per_second: float = DEFAULT_HOST_LINK_BYTES_PER_SECOND,
    libcuda_path: str = "libcuda.so.1",
    libnvml_path: str = "libnvidia-ml.so.1",
    events: EventSink | None = None,
    evictor: Evictor | None = None,
    metrics_registry: CollectorRegistry | None = None,
    verifier: CheckpointVerifier | None = None,
    simulated_host_dir: str = "",
    simulated_host_copy_bytes: int = 0,
    pid_resolver: PidResolver = resolve_pid,
) -> NodeSuspendEngine:
    """Raises CudaCheckpointUnavailable when cuda-checkpoint is enabled but libcuda cannot serve it
    or NVML cannot measure processes' GPU memory (the host-memory budget needs that measurement).

    With a spill directory the engine gets its disk tier, and the simulated backend real bytes
    (``SimulatedHostMemory`` under ``simulated_host_dir``; default a /dev/shm folder per node).
    ``simulated_host_copy_bytes`` > 0: the simulated backend keeps at most that many real bytes per
    workload (a soak's 64 GiB occupants without 64 GiB files; the budgets still charge the state size).
    ``pid_resolver``: how the cooperative backend finds a workload's process (a cooperative spill
    hands its file to that process's owner and checks its resident memory)."""
    spill = SpillStore(config.spill_dir, config.spill_budget_bytes) if config.spill_dir else None
    backends: dict[str, Backend] = {}
    for name in config.backends:
        if name == BACKEND_COOPERATIVE:
            backends[name] = CooperativeBackend(pid_resolver)
        elif name == BACKEND_SIMULATED:
            host = (
                SimulatedHostMemory(
                    simulated_host_dir or _default_host_dir(config), copy_bytes=simulated_host_copy_bytes
                )
                if spill
                else None
            )
            backends[name] = SimulatedBackend(simulated_host_link_bytes_per_second, host=host)
        elif name == BACKEND_CUDA_CHECKPOINT:
            backends[name] = _cuda_checkpoint(libcuda_path, libnvml_path)
    return NodeSuspendEngine(
        config,
        backends,
        events=events,
        evictor=evictor,
        metrics=SuspendMetrics(metrics_registry),
        verifier=verifier,
        spill=spill,
    )


def _default_host_dir(config: EngineConfig) -> str:
    shm = Path("/dev/shm")
    if shm.is_dir():
        return str(shm / f"rose-simulated-host-{config.node_name or 'node'}")
    return config.spill_dir.rstrip("/") + ".simulated-host"


def _cuda_checkpoint(libcuda_path: str, libnvml_path: str) -> CudaCheckpointBackend:
    driver = CudaDriver.load(libcuda_path)
    driver.init()  # cuInit first: its failure says more than a missing NVML
    try:
        probe = NvmlMemoryProbe.load(libnvml_path)
    except NvmlUnavailable as e:
        raise CudaCheckpointUnavailable(str(e)) from e
    return CudaCheckpointBackend(driver, memory_probe=probe)

"""The suspend engine: moves a lent workload's GPU state into host memory and back.

Backends (``BACKENDS``): ``cuda-checkpoint`` (driver API process checkpoint by PID),
``cooperative`` (the rose_sdk inside the workload offloads its tensors at a safe point) and
``simulated`` (explicit test backend: sizes and host-link-bound timings, never chosen silently).
See README.md in this folder.
"""

from dra_driver.suspend.budget import HostMemoryBudget
from dra_driver.suspend.engine import EngineConfig, NodeSuspendEngine, UnknownOccupantError
from dra_driver.suspend.events import EventSink, LogEventSink, RecordingEventSink
from dra_driver.suspend.metrics import SuspendMetrics
from dra_driver.suspend.model import (
    BACKEND_COOPERATIVE,
    BACKEND_CUDA_CHECKPOINT,
    BACKEND_SIMULATED,
    BACKENDS,
    FALLBACK_CHECKPOINT_EVICT,
)
from dra_driver.suspend.registry import RegistrationError, WorkloadRegistry

__all__ = [
    "BACKENDS",
    "BACKEND_COOPERATIVE",
    "BACKEND_CUDA_CHECKPOINT",
    "BACKEND_SIMULATED",
    "FALLBACK_CHECKPOINT_EVICT",
    "EngineConfig",
    "EventSink",
    "HostMemoryBudget",
    "LogEventSink",
    "NodeSuspendEngine",
    "RecordingEventSink",
    "RegistrationError",
    "SuspendMetrics",
    "UnknownOccupantError",
    "WorkloadRegistry",
]

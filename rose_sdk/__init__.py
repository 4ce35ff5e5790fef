"""rose_sdk: the workload side of ROSE.

Safe points, suspend / resume hooks, cooperative offload of a torch model, its optimizer and
registered tensors into reused (pinned) host buffers, and an atomic durable checkpoint.

The offload and checkpoint paths import only torch and NumPy. The agent client (``init``,
``Workload``, ``safe_point``…, in ``rose_sdk.workload``) needs grpc and the generated
``rose.agent.v1`` stubs (a protobuf runtime as new as the one they were generated with); it is
imported on first use, so ``from rose_sdk import CooperativeOffloader`` works without them. So is
the time-slice client (``TimeSliceOrchestratorClient``, in ``rose_sdk.timeslice``).

The ``rose-sdk`` distribution (``sdk/pyproject.toml``) installs grpcio, protobuf and NumPy, not
torch (the training image's own is used; ``rose-sdk[torch]`` installs one). For RL engineers:
``rose_sdk/README.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

try:  # every part but World needs torch, which rose-sdk does not install unless asked ([torch])
    import torch  # noqa: F401
except ModuleNotFoundError as e:
    if e.name != "torch":
        raise
    raise ModuleNotFoundError(
        "rose_sdk needs PyTorch: install it into the training image that has torch, or pip install 'rose-sdk[torch]'",
        name="torch",
    ) from e

from rose_sdk.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointInfo,
    get_rng_state,
    load_checkpoint,
    save_checkpoint,
    set_rng_state,
)
from rose_sdk.offload import CooperativeOffloader, OffloadReport, tensors_equal
from rose_sdk.world import World

if TYPE_CHECKING:
    from rose_sdk.timeslice import TimeSliceOrchestratorClient
    from rose_sdk.workload import (
        AgentError,
        Workload,
        current,
        init,
        on_resume,
        on_suspend,
        on_world_change,
        report,
        safe_point,
    )

_AGENT_CLIENT = (
    "AgentError",
    "Workload",
    "current",
    "init",
    "on_resume",
    "on_suspend",
    "on_world_change",
    "report",
    "safe_point",
)


def __getattr__(name: str) -> Any:
    """The agent client's names, imported from rose_sdk.workload on first use."""
    if name in _AGENT_CLIENT:
        return getattr(importlib.import_module("rose_sdk.workload"), name)
    if name == "TimeSliceOrchestratorClient":
        return importlib.import_module("rose_sdk.timeslice").TimeSliceOrchestratorClient
    raise AttributeError(f"module 'rose_sdk' has no attribute {name!r}")


__all__ = [
    "AgentError",
    "Checkpoint",
    "CheckpointError",
    "CheckpointInfo",
    "CooperativeOffloader",
    "OffloadReport",
    "TimeSliceOrchestratorClient",
    "Workload",
    "World",
    "current",
    "get_rng_state",
    "init",
    "load_checkpoint",
    "on_resume",
    "on_suspend",
    "on_world_change",
    "report",
    "safe_point",
    "save_checkpoint",
    "set_rng_state",
    "tensors_equal",
]

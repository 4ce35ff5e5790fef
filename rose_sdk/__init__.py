"""rose_sdk: the workload side of ROSE.

Safe points, suspend / resume hooks, cooperative offload of a torch model, its optimizer and
registered tensors into reused (pinned) host buffers, and an atomic durable checkpoint.
"""

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
from rose_sdk.workload import AgentError, Workload, current, init, on_resume, on_suspend, safe_point

__all__ = [
    "AgentError",
    "Checkpoint",
    "CheckpointError",
    "CheckpointInfo",
    "CooperativeOffloader",
    "OffloadReport",
    "Workload",
    "current",
    "get_rng_state",
    "init",
    "load_checkpoint",
    "on_resume",
    "on_suspend",
    "safe_point",
    "save_checkpoint",
    "set_rng_state",
    "tensors_equal",
]

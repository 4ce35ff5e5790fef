"""Plain data of the suspend engine: backend names, workload states, commands, acknowledgements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

from dra_driver.engine_api import SuspendReason
from rose_common.names import SuspendState

BACKEND_CUDA_CHECKPOINT: Final = "cuda-checkpoint"
BACKEND_COOPERATIVE: Final = "cooperative"
BACKEND_SIMULATED: Final = "simulated"
BACKENDS: Final = (BACKEND_CUDA_CHECKPOINT, BACKEND_COOPERATIVE, BACKEND_SIMULATED)

FALLBACK_CHECKPOINT_EVICT: Final = "checkpoint-evict"

# Workload states: the one definition is rose_common.names.SuspendState (also the values of the
# pod annotation rose.io/suspend-state).
STATE_RUNNING: Final[str] = SuspendState.RUNNING
STATE_SUSPENDING: Final[str] = SuspendState.SUSPENDING
STATE_SUSPENDED: Final[str] = SuspendState.SUSPENDED
STATE_RESUMING: Final[str] = SuspendState.RESUMING
STATE_CHECKPOINTED_EVICTED: Final[str] = SuspendState.CHECKPOINTED_EVICTED
WORKLOAD_STATES: Final = (
    STATE_RUNNING,
    STATE_SUSPENDING,
    STATE_SUSPENDED,
    STATE_RESUMING,
    STATE_CHECKPOINTED_EVICTED,
)

CommandKind = Literal["suspend", "resume", "checkpoint", "spill", "spill-commit"]
COMMAND_KINDS: Final = ("suspend", "resume", "checkpoint", "spill", "spill-commit")

# Fallback reasons (metric label values).
FALLBACK_REASONS: Final = (
    "host_memory_budget",
    "deadline_exceeded",
    "backend_failed",
    "no_backend",
    "unsupported_workload",
    "spill_corrupt",  # a spilled copy failed its checksum on resume: back to the durable checkpoint
)


SIMULATED_CLAIM_PREFIX = "simulated-claim-"


def stand_in_pod_uid(claim_uid: str) -> str:
    """Pure: the registry key of a claim's one simulated occupant (a claim of one pod, or of none
    bound). Not a pod: its Events go to the pods of the claim's ``reservedFor``."""
    return SIMULATED_CLAIM_PREFIX + claim_uid


def stand_in_claim(pod_uid: str) -> str | None:
    """Pure: the claim whose simulated stand-in ``pod_uid`` is; None for a pod's own UID."""
    return pod_uid.removeprefix(SIMULATED_CLAIM_PREFIX) if pod_uid.startswith(SIMULATED_CLAIM_PREFIX) else None


@dataclass(frozen=True)
class Registration:
    """What a workload tells the node agent when it registers."""

    pod_uid: str
    pid: int
    state_bytes: int
    backends: frozenset[str]
    pod_namespace: str = ""
    pod_name: str = ""
    claim_uids: frozenset[str] = frozenset()
    checkpoint_path: str = ""
    current_state: str = STATE_RUNNING

    @property
    def pod_ref(self) -> str:
        """``ns/name`` when known (the k8s structured-logging form), else the UID."""
        if self.pod_namespace and self.pod_name:
            return f"{self.pod_namespace}/{self.pod_name}"
        return self.pod_uid


@dataclass(frozen=True)
class Command:
    """One request pushed to a workload over its command stream."""

    operation_id: str
    kind: CommandKind
    backend: str
    deadline_unix_ms: int
    grace_seconds: float
    reason: str = ""
    # spill / spill-commit, and a resume of spilled state: the file the driver created for it.
    spill_path: str = ""


@dataclass(frozen=True)
class Ack:
    """A workload's answer to one command, sent from its safe point."""

    operation_id: str
    ok: bool
    bytes_moved: int = 0
    seconds: float = 0.0
    message: str = ""
    checkpoint_path: str = ""
    checkpoint_sha256: str = ""


@dataclass
class OperationRecord:
    """One suspend / resume / fallback as NodeControl reports it."""

    id: str
    pod_uid: str
    kind: CommandKind
    state: Literal["pending", "running", "succeeded", "failed"] = "pending"
    backend: str = ""
    bytes_moved: int = 0
    duration_seconds: float = 0.0
    fallback: str | None = None
    message: str = ""
    started_unix_ms: int = 0
    finished_unix_ms: int = 0
    checkpoint_path: str = ""
    extra: dict[str, str] = field(default_factory=dict)
    reason: SuspendReason = SuspendReason.DONE


@dataclass(frozen=True)
class BackendOutcome:
    """What a backend reports for one move of state."""

    ok: bool
    bytes_moved: int
    message: str
    timed_out: bool = False
    # The backend cannot move this workload at all (e.g. NCCL ranks for cuda-checkpoint).
    unsupported: bool = False


@dataclass(frozen=True)
class OpContext:
    """Identifies the operation a backend call belongs to."""

    operation_id: str
    grace_seconds: float = 0.0
    reason: str = ""
    spill_path: str = ""  # a resume: the verified spill file of its state ("": in host memory)

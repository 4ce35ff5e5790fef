"""Translation between rose.agent.v1 messages and the suspend engine's plain data."""

from __future__ import annotations

from dra_driver.agent.reports import Report, World, validate
from dra_driver.suspend.model import (
    BACKEND_COOPERATIVE,
    BACKEND_CUDA_CHECKPOINT,
    BACKEND_SIMULATED,
    STATE_CHECKPOINTED_EVICTED,
    STATE_RESUMING,
    STATE_RUNNING,
    STATE_SUSPENDED,
    STATE_SUSPENDING,
    Ack,
    Command,
    OperationRecord,
    Registration,
)
from dra_driver.suspend.registry import RegistrationError, Workload
from rose_common.proto import rose_agent_v1_pb2 as pb

BACKEND_TO_PB = {
    BACKEND_CUDA_CHECKPOINT: pb.BACKEND_CUDA_CHECKPOINT,
    BACKEND_COOPERATIVE: pb.BACKEND_COOPERATIVE,
    BACKEND_SIMULATED: pb.BACKEND_SIMULATED,
}
PB_TO_BACKEND = {v: k for k, v in BACKEND_TO_PB.items()}
STATE_TO_PB = {
    STATE_RUNNING: pb.WORKLOAD_STATE_RUNNING,
    STATE_SUSPENDING: pb.WORKLOAD_STATE_SUSPENDING,
    STATE_SUSPENDED: pb.WORKLOAD_STATE_SUSPENDED,
    STATE_RESUMING: pb.WORKLOAD_STATE_RESUMING,
    STATE_CHECKPOINTED_EVICTED: pb.WORKLOAD_STATE_CHECKPOINTED_EVICTED,
}
PB_TO_STATE = {v: k for k, v in STATE_TO_PB.items()}
KIND_TO_PB = {
    "suspend": pb.COMMAND_KIND_SUSPEND,
    "resume": pb.COMMAND_KIND_RESUME,
    "checkpoint": pb.COMMAND_KIND_CHECKPOINT,
    "spill": pb.COMMAND_KIND_SPILL,
    "spill-commit": pb.COMMAND_KIND_SPILL_COMMIT,
}
OP_STATE_TO_PB = {
    "pending": pb.OPERATION_STATE_PENDING,
    "running": pb.OPERATION_STATE_RUNNING,
    "succeeded": pb.OPERATION_STATE_SUCCEEDED,
    "failed": pb.OPERATION_STATE_FAILED,
}


def registration_from_pb(req: pb.RegisterRequest) -> Registration:
    """Raises RegistrationError for enum values this agent does not know."""
    backends: set[str] = set()
    for b in req.supported_backends:
        if b not in PB_TO_BACKEND:
            raise RegistrationError(
                f"invalid registration: supported_backends has unknown value {b};"
                f" use one of {sorted(pb.Backend.Name(v) for v in PB_TO_BACKEND)}"
            )
        backends.add(PB_TO_BACKEND[b])
    state = STATE_RUNNING
    if req.current_state != pb.WORKLOAD_STATE_UNSPECIFIED:
        if req.current_state not in PB_TO_STATE:
            raise RegistrationError(f"invalid registration: current_state has unknown value {req.current_state}")
        state = PB_TO_STATE[req.current_state]
    return Registration(
        pod_uid=req.pod_uid,
        pid=req.pid,
        state_bytes=req.state_bytes,
        backends=frozenset(backends),
        pod_namespace=req.pod_namespace,
        pod_name=req.pod_name,
        claim_uids=frozenset(req.claim_uids),
        checkpoint_path=req.checkpoint_path,
        current_state=state,
    )


def command_to_pb(c: Command) -> pb.Command:
    return pb.Command(
        operation_id=c.operation_id,
        kind=KIND_TO_PB[c.kind],
        backend=BACKEND_TO_PB.get(c.backend, pb.BACKEND_UNSPECIFIED),
        deadline_unix_ms=c.deadline_unix_ms,
        grace_seconds=c.grace_seconds,
        reason=c.reason,
        spill_path=c.spill_path,
    )


def ack_from_pb(req: pb.AcknowledgeRequest) -> Ack:
    return Ack(
        operation_id=req.operation_id,
        ok=req.ok,
        bytes_moved=req.bytes_moved,
        seconds=req.seconds,
        message=req.message,
        checkpoint_path=req.checkpoint_path,
        checkpoint_sha256=req.checkpoint_sha256,
    )


def operation_to_pb(r: OperationRecord) -> pb.Operation:
    return pb.Operation(
        id=r.id,
        pod_uid=r.pod_uid,
        kind=KIND_TO_PB[r.kind],
        state=OP_STATE_TO_PB[r.state],
        backend=BACKEND_TO_PB.get(r.backend, pb.BACKEND_UNSPECIFIED),
        bytes_moved=r.bytes_moved,
        duration_seconds=r.duration_seconds,
        fallback=r.fallback or "",
        message=r.message,
        started_unix_ms=r.started_unix_ms,
        finished_unix_ms=r.finished_unix_ms,
        checkpoint_path=r.checkpoint_path,
    )


def workload_to_pb(w: Workload) -> pb.WorkloadStatus:
    return pb.WorkloadStatus(
        pod_uid=w.pod_uid,
        pid=w.reg.pid,
        state=STATE_TO_PB[w.state],
        state_bytes=w.reg.state_bytes,
        supported_backends=sorted(BACKEND_TO_PB[b] for b in w.reg.backends),
        connected=w.connected,
        host_bytes_held=w.host_bytes_held,
        claim_uids=sorted(w.reg.claim_uids),
        suspended_by=BACKEND_TO_PB.get(w.suspended_by or "", pb.BACKEND_UNSPECIFIED),
        pod_namespace=w.reg.pod_namespace,
        pod_name=w.reg.pod_name,
    )


def report_from_pb(req: pb.ReportRequest) -> Report:
    """Raises ReportError naming the bad fields."""
    r = Report(
        phase=req.phase,
        seconds_to_safe_point=req.seconds_to_safe_point,
        state_bytes=req.state_bytes,
        min_gpus=req.min_gpus,
        min_host_memory_bytes=req.min_host_memory_bytes,
        steps=req.steps_total,
        samples=req.samples_total,
        tokens=req.tokens_total if req.reports_tokens else None,
    )
    validate(r)
    return r


def world_command(w: World) -> pb.Command:
    return pb.Command(kind=pb.COMMAND_KIND_WORLD, world_active=w.active, world_total=w.total, reason="world changed")

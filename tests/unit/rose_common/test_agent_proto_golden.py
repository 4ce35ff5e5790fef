"""rose.agent.v1 wire format frozen as golden bytes: one request and one response of every RPC.

RegisterRequest was decoded by hand once: 0a05 "uid-1" (field 1), 10 9221 (pid 4242), 18 8080808004
(2^30), 22 02 0201 (packed backends [COOPERATIVE, CUDA_CHECKPOINT]), 2a/32/3a/42 strings, 48 03
(current_state SUSPENDED). A renumbered field or changed type breaks these.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from google.protobuf.message import Message

from rose_common.proto import rose_agent_v1_pb2 as pb

GOLDEN = {
    "RegisterRequest": "0a057569642d31109221188080808004220202012a02726c3203772d303a03632d3142072f636b70742f614803",
    "RegisterResponse": "0a02733112026e30",
    "CommandsRequest": "0a057569642d3112027331",
    "Command": "0a036f7031100118022080d095ffbc31290000000000000440320172",
    "AcknowledgeRequest": "0a057569642d31120273311a036f7031200128800831000000000000e03f3a016d42022f634a026162",
    "AcknowledgeResponse": "0801120178",
    "UpdateStateSizeRequest": "0a057569642d311202733118808080800c",
    "UpdateStateSizeResponse": "0801",
    "SuspendRequest": "0a057569642d31110000000000003e401a0773657276696e672001",
    "ResumeRequest": "0a057569642d311001",
    "GetOperationRequest": "0a036f7031",
    "Operation": (
        "0a036f703112057569642d31180220032803300839000000000000f03f42"
        "10636865636b706f696e742d65766963744a026f6b5001580262022f63"
    ),
    "StatusRequest": "0a057569642d31",
    "ReportRequest": (
        "0a057569642d31120273311a05747261696e210000000000000440288080808004300138808040400748c00350a8465801"
    ),
    "ReportResponse": "080110021804",
    "WorldCommand": "100438024004",
    # kind 5 (COMMAND_KIND_SPILL), field 9 spill_path "/s": 4a 02 2f73 (decoded by hand)
    "SpillCommand": "10054a022f73",
    "StatusResponse": "0a1c0a01751001180120022a010230013803420163480252026e735a017010041805",
}


def messages() -> dict[str, Message]:
    return {
        "RegisterRequest": pb.RegisterRequest(
            pod_uid="uid-1",
            pid=4242,
            state_bytes=1 << 30,
            supported_backends=[pb.BACKEND_COOPERATIVE, pb.BACKEND_CUDA_CHECKPOINT],
            pod_namespace="rl",
            pod_name="w-0",
            claim_uids=["c-1"],
            checkpoint_path="/ckpt/a",
            current_state=pb.WORKLOAD_STATE_SUSPENDED,
        ),
        "RegisterResponse": pb.RegisterResponse(session_id="s1", node_name="n0"),
        "CommandsRequest": pb.CommandsRequest(pod_uid="uid-1", session_id="s1"),
        "Command": pb.Command(
            operation_id="op1",
            kind=pb.COMMAND_KIND_SUSPEND,
            backend=pb.BACKEND_COOPERATIVE,
            deadline_unix_ms=1700000000000,
            grace_seconds=2.5,
            reason="r",
        ),
        "AcknowledgeRequest": pb.AcknowledgeRequest(
            pod_uid="uid-1",
            session_id="s1",
            operation_id="op1",
            ok=True,
            bytes_moved=1024,
            seconds=0.5,
            message="m",
            checkpoint_path="/c",
            checkpoint_sha256="ab",
        ),
        "AcknowledgeResponse": pb.AcknowledgeResponse(accepted=True, message="x"),
        "UpdateStateSizeRequest": pb.UpdateStateSizeRequest(pod_uid="uid-1", session_id="s1", state_bytes=3 << 30),
        "UpdateStateSizeResponse": pb.UpdateStateSizeResponse(accepted=True),
        "ReportRequest": pb.ReportRequest(
            pod_uid="uid-1",
            session_id="s1",
            phase="train",
            seconds_to_safe_point=2.5,
            state_bytes=1 << 30,
            min_gpus=1,
            min_host_memory_bytes=1 << 20,
            steps_total=7,
            samples_total=448,
            tokens_total=9000,
            reports_tokens=True,
        ),
        "ReportResponse": pb.ReportResponse(accepted=True, world_active=2, world_total=4),
        "WorldCommand": pb.Command(kind=pb.COMMAND_KIND_WORLD, world_active=2, world_total=4),
        "SpillCommand": pb.Command(kind=pb.COMMAND_KIND_SPILL, spill_path="/s"),
        "SuspendRequest": pb.SuspendRequest(pod_uid="uid-1", grace_seconds=30.0, reason="serving", no_wait=True),
        "ResumeRequest": pb.ResumeRequest(pod_uid="uid-1", no_wait=True),
        "GetOperationRequest": pb.GetOperationRequest(operation_id="op1"),
        "Operation": pb.Operation(
            id="op1",
            pod_uid="uid-1",
            kind=pb.COMMAND_KIND_RESUME,
            state=pb.OPERATION_STATE_SUCCEEDED,
            backend=pb.BACKEND_SIMULATED,
            bytes_moved=8,
            duration_seconds=1.0,
            fallback="checkpoint-evict",
            message="ok",
            started_unix_ms=1,
            finished_unix_ms=2,
            checkpoint_path="/c",
        ),
        "StatusRequest": pb.StatusRequest(pod_uid="uid-1"),
        "StatusResponse": pb.StatusResponse(
            workloads=[
                pb.WorkloadStatus(
                    pod_uid="u",
                    pid=1,
                    state=pb.WORKLOAD_STATE_RUNNING,
                    state_bytes=2,
                    supported_backends=[pb.BACKEND_COOPERATIVE],
                    connected=True,
                    host_bytes_held=3,
                    claim_uids=["c"],
                    suspended_by=pb.BACKEND_COOPERATIVE,
                    pod_namespace="ns",
                    pod_name="p",
                )
            ],
            host_budget_bytes=4,
            host_bytes_held=5,
        ),
    }


def test_golden_bytes() -> None:
    for name, msg in messages().items():
        assert msg.SerializeToString(deterministic=True).hex() == GOLDEN[name], name
        back = type(msg).FromString(bytes.fromhex(GOLDEN[name]))
        assert back == msg, name


def test_service_method_paths() -> None:
    svc = {s.name: [m.name for m in s.methods] for s in pb.DESCRIPTOR.services_by_name.values()}
    assert pb.DESCRIPTOR.package == "rose.agent.v1"
    assert svc == {
        "WorkloadAgent": ["Register", "Commands", "Acknowledge", "UpdateStateSize", "Report"],
        "NodeControl": ["Suspend", "Resume", "Status", "GetOperation"],
    }
    commands = pb.DESCRIPTOR.services_by_name["WorkloadAgent"].methods_by_name["Commands"]
    assert commands.server_streaming and not commands.client_streaming


def test_stubs_are_current(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[3]
    subprocess.run(
        ["bash", str(repo / "hack" / "gen-protos.sh"), str(tmp_path)],
        cwd=repo,
        check=True,
        timeout=120,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
    )
    for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
        rel = f"rose_common/proto/rose_agent_v1{suffix}"
        assert (tmp_path / rel).read_text() == (repo / rel).read_text(), f"{rel} is stale: run hack/gen-protos.sh"

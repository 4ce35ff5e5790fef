"""rose.agent.v1 over real unix sockets: a real SDK workload subprocess and the real agent server."""

from __future__ import annotations

import stat
import time
from pathlib import Path

import grpc
import pytest
import torch

from rose_common.proto import rose_agent_v1_pb2 as pb
from rose_common.proto import rose_agent_v1_pb2_grpc as pb_grpc
from rose_sdk import load_checkpoint
from tests.support.agent_fixtures import reaped, running_agent, start_workload, wait_registered


def test_sockets_are_0600(tmp_path: Path) -> None:
    with running_agent(tmp_path) as agent:
        for p in (agent.workload_socket, agent.control_socket):
            mode = p.stat().st_mode
            assert stat.S_ISSOCK(mode)
            assert stat.S_IMODE(mode) == 0o600


def test_workload_suspends_at_safe_point_and_resumes(tmp_path: Path) -> None:
    with running_agent(tmp_path) as agent:
        wl = start_workload(
            tmp_path,
            "wl",
            socket=agent.claim_socket("claim-uid-1", "uid-1"),
            pod_uid="uid-1",
            extra=["--updates", "20", "--suspend-points", "1", "--linger-seconds", "0"],
        )
        with reaped(wl):
            wl.wait_ready()
            wait_registered(agent.engine, "uid-1")
            st = agent.control.Status(pb.StatusRequest(pod_uid="uid-1"))
            assert st.workloads[0].state == pb.WORKLOAD_STATE_RUNNING
            assert st.workloads[0].connected and st.workloads[0].state_bytes > 0
            # Registered before Adam allocated its moments (policy 4-32-2 + a 256x4 replay tensor, fp32);
            # the SDK reports the growth at a later safe point, before the suspend arrives.
            params = (4 * 32 + 32 + 32 * 2 + 2) * 4
            registered = params + 256 * 4 * 4
            assert st.workloads[0].state_bytes in (registered, registered + 3 * params + 4 * 4)
            end = time.monotonic() + 30
            while agent.control.Status(pb.StatusRequest(pod_uid="uid-1")).workloads[0].state_bytes == registered:
                assert time.monotonic() < end, "state size growth never reported"
                time.sleep(0.05)
            grown = agent.control.Status(pb.StatusRequest(pod_uid="uid-1")).workloads[0].state_bytes
            assert grown == registered + 3 * params + 4 * 4  # + grads, exp_avg, exp_avg_sq, 4 step scalars
            op = agent.control.Suspend(pb.SuspendRequest(pod_uid="uid-1", grace_seconds=30, reason="test"))
            assert op.state == pb.OPERATION_STATE_SUCCEEDED, op.message
            assert op.backend == pb.BACKEND_COOPERATIVE and op.fallback == ""
            assert op.bytes_moved == grown
            st = agent.control.Status(pb.StatusRequest(pod_uid="uid-1"))
            assert st.workloads[0].state == pb.WORKLOAD_STATE_SUSPENDED
            assert st.host_bytes_held == op.bytes_moved
            # idempotent: a second suspend moves nothing
            again = agent.control.Suspend(pb.SuspendRequest(pod_uid="uid-1", grace_seconds=1))
            assert again.state == pb.OPERATION_STATE_SUCCEEDED and again.bytes_moved == 0
            # asynchronous resume, polled through GetOperation
            pending = agent.control.Resume(pb.ResumeRequest(pod_uid="uid-1", no_wait=True))
            deadline = time.monotonic() + 30
            got = pending
            while got.state in (pb.OPERATION_STATE_PENDING, pb.OPERATION_STATE_RUNNING):
                assert time.monotonic() < deadline
                time.sleep(0.05)
                got = agent.control.GetOperation(pb.GetOperationRequest(operation_id=pending.id))
            assert got.state == pb.OPERATION_STATE_SUCCEEDED, got.message
            assert got.bytes_moved == op.bytes_moved and got.duration_seconds > 0
            st = agent.control.Status(pb.StatusRequest())
            assert st.workloads[0].state == pb.WORKLOAD_STATE_RUNNING and st.host_bytes_held == 0
            out = wl.finish()
            assert "suspends=1 resumes=1" in out
            hooks = torch.load(wl.out, weights_only=True)["hooks"]
            assert hooks == {"suspend": 1, "resume": 1, "offloaded_at_resume_hook": 0}
        assert agent.events.reasons() == ["Suspended", "Resumed"]


def test_deadline_enforced_then_checkpoint_then_evict(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt" / "job.rose"
    with running_agent(tmp_path, checkpoint_timeout_seconds=30.0) as agent:
        wl = start_workload(
            tmp_path,
            "stall",
            socket=agent.claim_socket("claim-uid-stall", "uid-stall"),
            pod_uid="uid-stall",
            extra=["--updates", "400", "--stall-seconds", "2.5", "--checkpoint", str(ckpt)],
        )
        with reaped(wl):
            wl.wait_ready()
            wait_registered(agent.engine, "uid-stall")
            t0 = time.monotonic()
            op = agent.control.Suspend(pb.SuspendRequest(pod_uid="uid-stall", grace_seconds=0.5))
            took = time.monotonic() - t0
            # The 0.5 s deadline fired (the workload was 2.5 s away from a safe point); the engine
            # then took the fallback: a durable checkpoint at the next safe point, then eviction.
            assert op.state == pb.OPERATION_STATE_SUCCEEDED, op.message
            assert op.fallback == "checkpoint-evict"
            assert "did not acknowledge" in op.message and "durable checkpoint" in op.message
            assert op.checkpoint_path == str(ckpt)
            assert 0.5 <= took < 30
            assert agent.events.reasons() == ["SuspendFailed", "SuspendFallbackCheckpoint"]
            assert [u for u, _ in agent.evictor.evicted] == ["uid-stall"]
            wl.proc.wait(timeout=30)  # the evictor killed it (as the kubelet would)
            st = agent.control.Status(pb.StatusRequest(pod_uid="uid-stall"))
            assert st.workloads[0].state == pb.WORKLOAD_STATE_CHECKPOINTED_EVICTED
            assert st.host_bytes_held == 0
        # Nothing lost: the checkpoint is complete and verified.
        c = load_checkpoint(ckpt)
        assert c.step > 0 and c.model_state is not None and c.optimizer_state is not None
        assert set(c.rng) == {"python", "numpy", "torch", "cuda"}
        assert not [p for p in ckpt.parent.iterdir() if p.name != ckpt.name]  # no temp files left


def test_workload_that_never_acknowledges_is_not_evicted_blind(tmp_path: Path) -> None:
    with running_agent(tmp_path, checkpoint_timeout_seconds=0.5) as agent:
        wl = start_workload(
            tmp_path,
            "hung",
            socket=agent.claim_socket("claim-uid-hung", "uid-hung"),
            pod_uid="uid-hung",
            extra=["--updates", "100000", "--stall-seconds", "600"],
        )
        with reaped(wl):
            wl.wait_ready()
            wait_registered(agent.engine, "uid-hung")
            op = agent.control.Suspend(pb.SuspendRequest(pod_uid="uid-hung", grace_seconds=0.3))
            assert op.state == pb.OPERATION_STATE_FAILED
            assert op.fallback == "checkpoint-evict"
            assert "durable checkpoint not confirmed" in op.message and "did not evict" in op.message
            assert agent.evictor.evicted == []
            st = agent.control.Status(pb.StatusRequest(pod_uid="uid-hung"))
            # Its state is where it was (on its device, running); nothing was released or lost.
            assert st.workloads[0].state == pb.WORKLOAD_STATE_RUNNING and st.host_bytes_held == 0
            assert wl.proc.poll() is None
            assert agent.events.reasons() == ["SuspendFailed", "SuspendFallbackCheckpointFailed"]
            assert agent.engine.metrics.fallbacks.labels("deadline_exceeded")._value.get() == 1


def test_host_budget_refusal_takes_checkpoint_fallback(tmp_path: Path) -> None:
    ckpt = tmp_path / "b.rose"
    with running_agent(tmp_path, host_memory_budget_bytes=1024) as agent:
        wl = start_workload(
            tmp_path,
            "big",
            socket=agent.claim_socket("claim-uid-big", "uid-big"),
            pod_uid="uid-big",
            extra=["--updates", "400", "--checkpoint", str(ckpt)],
        )
        with reaped(wl):
            wl.wait_ready()
            wait_registered(agent.engine, "uid-big")
            op = agent.control.Suspend(pb.SuspendRequest(pod_uid="uid-big", grace_seconds=20))
            assert op.state == pb.OPERATION_STATE_SUCCEEDED, op.message
            assert op.fallback == "checkpoint-evict" and "host-memory budget" in op.message
            assert op.bytes_moved == 0
            assert agent.events.reasons() == ["SuspendFallbackCheckpoint"]
            assert agent.engine.metrics.fallbacks.labels("host_memory_budget")._value.get() == 1
        load_checkpoint(ckpt)


def test_malformed_registration_gets_clear_error_and_server_keeps_serving(tmp_path: Path) -> None:
    with running_agent(tmp_path) as agent:
        ch = grpc.insecure_channel(f"unix:{agent.workload_socket}")
        stub = pb_grpc.WorkloadAgentStub(ch)
        with pytest.raises(grpc.RpcError) as ei:
            stub.Register(pb.RegisterRequest(pod_uid="", pid=0, state_bytes=-5), timeout=5)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        d = ei.value.details()
        for needle in ("pod_uid", "pid must be", "state_bytes", "supported_backends"):
            assert needle in d, d
        with pytest.raises(grpc.RpcError) as ei:
            stub.Register(pb.RegisterRequest(pod_uid="u", pid=5, supported_backends=[42]), timeout=5)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "unknown value 42" in ei.value.details()
        # Commands / Acknowledge without a valid session
        with pytest.raises(grpc.RpcError) as ei:
            next(iter(stub.Commands(pb.CommandsRequest(pod_uid="u", session_id="nope"), timeout=5)))
        assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "Register first" in ei.value.details()
        with pytest.raises(grpc.RpcError) as ei:
            stub.Acknowledge(pb.AcknowledgeRequest(pod_uid="u", session_id="s"), timeout=5)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # NodeControl: unknown pod, bad grace
        with pytest.raises(grpc.RpcError) as ei:
            agent.control.Suspend(pb.SuspendRequest(pod_uid="ghost", grace_seconds=1), timeout=5)
        assert ei.value.code() == grpc.StatusCode.NOT_FOUND and "ghost" in ei.value.details()
        with pytest.raises(grpc.RpcError) as ei:
            agent.control.Suspend(pb.SuspendRequest(pod_uid="ghost", grace_seconds=-1), timeout=5)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # still serving: a valid registration works
        ok = stub.Register(
            pb.RegisterRequest(pod_uid="u", pid=5, state_bytes=10, supported_backends=[pb.BACKEND_COOPERATIVE]),
            timeout=5,
        )
        assert ok.session_id and ok.node_name == "rose-node-0"
        ch.close()

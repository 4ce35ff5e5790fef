"""rose_sdk's workload object without an agent: module-level API, hooks, checkpoint, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import rose_sdk
from rose_common.proto import rose_agent_v1_pb2 as pb
from rose_sdk import AgentError, Workload, load_checkpoint


def test_module_api_without_agent_is_a_no_op(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ROSE_AGENT_SOCKET", raising=False)
    monkeypatch.setenv("ROSE_CHECKPOINT_PATH", str(tmp_path / "c.rose"))
    monkeypatch.setenv("ROSE_CLAIM_UID_C1", "c1")
    monkeypatch.setenv("ROSE_CLAIM_UID_C2", "c2")
    m = torch.nn.Linear(2, 2)
    wl = rose_sdk.init(model=m, user_state=lambda: {"k": 1})
    assert rose_sdk.current() is wl and not wl.connected_to_agent and wl.claim_uids == ["c1", "c2"]

    @rose_sdk.on_suspend
    def hook() -> None:
        pass

    assert rose_sdk.safe_point(5) == 0 and wl.step == 5
    info = wl.checkpoint_now()
    c = load_checkpoint(info.path)
    assert c.step == 5 and c.user_state == {"k": 1}
    wl.close()


def test_unreachable_agent_is_a_clear_error(tmp_path: Path) -> None:
    wl = Workload(model=torch.nn.Linear(1, 1), socket_path=str(tmp_path / "none.sock"), pod_uid="u")
    with pytest.raises(AgentError, match="refused the registration"):
        wl.start()


def test_bad_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROSE_CHECKPOINT_PATH", raising=False)
    with pytest.raises(ValueError, match="unknown backend"):
        Workload(backends=["teleport"])
    with pytest.raises(AgentError, match="no checkpoint path"):
        Workload(checkpoint_path=None, socket_path="").checkpoint_now()


class RecordingAgentStub:
    """Stands in for the agent's gRPC stub in-process: records acknowledgements (the real agent
    drives these commands in tests/contract/agent/test_agent_training_unharmed.py)."""

    def __init__(self) -> None:
        self.acks: list[pb.AcknowledgeRequest] = []

    def Acknowledge(self, req: pb.AcknowledgeRequest, timeout: float) -> None:
        self.acks.append(req)


def _commands(wl: Workload, *kinds: int) -> RecordingAgentStub:
    stub = RecordingAgentStub()
    wl._stub = stub  # type: ignore[assignment]
    wl._state_bytes = 0  # no size reports
    for i, kind in enumerate(kinds):
        wl._pending.put(pb.Command(operation_id=f"op{i}", kind=kind))
    return stub


def test_on_suspended_runs_after_the_offload_while_suspended() -> None:
    m = torch.nn.Linear(2, 2)
    wl = Workload(model=m, socket_path="")
    seen: list[tuple[str, bool]] = []
    wl.on_suspend(lambda: seen.append(("suspend", wl.offloader.offloaded)))
    wl.on_suspended(lambda: seen.append(("suspended", wl.offloader.offloaded)))
    wl.on_resume(lambda: seen.append(("resume", wl.offloader.offloaded)))
    stub = _commands(wl, pb.COMMAND_KIND_SUSPEND, pb.COMMAND_KIND_RESUME)
    assert wl.safe_point(1) == 1  # the suspend parks inside and runs the resume
    assert seen == [("suspend", False), ("suspended", True), ("resume", False)]
    assert [a.ok for a in stub.acks] == [True, True] and wl.suspend_count == wl.resume_count == 1


def test_a_failing_on_suspended_hook_restores_and_refuses_the_suspend() -> None:
    m = torch.nn.Linear(2, 2)
    want = {k: v.clone() for k, v in m.state_dict().items()}
    wl = Workload(model=m, socket_path="")

    @wl.on_suspended
    def broken() -> None:
        raise RuntimeError("boom")

    stub = _commands(wl, pb.COMMAND_KIND_SUSPEND)
    assert wl.safe_point(1) == 1
    assert not stub.acks[0].ok and "on_suspended hook failed" in stub.acks[0].message
    assert not wl.suspended and not wl.offloader.offloaded
    assert all(torch.equal(m.state_dict()[k], v) for k, v in want.items())


def _resident(p: Path) -> int:
    return p.stat().st_blocks * 512


def test_simulated_device_memory_is_held_while_resident_and_freed_when_offloaded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """ROSE_SIMULATED_DEVICE_MEMORY (the claim's CDI env on simulated GPUs): the driver observes the
    file, so the SDK holds its state size there while resident, frees it at the offload (before the
    acknowledgement) and holds it again after the restore."""
    dev = tmp_path / "device-memory"
    dev.touch()
    monkeypatch.setenv("ROSE_SIMULATED_DEVICE_MEMORY", str(dev))
    wl = Workload(model=torch.nn.Linear(2, 2), socket_path="")
    assert wl.device_memory is not None
    wl._reported_bytes = 64 * 1024
    wl.device_memory.hold(wl._reported_bytes)
    assert _resident(dev) >= 64 * 1024
    seen: list[int] = []
    wl.on_suspended(lambda: seen.append(_resident(dev)))
    stub = _commands(wl, pb.COMMAND_KIND_SUSPEND)
    original_ack = stub.Acknowledge

    def ack(req: pb.AcknowledgeRequest, timeout: float) -> None:
        seen.append(_resident(dev))
        original_ack(req, timeout)
        if len(stub.acks) == 1:
            wl._pending.put(pb.Command(operation_id="op-r", kind=pb.COMMAND_KIND_RESUME))

    stub.Acknowledge = ack  # type: ignore[method-assign]
    assert wl.safe_point(1) == 1
    assert seen[1] == 0  # freed before the suspend was acknowledged
    assert _resident(dev) >= 64 * 1024  # held again after the resume
    wl.device_memory.close()
    assert _resident(dev) == 0  # a workload that lets go frees it


def test_simulated_device_memory_failures_are_logged_not_raised(tmp_path: Path) -> None:
    from rose_sdk.workload import SimulatedDeviceMemory

    m = SimulatedDeviceMemory(str(tmp_path / "missing" / "device-memory"))
    m.hold(4096)
    m.free()
    m.close()

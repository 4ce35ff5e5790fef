"""Issue 22 finding 8, over real unix sockets with the real driver, engine and node agent: a
time-slice group's shared claim (``reservedFor`` lists a worker of each member job) is suspended by
(claim, pod). Serving taking the GPU suspends every member registered on the claim; a suspend
request on one member's pod (the orchestrator parking that job) suspends that pod only, whichever
registered last; when serving leaves, the members nobody else holds run again.

The members are gRPC clients on the claim's own socket that acknowledge every command
(``Member``), so the test sees exactly which pod got which command."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from dra_driver.agent.server import AgentServer
from dra_driver.claims import ClaimRef, PodRef
from dra_driver.node import NodeDriver
from dra_driver.suspend.engine import EngineConfig, NodeSuspendEngine
from dra_driver.suspend.factory import build_engine
from rose_common.proto import rose_agent_v1_pb2 as pb
from rose_common.proto import rose_agent_v1_pb2_grpc as pb_grpc
from tests.support.driver_fixtures import NS, RecordingNotifier, StaticClaims, make_claim, make_driver

KINDS = {pb.COMMAND_KIND_SUSPEND: "suspend", pb.COMMAND_KIND_RESUME: "resume", pb.COMMAND_KIND_CHECKPOINT: "checkpoint"}


class Member:
    """One member job's worker on the shared claim's socket: records and acknowledges its commands."""

    def __init__(self, socket: Path, pod_uid: str) -> None:
        self.commands: list[str] = []
        self.channel = grpc.insecure_channel(f"unix:{socket}")
        stub = pb_grpc.WorkloadAgentStub(self.channel)
        req = pb.RegisterRequest(
            pod_uid=pod_uid, pid=os.getpid(), state_bytes=1 << 20, supported_backends=[pb.BACKEND_COOPERATIVE]
        )
        session = stub.Register(req, timeout=5).session_id

        def run() -> None:
            try:
                for cmd in stub.Commands(pb.CommandsRequest(pod_uid=pod_uid, session_id=session)):
                    if cmd.kind not in KINDS:
                        continue
                    self.commands.append(KINDS[cmd.kind])
                    ack = pb.AcknowledgeRequest(
                        pod_uid=pod_uid, session_id=session, operation_id=cmd.operation_id, ok=True, bytes_moved=1 << 20
                    )
                    stub.Acknowledge(ack, timeout=5)
            except grpc.RpcError:
                pass

        threading.Thread(target=run, daemon=True).start()

    def close(self) -> None:
        self.channel.close()


def shared_claim() -> dict[str, Any]:
    c = make_claim("uid-x", "ts-g1-w0-gpus", [("gpu", "gpu-0-lendable")], pod=("a-0", "pod-a-0"))
    c["status"]["reservedFor"].append({"resource": "pods", "name": "b-0", "uid": "pod-b-0"})
    return c


SERVING = make_claim("uid-s0", "s0", [("gpu", "gpu-0-serving")], pod=("serve-0", "pod-serve-0"))
A, B = PodRef(NS, "a-0", "pod-a-0"), PodRef(NS, "b-0", "pod-b-0")


@dataclass
class Group:
    driver: NodeDriver
    engine: NodeSuspendEngine
    notifier: RecordingNotifier
    members: dict[str, Member]


@pytest.fixture(params=[("pod-a-0", "pod-b-0"), ("pod-b-0", "pod-a-0")], ids=["b-last", "a-last"])
def group(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Group]:
    engine = build_engine(EngineConfig(host_memory_budget_bytes=1 << 30), metrics_registry=CollectorRegistry())
    agent = AgentServer(engine, None, tmp_path / "agent" / "c.sock", claim_socket_root=tmp_path / "p" / "claims")
    agent.start()
    notifier = RecordingNotifier()
    driver = make_driver(
        tmp_path, StaticClaims([shared_claim(), SERVING]), engine, notifier, workload_sockets=agent.claims
    )
    driver.recover()
    assert driver.prepare([ClaimRef(NS, "uid-x", "ts-g1-w0-gpus")])["uid-x"].error == ""
    sock = tmp_path / "p" / "claims" / "uid-x" / "workload.sock"
    members = {}
    for uid in request.param:  # the registration order the engine must not depend on
        members[uid] = Member(sock, uid)
        _wait(lambda uid=uid: engine.registry.get(uid) is not None and engine.registry.get(uid).connected)
    yield Group(driver, engine, notifier, members)
    for m in members.values():
        m.close()
    driver.close()
    agent.stop(0)


def _wait(cond: Any, timeout: float = 10.0) -> None:
    import time

    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.02)


def cmds(g: Group) -> dict[str, list[str]]:
    return {uid.removeprefix("pod-"): list(m.commands) for uid, m in g.members.items()}


def states(g: Group, pod: str) -> list[str]:
    return [s for p, s in g.notifier.states if p == pod]


def test_serving_suspends_every_member_of_a_shared_claim(group: Group) -> None:
    g = group
    assert g.driver.prepare([ClaimRef(NS, "uid-s0", "s0")])["uid-s0"].error == ""
    assert cmds(g) == {"a-0": ["suspend"], "b-0": ["suspend"]}
    assert g.engine.occupant_state("uid-x") == "suspended"
    assert states(g, "a-0")[-1] == states(g, "b-0")[-1] == "Suspended"
    assert g.driver.unprepare([ClaimRef(NS, "uid-s0", "s0")])["uid-s0"] == ""
    assert cmds(g) == {"a-0": ["suspend", "resume"], "b-0": ["suspend", "resume"]}
    assert states(g, "a-0")[-1] == states(g, "b-0")[-1] == "Running"


def test_a_suspend_request_on_one_member_moves_that_pod_only(group: Group) -> None:
    g = group
    assert g.driver.request_suspend(B, 5.0) == "Suspended"  # the orchestrator parks job b
    assert cmds(g) == {"a-0": [], "b-0": ["suspend"]}
    assert "Suspended" not in states(g, "a-0")
    # serving takes the GPU: a, still running, is suspended too; b is already off the GPU
    assert g.driver.prepare([ClaimRef(NS, "uid-s0", "s0")])["uid-s0"].error == ""
    assert cmds(g) == {"a-0": ["suspend"], "b-0": ["suspend"]}
    assert g.engine.occupant_state("uid-x") == "suspended"
    # serving leaves: a runs again, b stays parked by its own request
    assert g.driver.unprepare([ClaimRef(NS, "uid-s0", "s0")])["uid-s0"] == ""
    assert cmds(g) == {"a-0": ["suspend", "resume"], "b-0": ["suspend"]}
    assert states(g, "a-0")[-1] == "Running" and states(g, "b-0")[-1] == "Suspended"
    # the hand-over: a parked, then b's request withdrawn
    assert g.driver.request_suspend(A, 5.0) == "Suspended"
    assert g.driver.cancel_suspend(B) == "Running"
    assert cmds(g) == {"a-0": ["suspend", "resume", "suspend"], "b-0": ["suspend", "resume"]}
    assert states(g, "a-0")[-1] == "Suspended" and states(g, "b-0")[-1] == "Running"
    assert g.driver.cancel_suspend(A) == "Running"
    assert cmds(g)["a-0"] == ["suspend", "resume", "suspend", "resume"]
    assert g.driver.snapshot().suspensions == {}

"""Issue 11 (node part): attacks on the node agent's workload sockets, against the real agent over
real unix sockets, with a real SDK workload as the victim. Each must fail on a workload socket
that trusts the request body."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

import grpc
import pytest

from rose_common.proto import rose_agent_v1_pb2 as pb
from rose_common.proto import rose_agent_v1_pb2_grpc as pb_grpc
from tests.support.agent_fixtures import Agent, reaped, running_agent, start_workload, wait_registered

COOP = [pb.BACKEND_COOPERATIVE]


class Attacker:
    """A second client on a workload socket: registers under a name it chooses and acknowledges
    every command it gets, claiming success (and a fake checkpoint)."""

    def __init__(self, socket: Path) -> None:
        self.channel = grpc.insecure_channel(f"unix:{socket}")
        self.stub = pb_grpc.WorkloadAgentStub(self.channel)
        self.acked: list[int] = []

    def register(self, **fields: object) -> pb.RegisterResponse:
        req = pb.RegisterRequest(pid=os.getpid(), supported_backends=COOP, **fields)  # type: ignore[arg-type]
        resp: pb.RegisterResponse = self.stub.Register(req, timeout=5)
        return resp

    def serve_commands(self, pod_uid: str, session_id: str) -> threading.Thread:
        def run() -> None:
            try:
                for cmd in self.stub.Commands(pb.CommandsRequest(pod_uid=pod_uid, session_id=session_id)):
                    self.acked.append(cmd.kind)
                    self.stub.Acknowledge(
                        pb.AcknowledgeRequest(
                            pod_uid=pod_uid,
                            session_id=session_id,
                            operation_id=cmd.operation_id,
                            ok=True,
                            bytes_moved=1 << 30,
                            checkpoint_path="/etc/hostname",
                            checkpoint_sha256="0" * 64,
                        ),
                        timeout=5,
                    )
            except grpc.RpcError:
                pass

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t

    def close(self) -> None:
        self.channel.close()


def _victim(agent: Agent, tmp: Path) -> object:
    sock = agent.claim_socket("claim-v", "uid-v", namespace="rl", name="rl-victim")
    return start_workload(
        tmp, "victim", socket=sock, pod_uid="uid-v", extra=["--updates", "40", "--suspend-points", "1"]
    )


def test_second_client_cannot_register_as_the_victim_nor_acknowledge_its_suspend(tmp_path: Path) -> None:
    with running_agent(tmp_path) as agent:
        wl = _victim(agent, tmp_path)
        own = agent.claim_socket("claim-a", "uid-a", name="attacker")
        with reaped(wl):
            wl.wait_ready()
            wait_registered(agent.engine, "uid-v")
            victim_session = agent.engine.registry.get("uid-v").session_id  # type: ignore[attr-defined]
            for sock in (own, agent.workload_socket):  # its own claim's socket, the shared socket
                a = Attacker(sock)
                with pytest.raises(grpc.RpcError) as ei:
                    a.register(pod_uid="uid-v", state_bytes=1)
                assert ei.value.code() == grpc.StatusCode.PERMISSION_DENIED, ei.value.details()
                a.close()
            # Even with the victim's session id, another claim's socket cannot acknowledge for it.
            other = pb_grpc.WorkloadAgentStub(grpc.insecure_channel(f"unix:{own}"))
            with pytest.raises(grpc.RpcError) as ei:
                other.Acknowledge(
                    pb.AcknowledgeRequest(pod_uid="uid-v", session_id=victim_session, operation_id="x", ok=True),
                    timeout=5,
                )
            assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert agent.engine.registry.get("uid-v").session_id == victim_session  # type: ignore[attr-defined]
            op = agent.control.Suspend(pb.SuspendRequest(pod_uid="uid-v", grace_seconds=30))
            assert op.state == pb.OPERATION_STATE_SUCCEEDED and op.bytes_moved > 0, op.message
            res = agent.control.Resume(pb.ResumeRequest(pod_uid="uid-v"))
            assert res.state == pb.OPERATION_STATE_SUCCEEDED, res.message
            out = wl.finish()
        assert "suspends=1 resumes=1" in out  # the victim itself moved its state, and back


def test_client_naming_kube_system_pod_gets_nothing_evicted(tmp_path: Path) -> None:
    # Budget 1 KiB: every suspend takes the checkpoint-and-evict fallback.
    with running_agent(tmp_path, host_memory_budget_bytes=1024, checkpoint_timeout_seconds=5.0) as agent:
        wl = _victim(agent, tmp_path)
        with reaped(wl):
            wl.wait_ready()
            wait_registered(agent.engine, "uid-v")
            agent.engine.bind_claim("claim-v", "uid-v")  # type: ignore[attr-defined]  # the driver's record
            # 1) on the shared socket: bind the victim's claim to itself, name kube-system/coredns
            a = Attacker(agent.workload_socket)
            r = a.register(
                pod_uid="uid-evil",
                pod_namespace="kube-system",
                pod_name="coredns-5d78c9869d-abcde",
                claim_uids=["claim-v"],
                state_bytes=1 << 20,
            )
            a.serve_commands("uid-evil", r.session_id)
            assert agent.engine.registry.pod_for_claim("claim-v") == "uid-v"  # type: ignore[attr-defined]
            # 2) on its own claim's socket: same names, and a fake checkpoint when asked
            own = Attacker(agent.claim_socket("claim-a", "uid-a", name="attacker"))
            r2 = own.register(
                pod_uid="uid-a", pod_namespace="kube-system", pod_name="coredns-5d78c9869d-abcde", state_bytes=1 << 20
            )
            own.serve_commands("uid-a", r2.session_id)
            res = agent.engine.suspend("claim-a", 2.0)  # type: ignore[attr-defined]
            assert not res.ok and "checkpoint not verified" in res.message, res.message
            op = agent.control.Suspend(pb.SuspendRequest(pod_uid="uid-evil", grace_seconds=2))
            assert op.state == pb.OPERATION_STATE_FAILED and "checkpoint not verified" in op.message, op.message
            assert agent.evictor.evicted == []
            a.close()
            own.close()
    w = agent.engine.registry.get("uid-a")  # type: ignore[attr-defined]
    assert (w.reg.pod_namespace, w.reg.pod_name) == ("rl", "attacker")  # names from the claim records


def test_checkpointed_workload_evicted_by_uid_from_claim_records(tmp_path: Path) -> None:
    ckpt = tmp_path / "v.rose"
    with running_agent(tmp_path, host_memory_budget_bytes=1024) as agent:
        sock = agent.claim_socket("claim-v", "uid-v", namespace="rl", name="rl-victim")
        wl = start_workload(
            tmp_path,
            "victim",
            socket=sock,
            pod_uid="uid-v",
            namespace="kube-system",
            extra=["--updates", "400", "--checkpoint", str(ckpt)],
        )
        with reaped(wl):
            wl.wait_ready()
            wait_registered(agent.engine, "uid-v")
            res = agent.engine.suspend("claim-v", 20.0)  # type: ignore[attr-defined]
            assert res.ok and res.fallback == "checkpoint-evict" and "verified" in res.message, res.message
    assert [(p.namespace, p.name, p.uid) for p in agent.evictor.pods] == [("rl", "rl-victim", "uid-v")]  # type: ignore[attr-defined]


def test_twenty_thousand_fake_registrations_are_capped_and_never_touch_the_budget(tmp_path: Path) -> None:
    with running_agent(tmp_path) as agent:
        own = agent.claim_socket("claim-a", "uid-a")
        for sock, code in ((own, grpc.StatusCode.PERMISSION_DENIED), (agent.workload_socket, None)):
            ch = grpc.insecure_channel(f"unix:{sock}")
            stub = pb_grpc.WorkloadAgentStub(ch)
            codes: dict[str, int] = {}
            t0 = time.monotonic()
            for base in range(0, 20_000, 500):
                futs = [
                    stub.Register.future(
                        pb.RegisterRequest(
                            pod_uid=f"fake-{i}",
                            pid=1,
                            state_bytes=1 << 40,
                            supported_backends=COOP,
                            current_state=pb.WORKLOAD_STATE_SUSPENDED,
                        ),
                        timeout=30,
                    )
                    for i in range(base, base + 500)
                ]
                for f in futs:
                    e = f.exception()
                    name = "OK" if e is None else e.code().name  # type: ignore[union-attr]
                    codes[name] = codes.get(name, 0) + 1
            print(f"20000 registrations on {sock.name}: {codes} in {time.monotonic() - t0:.1f}s")
            ch.close()
            if code is not None:
                assert codes == {code.name: 20_000}
            else:  # the shared socket: capped at the registry's limit
                limit = agent.engine.registry.max_workloads  # type: ignore[attr-defined]
                assert codes == {"OK": limit, "RESOURCE_EXHAUSTED": 20_000 - limit}
            assert agent.engine.registry.count() <= agent.engine.registry.max_workloads  # type: ignore[attr-defined]
            st = agent.control.Status(pb.StatusRequest())
            assert st.host_bytes_held == 0


def _others_can_connect(sock: Path, public_root: Path) -> bool:
    """Whether a user other than the owner could connect: the socket writable by others and every
    directory from ``public_root`` down searchable by others."""
    if not sock.exists() or not stat.S_IMODE(sock.stat().st_mode) & 0o002:
        return False
    d = sock.parent
    while True:
        if not stat.S_IMODE(d.stat().st_mode) & 0o001:
            return False
        if d == public_root:
            return True
        d = d.parent


def test_sockets_never_world_connectable_between_bind_and_chmod(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    from dra_driver.agent.server import AgentServer
    from dra_driver.suspend.engine import EngineConfig
    from dra_driver.suspend.factory import build_engine

    public = tmp_path / "var"
    public.mkdir()
    public.chmod(0o755)  # like /var/lib: anyone may traverse it
    engine = build_engine(EngineConfig(host_memory_budget_bytes=1 << 20), metrics_registry=CollectorRegistry())
    old = os.umask(0)
    try:
        server = AgentServer(engine, public / "agent" / "w.sock", public / "agent" / "c.sock")  # bound, not chmod
        try:
            for s in (server.workload_socket, server.control_socket):
                assert s is not None and s.exists()
                assert not _others_can_connect(s, public), f"{s} is connectable by anyone before chmod"
            from dra_driver.claims import PodRef

            d = server.claims.open_claim("claim-x", [PodRef("rl", "p", "uid-p")], 1 << 30)
            assert not _others_can_connect(d / "workload.sock", public)  # the claim root is 0700
            assert stat.S_IMODE(server.claims.root.stat().st_mode) == 0o700
        finally:
            server.stop(0)
    finally:
        os.umask(old)

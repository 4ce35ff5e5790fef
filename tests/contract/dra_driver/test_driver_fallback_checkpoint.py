"""Issue 22 finding 2, over real unix sockets with the real driver, engine and node agent: a
workload answering the fallback's CHECKPOINT with a FIFO, a symlink out of its root or a host
path gets nothing verified, learns nothing about the host from its Events, and cannot delay an
honest workload's suspend on another claim.

The attackers are gRPC clients on their claims' own sockets (``Liar``); the honest workload is the
real SDK example as a subprocess. A pod's root is its process's ``/proc/<pid>/root``: the
symlink test runs a real chrooted process for it. The PID of each pod comes from
``agent_fixtures.workload_pids`` (the stand-in for the pod cgroup lookup)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry

from dra_driver.agent.server import AgentServer
from dra_driver.claims import ClaimRef, PodRef
from dra_driver.node import NodeDriver
from dra_driver.suspend.engine import EngineConfig, NodeSuspendEngine
from dra_driver.suspend.events import NotifierEventSink
from dra_driver.suspend.factory import build_engine
from rose_common.proto import rose_agent_v1_pb2 as pb
from rose_common.proto import rose_agent_v1_pb2_grpc as pb_grpc
from tests.support.agent_fixtures import checkpoint_verifier, reaped, start_workload, wait_registered
from tests.support.driver_fixtures import NS, StaticClaims, make_claim, make_driver


@dataclass
class TextNotifier:
    """Records what the driver and the engine would write to the API: states and Event texts."""

    states: list[tuple[str, str]] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    mu: threading.Lock = field(default_factory=threading.Lock)

    def suspend_state(self, pod: PodRef, state: str, message: str) -> None:
        with self.mu:
            self.states.append((pod.name, state))

    def event(self, pod: PodRef, reason: str, message: str, warning: bool) -> None:
        with self.mu:
            self.events.append((pod.name, reason, message))

    def texts(self, pod: str) -> list[str]:
        with self.mu:
            return [m for p, _, m in self.events if p == pod]


class Liar:
    """A workload on its claim's own socket that refuses every suspend (so the fallback runs) and
    answers CHECKPOINT with ``path`` and a digest of its choosing."""

    def __init__(self, socket: Path, pod_uid: str, pid: int, path: str, digest: str = "0" * 64) -> None:
        self.channel = grpc.insecure_channel(f"unix:{socket}")
        stub = pb_grpc.WorkloadAgentStub(self.channel)
        req = pb.RegisterRequest(
            pod_uid=pod_uid, pid=pid, state_bytes=1 << 20, supported_backends=[pb.BACKEND_COOPERATIVE]
        )
        session = stub.Register(req, timeout=5).session_id

        def run() -> None:
            try:
                for cmd in stub.Commands(pb.CommandsRequest(pod_uid=pod_uid, session_id=session)):
                    ckpt = cmd.kind == pb.COMMAND_KIND_CHECKPOINT
                    stub.Acknowledge(
                        pb.AcknowledgeRequest(
                            pod_uid=pod_uid,
                            session_id=session,
                            operation_id=cmd.operation_id,
                            ok=ckpt,
                            message="" if ckpt else "no pinned memory",
                            checkpoint_path=path if ckpt else "",
                            checkpoint_sha256=digest if ckpt else "",
                        ),
                        timeout=5,
                    )
            except grpc.RpcError:
                pass

        threading.Thread(target=run, daemon=True).start()

    def close(self) -> None:
        self.channel.close()


def lent(i: int, pod: str) -> dict[str, object]:
    return make_claim(f"uid-l{i}", f"l{i}", [("gpu", f"gpu-{i}-lendable")], pod=(pod, f"pod-{pod}"))


def serving(i: int) -> dict[str, object]:
    return make_claim(f"uid-s{i}", f"s{i}", [("gpu", f"gpu-{i}-serving")], pod=(f"serve-{i}", f"pod-serve-{i}"))


def ref(c: dict[str, object]) -> ClaimRef:
    meta = c["metadata"]
    assert isinstance(meta, dict)
    return ClaimRef(NS, meta["uid"], meta["name"])


@dataclass
class Node:
    driver: NodeDriver
    engine: NodeSuspendEngine
    agent: AgentServer
    notifier: TextNotifier
    tmp: Path

    def socket(self, claim_uid: str) -> Path:
        return self.tmp / "p" / "claims" / claim_uid / "workload.sock"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    claims = [lent(0, "liar-0"), lent(1, "liar-1"), lent(2, "honest"), serving(0), serving(1), serving(2)]
    notifier = TextNotifier()
    engine = build_engine(
        EngineConfig(host_memory_budget_bytes=1 << 30, checkpoint_timeout_seconds=3.0),
        events=NotifierEventSink(notifier),
        metrics_registry=CollectorRegistry(),
        verifier=checkpoint_verifier("/ckpt", timeout_seconds=5.0),
    )
    agent = AgentServer(engine, None, tmp_path / "agent" / "c.sock", claim_socket_root=tmp_path / "p" / "claims")
    agent.start()
    driver = make_driver(
        tmp_path,
        StaticClaims(claims),
        engine,
        notifier,
        gpus=3,
        workload_sockets=agent.claims,
        default_grace_seconds=1.0,
    )
    driver.recover()
    for c in claims[:3]:
        assert driver.prepare([ref(c)])[c["metadata"]["uid"]].error == ""  # type: ignore[index]
    yield Node(driver, engine, agent, notifier, tmp_path)
    driver.close()
    agent.stop(0)


@contextlib.contextmanager
def chrooted(root: Path) -> Iterator[int]:
    """A real process whose root is ``root`` (so ``/proc/<pid>/root`` is that directory, as a
    container's is); yields its PID."""
    root.mkdir(parents=True, exist_ok=True)
    code = "import os, sys, time; os.chroot(sys.argv[1]); os.chdir('/'); print('in', flush=True); time.sleep(600)"
    p = subprocess.Popen([sys.executable, "-c", code, str(root)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "in"
        yield p.pid
    finally:
        p.kill()
        p.wait(timeout=10)
        if p.stdout is not None:
            p.stdout.close()


def suspension(n: Node, claim_uid: str) -> str:
    s = n.driver.snapshot().suspensions.get(claim_uid)
    return "" if s is None else s.state


def test_fifo_answers_do_not_delay_an_honest_suspend_on_another_claim(node: Node) -> None:
    with contextlib.ExitStack() as stack:
        for i in (0, 1):
            root = node.tmp / f"root-{i}"
            (root / "ckpt").mkdir(parents=True)
            os.mkfifo(root / "ckpt" / "job.rose")  # read-opened without a writer: blocks forever
            pid = stack.enter_context(chrooted(root))
            stack.callback(Liar(node.socket(f"uid-l{i}"), f"pod-liar-{i}", pid, "/ckpt/job.rose").close)
        honest = start_workload(
            node.tmp, "honest", socket=node.socket("uid-l2"), pod_uid="pod-honest", extra=["--updates", "100000"]
        )
        stack.enter_context(reaped(honest))
        honest.wait_ready()
        wait_registered(node.engine, "pod-honest")
        took = []
        for i in (0, 1, 2):  # serving takes the liars' GPUs (their fallbacks name FIFOs), then the honest one's
            t0 = time.monotonic()
            assert node.driver.prepare([ref(serving(i))])[f"uid-s{i}"].error == ""
            took.append(time.monotonic() - t0)
        assert suspension(node, "uid-l2") == "Suspended", node.notifier.texts("honest")
        assert ("honest", "Suspended") in node.notifier.states
        assert [suspension(node, f"uid-l{i}") for i in (0, 1)] == ["SuspendFailed"] * 2
        assert max(took) < 5.0, took  # grace 1 s: nothing waited for the driver's engine timeout
        assert not any("did not finish" in t for t in node.notifier.texts("honest"))
        for i in (0, 1):
            texts = node.notifier.texts(f"liar-{i}")
            assert any("checkpoint not verified: not a regular file" in t for t in texts), texts
            assert not any("/ckpt" in t or "job.rose" in t for t in texts), texts
        assert node.driver.unprepare([ref(serving(2))])["uid-s2"] == ""
        assert ("honest", "Running") in node.notifier.states


def test_a_symlink_out_of_the_pod_root_gets_nothing_verified_nor_evicted(node: Node) -> None:
    from rose_sdk import save_checkpoint

    host = node.tmp / "host" / "job.rose"  # a valid checkpoint on the host, outside the pod's root
    info = save_checkpoint(host, step=1)
    root = node.tmp / "root-0"
    (root / "ckpt").mkdir(parents=True)
    (root / "ckpt" / "job.rose").symlink_to(host)
    with chrooted(root) as pid:
        liar = Liar(node.socket("uid-l0"), "pod-liar-0", pid, "/ckpt/job.rose", info.sha256)
        try:
            assert node.driver.prepare([ref(serving(0))])["uid-s0"].error == ""
        finally:
            liar.close()
    assert suspension(node, "uid-l0") == "SuspendFailed"  # not CheckpointedEvicted
    texts = node.notifier.texts("liar-0")
    assert any("checkpoint not verified: symlink refused" in t for t in texts), texts
    assert not any(str(node.tmp) in t for t in texts), texts


def test_host_paths_in_an_ack_leak_nothing_in_events(node: Node) -> None:
    with chrooted(node.tmp / "root-0") as p0, chrooted(node.tmp / "root-1") as p1:
        liars = [
            Liar(node.socket("uid-l0"), "pod-liar-0", p0, "/etc/shadow"),  # exists on the host
            Liar(node.socket("uid-l1"), "pod-liar-1", p1, "/etc/rose-no-such-file"),
        ]
        try:
            for i in (0, 1):
                assert node.driver.prepare([ref(serving(i))])[f"uid-s{i}"].error == ""
        finally:
            for liar in liars:
                liar.close()
    t0, t1 = node.notifier.texts("liar-0"), node.notifier.texts("liar-1")
    assert t0 and t0 == t1, (t0, t1)  # the same words whether the host file exists or not
    assert not any("/etc" in t or "shadow" in t or "No such file" in t for t in t0), t0
    assert any("checkpoint not verified: outside checkpointPath" in t for t in t0), t0


def test_a_100_gb_sparse_checkpoint_is_refused_fast(node: Node) -> None:
    root = node.tmp / "root-0"
    (root / "ckpt").mkdir(parents=True)
    with open(root / "ckpt" / "job.rose", "wb") as f:
        f.write(b"ROSECKPT1\n" + b"0" * 64 + b"\n")  # a valid header, then 100 GB of holes
        f.truncate(100 * 10**9)  # no blocks on disk; hashing it would take minutes
    with chrooted(root) as pid:
        liar = Liar(node.socket("uid-l0"), "pod-liar-0", pid, "/ckpt/job.rose")
        try:
            t0 = time.monotonic()
            assert node.driver.prepare([ref(serving(0))])["uid-s0"].error == ""
            took = time.monotonic() - t0
        finally:
            liar.close()
    texts = node.notifier.texts("liar-0")
    assert any("checkpoint not verified: too large" in t for t in texts), texts
    assert suspension(node, "uid-l0") == "SuspendFailed" and took < 5.0, took

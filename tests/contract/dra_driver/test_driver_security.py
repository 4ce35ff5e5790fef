"""Issue 11 (node part), driver side, over real unix sockets: a lent claim's own workload socket
reaches its containers through the CDI spec and acts only for the claim's pods; a busy node lock
and a full disk are per-claim errors, never an exception out of prepare() or a torn file."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry

from dra_driver import cdi
from dra_driver.agent.server import AgentServer
from dra_driver.claims import ClaimRef
from dra_driver.node import NodeDriver
from dra_driver.suspend.engine import EngineConfig
from dra_driver.suspend.factory import build_engine
from rose_common.proto import rose_agent_v1_pb2 as pb
from rose_common.proto import rose_agent_v1_pb2_grpc as pb_grpc
from tests.support.driver_fixtures import NS, StaticClaims, make_claim, make_driver

L0 = make_claim("uid-l0", "l0", [("gpu", "gpu-0-lendable")], pod=("rl-0", "pod-rl-0"))
S1 = make_claim("uid-s1", "s1", [("gpu", "gpu-1-serving")])
REF_L0 = ClaimRef(NS, "uid-l0", "l0")
REF_S1 = ClaimRef(NS, "uid-s1", "s1")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[NodeDriver, AgentServer]]:
    engine = build_engine(EngineConfig(host_memory_budget_bytes=1 << 30), metrics_registry=CollectorRegistry())
    agent = AgentServer(engine, None, tmp_path / "agent" / "control.sock", claim_socket_root=tmp_path / "p" / "claims")
    agent.start()
    driver = make_driver(tmp_path, StaticClaims([L0, S1]), engine, workload_sockets=agent.claims)
    driver.recover()
    yield driver, agent
    driver.close()
    agent.stop(0)


def _register(sock: Path, pod_uid: str, **fields: object) -> pb.RegisterResponse:
    with grpc.insecure_channel(f"unix:{sock}") as ch:
        req = pb.RegisterRequest(
            pod_uid=pod_uid, pid=os.getpid(), supported_backends=[pb.BACKEND_COOPERATIVE], **fields
        )  # type: ignore[arg-type]
        resp: pb.RegisterResponse = pb_grpc.WorkloadAgentStub(ch).Register(req, timeout=5)
        return resp


def test_lent_claim_gets_its_own_socket_through_cdi_and_it_acts_only_for_its_pods(
    node: tuple[NodeDriver, AgentServer], tmp_path: Path
) -> None:
    driver, agent = node
    assert driver.prepare([REF_L0, REF_S1])["uid-l0"].error == ""
    spec = json.loads((tmp_path / "cdi" / cdi.spec_filename("uid-l0")).read_text())
    host_dir = tmp_path / "p" / "claims" / "uid-l0"
    assert spec["containerEdits"]["mounts"] == [
        {
            "hostPath": str(host_dir),
            "containerPath": "/run/rose/claims/uid-l0",
            "options": ["rbind", "rw", "nosuid", "nodev", "noexec"],
        }
    ]
    assert "ROSE_AGENT_SOCKET=/run/rose/claims/uid-l0/workload.sock" in spec["containerEdits"]["env"]
    serving = json.loads((tmp_path / "cdi" / cdi.spec_filename("uid-s1")).read_text())
    assert "mounts" not in serving["containerEdits"]  # serving claims get no agent socket
    sock = host_dir / "workload.sock"
    with pytest.raises(grpc.RpcError) as ei:
        _register(sock, "uid-someone-else", pod_namespace="kube-system", pod_name="coredns")
    assert ei.value.code() == grpc.StatusCode.PERMISSION_DENIED and "reservedFor" in ei.value.details()
    assert _register(sock, "pod-rl-0", pod_namespace="kube-system", pod_name="coredns").session_id
    w = agent.engine.registry.get("pod-rl-0")
    assert w is not None and (w.reg.pod_namespace, w.reg.pod_name, w.reg.claim_uids) == (
        NS,
        "rl-0",
        frozenset({"uid-l0"}),
    )
    # bounded by the claim's GPU memory: a workload cannot claim more state than its devices hold
    gpu_mem = driver.gpus[0].info.memory_bytes
    with pytest.raises(grpc.RpcError) as ei:
        _register(sock, "pod-rl-0", state_bytes=gpu_mem + 1)
    assert ei.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert driver.unprepare([REF_L0])["uid-l0"] == ""
    assert not sock.exists() and agent.claims.claims() == []


def test_recovery_reopens_the_sockets_of_prepared_claims(tmp_path: Path) -> None:
    engine = build_engine(EngineConfig(host_memory_budget_bytes=1 << 30), metrics_registry=CollectorRegistry())
    root = tmp_path / "p" / "claims"
    a1 = AgentServer(engine, None, tmp_path / "agent" / "c.sock", claim_socket_root=root)
    d1 = make_driver(tmp_path, StaticClaims([L0]), engine, workload_sockets=a1.claims)
    d1.recover()
    assert d1.prepare([REF_L0])["uid-l0"].error == ""
    d1.close()
    a1.stop(0)  # the driver process is gone: its sockets with it
    assert not (root / "uid-l0" / "workload.sock").exists()
    a2 = AgentServer(engine, None, tmp_path / "agent" / "c.sock", claim_socket_root=root)
    d2 = make_driver(tmp_path, StaticClaims([L0]), engine, workload_sockets=a2.claims)
    try:
        d2.recover()
        assert a2.claims.claims() == ["uid-l0"]
        assert _register(root / "uid-l0" / "workload.sock", "pod-rl-0").session_id
    finally:
        d2.close()
        a2.stop(0)


def test_lock_timeout_is_a_per_claim_error_not_an_exception(tmp_path: Path) -> None:
    driver = make_driver(tmp_path, StaticClaims([L0, S1]), None, lock_timeout_seconds=0.3)
    lock = tmp_path / "state" / "checkpoint.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys,time; from filelock import FileLock; l=FileLock(sys.argv[1]); l.acquire();"
            " print('held', flush=True); time.sleep(60)",
            str(lock),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        out = driver.prepare([REF_L0, REF_S1])
        assert set(out) == {"uid-l0", "uid-s1"}
        assert all("lock" in o.error and "kubelet retries" in o.error for o in out.values()), out
        un = driver.unprepare([REF_L0])
        assert "lock" in un["uid-l0"]
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()
        driver.close()
    assert driver.prepare([REF_S1])["uid-s1"].error == ""  # the lock is free again


def test_full_disk_leaves_no_torn_temp_file_and_prepare_reports_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = make_driver(tmp_path, StaticClaims([L0, S1]), None)
    driver.recover()
    assert driver.prepare([REF_S1])["uid-s1"].error == ""
    from rose_common import atomic

    real_write = os.write

    def full(fd: int, data: bytes | memoryview) -> int:
        real_write(fd, bytes(data)[: len(data) // 2])  # part of it lands, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "write", full)
    out = driver.prepare([REF_L0])
    monkeypatch.undo()
    assert "No space left" in out["uid-l0"].error
    for d in (tmp_path / "state", tmp_path / "cdi"):
        assert [p.name for p in d.iterdir() if ".tmp-" in p.name] == []
    assert driver.prepare([REF_L0])["uid-l0"].error == ""  # and the node recovers once there is space
    driver.close()

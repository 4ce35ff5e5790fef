"""Fixtures of the agent/SDK tests. The workload they run as a real subprocess is
``examples/01_cartpole_reinforce.py`` (REINFORCE on a NumPy CartPole, rose_sdk safe points)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "01_cartpole_reinforce.py"  # the RL workload these tests run


# ---------------------------------------------------------------------- helpers for the tests


@dataclass
class WorkloadProc:
    proc: subprocess.Popen[str]
    out: Path

    def wait_ready(self, timeout: float = 60.0) -> int:
        """The step of the workload's ``READY <step>`` line."""
        return int(self.wait_line("READY ", timeout).split()[0])

    def wait_line(self, prefix: str, timeout: float = 90.0) -> str:
        """The next stdout line starting with ``prefix`` (its remainder)."""
        assert self.proc.stdout is not None
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
        raise AssertionError(f"no {prefix!r} line from the workload; rc={self.proc.poll()}")

    def finish(self, timeout: float = 120.0) -> str:
        out, _ = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, f"workload failed rc={self.proc.returncode}: {out[-3000:]}"
        return out


def start_workload(
    tmp: Path,
    name: str,
    *,
    socket: Path | None,
    pod_uid: str = "",
    extra: list[str] | None = None,
    namespace: str = "rl",
    script: Path = SCRIPT,
    env_extra: dict[str, str] | None = None,
    argv_prefix: list[str] | None = None,
) -> WorkloadProc:
    out = tmp / f"{name}.pt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROSE_")}
    env.update(env_extra or {})
    env["PYTHONPATH"] = str(REPO)
    if socket is not None:
        env["ROSE_AGENT_SOCKET"] = str(socket)
        env["ROSE_POD_UID"] = pod_uid
        env["ROSE_POD_NAMESPACE"] = namespace
        env["ROSE_POD_NAME"] = name
    proc = subprocess.Popen(
        [*(argv_prefix or []), sys.executable, str(script), "--out", str(out), *(extra or [])],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return WorkloadProc(proc, out)


@contextlib.contextmanager
def reaped(*procs: WorkloadProc) -> Iterator[None]:
    """Kill any workload subprocess still running when the test ends (only ours)."""
    try:
        yield
    finally:
        for w in procs:
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait(timeout=10)
            if w.proc.stdout is not None:
                w.proc.stdout.close()


class RecordingEvictor:
    """Stands in for the driver's API eviction: records the pod and kills the workload process."""

    def __init__(self) -> None:
        self.evicted: list[tuple[str, str]] = []
        self.pods: list[object] = []
        self.engine: object = None

    def evict(self, pod: object, reason: str) -> None:
        from dra_driver.suspend.registry import TrustedPod

        assert isinstance(pod, TrustedPod)
        self.evicted.append((pod.uid, reason))
        self.pods.append(pod)
        w = self.engine.registry.get(pod.uid) if self.engine is not None else None  # type: ignore[attr-defined]
        if w is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.reg.pid, 9)


@dataclass
class Agent:
    engine: object
    server: object
    events: object
    evictor: RecordingEvictor
    workload_socket: Path
    control_socket: Path
    channel: object
    control: object

    def claim_socket(
        self, claim_uid: str, pod_uid: str, *, namespace: str = "rl", name: str = "", max_state_bytes: int = 1 << 40
    ) -> Path:
        """Open claim ``claim_uid``'s own workload socket for pod ``pod_uid`` (as the driver does
        at prepare time) and return the socket's path."""
        from dra_driver.claims import PodRef

        d = self.server.claims.open_claim(  # type: ignore[attr-defined]
            claim_uid, [PodRef(namespace, name or pod_uid, pod_uid)], max_state_bytes
        )
        return Path(d) / "workload.sock"


def workload_pids(pod_uid: str, reported_pid: int) -> int | None:
    """Stands in for ``pids.resolve_pid`` (a pod cgroup naming the pod UID): the tests' workloads
    are plain processes in the test's own PID namespace, so the PID they report is theirs."""
    return reported_pid if pod_uid else None


def checkpoint_verifier(checkpoint_prefix: str, **limits: Any) -> Any:
    """The fallback's real checkpoint verifier; every test pod's job checkpoints under
    ``checkpoint_prefix`` (what the driver reads from the pod's ROSE_CHECKPOINT_PATH)."""
    from dra_driver.suspend.verify import CheckpointVerifier, StaticCheckpointPaths, VerifyLimits

    return CheckpointVerifier(
        VerifyLimits(**limits), paths=StaticCheckpointPaths(default=checkpoint_prefix), resolve_pid=workload_pids
    )


@contextlib.contextmanager
def running_agent(tmp: Path, verifier: Any = None, **config: object) -> Iterator[Agent]:
    """The real node agent (control socket, a shared workload socket, per-claim sockets under
    ``tmp/claims``) in this process; fallback checkpoints verify under ``tmp``."""
    import grpc
    from prometheus_client import CollectorRegistry

    from dra_driver.agent.server import AgentServer
    from dra_driver.suspend.engine import EngineConfig
    from dra_driver.suspend.events import RecordingEventSink
    from dra_driver.suspend.factory import build_engine
    from rose_common.proto import rose_agent_v1_pb2_grpc as pb_grpc

    cfg = {"host_memory_budget_bytes": 1 << 30, "backends": ("cooperative",), "node_name": "rose-node-0"}
    cfg.update(config)
    events = RecordingEventSink()
    evictor = RecordingEvictor()
    engine = build_engine(
        EngineConfig(**cfg),  # type: ignore[arg-type]
        events=events,
        evictor=evictor,
        metrics_registry=CollectorRegistry(),
        verifier=verifier if verifier is not None else checkpoint_verifier(str(tmp)),
        pid_resolver=workload_pids,
    )
    evictor.engine = engine
    ws, cs = tmp / "w.sock", tmp / "c.sock"
    server = AgentServer(engine, ws, cs, claim_socket_root=tmp / "claims", max_workers=16)
    server.start()
    channel = grpc.insecure_channel(f"unix:{cs}")
    try:
        yield Agent(engine, server, events, evictor, ws, cs, channel, pb_grpc.NodeControlStub(channel))
    finally:
        channel.close()
        server.stop(0)


def wait_registered(engine: object, pod_uid: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        w = engine.registry.get(pod_uid)  # type: ignore[attr-defined]
        if w is not None and w.connected:
            return
        time.sleep(0.05)
    raise AssertionError(f"workload {pod_uid} did not register and connect within {timeout}s")

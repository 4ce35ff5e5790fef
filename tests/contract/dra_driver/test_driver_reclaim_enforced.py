"""Serving wins, enforced (ARCHITECTURE §9): the real driver decides from what it observes.

The kubelet's side calls the real DRA plugin over unix sockets; the driver runs the real suspend
engine and node agent (claim sockets under ``tmp/claims``) and observes each lent claim's
simulated device memory (``dra_driver.suspend.devicewatch``) through the kernel. The lent
workloads are real processes: hostile ones (``tests/support/enforce_hostile.py``: registered as
SUSPENDED while computing, acknowledging without freeing, never registering, steering to the
``simulated`` backend) and the honest example trainer with ``rose_sdk``. Pods come from an
in-memory stand-in for the API server, evictions go to a recording stand-in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dra_driver.claims import PodRef
from dra_driver.enforce import Enforcer
from dra_driver.plugin import start_plugin
from dra_driver.suspend.devicewatch import SimulatedDeviceMemory
from tests.support.agent_fixtures import REPO, reaped, running_agent, start_workload
from tests.support.driver_fixtures import RecordingNotifier, StaticClaims, make_claim, make_driver
from tests.support.kubelet_grpc import Kubelet

L0 = make_claim("uid-l0", "l0", [("gpu", "gpu-0-lendable")], pod=("rl-0", "pod-rl-0"))
S0 = make_claim("uid-s0", "s0", [("gpu", "gpu-0-serving")])
GRACE, SLACK, ENFORCE = 1.0, 0.5, 5.0
HOSTILE = REPO / "tests" / "support" / "enforce_hostile.py"


class RecordingPodEvictor:
    def __init__(self) -> None:
        self.evicted: list[PodRef] = []

    def evict(self, pod: PodRef, reason: str) -> None:
        self.evicted.append(pod)


@dataclass
class Node:
    kubelet: Kubelet
    driver: Any
    agent: Any
    notifier: RecordingNotifier
    evictor: RecordingPodEvictor
    claims_root: Path

    def device_memory(self, claim_uid: str = "uid-l0") -> Path:
        return self.claims_root / claim_uid / "device-memory"

    def resident(self, claim_uid: str = "uid-l0") -> int:
        return os.stat(self.device_memory(claim_uid)).st_blocks * 512

    def env(self, claim_uid: str = "uid-l0") -> dict[str, str]:
        """The lent claim's container env from its CDI spec, with container paths mapped to the host."""
        spec = json.loads((self.driver.cdi_dir / f"gpu.rose.io-gpu_{claim_uid}.json").read_text())
        env = dict(e.split("=", 1) for e in spec["containerEdits"]["env"])
        return {k: v.replace("/run/rose/claims", str(self.claims_root)) for k, v in env.items()}

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        v = self.driver.metrics.registry.get_sample_value(name, labels or {})
        return 0.0 if v is None else float(v)


@pytest.fixture
def node(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Node]:
    kill = getattr(request, "param", {}).get("kill", os.kill)
    allow = getattr(request, "param", {}).get("allow", False)
    budget = getattr(request, "param", {}).get("budget", 1 << 30)
    with running_agent(
        tmp_path,
        backends=("cooperative", "simulated"),
        checkpoint_timeout_seconds=2.0 * ENFORCE,
        host_memory_budget_bytes=budget,
    ) as agent:
        evictor = RecordingPodEvictor()
        claims_root = tmp_path / "claims"
        watch = SimulatedDeviceMemory(claims_root, ledger=agent.engine.simulated_resident_bytes)
        notifier = RecordingNotifier()
        driver = make_driver(
            tmp_path,
            StaticClaims([L0, S0]),
            agent.engine,
            notifier,
            default_grace_seconds=GRACE,
            grace_slack_seconds=SLACK,
            workload_sockets=agent.server.claims,
            enforcer=Enforcer(watch, timeout_seconds=ENFORCE, evictor=evictor, kill=kill),
            allow_serving_on_occupied_device=allow,
        )
        driver.recover()
        servers = start_plugin(driver, tmp_path / "p", tmp_path / "r")
        k = Kubelet(servers.dra_socket, servers.registration_socket)
        try:
            assert k.prepare([L0]).claims["uid-l0"].error == ""
            yield Node(k, driver, agent, notifier, evictor, claims_root)
        finally:
            k.close()
            servers.stop()
            driver.close()


def start_hostile(node: Node, mode: str, *extra: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROSE_")}
    env.update(node.env(), ROSE_POD_UID="pod-rl-0", PYTHONPATH=str(REPO))
    cmd = [sys.executable, str(HOSTILE), "--mode", mode, *extra]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line.startswith("READY"), f"hostile workload did not start: {line!r} rc={p.poll()}"
    if mode != "never-registers":
        end = time.monotonic() + 20
        while node.agent.engine.registry.get("pod-rl-0") is None and time.monotonic() < end:
            time.sleep(0.05)
    return p


@pytest.mark.parametrize("mode", ["registered-suspended", "ack-without-freeing", "never-registers", "simulated-only"])
def test_a_workload_that_keeps_its_gpu_is_stopped_evicted_and_serving_gets_a_free_device(node: Node, mode: str) -> None:
    """Finding 1: whatever the workload says (SUSPENDED at registration, ok=True, nothing at all,
    only the simulated backend), the driver sees its device memory still resident after the
    cooperative phase, kills its processes, evicts its pod and prepares serving on a free device."""
    p = start_hostile(node, mode)
    try:
        assert node.resident() >= 4 << 20
        t0 = time.monotonic()
        resp = node.kubelet.prepare([S0])
        waited = time.monotonic() - t0
        assert resp.claims["uid-s0"].error == ""
        assert waited < GRACE + SLACK + 2 * ENFORCE + 1, waited  # the documented bound
        assert p.wait(timeout=5) == -9  # killed at the deadline
        assert node.resident() == 0  # observed free before serving was prepared
        assert [(e.namespace, e.name, e.uid) for e in node.evictor.evicted] == [("ml", "rl-0", "pod-rl-0")]
        assert node.driver.snapshot().suspensions["uid-l0"].state == "EnforcedEvicted"
        assert ("rl-0", "ReclaimEnforced", True) in node.notifier.events
        assert node.metric("rose_driver_gpu_returned_seconds_count", {"phase": "enforced"}) == 1
        assert node.metric("rose_driver_gpu_returned_seconds_count", {"phase": "cooperative"}) == 0
        assert node.metric("rose_driver_reclaim_enforced_total", {"method": "kill", "result": "freed"}) == 1
        # serving leaves: nothing to resume (the pod is evicted), the record is gone
        assert node.kubelet.unprepare([S0]).claims["uid-s0"].error == ""
        assert "uid-l0" not in node.driver.snapshot().suspensions
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)
        if p.stdout is not None:
            p.stdout.close()


@pytest.mark.parametrize("node", [{"kill": lambda pid, sig: None}], indirect=True)
def test_serving_is_never_prepared_onto_an_occupied_device(node: Node) -> None:
    """A holder the driver cannot stop (here: its signals go nowhere) keeps the device occupied:
    the serving prepare is refused with a per-claim error (the kubelet retries), counted."""
    p = start_hostile(node, "ack-without-freeing")
    try:
        resp = node.kubelet.prepare([S0])
        assert "serving is not prepared onto an occupied device" in resp.claims["uid-s0"].error
        assert p.poll() is None and node.resident() >= 4 << 20
        assert node.metric("rose_driver_serving_refused_occupied_total") == 1
        assert node.metric("rose_driver_reclaim_enforced_total", {"method": "kill", "result": "not_freed"}) == 1
        assert ("rl-0", "ReclaimNotFreed", True) in node.notifier.events
        assert node.metric("rose_driver_gpu_returned_seconds_count", {"phase": "enforced"}) == 0
    finally:
        p.kill()
        p.wait(timeout=10)
        if p.stdout is not None:
            p.stdout.close()


@pytest.mark.parametrize("node", [{"kill": lambda pid, sig: None, "allow": True}], indirect=True)
def test_the_operator_override_lets_serving_onto_an_occupied_device_counted_and_evented(node: Node) -> None:
    p = start_hostile(node, "never-registers")
    try:
        assert node.kubelet.prepare([S0]).claims["uid-s0"].error == ""
        assert node.metric("rose_driver_serving_on_occupied_device_total") == 1
        assert ("rl-0", "ServingOnOccupiedDevice", True) in node.notifier.events
    finally:
        p.kill()
        p.wait(timeout=10)
        if p.stdout is not None:
            p.stdout.close()


def test_an_honest_sdk_workload_frees_its_device_cooperatively_and_loses_nothing(node: Node, tmp_path: Path) -> None:
    """The example trainer (rose_sdk) holds its state in the simulated device memory while it runs,
    frees it at its safe point when suspended (cooperative phase: nobody is killed or evicted) and
    holds it again once resumed; the training finishes."""
    env = node.env()
    w = start_workload(
        tmp_path,
        "rl-0",
        socket=Path(env["ROSE_AGENT_SOCKET"]),
        pod_uid="pod-rl-0",
        namespace="ml",
        extra=["--updates", "20", "--suspend-points", "1", "--linger-seconds", "0"],
        env_extra={"ROSE_SIMULATED_DEVICE_MEMORY": env["ROSE_SIMULATED_DEVICE_MEMORY"]},
    )
    with reaped(w):
        w.wait_ready()
        end = time.monotonic() + 20
        while node.resident() == 0 and time.monotonic() < end:
            time.sleep(0.05)
        assert node.resident() > 0  # resident while it trains
        assert node.kubelet.prepare([S0]).claims["uid-s0"].error == ""
        assert node.resident() == 0 and w.proc.poll() is None and node.evictor.evicted == []
        assert node.driver.snapshot().suspensions["uid-l0"].state == "Suspended"
        assert node.metric("rose_driver_gpu_returned_seconds_count", {"phase": "cooperative"}) == 1
        assert node.metric("rose_driver_gpu_returned_seconds_count", {"phase": "enforced"}) == 0
        assert node.kubelet.unprepare([S0]).claims["uid-s0"].error == ""
        assert node.resident() > 0  # resumed: its state is on the device again
        w.finish()


@pytest.mark.parametrize("node", [{"budget": 1 << 20}], indirect=True)
def test_an_honest_fallback_checkpoint_still_being_written_at_the_deadline_is_waited_for(
    node: Node, tmp_path: Path
) -> None:
    """The host budget refuses the suspend, so the engine asks at once for the durable checkpoint;
    the workload writes it slowly, finishing after grace + slack. The driver gives that checkpoint
    the enforcement's bound instead of killing the process under it: nothing is lost (phase
    fallback), the pod is evicted by the engine after the checkpoint is verified."""
    ck = tmp_path / "slow.rose"
    delay = GRACE + SLACK + 1.0
    p = start_hostile(node, "slow-checkpoint", "--checkpoint", str(ck), "--checkpoint-delay", str(delay))
    try:
        assert node.kubelet.prepare([S0]).claims["uid-s0"].error == ""
        assert ck.exists() and node.resident() == 0
        assert node.driver.snapshot().suspensions["uid-l0"].state == "CheckpointedEvicted"
        assert [pod for pod, _ in node.agent.evictor.evicted] == ["pod-rl-0"]  # after the checkpoint verified
        assert node.metric("rose_driver_gpu_returned_seconds_count", {"phase": "fallback"}) == 1
        assert node.metric("rose_driver_gpu_returned_seconds_count", {"phase": "enforced"}) == 0
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)
        if p.stdout is not None:
            p.stdout.close()

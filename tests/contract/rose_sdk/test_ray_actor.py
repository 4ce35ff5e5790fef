"""A Ray actor registered with the real node agent (``rose_sdk.integrations.ray``), suspended and
resumed through NodeControl, its state intact.

A local Ray on the CPU (``ray`` from PyPI, one CPU, no dashboard) runs an actor that holds a small
torch model. The actor gets its pod's ``ROSE_*`` environment through ``actor_env`` (in a KubeRay pod
it inherits it) and registers on its claim's socket. The test suspends it while it is idle (the
helper's idle thread runs the command), checks a call made meanwhile waits, resumes it, and checks
the model equals the same updates applied without a suspend, bit for bit.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import torch

from rose_common.proto import rose_agent_v1_pb2 as pb
from rose_sdk.integrations.ray import actor_env
from tests.support import ray_policy
from tests.support.agent_fixtures import REPO, running_agent, wait_registered

NBYTES = (ray_policy.SIZE**2 + ray_policy.SIZE) * 4  # the Linear's weight and bias, float32


@pytest.fixture(scope="module")
def local_ray() -> Iterator[float]:
    t0 = time.monotonic()
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    started = time.monotonic() - t0
    try:
        yield started
    finally:
        ray.shutdown()


def _reference(steps: int) -> dict[str, torch.Tensor]:
    m = ray_policy.new_model()
    ray_policy.update(m, steps)
    return {k: v.clone() for k, v in m.state_dict().items()}


def test_ray_actor_is_suspended_and_resumed_through_its_node_agent(
    tmp_path: Path, local_ray: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_agent(tmp_path) as agent:
        sock = agent.claim_socket("claim-ray", "uid-ray", name="ray-worker-0")
        for k in [k for k in os.environ if k.startswith("ROSE_")]:
            monkeypatch.delenv(k)
        env = {
            "ROSE_AGENT_SOCKET": str(sock),
            "ROSE_POD_UID": "uid-ray",
            "ROSE_POD_NAMESPACE": "rl",
            "ROSE_POD_NAME": "ray-worker-0",
            "ROSE_CLAIM_UID_claim-ray": "claim-ray",
        }
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        opts = actor_env({"PYTHONPATH": str(REPO)})
        assert opts["env_vars"] == {**env, "PYTHONPATH": opts["env_vars"]["PYTHONPATH"]}
        assert opts["env_vars"]["ROSE_AGENT_SOCKET"] == str(sock)
        actor: Any = ray.remote(num_cpus=1)(ray_policy.Policy).options(runtime_env=opts).remote()
        try:
            pid = ray.get(actor.update.remote(3), timeout=60)
            assert pid != os.getpid()  # the actor runs in a Ray worker process
            wait_registered(agent.engine, "uid-ray")
            st = agent.control.Status(pb.StatusRequest(pod_uid="uid-ray")).workloads[0]
            assert st.connected and st.state_bytes == NBYTES
            assert ray.get(actor.status.remote(), timeout=30)[:2] == (True, False)

            op = agent.control.Suspend(pb.SuspendRequest(pod_uid="uid-ray", grace_seconds=30, reason="serving"))
            assert op.state == pb.OPERATION_STATE_SUCCEEDED, op.message
            assert op.backend == pb.BACKEND_COOPERATIVE and op.bytes_moved == NBYTES
            st = agent.control.Status(pb.StatusRequest(pod_uid="uid-ray")).workloads[0]
            assert st.state == pb.WORKLOAD_STATE_SUSPENDED
            pending = actor.update.remote(2)  # made while suspended: waits for the resume
            ready, _ = ray.wait([pending], timeout=1.0)
            assert not ready

            op = agent.control.Resume(pb.ResumeRequest(pod_uid="uid-ray"))
            assert op.state == pb.OPERATION_STATE_SUCCEEDED, op.message
            assert ray.get(pending, timeout=60) == pid
            assert ray.get(actor.status.remote(), timeout=30) == (True, False, 1, 1)
            state = ray.get(actor.state.remote(), timeout=30)
            ref = _reference(5)
            assert state.keys() == ref.keys()
            assert all(torch.equal(state[k], ref[k]) for k in ref)  # state intact, bit for bit
            ray.get(actor.close.remote(), timeout=30)
        finally:
            ray.kill(actor)
        assert agent.events.reasons() == ["Suspended", "Resumed"]
    print(f"local Ray started in {local_ray:.1f} s")

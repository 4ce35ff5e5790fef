"""Training is unharmed: REINFORCE on CartPole, suspended and resumed 6 times through the
cooperative backend over the real agent socket, ends bit-identical to an uninterrupted run.

The suspended run is the example under ``tests/support/next_tenant_workload.py``: while it is suspended,
the memory its tensors used is overwritten with NaN bytes (the GPU's next tenant), and every
parameter, gradient, optimizer state and registered tensor must have left that memory."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from rose_common.proto import rose_agent_v1_pb2 as pb
from rose_sdk import tensors_equal
from tests.support.agent_fixtures import REPO, reaped, running_agent, start_workload, wait_registered

CYCLES = 6
UPDATES = 42
NEXT_TENANT = REPO / "tests" / "support" / "next_tenant_workload.py"
# the example's tensors: 4 parameters, their 4 gradients, Adam's step/exp_avg/exp_avg_sq of each,
# the registered replay buffer
JOB_TENSORS = {"param": 4, "grad": 4, "optim": 12, "tensor": 1}


def test_training_unharmed_by_six_suspend_resume_cycles(tmp_path: Path) -> None:
    args = ["--updates", str(UPDATES), "--seed", "11"]
    report = tmp_path / "next-tenant.json"
    with running_agent(tmp_path) as agent:
        suspended = start_workload(
            tmp_path,
            "suspended",
            socket=agent.claim_socket("claim-uid-rl", "uid-rl"),
            pod_uid="uid-rl",
            extra=[*args, "--suspend-points", str(CYCLES), "--report", str(report)],
            script=NEXT_TENANT,
        )
        baseline = start_workload(tmp_path, "baseline", socket=None, extra=args)
        with reaped(suspended, baseline):
            suspended.wait_ready()
            wait_registered(agent.engine, "uid-rl")
            ops = []
            for _ in range(CYCLES):
                op = agent.control.Suspend(pb.SuspendRequest(pod_uid="uid-rl", grace_seconds=60))
                assert op.state == pb.OPERATION_STATE_SUCCEEDED and not op.fallback, op.message
                st = agent.control.Status(pb.StatusRequest(pod_uid="uid-rl"))
                assert st.workloads[0].state == pb.WORKLOAD_STATE_SUSPENDED
                assert st.host_bytes_held == op.bytes_moved > 0
                time.sleep(0.02)
                res = agent.control.Resume(pb.ResumeRequest(pod_uid="uid-rl"))
                assert res.state == pb.OPERATION_STATE_SUCCEEDED, res.message
                assert res.bytes_moved == op.bytes_moved
                ops.append((op, res))
            out = suspended.finish()
            baseline.finish()
    assert f"suspends={CYCLES} resumes={CYCLES}" in out
    # every tensor of the job left its memory at every suspend, and that memory was overwritten
    records = json.loads(report.read_text())["suspends"]
    assert [r["checked"] for r in records] == [JOB_TENSORS] * CYCLES
    assert [r["stayed"] for r in records] == [[]] * CYCLES
    # The host arena is reused after the first cycle (pinned-buffer reuse; here plain host memory).
    assert [("arena reused: True" in op.message) for op, _ in ops] == [False] + [True] * (CYCLES - 1)
    a = torch.load(suspended.out, weights_only=True)
    b = torch.load(baseline.out, weights_only=True)
    assert a["lengths"] == b["lengths"]
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    assert tensors_equal(a["optimizer"], b["optimizer"])
    assert len(a["optimizer"]["state"]) == 4  # Adam moments of every parameter were compared
    assert torch.equal(a["replay"], b["replay"]) and torch.equal(a["rng"], b["rng"])
    # and the run actually learned something (the comparison is not between two no-ops)
    assert max(a["lengths"][-10:]) > max(a["lengths"][:5])

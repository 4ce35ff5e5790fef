"""TRL's real GRPOTrainer on ROSE (``rose_sdk.integrations.transformers``), through the real node agent.

The workload is ``tests/support/trl_workload.py``: GRPO on a tiny 2-layer Qwen2 model built from a config,
generating in-process on the CPU, with ``num_iterations=2`` so that TRL's buffered generations
outlive the optimizer step where the suspends land, and ``beta=0.04`` so that TRL keeps a
reference model. The suspended run simulates the GPU's next
tenant (``tests/support/next_tenant.py``): while it is parked, the storage of every tensor of the job
(enumerated by the workload, not by the integration) is overwritten with NaN bytes, every RNG is
drawn from, the LR scheduler is stepped and the learning rate overwritten — and the run must still
end bit-identical to an uninterrupted one. ``--skip`` leaves one piece out of the integration;
``test_a_missing_piece_is_caught`` shows the comparison then fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from rose_common.proto import rose_agent_v1_pb2 as pb
from rose_sdk import load_checkpoint, tensors_equal
from tests.support.agent_fixtures import REPO, WorkloadProc, reaped, running_agent, start_workload, wait_registered

WORKLOAD = REPO / "tests" / "support" / "trl_workload.py"
STEPS = 6
# The suspends land at the safe point after each gate: steps 3 and 5, odd steps, where (with
# num_iterations=2) TRL's buffered generations are still to be trained on at the next step.
GATES = (2, 4)


class _Died(AssertionError):
    """The workload exited while the test waited for it."""


def _await(w: WorkloadProc, prefix: str, seen: list[str]) -> str:
    assert w.proc.stdout is not None
    for line in w.proc.stdout:
        seen.append(line)
        if line.startswith(prefix):
            return line
    raise _Died(f"workload exited before {prefix!r}: rc={w.proc.wait()}; {''.join(seen)[-3000:]}")


def _cycle(agent: Any, w: WorkloadProc, gate: Path) -> tuple[Any, Any]:
    """Ask for a suspend, open the gate (it lands at the next step's safe point), check, resume."""
    pending = agent.control.Suspend(pb.SuspendRequest(pod_uid="uid-grpo", grace_seconds=60, no_wait=True))
    gate.touch()
    op = pending
    end = time.monotonic() + 60
    while op.state in (pb.OPERATION_STATE_PENDING, pb.OPERATION_STATE_RUNNING):
        if w.proc.poll() is not None:
            raise _Died(f"workload exited (rc={w.proc.returncode}) before its suspend")
        assert time.monotonic() < end, "the suspend never completed"
        time.sleep(0.02)
        op = agent.control.GetOperation(pb.GetOperationRequest(operation_id=pending.id))
    assert op.state == pb.OPERATION_STATE_SUCCEEDED and not op.fallback, op.message
    st = agent.control.Status(pb.StatusRequest(pod_uid="uid-grpo"))
    assert st.workloads[0].state == pb.WORKLOAD_STATE_SUSPENDED
    assert st.host_bytes_held == op.bytes_moved > 0
    time.sleep(0.05)
    res = agent.control.Resume(pb.ResumeRequest(pod_uid="uid-grpo"))
    assert res.state == pb.OPERATION_STATE_SUCCEEDED, res.message
    assert res.bytes_moved == op.bytes_moved
    return op, res


def _suspended_run(
    tmp: Path, extra: list[str], *, may_fail: bool = False, env: dict[str, str] | None = None
) -> tuple[dict[str, Any] | None, list[tuple[Any, Any]], Path, str]:
    """The workload with the next tenant, suspended and resumed once at each gate through the agent;
    (its results, or None when it failed and ``may_fail``; the operations; the report; its output)."""
    report = tmp / "next-tenant.json"
    ops: list[tuple[Any, Any]] = []
    with running_agent(tmp) as agent:
        w = start_workload(
            tmp,
            "grpo",
            socket=agent.claim_socket("claim-grpo", "uid-grpo"),
            pod_uid="uid-grpo",
            script=WORKLOAD,
            extra=[
                "--max-steps",
                str(STEPS),
                "--gate-dir",
                str(tmp),
                "--gates",
                ",".join(map(str, GATES)),
                "--next-tenant",
                str(report),
                *extra,
            ],
            env_extra=env,
        )
        seen: list[str] = []
        with reaped(w):
            w.wait_ready(timeout=120)
            wait_registered(agent.engine, "uid-grpo")
            try:
                for gate in GATES:
                    _await(w, f"GATE {gate}", seen)
                    ops.append(_cycle(agent, w, tmp / f"go-{gate}"))
            except _Died:
                if not may_fail:
                    raise
            rest, _ = w.proc.communicate(timeout=300)
            out = "".join(seen) + rest
            if w.proc.returncode != 0:
                assert may_fail, f"workload failed rc={w.proc.returncode}: {out[-3000:]}"
                return None, ops, report, out
    assert f"suspends={len(GATES)} resumes={len(GATES)}" in out, out[-3000:]
    return torch.load(w.out, weights_only=False), ops, report, out


def _baseline(tmp: Path, extra: list[str] | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:
    w = start_workload(
        tmp, "baseline", socket=None, script=WORKLOAD, extra=["--max-steps", str(STEPS), *(extra or [])], env_extra=env
    )
    with reaped(w):
        w.finish(timeout=300)
    return torch.load(w.out, weights_only=False)


def _identical(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The parts of two runs that differ (empty: bit-identical)."""
    differ = [f"model:{k}" for k in a["model"] if not torch.equal(a["model"][k], b["model"][k])]
    if not tensors_equal(a["optimizer"], b["optimizer"]):
        differ.append("optimizer")
    if a["scheduler"] != b["scheduler"]:
        differ.append("scheduler")
    if not tensors_equal(a["rng"], b["rng"]):
        differ.append("rng")
    if a["losses"] != b["losses"]:
        differ.append("losses")
    return differ


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted run (no agent), shared by the tests of this module."""
    return _baseline(tmp_path_factory.mktemp("baseline"))


def test_grpo_suspended_mid_training_ends_bit_identical(tmp_path: Path, baseline: dict[str, Any]) -> None:
    base = baseline
    run, ops, report, _ = _suspended_run(tmp_path, [])
    assert run is not None
    assert _identical(run, base) == []
    assert len(run["losses"]) == STEPS and run["global_step"] == STEPS
    assert len(base["optimizer"]["state"]) > 0  # Adam's moments were compared
    # every tensor of the job left its storage at each suspend, and that storage was overwritten
    records = json.loads(report.read_text())["suspends"]
    assert len(records) == len(GATES)
    for r in records:
        assert r["stayed"] == []
        assert r["checked"]["param"] > 0 and r["checked"]["optim"] > 0
        # the accumulated loss, TRL's reference model (26 parameters) and buffered generations
        assert r["checked"]["tensor"] > 1 + 26
    # the parameters, Adam's moments and the buffered generations: more than the model alone
    # (lm_head.weight is tied to the embedding: one tensor)
    params = sum(v.numel() * v.element_size() for k, v in base["model"].items() if k != "lm_head.weight")
    assert all(op.bytes_moved > 3 * params for op, _ in ops)


# Example 02's trainer role: TRL takes its completions from the rollout service (rollout workers as
# threads of the trainer's process), not from in-process generation.
ROLLOUT = ["--rollout-service", "--rollout-threads", "2"]
ROLLOUT_ENV = {"ROSE_ROLLOUT_TOKEN": "test-token-0123456789abcdef"}


@pytest.mark.slow
def test_trainer_role_suspended_mid_training_ends_bit_identical(tmp_path: Path) -> None:
    """The trainer of an elastic job (its completions from rollout workers) suspended at steps 3 and
    5 through the agent with the next tenant, vs the same trainer uninterrupted."""
    (tmp_path / "base").mkdir()
    base = _baseline(tmp_path / "base", ROLLOUT, ROLLOUT_ENV)
    run, ops, report, out = _suspended_run(tmp_path, ROLLOUT, env=ROLLOUT_ENV)
    assert run is not None
    assert _identical(run, base) == []
    assert len(run["losses"]) == STEPS
    assert '"duplicate": 0' in out and '"accepted": 24' in out, out[-2000:]  # 3 generations x 8 completions
    records = json.loads(report.read_text())["suspends"]
    assert len(records) == len(GATES) and all(r["stayed"] == [] for r in records)
    assert all(op.bytes_moved > 0 for op, _ in ops)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("piece", "differ"),
    [
        ("rng", "rng"),  # the RNGs drawn from while parked are not put back
        ("scheduler", "scheduler"),  # the LR scheduler stepped and the learning rate overwritten while parked
        ("optimizer", "optimizer"),  # Adam's moments stay in the storage the next tenant overwrites
        ("buffered", "model:"),  # TRL's buffered generations too (the step after the suspend trains on NaN)
        ("ref_model", "model:"),  # TRL's reference model (the KL term turns NaN)
    ],
)
def test_a_missing_piece_is_caught(tmp_path: Path, baseline: dict[str, Any], piece: str, differ: str) -> None:
    run, _, _, out = _suspended_run(tmp_path, ["--skip", piece], may_fail=True)
    if run is None:  # the training itself failed on the garbage (NaN weights, token ids of -1)
        assert "Traceback" in out and "_inner_training_loop" in out, out[-3000:]
        return
    found = _identical(run, baseline)
    assert any(d.startswith(differ) for d in found), found


def _run(tmp: Path, name: str, env: dict[str, str], extra: list[str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ROSE_")}
    return subprocess.run(
        [sys.executable, str(WORKLOAD), "--out", str(tmp / f"{name}.pt"), "--max-steps", str(STEPS), *extra],
        env={**clean, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_lost_worker_resumes_from_the_trainer_checkpoint_bit_identical(
    tmp_path: Path, baseline: dict[str, Any]
) -> None:
    """ROSE_CHECKPOINT_EVERY=2 writes the trainer's own checkpoint at step 2 (and the ROSE file
    naming it); the worker dies; its replacement (ROSE_RESTORE=latest) resumes with
    ``resume_from_checkpoint`` and ends bit-identical to an uninterrupted run. (Step 2: with
    num_iterations=2 TRL's buffered generations are used up there; the trainer's checkpoint does
    not hold them, so a checkpoint at an odd step resumes with regenerated ones.)"""
    ckpt = tmp_path / "ckpt" / "grpo.rose"
    base = baseline
    lost = _run(
        tmp_path, "lost", {"ROSE_CHECKPOINT_EVERY": "2"}, ["--checkpoint", str(ckpt), "--exit-after-checkpoint"]
    )
    assert lost.returncode == 3 and "CHECKPOINTED 2" in lost.stdout, lost.stdout[-3000:] + lost.stderr[-3000:]
    manifest = load_checkpoint(ckpt).user_state
    trainer_dir = Path(manifest["trainer_checkpoint"])
    assert manifest["global_step"] == 2 and trainer_dir.name == "checkpoint-2"
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"} <= set(manifest["files"])
    again = _run(tmp_path, "again", {"ROSE_RESTORE": "latest"}, ["--checkpoint", str(ckpt)])
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"RESUMING {trainer_dir}" in again.stdout
    run = torch.load(tmp_path / "again.pt", weights_only=False)
    assert run["global_step"] == STEPS
    # the log history comes back from trainer_state.json, written at step 2's end before that step's
    # own log line: the resumed run's losses are steps 1, 3, 4, 5, 6
    assert run["losses"] == base["losses"][:1] + base["losses"][2:]
    assert _identical({**run, "losses": base["losses"]}, base) == []

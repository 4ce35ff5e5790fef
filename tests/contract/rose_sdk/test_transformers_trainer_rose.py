"""A plain Transformers ``Trainer`` (causal LM on digit strings, the tiny Qwen2 model of example 02)
on ROSE through ``rose_sdk.integrations.transformers.attach``, suspended and resumed through the real
node agent in this process (the agent's server and a control thread beside the training thread),
with the GPU's next tenant simulated (``tests/support/next_tenant.py``): bit-identical to an uninterrupted run;
and a world change sent through the agent changes its gradient accumulation."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples" / "02_grpo_tiny_llm"))

from rose_common import names
from rose_common.proto import rose_agent_v1_pb2 as pb
from rose_sdk import World
from tests.support.agent_fixtures import running_agent, wait_registered
from tests.support.next_tenant import NextTenant

STEPS = 6
SUSPEND_AFTER = 2  # the suspend is asked for after this step and lands at the next safe point


def _trainer(out: Path, samples: int = 32) -> Any:
    import tiny_grpo
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    tok = tiny_grpo.tokenizer()
    data = tiny_grpo.dataset(samples).map(lambda r: tok(r["prompt"] * 3), remove_columns=["prompt"])
    args = TrainingArguments(
        output_dir=str(out),
        use_cpu=True,
        max_steps=STEPS,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        learning_rate=1e-2,
        seed=3,
        data_seed=3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        lr_scheduler_type="linear",
    )
    return Trainer(
        model=tiny_grpo.model(3),
        args=args,
        train_dataset=data,
        data_collator=DataCollatorForLanguageModeling(tok, mlm=False),
    )


def _final(trainer: Any) -> dict[str, Any]:
    return {
        "model": {k: v.clone() for k, v in trainer.model.state_dict().items()},
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.lr_scheduler.state_dict(),
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
    }


@pytest.fixture
def no_rose_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("ROSE_AGENT_SOCKET", "ROSE_CHECKPOINT_PATH", "ROSE_CHECKPOINT_EVERY", "ROSE_RESTORE"):
        monkeypatch.delenv(k, raising=False)


def test_plain_trainer_suspended_through_the_agent_is_bit_identical(tmp_path: Path, no_rose_env: None) -> None:
    from transformers import TrainerCallback

    from rose_sdk import tensors_equal
    from rose_sdk.integrations.transformers import attach

    base_trainer = _trainer(tmp_path / "base")
    attach(base_trainer)  # no agent: safe points do nothing
    base_trainer.train()
    base = _final(base_trainer)

    with running_agent(tmp_path) as agent:
        trainer = _trainer(tmp_path / "run")
        sock = agent.claim_socket("claim-hf", "uid-hf")
        rose = attach(trainer, socket_path=str(sock), pod_uid="uid-hf", pod_namespace="rl", pod_name="hf")
        wl = rose.workload
        tenant = NextTenant(trainer.model, None, {}, wl.offloader.device)
        wl.on_suspend(lambda: (setattr(tenant, "optimizer", trainer.optimizer), tenant.before_offload()))
        wl.on_suspended(lambda: (tenant.while_suspended(), torch.rand(3), trainer.lr_scheduler.step()))
        reached, ops = threading.Event(), []

        class Gate(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                if state.global_step == SUSPEND_AFTER:
                    reached.set()

        def control() -> None:
            reached.wait(120)
            op = agent.control.Suspend(pb.SuspendRequest(pod_uid="uid-hf", grace_seconds=60))
            res = agent.control.Resume(pb.ResumeRequest(pod_uid="uid-hf"))
            ops.append((op, res))

        trainer.add_callback(Gate())
        wait_registered(agent.engine, "uid-hf")
        t = threading.Thread(target=control, daemon=True)
        t.start()
        trainer.train()
        t.join(60)
    (op, res) = ops[0]
    assert op.state == pb.OPERATION_STATE_SUCCEEDED and res.state == pb.OPERATION_STATE_SUCCEEDED, op.message
    assert op.bytes_moved == res.bytes_moved > 0 and wl.suspend_count == wl.resume_count == 1
    assert len(tenant.records) == 1 and tenant.records[0].stayed == []
    assert tenant.records[0].checked["optim"] > 0
    run = _final(trainer)
    for k in base["model"]:
        assert torch.equal(run["model"][k], base["model"][k]), k
    assert tensors_equal(run["optimizer"], base["optimizer"])
    assert run["scheduler"] == base["scheduler"] and run["losses"] == base["losses"]


def _pod(uid: str, world: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "hf",
            "namespace": "rl",
            "uid": uid,
            "labels": {names.LABEL_JOB: "job"},
            "annotations": {names.ANNOTATION_WORLD: world},
        }
    }


def test_world_from_the_agent_changes_gradient_accumulation(tmp_path: Path, no_rose_env: None) -> None:
    """The job's world goes the way the driver sends it (the pod's ``rose.io/world`` → the agent's
    ReportBook → ``COMMAND_KIND_WORLD`` on the command stream → the callback at a safe point):
    2/2 sets the global batch (4 x 2 x 2 = 16), 1/2 doubles the accumulation from the first step
    end where the epoch's micro-batches are a multiple of 4."""
    from transformers import TrainerCallback

    from rose_sdk.integrations.transformers import attach

    with running_agent(tmp_path) as agent:
        trainer = _trainer(tmp_path / "run", samples=64)
        sock = agent.claim_socket("claim-hf", "uid-hf")
        rose = attach(trainer, socket_path=str(sock), pod_uid="uid-hf", pod_namespace="rl", pod_name="hf")
        wl = rose.workload
        wait_registered(agent.engine, "uid-hf")
        schedule = {1: ("2/2", World(2, 2)), 2: ("1/2", World(1, 2))}
        micro: list[int] = []

        class Worlds(TrainerCallback):
            n = 0

            def on_substep_end(self, *a: Any, **kw: Any) -> None:
                self.n += 1

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                micro.append(self.n + 1)
                self.n = 0
                if state.global_step in schedule:
                    text, world = schedule[state.global_step]
                    agent.server.reports.observe_pod(_pod("uid-hf", text))  # what the pod watch hands the agent
                    end = time.monotonic() + 30
                    while wl.world != world:  # delivered on the command stream, run at a safe point
                        assert time.monotonic() < end, f"world {text} never arrived"
                        wl.safe_point(wait_seconds=0.2)

        trainer.add_callback(Worlds())
        trainer.train()
    assert wl.world_changes == 2 and rose.global_batch == 16
    assert rose.accumulation_changes == [(4, 4)]
    assert micro == [2, 2, 2, 2, 4, 4]

"""Demo act 3's honest RL process: example 02's GRPO job (TRL's real GRPOTrainer on the tiny LLM,
``examples/02_grpo_tiny_llm``) on ROSE through ``rose_sdk.integrations.transformers.attach``.

    python -m rose_cli.demo_grpo --out R.pt [--max-steps 30] [--seed 7] [--wait-step 10]

The same trainer as ``examples/02_grpo_tiny_llm/train.py``, plus what the demo needs: ``READY``
once training begins; at the end of step ``--wait-step``, when connected to a node agent, it stays
at that step's safe point (the integration's own ``Workload.safe_point``) until it has been
suspended and resumed once, so that the serving pod's suspend lands mid-training; the final model
and optimizer state, the rewards and the suspend counts go to ``--out`` for the demo's
bit-identity check against an uninterrupted run of the same seed. Without ``ROSE_AGENT_SOCKET`` it
runs straight through.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import warnings
from typing import Any

from local_cluster.binaries import REPO_ROOT

EXAMPLE_DIR = REPO_ROOT / "examples" / "02_grpo_tiny_llm"

# TRL 1.16 reads `is_gradient_checkpointing`, which Transformers 5.24 deprecates (as in the example).
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rose_cli.demo_grpo", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--max-steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--wait-step", type=int, default=10)
    p.add_argument("--wait-seconds", type=float, default=120.0)
    a = p.parse_args(argv)

    sys.path.insert(0, str(EXAMPLE_DIR))
    tiny_grpo: Any = importlib.import_module("tiny_grpo")  # the example's module, by its path
    import torch
    from transformers import PrinterCallback, TrainerCallback

    from rose_sdk.integrations.transformers import attach

    torch.set_num_threads(1)
    trainer = tiny_grpo.trainer(f"{a.out}.trainer", max_steps=a.max_steps, seed=a.seed, disable_tqdm=True)
    trainer.remove_callback(PrinterCallback)  # the demo prints its own summary
    rose = attach(trainer)
    wl = rose.workload

    class WaitForServing(TrainerCallback):  # added after attach: runs after the integration's safe point
        def on_train_begin(self, *args: Any, **kw: Any) -> None:
            print(f"READY {os.getpid()}", flush=True)

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step != a.wait_step or not wl.connected_to_agent:
                return
            deadline = time.monotonic() + a.wait_seconds
            while wl.resume_count < 1 and time.monotonic() < deadline:
                wl.safe_point(int(state.global_step), wait_seconds=0.5)

    trainer.add_callback(WaitForServing())
    trainer.train()
    rewards = [float(h["reward"]) for h in trainer.state.log_history if "reward" in h]
    torch.save(
        {
            "model": {k: v.clone() for k, v in trainer.model.state_dict().items()},
            "optimizer": trainer.optimizer.state_dict(),
            "rewards": rewards,
            "steps": int(trainer.state.global_step),
            "suspends": wl.suspend_count,
            "resumes": wl.resume_count,
        },
        a.out,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

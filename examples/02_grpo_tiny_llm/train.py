"""Example 02: GRPO on a tiny LLM with TRL's real GRPOTrainer, on ROSE.

A 2-layer Qwen2-architecture model built from a config (random weights, no download) learns to
answer a prompt of 4 digits with one digit repeated (``tiny_grpo.py``; the reward is the share of
the 8 completion tokens its most repeated digit takes): TRL generates the completions in-process,
scores them, and takes GRPO steps; the reward goes from about 0.4 to 1.0 in 60 steps. One call puts the trainer on ROSE:
``rose_sdk.integrations.transformers.attach`` makes the end of every optimizer step a safe point
where the node agent can suspend the job into host memory and resume it bit-exact, keeps the
global batch when an elastic job's world changes, and writes the trainer's own checkpoint as the
durable one. Without ROSE_AGENT_SOCKET it runs uninterrupted: the same script everywhere.

    pip install './sdk[trl]'    # or, in this repository: the venv of hack/setup.sh
    python examples/02_grpo_tiny_llm/train.py --max-steps 60 --out /tmp/grpo

CPU only as written (``use_cpu=True``); about 0.03-0.1 s a step on a laptop core.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent.parent), str(HERE)]  # run from a checkout

# TRL 1.16 reads `is_gradient_checkpointing`, which Transformers 5.24 deprecates (a FutureWarning
# at every generation); the job cannot avoid it.
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the trainer's output_dir (its checkpoints go there)")
    p.add_argument("--max-steps", type=int, default=60)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--checkpoint", default=None, help="the ROSE checkpoint file (else ROSE_CHECKPOINT_PATH)")
    a = p.parse_args(argv)

    import tiny_grpo
    import torch

    from rose_sdk.integrations.transformers import attach

    torch.set_num_threads(1)
    trainer = tiny_grpo.trainer(a.out, max_steps=a.max_steps, seed=a.seed, disable_tqdm=True)
    rose = attach(trainer, checkpoint_path=a.checkpoint)
    trainer.train(resume_from_checkpoint=rose.resume_from_checkpoint)
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    k = max(1, len(rewards) // 5)
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    wl = rose.workload
    print(f"steps={trainer.state.global_step} reward first {k}: {first:.3f} last {k}: {last:.3f}"
          f" suspends={wl.suspend_count} resumes={wl.resume_count}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Example 02's ``train.py`` run unchanged (its ``main``), with two test hooks around it for the
runs that play a pod's kubelet (``rose_cli/example02_pods.py``: ``rose demo``'s act 6 and
``tests/e2e/elastic_controller/test_example02_cluster_e2e.py``):

    python rose_cli/example02_role.py <train.py's arguments>

``ROSE_EXAMPLE_GATE_DIR`` + ``ROSE_EXAMPLE_GATES`` (``1,3``): at the end of each listed optimizer step
the trainer prints ``GATE <step>`` and waits for the file ``<dir>/go-<step>`` (so the test can
change the rollout world between two known steps). ``ROSE_EXAMPLE_WEIGHTS``: where the trained
model's final state dict (``model``) and the reward of each logged step (``rewards``) are written
(``torch.save``) — the example itself keeps no weights (``save_strategy="no"``).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "examples" / "02_grpo_tiny_llm")]


def main(argv: list[str]) -> int:
    import importlib

    tiny_grpo: Any = importlib.import_module("tiny_grpo")  # the example's modules, by their path
    train: Any = importlib.import_module("train")
    from transformers import TrainerCallback

    gate_dir = os.environ.get("ROSE_EXAMPLE_GATE_DIR", "")
    gates = {int(g) for g in os.environ.get("ROSE_EXAMPLE_GATES", "").split(",") if g}

    class Gates(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step in gates:
                print(f"GATE {state.global_step}", flush=True)
                go = Path(gate_dir) / f"go-{state.global_step}"
                while not go.exists():
                    time.sleep(0.02)

    made: list[Any] = []
    original = tiny_grpo.trainer

    def trainer(*a: Any, **kw: Any) -> Any:
        t = original(*a, **kw)
        t.add_callback(Gates())
        made.append(t)
        return t

    tiny_grpo.trainer = trainer
    rc: int = train.main(argv)
    weights = os.environ.get("ROSE_EXAMPLE_WEIGHTS")
    if weights and made:
        import torch

        t = made[0]
        rewards = [float(h["reward"]) for h in t.state.log_history if "reward" in h]
        torch.save(
            {"model": {k: v.detach().clone() for k, v in t.model.state_dict().items()}, "rewards": rewards}, weights
        )
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

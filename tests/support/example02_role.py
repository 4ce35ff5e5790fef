"""Example 02's ``train.py`` run unchanged (its ``main``), with two test hooks around it for the
end-to-end tests that play a pod's kubelet (``tests/e2e/elastic_controller/test_example02_cluster_e2e.py``):

    python tests/support/example02_role.py <train.py's arguments>

``ROSE_TEST_GATE_DIR`` + ``ROSE_TEST_GATES`` (``1,3``): at the end of each listed optimizer step
the trainer prints ``GATE <step>`` and waits for the file ``<dir>/go-<step>`` (so the test can
change the rollout world between two known steps). ``ROSE_TEST_WEIGHTS``: where the trained
model's final state dict is written (``torch.save``) — the example itself keeps no weights
(``save_strategy="no"``).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE.parents[1] / "examples" / "02_grpo_tiny_llm")]


def main(argv: list[str]) -> int:
    import tiny_grpo
    import train
    from transformers import TrainerCallback

    gate_dir = os.environ.get("ROSE_TEST_GATE_DIR", "")
    gates = {int(g) for g in os.environ.get("ROSE_TEST_GATES", "").split(",") if g}

    class Gates(TrainerCallback):  # type: ignore[misc]
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
    weights = os.environ.get("ROSE_TEST_WEIGHTS")
    if weights and made:
        import torch

        torch.save({k: v.detach().clone() for k, v in made[0].model.state_dict().items()}, weights)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""rose_sdk.integrations.transformers in-process, without a node agent: the world change keeps the
global batch by changing gradient accumulation (on TRL's real GRPOTrainer, tiny model, CPU), and
the module's import contract (``import rose_sdk`` imports no transformers; without transformers the
integration says how to install it)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "examples" / "02_grpo_tiny_llm"))

# TRL 1.16's generation helper (trl/models/utils.py, _unwrap_model_for_generation) reads
# `is_gradient_checkpointing`, which Transformers 5.24 deprecates; nothing the test passes avoids it.
pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")


def test_import_rose_sdk_imports_no_transformers() -> None:
    code = (
        "import sys, rose_sdk, rose_sdk.integrations\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'trl')))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr[-2000:]


def test_without_transformers_the_integration_says_how_to_install_it() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["transformers"] = None  # not installed
        try:
            import rose_sdk.integrations.transformers
        except ModuleNotFoundError as e:
            print(e.name, "|", e)
        """
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("transformers |") and "pip install 'rose-sdk[transformers]'" in r.stdout, r.stdout


def test_world_change_keeps_the_global_batch_through_gradient_accumulation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import tiny_grpo
    from transformers import TrainerCallback

    from rose_sdk import World
    from rose_sdk.integrations.transformers import attach

    for k in ("ROSE_AGENT_SOCKET", "ROSE_CHECKPOINT_PATH", "ROSE_CHECKPOINT_EVERY", "ROSE_RESTORE"):
        monkeypatch.delenv(k, raising=False)
    # one prompt (4 completions) per micro-batch, generated at every micro-batch
    trainer = tiny_grpo.trainer(
        str(tmp_path / "out"),
        max_steps=9,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        steps_per_generation=1,
    )
    rose = attach(trainer)
    # worlds as the agent would deliver them at the safe point of these steps; 0/2 (every worker
    # suspended, as the controller says to a parked one) changes nothing
    schedule = {1: World(2, 2), 2: World(1, 2), 3: World(0, 2), 6: World(3, 3)}
    micro: list[int] = []

    class Worlds(TrainerCallback):
        n = 0

        def on_substep_end(self, *a: Any, **kw: Any) -> None:
            self.n += 1

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            micro.append(self.n + 1)
            self.n = 0
            if state.global_step in schedule:
                rose.on_world(schedule[state.global_step])

    trainer.add_callback(Worlds())
    with caplog.at_level(logging.WARNING, logger="rose.sdk.transformers"):
        trainer.train()
    assert rose.global_batch == 4 * 2 * 2  # per device x accumulation x active, at the first world
    # 1/2: accumulation 4, from the first step end after which the epoch's micro-batches are a
    # multiple of 4 (8, after step 4); 3/3: ceil(16 / 12) = 2 (a global batch of 24, warned),
    # from step 7's end (20 micro-batches)
    assert rose.accumulation_changes == [(4, 4), (7, 2)]
    assert micro == [2, 2, 2, 2, 4, 4, 4, 2, 2]
    assert trainer.state.global_step == 9
    assert any("does not divide" in r.getMessage() for r in caplog.records)


def test_example_02_runs_standalone(tmp_path: Path) -> None:
    """examples/02_grpo_tiny_llm/train.py without a node agent: trains, no warning escapes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROSE_")}
    r = subprocess.run(
        [
            sys.executable,
            "-W",
            "error",
            str(ROOT / "examples" / "02_grpo_tiny_llm" / "train.py"),
            "--max-steps",
            "2",
            "--out",
            str(tmp_path / "out"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "steps=2 reward" in r.stdout and "suspends=0 resumes=0" in r.stdout, r.stdout[-2000:]

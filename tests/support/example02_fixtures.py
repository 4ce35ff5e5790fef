"""Example 02 (``examples/02_grpo_tiny_llm/train.py``) for the tests that run it: the job's test
token. The processes themselves (``Trainer``, ``ProcessKubelet`` which plays the kubelet for a
job's pods on KWOK nodes, the constant-world reference run) are the demo's own, in
``rose_cli/example02_pods.py`` (``rose demo`` act 6 runs them too).
"""

from __future__ import annotations

from pathlib import Path

from rose_cli import example02_pods

TOKEN = "test-token-0123456789abcdef"


def constant_world_run(tmp: Path, steps: int) -> tuple[Path, dict[str, int]]:
    return example02_pods.constant_world_run(tmp, steps, TOKEN)

"""The example trainer (``examples/01_cartpole_reinforce.py``) as a worker's process: started with
a Pod's environment, run once uninterrupted for the reference result, and the checks that a
resumed run is that run (its ``READY`` line, bit-exact state)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from rose_sdk import tensors_equal

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "01_cartpole_reinforce.py"
UPDATES, PARK_AT = 40, 20  # --suspend-points 1 parks the example at update 20 (no agent: it waits there)


def trainer(out: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """The example trainer as a worker's process; ``env`` is what its Pod gives it."""
    args = [sys.executable, str(EXAMPLE), "--updates", str(UPDATES), "--suspend-points", "1", "--out", str(out)]
    full = {**os.environ, "PYTHONPATH": str(REPO), **env}
    full.pop("ROSE_AGENT_SOCKET", None)
    return subprocess.Popen(args, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def uninterrupted(out: Path) -> dict[str, Any]:
    """The same training with no checkpoint, no restore and no park."""
    args = [sys.executable, str(EXAMPLE), "--updates", str(UPDATES), "--out", str(out)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROSE_")} | {"PYTHONPATH": str(REPO)}
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out_: dict[str, Any] = torch.load(out, weights_only=False)
    return out_


def finish(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    return out


def ready_step(log: str) -> int:
    """The step the trainer started at (its ``READY <pid> step=<n>`` line): > 0 after a restore."""
    line = next((x for x in log.splitlines() if x.startswith("READY ")), "")
    assert "step=" in line, f"the trainer printed no READY line: {log[:500]}"
    return int(line.rsplit("step=", 1)[1])


def assert_same_run(got: dict[str, Any], want: dict[str, Any]) -> None:
    for key in ("model", "optimizer", "replay", "rng"):
        assert tensors_equal({key: got[key]}, {key: want[key]}), f"{key} differs from the uninterrupted run"
    assert got["lengths"] == want["lengths"]

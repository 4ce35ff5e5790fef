"""Device tier: real GPU suspend and resume (deselected in CI, which has no GPU).

Runs benchmarks/gpu_suspend.py at a small size and checks bit-exactness of both backends; the
figures for the issue (1, 8, 32 GiB next to pinned memcpy) come from running the benchmark itself:
``python -m benchmarks.gpu_suspend --sizes-gib 1,8,32 --out gpu_suspend.json``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def test_cooperative_and_cuda_checkpoint_are_bit_exact_on_a_real_gpu() -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.fail("the device tier needs a CUDA GPU; run it with -m device only on a GPU machine")
    r = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_suspend", "--sizes-gib", "0.5", "--repeats", "1"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)
    text = json.dumps(report)
    assert '"bit_exact": true' in text and '"bit_exact": false' not in text, text[:3000]

"""Device tier (real NVIDIA GPU): needs only torch and this repository — not the local cluster.

``cuda`` fails, with what was measured, when no GPU is visible: the device tier is run on purpose
on a GPU machine (``hack/device-check.sh``), so a missing GPU is an error there, not a skip.
Deterministic cuBLAS (``CUBLAS_WORKSPACE_CONFIG``) is set before CUDA starts, for bit-exact runs.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@pytest.fixture(scope="session")
def cuda() -> str:
    try:
        import torch
    except ImportError as e:
        pytest.fail(f"the device tier needs torch with CUDA: {e}")
    if not torch.cuda.is_available():
        pytest.fail(
            f"no CUDA GPU visible (torch {torch.__version__}, CUDA build {torch.version.cuda}, "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}): run the device tier on a GPU machine"
        )
    return "cuda"

"""GPU shares on a real GPU (issue 27 §3): the CUDA MPS settings the driver writes into a share
claim's CDI spec (``dra_driver.shares.mps_env``) hold a lent share to its memory.

An MPS control daemon is started for this GPU with private pipe and log directories (what a GPU
node runs per shared GPU, mounted at the spec's CUDA_MPS_PIPE_DIRECTORY); a child process gets
exactly the spec's variables — a 2 GiB, 25 % share — and must be able to allocate within 2 GiB
and be refused beyond it. Skipped, saying so, where ``nvidia-cuda-mps-control`` is not installed.
Not part of hack/device-check.sh (its 10-minute budget is spent); run it on its own:

    pytest tests/device/dra_driver/test_gpu_share_mps.py -q -p no:cacheprovider
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver import shares
from dra_driver.claims import PreparedDevice
from rose_common import names

GiB = 1 << 30
SHARE = PreparedDevice(("gpu",), "node", "gpu-0-share", ("x",), 0, "GPU-0", names.ROLE_SHARE, 2 * GiB, 25)

CHILD = r"""
import json, torch
out = {"sm_count": torch.cuda.get_device_properties(0).multi_processor_count}
held = []
try:
    held.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))  # 1 GiB: within the share
    torch.cuda.synchronize()
    out["within"] = "ok"
except Exception as e:
    out["within"] = repr(e)
try:
    held.append(torch.empty(3 << 30, dtype=torch.uint8, device="cuda"))  # 4 GiB in all: over 2 GiB
    torch.cuda.synchronize()
    out["beyond"] = "allocated"
except Exception as e:
    out["beyond"] = type(e).__name__ + ": " + str(e)[:200]
print(json.dumps(out))
"""


@pytest.fixture
def mps_daemon(cuda: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        pytest.skip("nvidia-cuda-mps-control is not installed on this GPU machine: the MPS check cannot run")
    pipe, logs = tmp_path / "pipe", tmp_path / "log"
    pipe.mkdir()
    logs.mkdir()
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_LOG_DIRECTORY=str(logs))
    subprocess.run([control, "-d"], env=env, check=True, timeout=30)
    try:
        deadline = time.monotonic() + 10
        while not any(pipe.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.1)
        yield env
    finally:
        subprocess.run([control], input="quit\n", text=True, env=env, timeout=30, check=False)


def test_a_share_is_held_to_its_mps_memory_limit(mps_daemon: dict[str, str]) -> None:
    spec_env = shares.mps_env([SHARE])
    assert spec_env[names.ENV_MPS_MEM_LIMIT] == "0=2048M"
    # the container sees the daemon's directories at the spec's paths; on this host they are the daemon's own
    env = {
        **mps_daemon,
        names.ENV_MPS_MEM_LIMIT: spec_env[names.ENV_MPS_MEM_LIMIT],
        names.ENV_MPS_THREAD_PERCENTAGE: spec_env[names.ENV_MPS_THREAD_PERCENTAGE],
    }
    r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    print("mps share:", out)  # the SM count the share's client sees is recorded, not judged
    assert out["within"] == "ok", out
    assert out["beyond"].startswith("OutOfMemoryError"), out

"""GPU shares on a real GPU (issue 27 §3): the driver's MPS daemon manager (``dra_driver.mps``)
starts the real ``nvidia-cuda-mps-control`` for the GPU, and the CUDA MPS settings the driver
writes into a share claim's CDI spec (``dra_driver.shares.mps_env``, ``mps_mounts``) hold a lent
share to its memory through that daemon.

The manager starts one control daemon for this GPU (``CUDA_VISIBLE_DEVICES=<UUID>``, pipe and log
directories under a private root, as ``<state-dir>/mps`` on a node); a second manager (a restarted
driver) adopts it; a child process gets exactly the spec's variables — a 2 GiB, 25 % share — with
the pipe directory the spec mounts, and must be able to allocate within 2 GiB and be refused beyond
it; ``quit`` then stops the daemon. Skipped, saying so, where ``nvidia-cuda-mps-control`` or
``nvidia-smi`` is not installed. Collected by step 2 of hack/device-check.sh (``pytest tests/device``);
on its own:

    pytest tests/device/dra_driver/test_gpu_share_mps.py -q -p no:cacheprovider

Not yet run on a GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver import cdi, mps, shares
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


def first_gpu_uuid() -> str:
    """The UUID of the GPU the child sees first (NVML's order, as the driver's discovery)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi is not installed on this GPU machine: no GPU UUID for the MPS daemon")
    out = subprocess.run(
        [smi, "--query-gpu=uuid", "--format=csv,noheader", "-i", "0"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout.strip()


@pytest.fixture
def mps_daemon(cuda: str) -> Iterator[tuple[mps.MpsDaemons, str]]:
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        pytest.skip("nvidia-cuda-mps-control is not installed on this GPU machine: the MPS check cannot run")
    uuid = first_gpu_uuid()
    root = Path(tempfile.mkdtemp(prefix="mps", dir="/tmp")) / "mps"  # short: MPS keeps its pipes there
    daemons = mps.MpsDaemons(control, root, {0: uuid}, timeout_seconds=30.0)
    daemons.ensure([0])  # what the driver does at the first share prepare on the GPU
    try:
        yield daemons, uuid
    finally:
        daemons.sync([])  # no share left: quit
        shutil.rmtree(root.parent, ignore_errors=True)


def test_a_share_is_held_to_its_mps_memory_limit(mps_daemon: tuple[mps.MpsDaemons, str]) -> None:
    daemons, uuid = mps_daemon
    assert daemons.answers(0) and daemons.running() == {0}
    restarted = mps.MpsDaemons(daemons.control, daemons.root, daemons.uuids, timeout_seconds=30.0)
    assert restarted.adopt() == [0]  # a restarted driver takes it over, starts no second one
    spec_env_in = shares.mps_env([SHARE])
    spec = cdi.build_spec("u1", [SHARE], {0: 0}, simulated=False, extra_env=spec_env_in, mps_root=daemons.root)
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    spec_env = dict(e.split("=", 1) for e in spec["containerEdits"]["env"])
    assert spec_env[names.ENV_MPS_MEM_LIMIT] == "0=2048M"
    # the container sees the spec's mounts at the spec's paths; on this host the child uses the host side
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
    env |= {
        "CUDA_VISIBLE_DEVICES": uuid,  # NVIDIA_VISIBLE_DEVICES in the container
        names.ENV_MPS_PIPE_DIRECTORY: mounts[spec_env[names.ENV_MPS_PIPE_DIRECTORY]],
        names.ENV_MPS_LOG_DIRECTORY: mounts[spec_env[names.ENV_MPS_LOG_DIRECTORY]],
        names.ENV_MPS_MEM_LIMIT: spec_env[names.ENV_MPS_MEM_LIMIT],
        names.ENV_MPS_THREAD_PERCENTAGE: spec_env[names.ENV_MPS_THREAD_PERCENTAGE],
    }
    assert env[names.ENV_MPS_PIPE_DIRECTORY] == str(mps.dirs(daemons.root, 0).pipe)  # the daemon's own
    r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    print("mps share:", out)  # the SM count the share's client sees is recorded, not judged
    assert out["within"] == "ok", out
    assert out["beyond"].startswith("OutOfMemoryError"), out
    daemons.sync([])
    assert not daemons.answers(0) and daemons.running() == frozenset()

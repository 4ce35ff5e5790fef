"""The device tier collects with only what it needs: no local cluster, no cryptography, no kubernetes,
no grpc (a GPU machine's image may lack them), and without a GPU it fails saying so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BLOCKED = ("local_cluster", "cryptography", "kubernetes", "grpc")

_SITECUSTOMIZE = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError("not installed on this machine: " + name)
        return None
sys.meta_path.insert(0, Block())
"""


def _pytest_device(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}", CUDA_VISIBLE_DEVICES="")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "tests/device", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_device_tier_collects_without_the_cluster_dependencies(tmp_path: Path) -> None:
    r = _pytest_device(tmp_path, "--collect-only", "-q")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "10 tests collected" in r.stdout


def test_device_tier_without_a_gpu_fails_saying_so(tmp_path: Path) -> None:
    r = _pytest_device(
        tmp_path,
        "-q",
        "-x",
        "tests/device/suspend/test_gpu_training.py::test_cooperative_suspend_resume_of_adam_training_is_bit_exact",
    )
    assert r.returncode == 1 and "no CUDA GPU visible" in r.stdout, r.stdout[-3000:]

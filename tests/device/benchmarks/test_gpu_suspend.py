"""Device tier: each suspend backend on a real GPU, checked explicitly — checkpointed, device
memory freed, bit-exact — or skipped with the reason the benchmark measured (e.g. a driver older
than r570). Runs benchmarks/gpu_suspend.py once at a small size; the figures for the issue
(1, 8, 32 GiB beside pinned memcpy) come from the benchmark itself (``hack/device-check.sh``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

GIB = 0.5


@pytest.fixture(scope="module")
def report(cuda: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench") / "gpu_suspend.json"
    r = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_suspend", "--sizes-gib", str(GIB), "--repeats", "2", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert r.returncode == 0, r.stderr[-3000:]
    got: dict[str, Any] = json.loads(out.read_text())
    return got


def _entry(report: dict[str, Any], key: str) -> dict[str, Any]:
    (size,) = report["sizes"]
    e = size.get(key)
    assert e is not None, f"{key} was not measured: {json.dumps(report)[:2000]}"
    assert "error" not in e, f"{key} failed: {e['error']}" if "error" in e else ""
    return dict(e)


def test_cooperative_offload_frees_device_memory_and_is_bit_exact(report: dict[str, Any]) -> None:
    e = _entry(report, "cooperative")
    assert e["device_memory_freed"], e["cycles"]
    assert e["bit_exact"], e["cycles"]
    assert all(c["bytes"] >= GIB * (1 << 30) for c in e["cycles"])
    assert 0 < e["suspend_copy_seconds"] <= e["suspend_seconds"]


def test_cuda_checkpoint_checkpoints_frees_device_memory_and_is_bit_exact(report: dict[str, Any]) -> None:
    if "cuda_checkpoint_unavailable" in report:
        pytest.skip(f"cuda-checkpoint unavailable: {report['cuda_checkpoint_unavailable']}")
    e = _entry(report, "cuda_checkpoint")
    assert e["checkpointed"], e["cycles"]
    assert e["device_memory_freed"], e["cycles"]
    assert e["bit_exact"], e["cycles"]
    assert all(c["running_after_resume"] for c in e["cycles"])
    assert e["driver_moved_bytes"] is None or e["driver_moved_bytes"] >= GIB * (1 << 30)

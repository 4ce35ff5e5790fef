"""A crash while spilling loses nothing: the engine runs in a subprocess (``tests/support/spill_fixtures.py
crash-child``) that suspends two workloads into a DRAM budget that holds one, so the first spills
to disk; it dies at each named spill point (``os._exit(137)``, the driver's ``ROSE_DRIVER_CRASH_AT``
hook: no cleanup, like kill -9), or by a real SIGKILL at a random moment of the spill. Then a fresh
engine recovers the same directories: no partial file is left, and the first workload's state is
in exactly one tier, whole — DRAM byte-for-byte, or disk with every chunk verified — and a resume
brings it back bit-exact."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from dra_driver.checkpoint import CRASH_ENV
from dra_driver.suspend.spill import SPILL_CRASH_POINTS, TMP_SUFFIX
from tests.support.spill_fixtures import STATE, reg, spill_engine

FIXTURES = Path(__file__).resolve().parents[2] / "support" / "spill_fixtures.py"


def _child(root: Path, crash_at: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    if crash_at:
        env[CRASH_ENV] = crash_at
    return subprocess.run(
        [sys.executable, str(FIXTURES), "crash-child", str(root)],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _prepare(root: Path) -> bytes:
    """pod-a's device memory, created before the child runs; returns its bytes."""
    _, host, _ = spill_engine(root)
    host.ensure_device("pod-a", STATE)
    return host.device("pod-a").read_bytes()


@pytest.mark.parametrize("point", SPILL_CRASH_POINTS)
def test_a_crash_at_each_spill_point_loses_no_state(tmp_path: Path, point: str) -> None:
    root = tmp_path / "node"
    original = _prepare(root)
    done = _child(root, point)
    assert done.returncode == 137, f"the child did not die at {point}: rc={done.returncode} {done.stdout}{done.stderr}"
    _check_recovered(root, original, point)


@pytest.mark.parametrize("seed", range(4))
def test_sigkill_at_a_random_moment_of_a_spill_loses_no_state(tmp_path: Path, seed: int) -> None:
    """A real SIGKILL, at a random delay after the child says it starts the suspend that spills."""
    root = tmp_path / "node"
    original = _prepare(root)
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    child = subprocess.Popen(
        [sys.executable, str(FIXTURES), "crash-child", str(root)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "spilling"
        time.sleep(random.Random(seed).uniform(0.0, 0.25))
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=60)
        if child.stdout is not None:
            child.stdout.close()
    _check_recovered(root, original, f"random delay (seed {seed}), rc {child.returncode}")


def _check_recovered(root: Path, original: bytes, point: str) -> None:
    again, host2, _ = spill_engine(root)  # recovery: partial files removed, ledger rebuilt
    spill_dir = root / "spill"
    assert not [p.name for p in spill_dir.iterdir() if p.name.endswith(TMP_SUFFIX)]
    in_dram = host2.host_bytes("pod-a") is not None
    assert again.spill is not None
    on_disk = again.spill.has("pod-a")
    assert in_dram != on_disk, f"after a crash at {point}: in DRAM {in_dram}, on disk {on_disk} (exactly one)"
    if in_dram:
        assert host2.dram("pod-a").read_bytes() == original
    else:
        assert b"".join(again.spill.read("pod-a")) == original  # every chunk verified

    # The workload re-registers as suspended (its process outlived the driver); resume is bit-exact.
    again.register(replace(reg("pod-a"), current_state="Suspended"))
    w = again.registry.get("pod-a")
    assert w is not None and w.suspended_by == "simulated"  # the engine knows which backend holds it
    out = again.resume_pod("pod-a")
    assert out.state == "succeeded", out.message
    assert host2.device("pod-a").read_bytes() == original


def test_the_child_reaches_every_point_without_a_crash(tmp_path: Path) -> None:
    """Without a crash the same script completes: pod-a on disk, pod-b in DRAM (the points are real)."""
    done = _child(tmp_path / "node", None)
    assert done.returncode == 0 and "done" in done.stdout, done.stderr
    assert (tmp_path / "node" / "spill" / "pod-a.spill").exists()
    assert not (tmp_path / "node" / "host" / "dram" / "pod-a").exists()
    assert (tmp_path / "node" / "host" / "dram" / "pod-b").exists()

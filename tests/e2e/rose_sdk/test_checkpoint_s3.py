"""s3:// checkpoints against a real S3-compatible server: MinIO built from its Go module
(hack/build-binaries.sh) and started by ``local_cluster.s3`` on a free port with generated
credentials, passed as the standard AWS variables (what a Secret mounted with envFrom gives a
worker). No mock: every byte goes through the server over HTTP.

- round trip: params, optimizer state, every RNG and user state come back bit-exact, and the
  objects are in the bucket (a data object and the ``LATEST`` pointer);
- a process killed between the data upload and the pointer write leaves ``LATEST`` on the
  previous, complete checkpoint; the orphan is pruned by later saves;
- the example trainer, killed after its checkpoint at step 20 and started again with
  ROSE_RESTORE=latest, ends bit-exact with an uninterrupted run.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from local_cluster.s3 import S3Server
from rose_sdk import CheckpointError, load_checkpoint, save_checkpoint, tensors_equal
from rose_sdk import checkpoint as ck
from tests.support.example01_runs import PARK_AT, REPO, assert_same_run, finish, ready_step, trainer, uninterrupted
from tests.support.s3_fixtures import objects, s3, url, wait_checkpoint

__all__ = ["s3", "url"]  # fixtures


def model_and_opt(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    for _ in range(3):
        m(torch.randn(4, 6)).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
    return m, opt


def draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_round_trip_through_the_server_is_bit_exact(url: str, s3: S3Server) -> None:
    m, opt = model_and_opt(1)
    random.seed(5)
    np.random.seed(5)
    user = {"replay": torch.randn(8, 4), "episodes": 12}
    info = save_checkpoint(url, model=m, optimizer=opt, step=9, user_state=user)
    expected = draws()
    assert objects(s3, url) == sorted([str(info.path).rsplit("/", 1)[-1], "LATEST"]), "the data and pointer are in S3"
    latest = ck.latest_checkpoint(url)
    assert latest is not None and (latest.step, latest.sha256, latest.path) == (9, info.sha256, info.path)

    m2, opt2 = model_and_opt(2)
    c = load_checkpoint(url)
    c.restore(m2, opt2)
    assert c.step == 9 and c.sha256 == info.sha256 and draws() == expected
    assert tensors_equal(m2.state_dict(), m.state_dict()) and tensors_equal(opt2.state_dict(), opt.state_dict())
    assert torch.equal(c.user_state["replay"], user["replay"]) and c.user_state["episodes"] == 12


_CRASHING_SAVE = textwrap.dedent(
    """
    import os, sys, torch
    from rose_sdk import checkpoint as ck
    torch.manual_seed(3)
    m = torch.nn.Linear(6, 2)
    ck._write_pointer = lambda *a: os._exit(137)  # the process dies after the upload, before the pointer
    ck.save_checkpoint(sys.argv[1], model=m, step=2)
    """
)


def test_a_crash_between_data_and_pointer_keeps_the_previous_checkpoint(url: str, s3: S3Server) -> None:
    m, opt = model_and_opt(1)
    first = save_checkpoint(url, model=m, optimizer=opt, step=1)
    env = {**os.environ, **s3.env(), "PYTHONPATH": str(REPO)}
    r = subprocess.run(
        [sys.executable, "-c", _CRASHING_SAVE, url], env=env, capture_output=True, timeout=120, check=False
    )
    assert r.returncode == 137, r.stderr.decode()[-2000:]
    data = [n for n in objects(s3, url) if n != "LATEST"]
    assert len(data) == 2, f"the crashed save's data object reached S3, its pointer did not: {data}"

    c = load_checkpoint(url)
    assert (c.step, c.sha256) == (1, first.sha256)
    assert tensors_equal(c.model_state, m.state_dict()) and tensors_equal(c.optimizer_state, opt.state_dict())

    kept = [save_checkpoint(url, model=m, step=s) for s in (3, 4)]
    want = sorted(str(i.path).rsplit("/", 1)[-1] for i in kept)
    assert [n for n in objects(s3, url) if n != "LATEST"] == want, "the orphan and older data were pruned"


def test_missing_checkpoint_and_bad_credentials_say_what_to_fix(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(CheckpointError, match=f"no checkpoint at {url}: {url}/LATEST does not exist"):
        load_checkpoint(url)
    assert ck.restore_latest(url) is None
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(CheckpointError, match="check the endpoint and credentials"):
        ck.latest_checkpoint(url)


# ---------------------------------------------------------------------- the example trainer as a process


def test_the_example_killed_after_its_checkpoint_resumes_bit_exact(url: str, s3: S3Server, tmp_path: Path) -> None:
    env = {"ROSE_CHECKPOINT_PATH": url, "ROSE_RESTORE": "latest", "ROSE_CHECKPOINT_EVERY": str(PARK_AT)}
    first = trainer(tmp_path / "lost.pt", env)
    try:
        wait_checkpoint(s3, url, PARK_AT, first)
    finally:
        first.kill()  # the worker is lost: its process dies with whatever it held
        first.communicate()
    out = finish(trainer(tmp_path / "resumed.pt", env))
    assert ready_step(out) == PARK_AT, out[:500]
    assert not (tmp_path / "lost.pt").exists()
    assert_same_run(torch.load(tmp_path / "resumed.pt", weights_only=False), uninterrupted(tmp_path / "whole.pt"))

"""Atomic durable checkpoint: round trip with every RNG, corruption and truncation detected."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from rose_sdk import CheckpointError, load_checkpoint, save_checkpoint, tensors_equal


def model_and_opt() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(1)
    m = torch.nn.Linear(5, 3)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    m(torch.randn(2, 5)).sum().backward()
    opt.step()
    return m, opt


def draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_round_trip_restores_states_and_rng(tmp_path: Path) -> None:
    m, opt = model_and_opt()
    random.seed(3)
    np.random.seed(3)
    path = tmp_path / "sub" / "job.rose"
    info = save_checkpoint(path, model=m, optimizer=opt, step=17, user_state={"lr": [0.1, 0.05], "ep": 4})
    expected = draws()
    assert path.exists() and len(info.sha256) == 64 and info.nbytes > 0
    assert sorted(p.name for p in path.parent.iterdir()) == ["job.rose"]  # no temp files
    c = load_checkpoint(path)
    assert c.step == 17 and c.user_state == {"lr": [0.1, 0.05], "ep": 4} and c.sha256 == info.sha256
    m2 = torch.nn.Linear(5, 3)
    opt2 = torch.optim.SGD(m2.parameters(), lr=0.1, momentum=0.9)
    c.restore(m2, opt2)  # also rewinds python / numpy / torch RNG to the save point
    assert draws() == expected
    assert tensors_equal(m2.state_dict(), m.state_dict()) and tensors_equal(opt2.state_dict(), opt.state_dict())


@pytest.mark.parametrize("where", ["payload", "header"])
def test_corruption_detected(tmp_path: Path, where: str) -> None:
    m, opt = model_and_opt()
    path = tmp_path / "c.rose"
    save_checkpoint(path, model=m, optimizer=opt, step=1)
    raw = bytearray(path.read_bytes())
    i = len(raw) - 100 if where == "payload" else 15
    raw[i] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="corrupted: sha256"):
        load_checkpoint(path)


def test_truncated_missing_and_foreign_files(tmp_path: Path) -> None:
    m, _ = model_and_opt()
    path = tmp_path / "t.rose"
    save_checkpoint(path, model=m)
    raw = path.read_bytes()
    path.write_bytes(raw[:40])
    with pytest.raises(CheckpointError, match="truncated"):
        load_checkpoint(path)
    path.write_bytes(raw[:-10])
    with pytest.raises(CheckpointError, match="corrupted"):
        load_checkpoint(path)
    path.write_bytes(b"PK\x03\x04 a zip file")
    with pytest.raises(CheckpointError, match="not a ROSE checkpoint"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "none.rose")


def test_failed_write_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m, _ = model_and_opt()
    path = tmp_path / "a.rose"
    first = save_checkpoint(path, model=m, step=1)

    def boom(fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, model=m, step=2)
    monkeypatch.undo()
    assert load_checkpoint(path).sha256 == first.sha256  # old file intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.rose"]  # temp file removed


class Custom:
    pass


def test_unsafe_user_state_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "u.rose"
    with pytest.raises(CheckpointError, match=r"user_state\['obj'\]\[1\] is a Custom"):
        save_checkpoint(path, user_state={"obj": [1, Custom()]})
    assert not path.exists()
    # and a file that carries pickled objects anyway is refused on load (weights_only: no code runs)
    import hashlib
    import io

    from rose_sdk.checkpoint import MAGIC, write_atomic

    buf = io.BytesIO()
    torch.save({"format": 1, "step": 0, "model": None, "optimizer": None, "rng": {}, "user": Custom()}, buf)
    body = buf.getvalue()
    write_atomic(path, MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
    with pytest.raises(CheckpointError, match="does not load"):
        load_checkpoint(path)


def _resign(path: Path, payload: object) -> None:
    """Write ``payload`` as a checkpoint with a valid checksum (what a buggy writer or a forger does)."""
    import hashlib
    import io

    from rose_sdk.checkpoint import MAGIC, write_atomic

    buf = io.BytesIO()
    torch.save(payload, buf)
    body = buf.getvalue()
    write_atomic(path, MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body)


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        ({"format": 1}, r"missing \['model', 'optimizer', 'rng', 'step', 'user'\]"),
        ({"format": 1, "step": "x", "model": None, "optimizer": None, "rng": {}, "user": None}, "step is str"),
        ({"format": 1, "step": 1, "model": [1], "optimizer": None, "rng": {}, "user": None}, "model state is a list"),
        ({"format": 1, "step": 1, "model": None, "optimizer": None, "rng": {"python": 1}, "user": None}, "RNG state"),
        ([1, 2], "unknown checkpoint format"),
    ],
)
def test_resigned_malformed_checkpoint_is_a_checkpoint_error(tmp_path: Path, payload: object, match: str) -> None:
    path = tmp_path / "m.rose"
    _resign(path, payload)
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(path).restore()


def test_on_disk_format_verifies_with_a_streaming_hash_and_no_torch(tmp_path: Path) -> None:
    """The layout the driver's fallback may verify: 10-byte magic, 64 hex digits, newline, payload."""
    import hashlib

    m, opt = model_and_opt()
    path = tmp_path / "f.rose"
    info = save_checkpoint(path, model=m, optimizer=opt, step=3)
    sha = hashlib.sha256()
    with path.open("rb") as f:
        head = f.read(75)
        while chunk := f.read(4096):
            sha.update(chunk)
    assert head[:10] == b"ROSECKPT1\n" and head[74:] == b"\n"
    assert head[10:74].decode() == sha.hexdigest() == info.sha256
    assert path.stat().st_size == 75 + info.nbytes


@pytest.mark.parametrize("mode", ["save", "load"])
def test_checkpoint_streams_without_a_copy_of_the_state(tmp_path: Path, mode: str) -> None:
    """Peak extra RSS of save / load of a 64 MiB state, in a fresh process: far below one copy."""
    import json
    import subprocess
    import sys

    path = tmp_path / "big.rose"
    cmd = [sys.executable, "-m", "tests.support.sdk_checkpoint_memory", "64"]
    if mode == "load":
        subprocess.run([*cmd, "save", str(path)], check=True, capture_output=True, timeout=120)
    out = subprocess.run([*cmd, mode, str(path)], check=True, capture_output=True, text=True, timeout=120)
    extra = json.loads(out.stdout)["extra_mib"]
    assert extra < 16, f"{mode} of a 64 MiB state took {extra} MiB of extra host RAM"

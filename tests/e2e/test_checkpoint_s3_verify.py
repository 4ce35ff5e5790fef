"""The driver's checkpoint-and-evict fallback verifies an ``s3://`` checkpoint (the object the SDK's
ack names) against the real local S3 server (MinIO, the fixtures of ``test_checkpoint_s3``) before
it evicts anything: a good object passes, a wrong digest, a tampered object and a missing one are
refused with what is wrong, and a driver without the bucket's credentials says so."""

from __future__ import annotations

import pytest
import torch

from dra_driver.suspend.cooperative import verify_checkpoint
from rose_sdk import save_checkpoint
from tests.e2e.test_checkpoint_s3 import bucket_view, s3, url

__all__ = ["s3", "url"]  # fixtures


def test_the_fallback_verifies_an_s3_checkpoint_through_the_server(url: str, s3: object) -> None:
    torch.manual_seed(0)
    info = save_checkpoint(url, model=torch.nn.Linear(6, 2), step=3)
    obj = str(info.path)
    assert obj.startswith("s3://")
    assert verify_checkpoint(obj, info.sha256, pid=1) == ""
    assert "acknowledgement says" in verify_checkpoint(obj, "0" * 64)
    assert "cannot read" in verify_checkpoint(f"{url}/ckpt-000000000003-none.rose", info.sha256)
    view = bucket_view(s3)  # type: ignore[arg-type]
    key = obj.removeprefix("s3://")
    body = bytearray(view.cat_file(key))
    body[-1] ^= 0xFF  # one flipped payload byte
    view.pipe_file(key, bytes(body))
    assert "payload sha256" in verify_checkpoint(obj, info.sha256)


def test_a_driver_without_the_buckets_credentials_says_what_to_set(
    url: str, s3: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = save_checkpoint(url, model=torch.nn.Linear(2, 2), step=1)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    problem = verify_checkpoint(str(info.path), info.sha256)
    assert problem.startswith(f"cannot read {info.path}") and "AWS_ACCESS_KEY_ID" in problem

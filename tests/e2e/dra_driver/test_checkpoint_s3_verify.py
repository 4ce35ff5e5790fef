"""The driver's checkpoint-and-evict fallback verifies an ``s3://`` checkpoint (the object the SDK's
ack names) against the real local S3 server (MinIO, the fixtures of ``tests/support/s3_fixtures.py``) before
it evicts anything, only under the job's own ``s3://`` checkpointPath: a good object passes; a
wrong digest, a tampered object, a missing one, an object beside the prefix and one over the size
cap are refused with a category that names no object; a driver without the bucket's credentials
refuses too (the detail, for the driver's log, says what failed)."""

from __future__ import annotations

import pytest
import torch

from dra_driver.suspend.verify import CheckpointVerifier, Problem, StaticCheckpointPaths, VerifyLimits, VerifyRequest
from rose_sdk import save_checkpoint
from tests.support.s3_fixtures import bucket_view, s3, url

__all__ = ["s3", "url"]  # fixtures


def _verifier(prefix: str, max_bytes: int = 1 << 30) -> CheckpointVerifier:
    return CheckpointVerifier(VerifyLimits(max_bytes=max_bytes), paths=StaticCheckpointPaths(default=prefix))


def _req(path: str, digest: str) -> VerifyRequest:
    return VerifyRequest(pod_uid="uid-w0", namespace="rl", name="w-0", reported_pid=1, path=path, sha256=digest)


def test_the_fallback_verifies_an_s3_checkpoint_through_the_server(url: str, s3: object) -> None:
    torch.manual_seed(0)
    info = save_checkpoint(url, model=torch.nn.Linear(6, 2), step=3)
    obj = str(info.path)
    assert obj.startswith(url + "/")
    v = _verifier(url)
    assert v.verify(_req(obj, info.sha256)).ok
    assert v.verify(_req(obj, "0" * 64)).problem is Problem.MISMATCH
    assert v.verify(_req(f"{url}/ckpt-000000000003-none.rose", info.sha256)).problem is Problem.UNREADABLE
    assert _verifier(url + "-other").verify(_req(obj, info.sha256)).problem is Problem.OUTSIDE
    assert _verifier(url, max_bytes=64).verify(_req(obj, info.sha256)).problem is Problem.TOO_LARGE
    view = bucket_view(s3)  # type: ignore[arg-type]
    key = obj.removeprefix("s3://")
    body = bytearray(view.cat_file(key))
    body[-1] ^= 0xFF  # one flipped payload byte
    view.pipe_file(key, bytes(body))
    assert v.verify(_req(obj, info.sha256)).problem is Problem.MISMATCH


def test_a_driver_without_the_buckets_credentials_refuses(
    url: str, s3: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = save_checkpoint(url, model=torch.nn.Linear(2, 2), step=1)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    got = _verifier(url).verify(_req(str(info.path), info.sha256))
    assert got.problem is Problem.UNREADABLE and str(info.path) in got.detail

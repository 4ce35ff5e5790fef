"""A real S3-compatible server for tests: MinIO (built by hack/build-binaries.sh) started by
``local_cluster.s3`` on a free port with generated credentials, and the test's own view of its
buckets (s3fs directly, never through the code under test).

``s3`` is module-scoped: a module that imports it gets one server for its tests, started at its
first use and stopped after its last. ``url`` (function scope) needs ``s3`` imported beside it."""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import s3fs

from local_cluster.s3 import S3Server, s3_server


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with s3_server(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture
def url(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket; the process's environment points at the server as a worker's would."""
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    bucket = f"ckpt-{secrets.token_hex(4)}"
    bucket_view(s3).mkdir(bucket)
    return f"s3://{bucket}/jobs/grpo"


def bucket_view(s3: S3Server) -> Any:
    """The test's own view of the server (s3fs directly, not through the code under test)."""
    return s3fs.S3FileSystem(
        endpoint_url=s3.endpoint, key=s3.access_key, secret=s3.secret_key, skip_instance_cache=True
    )


def objects(s3: S3Server, url: str) -> list[str]:
    return sorted(p.rsplit("/", 1)[-1] for p in bucket_view(s3).ls(url.removeprefix("s3://"), refresh=True))


def pointer_step(s3: S3Server, url: str) -> int | None:
    """The step ``LATEST`` names, read straight from the server (None: no pointer yet)."""
    try:
        return int(json.loads(bucket_view(s3).cat_file(f"{url.removeprefix('s3://')}/LATEST"))["step"])
    except FileNotFoundError:
        return None


def wait_checkpoint(s3: S3Server, url: str, step: int, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pointer_step(s3, url) == step:
            return
        assert proc.poll() is None, f"the trainer exited ({proc.returncode}) before its checkpoint at {step}"
        time.sleep(0.1)
    raise AssertionError(f"no checkpoint at step {step} in {url} after {timeout:.0f} s")

"""Issue 22 finding 2 and the S3 confused deputy: the fallback's checkpoint verification opens only
files inside the pod's own root (PID resolved from the pod UID of the claim records), only under
the job's checkpointPath, never a symlink, FIFO or device, never more than the size cap, within a
deadline and on its own thread; the tenant learns only a category.

The pod's ``/proc/<pid>`` is a directory tree here (``cgroup``, ``status``, ``root/``), because a
pod cgroup and a container root cannot be made on the test machine: ``pids.resolve_pid`` reads it
as it reads ``/proc``, and everything below ``root/`` is opened with the real ``openat2`` (and the
real component walk)."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dra_driver.suspend import verify
from dra_driver.suspend.verify import (
    CheckpointVerifier,
    Problem,
    StaticCheckpointPaths,
    VerifyLimits,
    VerifyRequest,
    within,
)

POD = "7c0d6a3e-1111-4bb2-9c1e-000000000001"
HOST_PID, POD_PID = 4242, 7


def fake_proc(tmp: Path, pod_uid: str = POD) -> Path:
    """``<tmp>/proc/4242``: the pod's process (cgroup names the pod, NSpid ends with 7) and its root."""
    proc = tmp / "proc"
    d = proc / str(HOST_PID)
    (d / "root").mkdir(parents=True)
    (d / "cgroup").write_text(f"0::/kubepods.slice/kubepods-pod{pod_uid.replace('-', '_')}.slice/cri-containerd-x\n")
    (d / "status").write_text(f"Name:\tpython\nNSpid:\t{HOST_PID}\t{POD_PID}\n")
    return proc


def checkpoint_bytes(payload: bytes = b"state" * 1000) -> tuple[bytes, str]:
    digest = hashlib.sha256(payload).hexdigest()
    return b"ROSECKPT1\n" + digest.encode() + b"\n" + payload, digest


def req(path: str, digest: str, pid: int = POD_PID, uid: str = POD) -> VerifyRequest:
    return VerifyRequest(pod_uid=uid, namespace="rl", name="w-0", reported_pid=pid, path=path, sha256=digest)


@pytest.fixture(params=[True, False], ids=["openat2", "walk"])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[CheckpointVerifier, Path, str]:
    if request.param and not verify.openat2_available():
        pytest.skip("this kernel or seccomp profile does not serve openat2")
    proc = fake_proc(tmp_path)
    root = proc / str(HOST_PID) / "root"
    (root / "ckpt").mkdir()
    data, digest = checkpoint_bytes()
    (root / "ckpt" / "job.rose").write_bytes(data)
    v = CheckpointVerifier(
        VerifyLimits(max_bytes=1 << 20, timeout_seconds=5),
        paths=StaticCheckpointPaths({POD: "/ckpt"}),
        proc=proc,
        use_openat2=request.param,
    )
    return v, root, digest


def test_a_good_checkpoint_inside_the_pods_root_and_checkpoint_path_verifies(
    world: tuple[CheckpointVerifier, Path, str],
) -> None:
    v, _, digest = world
    assert v.verify(req("/ckpt/job.rose", digest)).ok
    assert v.verify(req("//ckpt///job.rose", digest)).ok  # the same components
    assert v.verify(req("/ckpt/job.rose", "0" * 64)).problem is Problem.MISMATCH


def test_host_files_are_never_opened_and_nothing_about_them_is_told(
    world: tuple[CheckpointVerifier, Path, str],
) -> None:
    v, _, digest = world
    for path in ("/etc/shadow", "/ckpt/../etc/shadow", "/ckpt/./job.rose", "ckpt/job.rose", "/ckptx/job.rose"):
        got = v.verify(req(path, digest))
        assert got.problem is Problem.OUTSIDE, (path, got)
    # the same answer whether the host file exists or not: existence does not leak
    assert v.verify(req("/etc/shadow", digest)).problem == v.verify(req("/etc/no-such-file", digest)).problem
    assert str(Problem.OUTSIDE) == "outside checkpointPath" and "/" not in str(Problem.OUTSIDE)


def test_a_symlink_out_of_the_pod_root_is_refused(world: tuple[CheckpointVerifier, Path, str]) -> None:
    v, root, digest = world
    host = root.parent.parent.parent / "host-secret.rose"  # outside the pod's root, a valid checkpoint
    data, host_digest = checkpoint_bytes(b"host")
    host.write_bytes(data)
    (root / "ckpt" / "link.rose").symlink_to(host)
    (root / "ckpt" / "rel.rose").symlink_to("../../../../host-secret.rose")
    (root / "ckpt" / "dir").symlink_to(host.parent)
    for name in ("link.rose", "rel.rose", "dir/host-secret.rose"):
        got = v.verify(req(f"/ckpt/{name}", host_digest))
        assert got.problem is Problem.SYMLINK, (name, got)
    assert v.verify(req("/ckpt/job.rose", digest)).ok


def test_a_fifo_a_directory_and_a_device_are_refused_at_once(world: tuple[CheckpointVerifier, Path, str]) -> None:
    v, root, digest = world
    os.mkfifo(root / "ckpt" / "fifo.rose")  # opened for reading without a writer: would block forever
    (root / "ckpt" / "d.rose").mkdir()
    (root / "ckpt" / "null.rose").symlink_to("/dev/null")
    t0 = time.monotonic()
    assert v.verify(req("/ckpt/fifo.rose", digest)).problem is Problem.NOT_REGULAR
    assert v.verify(req("/ckpt/d.rose", digest)).problem is Problem.NOT_REGULAR
    assert v.verify(req("/ckpt/null.rose", digest)).problem is Problem.SYMLINK
    assert time.monotonic() - t0 < 2


def test_a_100_gb_sparse_file_is_refused_before_a_byte_is_read(world: tuple[CheckpointVerifier, Path, str]) -> None:
    v, root, digest = world
    with open(root / "ckpt" / "big.rose", "wb") as f:
        f.truncate(100 * 10**9)
    t0 = time.monotonic()
    got = v.verify(req("/ckpt/big.rose", digest))
    assert got.problem is Problem.TOO_LARGE and time.monotonic() - t0 < 1, got


def test_the_pid_comes_from_the_pod_uid_never_from_the_report(world: tuple[CheckpointVerifier, Path, str]) -> None:
    v, _, digest = world
    assert v.verify(req("/ckpt/job.rose", digest, pid=1)).problem is Problem.NO_PROCESS  # hostPID: host init
    assert v.verify(req("/ckpt/job.rose", digest, uid="someone-else")).problem is Problem.NO_CHECKPOINT_PATH
    other = CheckpointVerifier(paths=StaticCheckpointPaths(default="/ckpt"), proc=v.proc)
    assert other.verify(req("/ckpt/job.rose", digest, uid="someone-else")).problem is Problem.NO_PROCESS
    assert other.verify(req("/ckpt/job.rose", digest, uid="")).problem is Problem.NO_CHECKPOINT_PATH


def test_malformed_acks(world: tuple[CheckpointVerifier, Path, str]) -> None:
    v, root, digest = world
    (root / "ckpt" / "plain.rose").write_bytes(b"not ours at all")
    assert v.verify(req("", digest)).problem is Problem.NO_PATH
    assert v.verify(req("/ckpt/job.rose", "zz" * 32)).problem is Problem.BAD_DIGEST
    assert v.verify(req("/ckpt/plain.rose", digest)).problem is Problem.NOT_CHECKPOINT
    assert v.verify(req("/ckpt/none.rose", digest)).problem is Problem.UNREADABLE


def test_within_compares_whole_components() -> None:
    assert within("/ckpt/a/b.rose", "/ckpt") == ["ckpt", "a", "b.rose"]
    assert within("/ckpt", "/ckpt") == ["ckpt"]
    assert within("/ckpt2/x", "/ckpt") is None
    assert within("/ckpt/../x", "/ckpt") is None
    assert within("s3://b/job/c.rose", "s3://b/job") == ["b", "job", "c.rose"]
    assert within("s3://b/jobx/c.rose", "s3://b/job") is None
    assert within("s3://other/job/c.rose", "s3://b/job") is None
    assert within("s3://b/job/c.rose", "/ckpt") is None
    assert within("/b/job/c.rose", "s3://b/job") is None
    assert within("s3://b/x", "s3://") is None


class FakeS3:
    """Stands in for an s3fs file system (a real one is tests/e2e/dra_driver/test_checkpoint_s3_verify.py)."""

    def __init__(self, objects: dict[str, bytes], sizes: dict[str, int] | None = None) -> None:
        self.objects, self.sizes, self.opened = objects, sizes or {}, []  # type: list[str]

    def info(self, key: str) -> dict[str, Any]:
        if key not in self.objects:
            raise FileNotFoundError(key)
        return {"size": self.sizes.get(key, len(self.objects[key]))}

    def open(self, key: str, mode: str) -> Any:
        import io

        self.opened.append(key)
        return io.BytesIO(self.objects[key])


def test_s3_objects_only_under_the_jobs_own_prefix_with_the_same_categories() -> None:
    data, digest = checkpoint_bytes()
    fs = FakeS3({"b/job/c.rose": data, "b/other/c.rose": data, "b/job/huge.rose": b""}, {"b/job/huge.rose": 10**12})
    v = CheckpointVerifier(
        VerifyLimits(max_bytes=1 << 20), paths=StaticCheckpointPaths({POD: "s3://b/job"}), s3_filesystem=lambda: fs
    )
    assert v.verify(req("s3://b/job/c.rose", digest)).ok
    for outside in ("s3://b/other/c.rose", "s3://secret-bucket/c.rose", "s3://b/job/../other/c.rose", "/b/job/c.rose"):
        assert v.verify(req(outside, digest)).problem is Problem.OUTSIDE, outside
    assert v.verify(req("s3://b/job/huge.rose", digest)).problem is Problem.TOO_LARGE
    assert v.verify(req("s3://b/job/missing.rose", digest)).problem is Problem.UNREADABLE
    assert fs.opened == ["b/job/c.rose"]  # nothing outside the prefix, nothing too large was read


def test_a_stuck_verification_holds_only_its_own_thread(tmp_path: Path) -> None:
    release = threading.Event()

    class HangingPaths:
        def checkpoint_path(self, namespace: str, name: str, uid: str) -> str | None:
            if uid == "stuck":
                release.wait(30)  # a verification stuck in the kernel, in the API, anywhere
            return "/ckpt"

    proc = fake_proc(tmp_path)
    root = proc / str(HOST_PID) / "root"
    (root / "ckpt").mkdir()
    data, digest = checkpoint_bytes()
    (root / "ckpt" / "job.rose").write_bytes(data)
    v = CheckpointVerifier(VerifyLimits(timeout_seconds=0.5, max_in_flight=2), paths=HangingPaths(), proc=proc)
    try:
        t0 = time.monotonic()
        assert v.verify(req("/ckpt/job.rose", digest, uid="stuck")).problem is Problem.TIMED_OUT
        assert 0.5 <= time.monotonic() - t0 < 2
        t0 = time.monotonic()  # the same pod again: refused at once while its first one is stuck
        assert v.verify(req("/ckpt/job.rose", digest, uid="stuck")).problem is Problem.TIMED_OUT
        assert time.monotonic() - t0 < 0.2
        assert v.verify(req("/ckpt/job.rose", digest)).ok  # another pod is not delayed
    finally:
        release.set()

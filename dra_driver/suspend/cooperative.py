"""The ``cooperative`` backend: the rose_sdk inside the workload moves its own tensors.

The engine pushes a command on the workload's stream with a wall-clock deadline; the SDK acts at
its next safe point (offload into reused pinned host buffers and free device memory, or the
reverse, or an atomic durable checkpoint) and acknowledges with the bytes it moved.

``verify_checkpoint`` checks the checkpoint an ack names before anything is evicted: the file of
``rose_sdk.checkpoint``'s format (``ROSECKPT1\\n`` + 64 hex sha256 of the payload + ``\\n`` +
payload), streamed in 1 MiB reads. An ``s3://bucket/key`` checkpoint (the object the SDK's ack
names) is streamed the same way through fsspec + s3fs, with the endpoint and credentials of the
driver's own environment (``ROSE_S3_ENDPOINT``, else ``AWS_ENDPOINT_URL_S3`` /
``AWS_ENDPOINT_URL``; ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, the standard AWS chain,
as the SDK reads them). I/O boundary: the workload's command queue, reading that file or object.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from dra_driver.suspend.model import BACKEND_COOPERATIVE, Ack, BackendOutcome, Command, CommandKind, OpContext
from dra_driver.suspend.registry import Workload


def unix_ms_for(deadline_monotonic: float) -> int:
    """Convert a monotonic deadline into the wall-clock milliseconds a workload can compare with."""
    return int((time.time() + (deadline_monotonic - time.monotonic())) * 1000)


class CooperativeBackend:
    name = BACKEND_COOPERATIVE

    def _roundtrip(
        self, w: Workload, kind: CommandKind, deadline_monotonic: float, op: OpContext
    ) -> tuple[Ack | None, str]:
        note = "" if w.connected else " (its command stream is not connected now; the command waits for it)"
        w.send(
            Command(
                operation_id=op.operation_id,
                kind=kind,
                backend=self.name,
                deadline_unix_ms=unix_ms_for(deadline_monotonic),
                grace_seconds=op.grace_seconds,
                reason=op.reason,
            )
        )
        return w.wait_ack(op.operation_id, deadline_monotonic), note

    def suspend(self, w: Workload, deadline_monotonic: float, op: OpContext) -> BackendOutcome:
        ack, note = self._roundtrip(w, "suspend", deadline_monotonic, op)
        if ack is None:
            return BackendOutcome(
                False,
                0,
                f"workload did not acknowledge the suspend within its grace period{note}",
                timed_out=True,
            )
        if not ack.ok:
            return BackendOutcome(False, 0, f"workload refused or failed the suspend: {ack.message}")
        return BackendOutcome(True, ack.bytes_moved, ack.message or "offloaded to host memory")

    def resume(self, w: Workload, deadline_monotonic: float, op: OpContext) -> BackendOutcome:
        ack, note = self._roundtrip(w, "resume", deadline_monotonic, op)
        if ack is None:
            return BackendOutcome(False, 0, f"workload did not acknowledge the resume in time{note}", timed_out=True)
        if not ack.ok:
            return BackendOutcome(False, 0, f"workload failed the resume: {ack.message}")
        return BackendOutcome(True, ack.bytes_moved, ack.message or "restored to device memory")

    def checkpoint(self, w: Workload, deadline_monotonic: float, op: OpContext) -> Ack | None:
        """Ask for an atomic durable checkpoint; the ack carries its path and sha256, or None on timeout."""
        ack, _ = self._roundtrip(w, "checkpoint", deadline_monotonic, op)
        return ack


CHECKPOINT_MAGIC = b"ROSECKPT1\n"
_HEX_LEN = 64
_CHUNK = 1 << 20


def checkpoint_candidates(path: str, pid: int) -> list[Path]:
    """Where the agent can read a path the workload named: through its process's root (its
    container's file system, with hostPID) first, then as given (same mount namespace)."""
    out = []
    if pid > 0 and os.path.isabs(path):
        out.append(Path(f"/proc/{pid}/root") / path.lstrip("/"))
    out.append(Path(path))
    return out


def verify_checkpoint(path: str, sha256: str, pid: int = 0) -> str:
    """'' when the checkpoint at ``path`` exists, has the ROSE header and its payload hashes to
    both the header's and the ack's ``sha256``; otherwise what is wrong."""
    if not path:
        return "the acknowledgement names no checkpoint_path"
    if len(sha256) != _HEX_LEN:
        return f"the acknowledgement's checkpoint_sha256 must be {_HEX_LEN} hex digits, got {sha256!r:.80}"
    if path.startswith(S3_SCHEME):
        return _verify_s3(path, sha256.lower())
    problems = []
    for p in checkpoint_candidates(path, pid):
        problem = _verify_file(p, sha256.lower())
        if not problem:
            return ""
        problems.append(problem)
    return "; ".join(problems)


def _verify_stream(f: IO[bytes], name: str, want: str) -> str:
    """The header and payload checks of one open checkpoint; read errors propagate."""
    head = f.read(len(CHECKPOINT_MAGIC) + _HEX_LEN + 1)
    if not head.startswith(CHECKPOINT_MAGIC) or len(head) != len(CHECKPOINT_MAGIC) + _HEX_LEN + 1:
        return f"{name} is not a ROSE checkpoint (bad header)"
    header_sum = head[len(CHECKPOINT_MAGIC) : -1].decode("ascii", "replace").lower()
    h = hashlib.sha256()
    while chunk := f.read(_CHUNK):
        h.update(chunk)
    got = h.hexdigest()
    if got != header_sum or got != want:
        return f"{name}: payload sha256 {got}, header says {header_sum}, acknowledgement says {want}"
    return ""


def _verify_file(p: Path, want: str) -> str:
    try:
        with open(p, "rb") as f:
            return _verify_stream(f, str(p), want)
    except OSError as e:
        return f"cannot read {p}: {e.strerror or e}"


S3_SCHEME = "s3://"
_S3_HELP = "give the driver the bucket's endpoint and credentials (ROSE_S3_ENDPOINT, AWS_ACCESS_KEY_ID, ...)"


def s3_endpoint(env: Mapping[str, str]) -> str | None:
    """The S3 endpoint URL as the SDK finds it: ROSE_S3_ENDPOINT, else AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL."""
    return next((env[n] for n in ("ROSE_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL") if env.get(n)), None)


def _s3_filesystem() -> Any:
    import s3fs  # only s3:// checkpoints need it (the workload extra)

    return s3fs.S3FileSystem(endpoint_url=s3_endpoint(os.environ), skip_instance_cache=True)


def _verify_s3(url: str, want: str) -> str:
    try:
        fs = _s3_filesystem()
    except ImportError:
        return f"cannot read {url}: s3:// checkpoints need s3fs in the driver's environment (pip install s3fs)"
    try:
        with fs.open(url[len(S3_SCHEME) :], "rb") as f:
            return _verify_stream(f, url, want)
    except Exception as e:  # s3fs and botocore raise more than OSError (e.g. no credentials)
        return f"cannot read {url}: {' '.join(str(e).split())[:300] or type(e).__name__}; {_S3_HELP}"

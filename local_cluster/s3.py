"""A real S3-compatible server on localhost: MinIO, built from its Go module like the Kubernetes
binaries (``hack/build-binaries.sh``, pinned by ``MINIO_VERSION`` in ``hack/versions.env``).

    with s3_server(tmp_path) as s3:
        os.environ.update(s3.env())        # what a Secret mounted with envFrom gives a worker
        save_checkpoint("s3://ckpt/job", ...)

I/O boundary: the ``minio`` binary (found in the version-keyed cache, built by the script when
missing), one child process with its data directory and log under ``workdir``, a free TCP port
on 127.0.0.1, and an HTTP readiness probe (``/minio/health/ready``). Credentials are generated
per server and exist only in memory and in the child's environment.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from local_cluster import binaries
from local_cluster.cluster import log_tail, reserved_port, stop_process

READY_TIMEOUT_S = 60.0
REGION = "us-east-1"


class S3ServerError(RuntimeError):
    """The S3 server could not be found, built or started; the message says what to do."""


@dataclass(frozen=True)
class S3Server:
    endpoint: str  # http://127.0.0.1:PORT
    access_key: str
    secret_key: str
    pid: int
    log: Path

    def env(self) -> dict[str, str]:
        """The standard AWS variables for this server (endpoint, credentials, region)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": REGION,
        }


def minio_version() -> str:
    for line in (binaries.HACK / "versions.env").read_text().splitlines():
        key, _, value = line.strip().partition("=")
        if key == "MINIO_VERSION":
            return os.environ.get("ROSE_MINIO_VERSION", value.strip())
    raise S3ServerError(f"MINIO_VERSION is missing from {binaries.HACK / 'versions.env'}")


def minio_binary(build: bool = True) -> Path:
    """The cached ``minio`` of the pinned version, built by hack/build-binaries.sh when missing."""
    entry = binaries.cache_dir() / "bin" / f"minio-{minio_version()}"
    if _stamp_ok(entry):
        return entry / "minio"
    if not build:
        raise S3ServerError(f"minio is not built in {entry}; run hack/build-binaries.sh")
    env = {**os.environ, "ROSE_CACHE_DIR": str(binaries.cache_dir())}
    script = str(binaries.HACK / "build-binaries.sh")
    r = subprocess.run(["bash", script], env=env, check=False, stdout=subprocess.DEVNULL)
    if r.returncode != 0 or not _stamp_ok(entry):
        raise S3ServerError(f"building minio failed (exit {r.returncode}); run hack/build-binaries.sh to see why")
    return entry / "minio"


def _stamp_ok(entry: Path) -> bool:
    if not (entry / "minio").is_file() or not (entry / ".sha256").is_file():
        return False
    r = subprocess.run(["sha256sum", "--quiet", "-c", ".sha256"], cwd=entry, capture_output=True, check=False)
    return r.returncode == 0


@contextlib.contextmanager
def s3_server(workdir: Path, binary: Path | None = None) -> Iterator[S3Server]:
    """Start MinIO on a free port with generated credentials, wait until it is ready, stop it at the end."""
    exe = binary or minio_binary()
    data, log = workdir / "s3-data", workdir / "s3.log"
    data.mkdir(parents=True, exist_ok=True)
    port, console = reserved_port(), reserved_port()
    access, secret = f"rose{secrets.token_hex(6)}", secrets.token_urlsafe(24)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(workdir),
        "MINIO_ROOT_USER": access,
        "MINIO_ROOT_PASSWORD": secret,
        "MINIO_BROWSER": "off",
        "MINIO_UPDATE": "off",
    }
    cmd = [str(exe), "server", str(data), "--address", f"127.0.0.1:{port}", "--console-address", f"127.0.0.1:{console}"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait_ready(proc, port, log)
            yield S3Server(f"http://127.0.0.1:{port}", access, secret, proc.pid, log)
        finally:
            stop_process(proc)


def _wait_ready(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise S3ServerError(f"minio exited with {proc.returncode} before it was ready:\n{log_tail(log)}")
        if _ready(port):
            return
        time.sleep(0.2)
    raise S3ServerError(f"minio on port {port} not ready after {READY_TIMEOUT_S:.0f} s:\n{log_tail(log)}")


def _ready(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/minio/health/ready")
        status = conn.getresponse().status
        conn.close()
        return status == 200
    except OSError:
        return False

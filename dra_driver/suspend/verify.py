"""Verifies the durable checkpoint a workload's ack names, before the fallback evicts anything.

The ack is a *hint*: the driver opens only what the driver itself knows the workload may name.

* **Where**: only under the job's ``checkpointPath`` as the driver knows it (the pod's
  ``ROSE_CHECKPOINT_PATH`` as the API server has it, which the controller sets from the job's
  ``spec.checkpointPath``: :class:`CheckpointPaths`), never the path the ack names on its own.
  The comparison is by path components; ``.`` and ``..`` components are refused outright.
* **Whose file system**: a file path is opened only inside the pod's own root,
  ``/proc/<pid>/root``, where ``<pid>`` is resolved from the pod UID of the driver's claim
  records (:func:`dra_driver.suspend.pids.resolve_pid`), never the PID the workload reports.
  The root directory is opened once (following that magic link on purpose) and the path is then
  resolved *relative to that directory fd* with ``openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS
  | RESOLVE_NO_SYMLINKS)`` (Linux 5.6+, syscall 437 on x86_64 and aarch64): the kernel keeps the
  walk inside the root, refuses every symlink (a checkpoint the SDK writes is a plain file in a
  plain directory, so nothing legitimate is lost) and every magic link such as the pod's view of
  ``/proc/1/root`` under hostPID. Where ``openat2`` is missing (old kernel, a seccomp profile that
  answers ``ENOSYS``/``EPERM``) the same rule is a walk one component at a time from the root fd
  with ``O_PATH | O_NOFOLLOW`` (``..`` is already refused lexically).
* **What**: the last component is first opened ``O_PATH`` (no open side effects on a device or a
  FIFO), ``fstat`` must say a regular file no larger than ``max_bytes`` (a 100 GB sparse file is
  refused before one byte is read), then it is reopened read-only ``O_NONBLOCK`` through
  ``/proc/self/fd`` and checked to be the same inode; reads stop at the cap and at the deadline.
* **Off the caller's threads**: each verification runs on its own daemon thread, at most
  ``max_in_flight`` at once on the node and one per pod; the caller (the engine's operation, on
  the driver's engine pool) waits at most ``timeout_seconds`` and then gets ``timed out``. A
  verification stuck in the kernel (a hung mount in the pod) holds only its own thread.
* **What the tenant learns**: :class:`Verdict` ``problem`` is a fixed category (``Problem``),
  the only text that goes into Events and results; ``detail`` (paths, OS errors) is for the
  driver's log. An ``s3://`` checkpoint follows the same rules with the driver's own credentials
  (``ROSE_S3_ENDPOINT`` / ``AWS_*``): only under the job's own ``s3://`` ``checkpointPath``, size
  from the object's metadata first, the same categories (a missing object and a forbidden one are
  both ``unreadable``).

I/O boundary: ``/proc`` (the pod's root and cgroup), the checkpoint file or object, the
``openat2`` syscall.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import logging
import os
import platform
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import IO, Any, Protocol

from dra_driver.suspend import pids

log = logging.getLogger("rose.suspend.verify")

CHECKPOINT_MAGIC = b"ROSECKPT1\n"
S3_SCHEME = "s3://"
_HEX_LEN = 64
_HEAD_LEN = len(CHECKPOINT_MAGIC) + _HEX_LEN + 1
_CHUNK = 1 << 20

DEFAULT_MAX_BYTES = 64 << 30
DEFAULT_TIMEOUT_SECONDS = 120.0
DEFAULT_MAX_IN_FLIGHT = 16


class Problem(StrEnum):
    """Why a checkpoint was not verified: the only words a tenant's Event carries."""

    NONE = ""
    NO_PATH = "the acknowledgement names no checkpoint"
    BAD_DIGEST = "malformed sha256"
    NO_CHECKPOINT_PATH = "no checkpointPath known for the pod"
    OUTSIDE = "outside checkpointPath"
    NO_PROCESS = "workload process not found"
    SYMLINK = "symlink refused"
    NOT_REGULAR = "not a regular file"
    TOO_LARGE = "too large"
    UNREADABLE = "unreadable"
    NOT_CHECKPOINT = "not a ROSE checkpoint"
    MISMATCH = "hash mismatch"
    TIMED_OUT = "timed out"
    BUSY = "too many verifications running"
    NO_S3 = "s3 not supported by this node's driver"


@dataclass(frozen=True)
class Verdict:
    problem: Problem
    detail: str = ""  # the driver's log only: may name host paths and OS errors

    @property
    def ok(self) -> bool:
        return self.problem is Problem.NONE


OK = Verdict(Problem.NONE)


@dataclass(frozen=True)
class VerifyLimits:
    max_bytes: int = DEFAULT_MAX_BYTES
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT

    def __post_init__(self) -> None:
        if self.max_bytes <= 0 or self.timeout_seconds <= 0 or self.max_in_flight <= 0:
            raise ValueError("checkpoint verification limits must be > 0 (bytes, seconds, in flight)")


@dataclass(frozen=True)
class VerifyRequest:
    """One verification. ``pod_uid`` and ``namespace``/``name`` come from the driver's claim
    records; ``reported_pid``, ``path`` and ``sha256`` from the workload (hints)."""

    pod_uid: str
    namespace: str
    name: str
    reported_pid: int
    path: str
    sha256: str


class CheckpointPaths(Protocol):
    """The job's ``checkpointPath`` of a pod as the driver knows it (None: none)."""

    def checkpoint_path(self, namespace: str, name: str, uid: str) -> str | None: ...


class StaticCheckpointPaths:
    """A fixed table pod UID → checkpointPath (the standalone agent's ``--checkpoint-prefix``, tests)."""

    def __init__(self, by_uid: Mapping[str, str] | None = None, default: str | None = None) -> None:
        self.by_uid = dict(by_uid or {})
        self.default = default

    def checkpoint_path(self, namespace: str, name: str, uid: str) -> str | None:
        return self.by_uid.get(uid, self.default)


# ------------------------------------------------------------------------------------ pure
def path_parts(path: str) -> list[str] | None:
    """The components of an absolute path or an ``s3://bucket/key`` URL (scheme kept as the first
    part); None when it is neither, or has a ``.`` / ``..`` component."""
    if path.startswith(S3_SCHEME):
        head, rest = [S3_SCHEME], path[len(S3_SCHEME) :]
    elif path.startswith("/"):
        head, rest = ["/"], path
    else:
        return None
    parts = [p for p in rest.split("/") if p]
    if any(p in (".", "..") or "\x00" in p for p in parts):
        return None
    return head + parts


def within(path: str, prefix: str) -> list[str] | None:
    """Pure: the components of ``path`` below the root (``s3://`` bucket first) when ``path`` is
    ``prefix`` or lies under it, by whole components; None otherwise."""
    p, q = path_parts(path), path_parts(prefix)
    if p is None or q is None or (len(q) < 2 and q[0] == S3_SCHEME):
        return None
    if len(p) <= 1 or p[: len(q)] != q:
        return None
    return p[1:]


def check_stream(read: Callable[[int], bytes], want: str, max_bytes: int, deadline: float) -> Verdict:
    """The header and payload checks of one open checkpoint (``rose_sdk.checkpoint``'s format:
    ``ROSECKPT1\\n`` + 64 hex sha256 of the payload + ``\\n`` + payload)."""
    head = read(_HEAD_LEN)
    if not head.startswith(CHECKPOINT_MAGIC) or len(head) != _HEAD_LEN or head[-1:] != b"\n":
        return Verdict(Problem.NOT_CHECKPOINT, "bad header")
    header_sum = head[len(CHECKPOINT_MAGIC) : -1].decode("ascii", "replace").lower()
    h, n = hashlib.sha256(), len(head)
    while chunk := read(_CHUNK):
        n += len(chunk)
        if n > max_bytes:
            return Verdict(Problem.TOO_LARGE, f"grew past {max_bytes} B while read")
        if time.monotonic() > deadline:
            return Verdict(Problem.TIMED_OUT, f"deadline passed after {n} B")
        h.update(chunk)
    got = h.hexdigest()
    if got != header_sum or got != want:
        return Verdict(Problem.MISMATCH, f"payload sha256 {got}, header says {header_sum}, ack says {want}")
    return OK


# ------------------------------------------------------------------------------------ openat2
_O_PATH = getattr(os, "O_PATH", 0o10000000)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_IN_ROOT = 0x10
_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437, "arm64": 437}


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _openat2(dirfd: int, path: str, flags: int, resolve: int) -> int:
    nr = _SYS_OPENAT2.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, "openat2 not known on this architecture")
    libc = ctypes.CDLL(None, use_errno=True)
    how = _OpenHow(flags, 0, resolve)
    fd = int(libc.syscall(nr, dirfd, os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how)))
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return fd


@functools.cache
def openat2_available() -> bool:
    """Whether this kernel (and seccomp profile) serves openat2; probed once."""
    try:
        root = os.open("/", _O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.close(_openat2(root, ".", _O_PATH | os.O_CLOEXEC, _RESOLVE_IN_ROOT))
        finally:
            os.close(root)
    except OSError:
        return False
    return True


def _os_problem(e: OSError) -> Problem:
    """ELOOP: a symlink or magic link on the path; EXDEV: openat2 saw the walk leave the root."""
    return Problem.SYMLINK if e.errno in (errno.ELOOP, errno.EXDEV) else Problem.UNREADABLE


def open_path_in_root(root_fd: int, parts: list[str], *, use_openat2: bool) -> int:
    """An ``O_PATH`` fd of ``parts`` below the directory ``root_fd``, never leaving it and never
    following a symlink (OSError otherwise)."""
    rel = "/".join(parts)
    if use_openat2:
        return _openat2(
            root_fd,
            rel,
            _O_PATH | os.O_CLOEXEC,  # no O_NOFOLLOW: with O_PATH it would open a trailing symlink itself
            _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS | _RESOLVE_NO_SYMLINKS,
        )
    fd = os.dup(root_fd)
    try:
        for i, part in enumerate(parts):
            nfd = os.open(part, _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)  # a symlink: itself
            os.close(fd)
            fd = nfd
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode):
                raise OSError(errno.ELOOP, f"component {i} is a symlink")
            if i < len(parts) - 1 and not stat.S_ISDIR(mode):
                raise OSError(errno.ENOTDIR, f"component {i} is not a directory")
        return fd
    except BaseException:
        os.close(fd)
        raise


# ------------------------------------------------------------------------------------ the verifier
def _s3_filesystem() -> Any:
    import s3fs  # only s3:// checkpoints need it (the workload extra)

    return s3fs.S3FileSystem(endpoint_url=s3_endpoint(os.environ), skip_instance_cache=True)


def s3_endpoint(env: Mapping[str, str]) -> str | None:
    """The S3 endpoint URL as the SDK finds it: ROSE_S3_ENDPOINT, else AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL."""
    return next((env[n] for n in ("ROSE_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL") if env.get(n)), None)


class CheckpointVerifier:
    """Verifies checkpoints under the rules of this module's docstring, each on its own thread."""

    def __init__(
        self,
        limits: VerifyLimits | None = None,
        *,
        paths: CheckpointPaths | None = None,
        proc: Path = Path("/proc"),
        resolve_pid: Callable[[str, int], int | None] | None = None,
        s3_filesystem: Callable[[], Any] = _s3_filesystem,
        use_openat2: bool | None = None,
    ) -> None:
        self.limits = limits or VerifyLimits()
        self.paths = paths
        self.proc = proc
        self._resolve = resolve_pid or (lambda uid, pid: pids.resolve_pid(uid, pid, proc))
        self._s3 = s3_filesystem
        self.use_openat2 = openat2_available() if use_openat2 is None else use_openat2
        self._mu = threading.Lock()
        self._in_flight: set[str] = set()

    def verify(self, req: VerifyRequest) -> Verdict:
        """Run one verification on its own thread; wait at most ``timeout_seconds``."""
        key = req.pod_uid or f"pid:{req.reported_pid}"
        with self._mu:
            if key in self._in_flight:
                return Verdict(Problem.TIMED_OUT, "an earlier verification of this pod is still running")
            if len(self._in_flight) >= self.limits.max_in_flight:
                return Verdict(Problem.BUSY, f"{len(self._in_flight)} verifications running")
            self._in_flight.add(key)
        deadline = time.monotonic() + self.limits.timeout_seconds
        box: list[Verdict] = []
        done = threading.Event()

        def run() -> None:
            try:
                box.append(self.verify_now(req, deadline))
            except Exception as e:  # a bug must end in a verdict, never in a hang
                box.append(Verdict(Problem.UNREADABLE, f"internal error {e!r}"))
            finally:
                with self._mu:
                    self._in_flight.discard(key)
                done.set()

        threading.Thread(target=run, name=f"rose-verify-{key[:12]}", daemon=True).start()
        if not done.wait(self.limits.timeout_seconds) or not box:
            return Verdict(Problem.TIMED_OUT, f"no verdict within {self.limits.timeout_seconds:g}s")
        return box[0]

    def verify_now(self, req: VerifyRequest, deadline: float) -> Verdict:
        """The verification itself, on the calling thread."""
        if not req.path:
            return Verdict(Problem.NO_PATH)
        want = req.sha256.lower()
        if len(want) != _HEX_LEN or any(c not in "0123456789abcdef" for c in want):
            return Verdict(Problem.BAD_DIGEST, f"{req.sha256!r:.80}")
        try:
            prefix = (
                self.paths.checkpoint_path(req.namespace, req.name, req.pod_uid) if self.paths and req.pod_uid else None
            )
        except Exception as e:  # the API server down: nothing is verified, nothing evicted
            return Verdict(Problem.NO_CHECKPOINT_PATH, f"reading the pod's checkpointPath failed: {e!r}")
        if not prefix:
            return Verdict(Problem.NO_CHECKPOINT_PATH, f"pod {req.namespace}/{req.name} uid {req.pod_uid!r}")
        parts = within(req.path, prefix)
        if parts is None:
            return Verdict(Problem.OUTSIDE, f"{req.path!r} is not under {prefix!r}")
        if req.path.startswith(S3_SCHEME):
            return self._verify_s3(parts, want, deadline)
        return self._verify_file(req, parts, want, deadline)

    # -------------------------------------------------------------------- files
    def _verify_file(self, req: VerifyRequest, parts: list[str], want: str, deadline: float) -> Verdict:
        pid = self._resolve(req.pod_uid, req.reported_pid)
        if pid is None:
            return Verdict(Problem.NO_PROCESS, f"no process of pod {req.pod_uid} reports pid {req.reported_pid}")
        root = self.proc / str(pid) / "root"
        try:
            root_fd = os.open(root, _O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            return Verdict(Problem.NO_PROCESS, f"cannot open {root}: {e}")
        try:
            if self._resolve(req.pod_uid, req.reported_pid) != pid:  # the pid was reused meanwhile
                return Verdict(Problem.NO_PROCESS, f"pid {pid} changed while its root was opened")
            return self._verify_below(root_fd, parts, want, deadline, f"{root}/{'/'.join(parts)}")
        finally:
            os.close(root_fd)

    def _verify_below(self, root_fd: int, parts: list[str], want: str, deadline: float, name: str) -> Verdict:
        try:
            pfd = open_path_in_root(root_fd, parts, use_openat2=self.use_openat2)
        except OSError as e:
            return Verdict(_os_problem(e), f"{name}: {e}")
        try:
            st = os.fstat(pfd)
            if stat.S_ISLNK(st.st_mode):
                return Verdict(Problem.SYMLINK, f"{name}: a symlink")
            if not stat.S_ISREG(st.st_mode):
                return Verdict(Problem.NOT_REGULAR, f"{name}: mode {stat.filemode(st.st_mode)}")
            if st.st_size > self.limits.max_bytes:
                return Verdict(Problem.TOO_LARGE, f"{name}: {st.st_size} B > {self.limits.max_bytes} B")
            try:
                fd = os.open(f"/proc/self/fd/{pfd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
            except OSError as e:
                return Verdict(Problem.UNREADABLE, f"{name}: {e}")
        finally:
            os.close(pfd)
        try:
            st2 = os.fstat(fd)
            if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(st2.st_mode):
                return Verdict(Problem.NOT_REGULAR, f"{name}: changed while opened")
            return check_stream(lambda n: os.read(fd, n), want, self.limits.max_bytes, deadline)
        except OSError as e:
            return Verdict(Problem.UNREADABLE, f"{name}: {e}")
        finally:
            os.close(fd)

    # -------------------------------------------------------------------- s3
    def _verify_s3(self, parts: list[str], want: str, deadline: float) -> Verdict:
        key = "/".join(parts)
        try:
            fs = self._s3()
        except ImportError:
            return Verdict(Problem.NO_S3, "s3fs is not installed in the driver's environment (pip install s3fs)")
        try:
            size = int(fs.info(key).get("size") or 0)
            if size > self.limits.max_bytes:
                return Verdict(Problem.TOO_LARGE, f"s3://{key}: {size} B > {self.limits.max_bytes} B")
            f: IO[bytes]
            with fs.open(key, "rb") as f:
                return check_stream(f.read, want, self.limits.max_bytes, deadline)
        except Exception as e:  # s3fs and botocore raise more than OSError (e.g. no credentials)
            return Verdict(Problem.UNREADABLE, f"s3://{key}: {' '.join(str(e).split())[:300] or type(e).__name__}")

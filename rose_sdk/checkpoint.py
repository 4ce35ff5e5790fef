"""Atomic durable checkpoint: model, optimizer, every RNG state, step and user state.

I/O boundary: the checkpoint file and a temporary file next to it; nothing else.

File layout (format 1): ``ROSECKPT1\\n`` (10 bytes) + the sha256 of the payload (64 lower-case
hex digits) + ``\\n`` + payload, where the payload (from byte 75 to the end of the file) is
``torch.save`` (zip) of plain containers, numbers, strings and tensors only, loaded back with
``weights_only=True`` (no pickled code runs on load). A verifier needs no torch: read the first
75 bytes, then hash the rest of the file in chunks and compare.

Both directions stream, so a checkpoint costs little host RAM beyond the state itself (the
fallback that writes one runs exactly when host memory is short): ``save_checkpoint`` writes the
tensors one by one into a temporary file in the same directory while hashing them, then puts the
digest into the header, fsyncs, renames over the target and fsyncs the directory — a crash
leaves either the old file or the new one, never a torn one. ``load_checkpoint`` hashes the file
in chunks and compares before it deserialises anything, then loads from the same open file; a
file whose checksum matches but whose content is not a well-formed checkpoint (re-signed or
written by a buggy writer) raises :class:`CheckpointError` too, saying what is wrong.
Peak extra host RAM for a 256 MiB state: 2.5 MiB to save, 0.8 MiB to load beyond the loaded
state (``python -m tests.support.sdk_checkpoint_memory 256 save|load PATH``, VmHWM in a fresh process).

User state must be made of dicts, lists, tuples, str, int, float, bool, None and tensors.

``s3://bucket/prefix`` (fsspec + s3fs): the prefix holds data objects
``ckpt-<step:012d>-<random>.rose`` (the same file format) and a pointer object ``LATEST`` (JSON:
format, object, sha256, nbytes, step), written *last*. An S3 PUT is all-or-nothing, so a crash
between the data and the pointer leaves ``LATEST`` naming the previous, complete checkpoint and
an orphan object that a later save prunes. A save spools the checkpoint to a local temporary file
(``TMPDIR``; as much disk as the checkpoint, little RAM) and uploads it (multipart); a load
downloads the object named by ``LATEST`` to a temporary file and verifies it against both the
file's header and the pointer. I/O boundary for s3://: the bucket prefix, a temporary local file,
and the environment for the endpoint (``ROSE_S3_ENDPOINT``, else ``AWS_ENDPOINT_URL_S3`` /
``AWS_ENDPOINT_URL``) and credentials (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, the
standard AWS chain; in a cluster from a Secret mounted with ``envFrom``).

``ROSE_RESTORE=latest`` (set by the ElasticRLJob controller on every worker) makes
:func:`restore_latest`, which ``Workload.start`` calls, restore the newest checkpoint at the
path when there is one: a recreated worker continues from the job's durable checkpoint.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import secrets
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from rose_common.atomic import atomic_write, fsync_dir

MAGIC = b"ROSECKPT1\n"
_HEX_LEN = 64
HEADER_LEN = len(MAGIC) + _HEX_LEN + 1
_CHUNK = 1 << 20


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, truncated, corrupted or not a ROSE checkpoint."""


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path | str  # a str for an s3:// object
    sha256: str
    nbytes: int
    seconds: float
    step: int | None = None


@dataclass
class Checkpoint:
    step: int
    model_state: dict[str, Any] | None
    optimizer_state: dict[str, Any] | None
    rng: dict[str, Any]
    user_state: Any
    sha256: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def restore(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        rng: bool = True,
    ) -> None:
        """Load the states into ``model`` / ``optimizer`` and (by default) set every RNG back."""
        if model is not None:
            if self.model_state is None:
                raise CheckpointError("the checkpoint has no model state")
            model.load_state_dict(self.model_state)
        if optimizer is not None:
            if self.optimizer_state is None:
                raise CheckpointError("the checkpoint has no optimizer state")
            optimizer.load_state_dict(self.optimizer_state)
        if rng:
            try:
                set_rng_state(self.rng)
            except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as e:
                if isinstance(e, CheckpointError):
                    raise
                raise CheckpointError(f"the checkpoint's RNG state is malformed ({type(e).__name__}: {e})") from e


# ---------------------------------------------------------------------- RNG


def get_rng_state() -> dict[str, Any]:
    """Python ``random``, NumPy's global RNG, torch CPU and (when initialised) every CUDA device."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
        "numpy": {
            "name": str(name),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
        "cuda": [],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    n = state["numpy"]
    np.random.set_state(
        (n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    if state.get("cuda"):
        if not torch.cuda.is_available():
            raise CheckpointError("the checkpoint holds CUDA RNG states but CUDA is not available here")
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------- save / load


def write_atomic(path: Path, data: bytes) -> None:
    """temp file in the same directory → write → fsync → rename → fsync the directory
    (:func:`rose_common.atomic.atomic_write`; permissions as ``open()`` gives, umask applied)."""
    atomic_write(path, data, mode=0o666)


_PLAIN = (str, int, float, bool, type(None), torch.Tensor)


def check_plain(obj: Any, where: str = "user_state") -> None:
    """Raise CheckpointError unless ``obj`` is made of containers, scalars, strings and tensors."""
    if isinstance(obj, _PLAIN):
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, str | int):
                raise CheckpointError(f"{where} has a key of type {type(k).__name__}; use str or int keys")
            check_plain(v, f"{where}[{k!r}]")
        return
    if isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            check_plain(v, f"{where}[{i}]")
        return
    raise CheckpointError(
        f"{where} is a {type(obj).__name__}: checkpoints hold only dicts, lists, tuples, str, int, float,"
        " bool, None and tensors (convert it, e.g. to a dict, before saving)"
    )


class _HashingWriter:
    """A write-only file object that hashes what passes through it (torch.save writes here)."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.sha = hashlib.sha256()
        self.nbytes = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.sha.update(view)
        self.f.write(view)
        self.nbytes += len(view)
        return len(view)

    def flush(self) -> None:
        self.f.flush()


def _stream_atomic(path: Path, payload: dict[str, Any]) -> tuple[str, int]:
    """Stream ``payload`` into a temp file next to ``path`` while hashing it, fill in the header's
    digest, fsync, rename over ``path``, fsync the directory; (sha256 hex, payload bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + b"0" * _HEX_LEN + b"\n")
            w = _HashingWriter(f)
            torch.save(payload, w)  # type: ignore[arg-type]  # a write-only file object is enough
            digest = w.sha.hexdigest()
            f.seek(len(MAGIC))
            f.write(digest.encode("ascii"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)
    return digest, w.nbytes


def save_checkpoint(
    path: str | os.PathLike[str],
    *,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    step: int = 0,
    user_state: Any = None,
) -> CheckpointInfo:
    t0 = time.perf_counter()
    check_plain(user_state)
    payload = {
        "format": 1,
        "step": int(step),
        "model": None if model is None else model.state_dict(),
        "optimizer": None if optimizer is None else optimizer.state_dict(),
        "rng": get_rng_state(),
        "user": user_state,
    }
    where = checkpoint_location(path)
    if isinstance(where, str):
        return _save_s3(where, payload, t0)
    digest, nbytes = _stream_atomic(where, payload)
    return CheckpointInfo(where, digest, nbytes, time.perf_counter() - t0, int(step))


class _Payload:
    """A read-only, seekable view of an open file from ``offset`` on (what torch.load reads)."""

    def __init__(self, f: IO[bytes], offset: int) -> None:
        self.f = f
        self.offset = offset

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_SET:
            pos += self.offset
        return self.f.seek(pos, whence) - self.offset

    def tell(self) -> int:
        return self.f.tell() - self.offset

    def read(self, n: int = -1) -> bytes:
        return self.f.read(n)

    def readinto(self, buf: Any) -> int:
        return self.f.readinto(buf)  # type: ignore[attr-defined,no-any-return]

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True


def verify_stream(f: IO[bytes], name: str) -> tuple[str, int]:
    """Check the header and hash the payload of an open checkpoint in chunks; (sha256, payload bytes)."""
    head = f.read(HEADER_LEN)
    if not head.startswith(MAGIC):
        raise CheckpointError(f"{name} is not a ROSE checkpoint (bad magic; expected {MAGIC!r} at the start)")
    if len(head) < HEADER_LEN or head[-1:] != b"\n":
        raise CheckpointError(f"{name} is truncated ({len(head)} bytes): header incomplete")
    want = head[len(MAGIC) : -1].decode("ascii", errors="replace")
    sha, n = hashlib.sha256(), 0
    while chunk := f.read(_CHUNK):
        sha.update(chunk)
        n += len(chunk)
    got = sha.hexdigest()
    if got != want:
        raise CheckpointError(
            f"{name} is corrupted: sha256 of the {n}-byte payload is {got}, the header says {want};"
            " restore from an older checkpoint"
        )
    return got, n


def load_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Read and verify a checkpoint; raises CheckpointError saying what is wrong.

    The checksum is verified (one streaming pass) before anything is deserialised; the load
    then reads the same open file, so a rename over ``path`` in between changes nothing.
    """
    where = checkpoint_location(path)
    if isinstance(where, str):
        return _load_s3(where)
    p = where
    try:
        f = p.open("rb")
    except FileNotFoundError as e:
        raise CheckpointError(f"checkpoint {p} does not exist") from e
    with f:
        got, _ = verify_stream(f, str(p))
        payload = _Payload(f, HEADER_LEN)
        payload.seek(0)
        try:
            data = torch.load(payload, weights_only=True, map_location="cpu")  # type: ignore[arg-type]
        except Exception as e:  # checksum matched but content is not loadable: a writer bug
            raise CheckpointError(f"{p}: payload does not load ({e})") from e
    return _checked(data, str(p), got)


def _checked(data: Any, name: str, sha256: str) -> Checkpoint:
    """The payload's shape, checked field by field: a malformed one is a CheckpointError."""
    if not isinstance(data, dict) or data.get("format") != 1:
        raise CheckpointError(
            f"{name}: unknown checkpoint format {data.get('format') if isinstance(data, dict) else '?'}"
        )
    missing = sorted({"step", "model", "optimizer", "rng", "user"} - data.keys())
    if missing:
        raise CheckpointError(f"{name}: malformed checkpoint, missing {missing}")
    step = data["step"]
    if not isinstance(step, int) or isinstance(step, bool):
        raise CheckpointError(f"{name}: malformed checkpoint, step is {type(step).__name__}, not int")
    for key in ("model", "optimizer"):
        if data[key] is not None and not isinstance(data[key], dict):
            raise CheckpointError(f"{name}: malformed checkpoint, {key} state is a {type(data[key]).__name__}")
    _check_rng(data["rng"], name)
    return Checkpoint(
        step=step,
        model_state=data["model"],
        optimizer_state=data["optimizer"],
        rng=data["rng"],
        user_state=data["user"],
        sha256=sha256,
    )


def _check_rng(rng: Any, name: str) -> None:
    ok = (
        isinstance(rng, dict)
        and isinstance(rng.get("python"), dict)
        and {"version", "internal", "gauss"} <= rng["python"].keys()
        and isinstance(rng.get("numpy"), dict)
        and {"name", "keys", "pos", "has_gauss", "cached_gaussian"} <= rng["numpy"].keys()
        and isinstance(rng["numpy"]["keys"], torch.Tensor)
        and isinstance(rng.get("torch"), torch.Tensor)
        and isinstance(rng.get("cuda", []), list)
    )
    if not ok:
        raise CheckpointError(f"{name}: malformed checkpoint, the RNG state lacks python/numpy/torch fields")


# ---------------------------------------------------------------------- location, latest, restore

S3_SCHEME = "s3://"
POINTER = "LATEST"
RESTORE_ENV = "ROSE_RESTORE"
RESTORE_LATEST = "latest"
_OBJECT_RE = re.compile(r"^ckpt-(?P<step>\d{12})-[0-9a-f]{8}\.rose$")


def checkpoint_location(path: str | os.PathLike[str]) -> Path | str:
    """A filesystem path as a Path, an ``s3://bucket/prefix`` URL as a normalised str; any other
    URL scheme is a CheckpointError saying what is supported."""
    text = os.fspath(path)
    if text.startswith(S3_SCHEME):
        bucket, _, prefix = text[len(S3_SCHEME) :].partition("/")
        if not bucket:
            raise CheckpointError(f"checkpoint path {text!r} names no bucket; write s3://BUCKET/PREFIX")
        return f"{S3_SCHEME}{bucket}/{prefix.strip('/')}".rstrip("/")
    if "://" in text:
        raise CheckpointError(
            f"checkpoint path {text!r}: only a filesystem path (e.g. a PVC mount) or s3://BUCKET/PREFIX is supported"
        )
    return Path(text)


def latest_checkpoint(path: str | os.PathLike[str]) -> CheckpointInfo | None:
    """The newest complete checkpoint at ``path`` (from the file's header, or the s3 pointer), or
    None when none was written yet. Cheap: nothing is hashed or downloaded but the pointer."""
    where = checkpoint_location(path)
    if isinstance(where, str):
        ptr = _read_pointer(s3_filesystem(), where)
        if ptr is None:
            return None
        return CheckpointInfo(f"{where}/{ptr['object']}", ptr["sha256"], ptr["nbytes"], 0.0, ptr["step"])
    try:
        with where.open("rb") as f:
            head = f.read(HEADER_LEN)
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        return None
    if not head.startswith(MAGIC) or len(head) < HEADER_LEN:
        raise CheckpointError(f"{where} is not a ROSE checkpoint (bad header); move it away or fix the path")
    return CheckpointInfo(where, head[len(MAGIC) : -1].decode("ascii", "replace"), size - HEADER_LEN, 0.0)


def restore_latest(
    path: str | os.PathLike[str],
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> Checkpoint | None:
    """Load the newest checkpoint at ``path`` and restore ``model``, ``optimizer`` and every RNG
    from it; None (nothing touched) when no checkpoint exists there yet."""
    if latest_checkpoint(path) is None:
        return None
    ck = load_checkpoint(path)
    ck.restore(model, optimizer)
    return ck


def restore_requested(env: Mapping[str, str]) -> bool:
    """Whether ``ROSE_RESTORE`` asks for a restore on start; any other non-empty value is an error."""
    value = env.get(RESTORE_ENV, "")
    if value not in ("", RESTORE_LATEST):
        raise CheckpointError(f"{RESTORE_ENV}={value!r}: set it to {RESTORE_LATEST!r} or leave it unset")
    return value == RESTORE_LATEST


# ---------------------------------------------------------------------- s3:// through fsspec + s3fs


def s3_endpoint(env: Mapping[str, str]) -> str | None:
    """The S3 endpoint URL: ROSE_S3_ENDPOINT, else AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL."""
    for name in ("ROSE_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        if env.get(name):
            return env[name]
    return None


def s3_filesystem() -> Any:
    """An s3fs filesystem for the endpoint and credentials in the environment (standard AWS chain)."""
    try:
        import s3fs  # only s3:// checkpoints need it
    except ImportError as e:
        raise CheckpointError("s3:// checkpoints need s3fs: pip install 'rose-sdk[s3]' (or s3fs)") from e
    endpoint = s3_endpoint(os.environ)
    return s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)


def _key(url: str, name: str = "") -> str:
    base = url[len(S3_SCHEME) :]
    return f"{base}/{name}" if name else base


def _save_s3(url: str, payload: dict[str, Any], t0: float) -> CheckpointInfo:
    fs = s3_filesystem()
    step = int(payload["step"])
    name = f"ckpt-{step:012d}-{secrets.token_hex(4)}.rose"
    previous = _read_pointer(fs, url)
    with tempfile.TemporaryDirectory(prefix="rose-ckpt-") as tmp:
        local = Path(tmp) / name
        digest, nbytes = _stream_atomic(local, payload)
        _s3_call(url, "upload the checkpoint", fs.put_file, str(local), _key(url, name))
    pointer = {"format": 1, "object": name, "sha256": digest, "nbytes": nbytes, "step": step}
    _write_pointer(fs, url, pointer)
    _prune(fs, url, pointer, previous)
    return CheckpointInfo(f"{url}/{name}", digest, nbytes, time.perf_counter() - t0, step)


def _write_pointer(fs: Any, url: str, pointer: dict[str, Any]) -> None:
    """One PUT of the small pointer object, the last write of a save: it is what makes it visible."""
    _s3_call(url, "write the LATEST pointer", fs.pipe_file, _key(url, POINTER), json.dumps(pointer).encode())


def _read_pointer(fs: Any, url: str) -> dict[str, Any] | None:
    try:
        raw = fs.cat_file(_key(url, POINTER))
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CheckpointError(f"{url}: cannot read {POINTER} ({e}); check the endpoint and credentials") from e
    return _checked_pointer(raw, url)


def _checked_pointer(raw: bytes, url: str) -> dict[str, Any]:
    try:
        ptr = json.loads(raw)
    except ValueError as e:
        raise CheckpointError(f"{url}/{POINTER} is not JSON ({e}); delete it to start afresh") from e
    ok = (
        isinstance(ptr, dict)
        and ptr.get("format") == 1
        and isinstance(ptr.get("object"), str)
        and _OBJECT_RE.match(ptr["object"]) is not None
        and isinstance(ptr.get("sha256"), str)
        and len(ptr["sha256"]) == _HEX_LEN
        and isinstance(ptr.get("nbytes"), int)
        and isinstance(ptr.get("step"), int)
    )
    if not ok:
        want = "format 1, object, sha256, nbytes, step"
        raise CheckpointError(f"{url}/{POINTER} is malformed (want {want}): {raw[:200]!r}")
    return dict(ptr)


def _prune(fs: Any, url: str, pointer: dict[str, Any], previous: dict[str, Any] | None) -> None:
    """Delete data objects older than both the new and the previous checkpoint (orphans of crashed
    saves included); a concurrent writer's object (same or later step) is never touched."""
    keep = {pointer["object"]} | ({previous["object"]} if previous else set())
    floor = min(pointer["step"], previous["step"]) if previous else pointer["step"]
    try:
        names = [p.rsplit("/", 1)[-1] for p in fs.ls(_key(url), detail=False, refresh=True)]
    except OSError:
        return  # pruning is best effort: the pointer is already written
    old = [n for n in names if (m := _OBJECT_RE.match(n)) and n not in keep and int(m["step"]) < floor]
    if old:
        with contextlib.suppress(OSError):
            fs.rm([_key(url, n) for n in old])


def _load_s3(url: str) -> Checkpoint:
    fs = s3_filesystem()
    ptr = _read_pointer(fs, url)
    if ptr is None:
        raise CheckpointError(f"no checkpoint at {url}: {url}/{POINTER} does not exist")
    obj = f"{url}/{ptr['object']}"
    with tempfile.TemporaryDirectory(prefix="rose-ckpt-") as tmp:
        local = Path(tmp) / ptr["object"]
        try:
            fs.get_file(_key(url, ptr["object"]), str(local))
        except FileNotFoundError as e:
            raise CheckpointError(f"{url}/{POINTER} names {obj}, which does not exist") from e
        except OSError as e:
            raise CheckpointError(f"cannot download {obj} ({e}); check the endpoint and credentials") from e
        try:
            ck = load_checkpoint(local)
        except CheckpointError as e:
            raise CheckpointError(str(e).replace(str(local), obj)) from e
    if ck.sha256 != ptr["sha256"]:
        raise CheckpointError(f"{obj}: sha256 {ck.sha256}, but {url}/{POINTER} says {ptr['sha256']}")
    return ck


def _s3_call(url: str, what: str, fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except OSError as e:
        raise CheckpointError(f"{url}: could not {what} ({e}); check the bucket, endpoint and credentials") from e

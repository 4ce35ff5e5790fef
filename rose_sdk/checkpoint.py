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
state (``python -m tests.sdk_checkpoint_memory 256 save|load PATH``, VmHWM in a fresh process).

User state must be made of dicts, lists, tuples, str, int, float, bool, None and tensors.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import secrets
import time
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
    path: Path
    sha256: str
    nbytes: int
    seconds: float


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
    p = Path(path)
    digest, nbytes = _stream_atomic(p, payload)
    return CheckpointInfo(p, digest, nbytes, time.perf_counter() - t0)


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
    p = Path(path)
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

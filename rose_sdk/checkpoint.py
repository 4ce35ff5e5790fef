"""Atomic durable checkpoint: model, optimizer, every RNG state, step and user state.

File layout: ``ROSECKPT1\\n`` + sha256 of the payload (64 hex digits) + ``\\n`` + payload, where
the payload is ``torch.save`` of plain containers, numbers, strings and tensors only, loaded back
with ``weights_only=True`` (no pickled code runs on load). Written to a temporary file in the same
directory, fsync'ed, renamed over the target, and the directory fsync'ed: a crash leaves either
the old file or the new one, never a torn one. ``load_checkpoint`` verifies the checksum and says
what is wrong when it does not match.

User state must be made of dicts, lists, tuples, str, int, float, bool, None and tensors.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rose_common.atomic import atomic_write

MAGIC = b"ROSECKPT1\n"
_HEX_LEN = 64


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
            set_rng_state(self.rng)


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
    buf = io.BytesIO()
    torch.save(payload, buf)
    body = buf.getvalue()
    digest = hashlib.sha256(body).hexdigest()
    p = Path(path)
    write_atomic(p, MAGIC + digest.encode("ascii") + b"\n" + body)
    return CheckpointInfo(p, digest, len(body), time.perf_counter() - t0)


def load_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Read and verify a checkpoint; raises CheckpointError saying what is wrong."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError as e:
        raise CheckpointError(f"checkpoint {p} does not exist") from e
    head = len(MAGIC) + _HEX_LEN + 1
    if not raw.startswith(MAGIC):
        raise CheckpointError(f"{p} is not a ROSE checkpoint (bad magic; expected {MAGIC!r} at the start)")
    if len(raw) < head or raw[head - 1 : head] != b"\n":
        raise CheckpointError(f"{p} is truncated ({len(raw)} bytes): header incomplete")
    want = raw[len(MAGIC) : head - 1].decode("ascii", errors="replace")
    body = raw[head:]
    got = hashlib.sha256(body).hexdigest()
    if got != want:
        raise CheckpointError(
            f"{p} is corrupted: sha256 of the {len(body)}-byte payload is {got}, the header says {want};"
            " restore from an older checkpoint"
        )
    try:
        data = torch.load(io.BytesIO(body), weights_only=True, map_location="cpu")
    except Exception as e:  # checksum matched but content is not loadable: a writer bug
        raise CheckpointError(f"{p}: payload does not load ({e})") from e
    if not isinstance(data, dict) or data.get("format") != 1:
        raise CheckpointError(f"{p}: unknown checkpoint format {data.get('format') if isinstance(data, dict) else '?'}")
    return Checkpoint(
        step=int(data["step"]),
        model_state=data["model"],
        optimizer_state=data["optimizer"],
        rng=data["rng"],
        user_state=data["user"],
        sha256=got,
    )

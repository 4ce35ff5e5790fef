"""Cooperative offload: move a workload's device tensors into reused host buffers and back.

Every tensor the job owns on its device — model parameters, their gradients, module buffers,
optimizer state, and any tensor registered by name — is copied into one host arena (pinned when
CUDA is available), then re-pointed at its host copy with ``tensor.data = host_view`` so every
reference the program holds (the optimizer's param keys, user variables) stays valid, and the
device memory is freed. Resume reverses it. The arena is allocated once and reused while the
layout is unchanged (pinning is expensive: SUSPEND.md §2.3).

Speed by design: on CUDA all copies are issued ``non_blocking`` on one side stream into the pinned
arena and synchronised once. On a machine without CUDA the "device" is the CPU: the data still
moves to separate host buffers and back, so the code path and bit-exactness are tested.

Spill (the driver's disk tier): while offloaded, :meth:`CooperativeOffloader.spill_to` writes the
offloaded bytes, tensor after tensor, to a file the driver created (``rose_common.spillfmt``:
chunks with blake2b digests), fsynced; :meth:`drop_host_copy` frees the host arena (only when the
driver says it verified the file); :meth:`load_from` reads it back, every chunk verified, into a
new arena, and :meth:`restore` proceeds as usual.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from rose_common import spillfmt

_ALIGN = 256


@dataclass(frozen=True)
class _Slot:
    offset: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device


@dataclass(frozen=True)
class OffloadReport:
    bytes_moved: int
    tensors: int
    seconds: float
    arena_reused: bool
    copy_seconds: float = 0.0  # the copies alone (issue to last sync), without allocation and free


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def default_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


class CooperativeOffloader:
    """Offloads the tensors of ``model``, ``optimizer`` and ``tensors`` that live on ``device``
    (default: where the model's first parameter lives, else the current CUDA device, else the CPU)."""

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        tensors: Mapping[str, torch.Tensor] | None = None,
        *,
        device: torch.device | str | None = None,
        pin_memory: bool | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self._named: dict[str, torch.Tensor] = dict(tensors or {})
        if device is None:
            first: torch.Tensor | None = next(iter(model.parameters()), None) if model is not None else None
            if first is None and self._named:
                first = next(iter(self._named.values()))
            device = first.device if first is not None else default_device()
        self.device = torch.device(device)
        cuda_ok = torch.cuda.is_available()
        if pin_memory and not cuda_ok:
            raise ValueError("pin_memory=True needs CUDA; leave it unset on machines without a GPU")
        self.pin_memory = cuda_ok if pin_memory is None else pin_memory
        self._arena: torch.Tensor | None = None
        self._layout: tuple[tuple[int, tuple[int, ...], torch.dtype], ...] = ()
        self._moved: list[tuple[torch.Tensor, _Slot]] = []
        self.offloaded = False
        self.host_dropped = False  # offloaded, and the host copy is only in the driver's spill file

    def register(self, name: str, tensor: torch.Tensor) -> None:
        """Also move ``tensor`` (any device tensor the job keeps: replay buffers, RNG seeds...)."""
        if self.offloaded:
            raise RuntimeError("cannot register tensors while offloaded; register before or after")
        self._named[name] = tensor

    # ------------------------------------------------------------------ what moves

    def _candidates(self) -> Iterable[torch.Tensor]:
        if self.model is not None:
            for p in self.model.parameters():
                yield p
                if p.grad is not None:
                    yield p.grad
            yield from self.model.buffers()
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                for v in state.values():
                    if isinstance(v, torch.Tensor):
                        yield v
        yield from self._named.values()

    def _on_device(self, t: torch.Tensor) -> bool:
        if t.device.type != self.device.type:
            return False
        return self.device.index is None or t.device.index == self.device.index

    def device_tensors(self) -> list[torch.Tensor]:
        seen: set[int] = set()
        out: list[torch.Tensor] = []
        for t in self._candidates():
            if id(t) in seen or t.numel() == 0 or not self._on_device(t):
                continue
            seen.add(id(t))
            out.append(t)
        return out

    def state_bytes(self) -> int:
        """Bytes a suspend would move now (while offloaded: the bytes parked in host memory)."""
        if self.offloaded:
            return sum(s.nbytes for _, s in self._moved)
        return sum(t.numel() * t.element_size() for t in self.device_tensors())

    # ------------------------------------------------------------------ moves

    def _ensure_arena(self, tensors: list[torch.Tensor]) -> tuple[list[_Slot], bool]:
        layout = tuple((t.numel() * t.element_size(), tuple(t.shape), t.dtype) for t in tensors)
        slots: list[_Slot] = []
        off = 0
        for t, (nbytes, shape, dtype) in zip(tensors, layout, strict=True):
            slots.append(_Slot(off, nbytes, shape, dtype, t.device))
            off += _align(nbytes)
        reused = self._arena is not None and self._arena.numel() >= off and layout == self._layout
        if not reused:
            self._arena = None  # drop the old arena before pinning a new one
            self._arena = torch.empty(max(off, 1), dtype=torch.uint8, pin_memory=self.pin_memory)
            self._layout = layout
        return slots, reused

    def _host_view(self, s: _Slot) -> torch.Tensor:
        assert self._arena is not None
        return self._arena[s.offset : s.offset + s.nbytes].view(s.dtype).view(s.shape)

    def offload(self) -> OffloadReport:
        """Move every device tensor into the host arena and free its device memory."""
        if self.offloaded:
            return OffloadReport(0, 0, 0.0, True)
        t0 = time.perf_counter()
        tensors = self.device_tensors()
        slots, reused = self._ensure_arena(tensors)
        views = [self._host_view(s) for s in slots]
        tc = time.perf_counter()
        if self.device.type == "cuda":
            side = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for v, t in zip(views, tensors, strict=True):
                    v.copy_(t.detach(), non_blocking=True)
            side.synchronize()
        else:
            for v, t in zip(views, tensors, strict=True):
                v.copy_(t.detach())
        copy_s = time.perf_counter() - tc
        # Only after every copy landed: re-point the tensors (nothing changed if a copy failed).
        for v, t in zip(views, tensors, strict=True):
            t.data = v
        self._moved = list(zip(tensors, slots, strict=True))
        self.offloaded = True
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        nbytes = sum(s.nbytes for s in slots)
        return OffloadReport(nbytes, len(slots), time.perf_counter() - t0, reused, copy_s)

    # ------------------------------------------------------------------ spill (the driver's disk tier)

    def _slot_views(self) -> Iterator[memoryview]:
        """Writable byte views of the offloaded tensors' host copies, in order (no copy)."""
        assert self._arena is not None
        base = int(self._arena.data_ptr())
        for _, s in self._moved:
            yield memoryview((ctypes.c_ubyte * s.nbytes).from_address(base + s.offset)).cast("B")

    def spill_to(self, path: str, chunk_bytes: int = spillfmt.DEFAULT_CHUNK_BYTES) -> int:
        """Write the host copy to ``path`` (a file the driver created: never created here, never a
        symlink) in the spill format, and fsync it. The host copy stays. Returns the payload bytes."""
        if not self.offloaded or self.host_dropped or self._arena is None:
            raise RuntimeError("nothing to spill: the state is not offloaded into host memory")
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            with os.fdopen(fd, "wb", buffering=1 << 20, closefd=False) as f:
                n = spillfmt.write_chunks(f, self._slot_views(), chunk_bytes)
            os.fsync(fd)
        finally:
            os.close(fd)
        return n

    def drop_host_copy(self) -> int:
        """Free the host arena (the driver verified the spill file): the offloaded tensors point at
        empty storage until :meth:`load_from`. Returns the bytes freed."""
        if not self.offloaded or self.host_dropped:
            raise RuntimeError("no host copy to drop")
        freed = self.host_buffer_bytes
        for t, s in self._moved:
            t.data = torch.empty(0, dtype=s.dtype)
        self._arena = None
        self._layout = ()
        self.host_dropped = True
        _return_freed_memory()
        return freed

    def load_from(self, path: str) -> int:
        """Read the spilled host copy back from ``path`` into a new arena, verifying every chunk and
        the total size (atomic: on any error no arena is kept and the file is untouched)."""
        if not self.host_dropped:
            raise RuntimeError("the host copy is in memory; nothing to load")
        size = max((s.offset + _align(s.nbytes) for _, s in self._moved), default=1)
        self._arena = torch.empty(max(size, 1), dtype=torch.uint8, pin_memory=self.pin_memory)
        try:
            n = _fill(self._slot_views(), path)
        except BaseException:
            self._arena = None
            raise
        self.host_dropped = False
        return n

    def restore(self) -> OffloadReport:
        """Move every offloaded tensor back onto its device (the host arena stays for reuse)."""
        if not self.offloaded:
            return OffloadReport(0, 0, 0.0, True)
        if self.host_dropped:
            raise RuntimeError("the host copy was spilled to disk: load_from(path) first")
        t0 = time.perf_counter()
        fresh = [torch.empty(s.shape, dtype=s.dtype, device=s.device) for _, s in self._moved]
        views = [self._host_view(s) for _, s in self._moved]
        tc = time.perf_counter()
        if self.device.type == "cuda":
            side = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for d, v in zip(fresh, views, strict=True):
                    d.copy_(v, non_blocking=True)
            side.synchronize()
        else:
            for d, v in zip(fresh, views, strict=True):
                d.copy_(v)
        copy_s = time.perf_counter() - tc
        for (t, _), d in zip(self._moved, fresh, strict=True):
            t.data = d
        nbytes = sum(s.nbytes for _, s in self._moved)
        n = len(self._moved)
        self._moved = []
        self.offloaded = False
        return OffloadReport(nbytes, n, time.perf_counter() - t0, True, copy_s)

    def release_host_buffers(self) -> None:
        """Free the reusable host arena (only while not offloaded)."""
        if self.offloaded:
            raise RuntimeError("the host arena holds the offloaded state; restore() first")
        self._arena = None
        self._layout = ()

    @property
    def host_buffer_bytes(self) -> int:
        return 0 if self._arena is None else int(self._arena.numel())

    def arena_data_ptr(self) -> int:
        """Address of the host arena (tests check it is reused across cycles)."""
        return 0 if self._arena is None else int(self._arena.data_ptr())


def _fill(views: Iterable[memoryview], path: str) -> int:
    """Copy the verified payload of spill file ``path`` into ``views``, in order; the payload must
    fill them exactly (spillfmt.FormatCorrupt otherwise)."""
    targets = list(views)
    i = pos = total = 0
    with open(path, "rb", buffering=0) as f:
        for chunk in spillfmt.read_chunks(f, os.path.basename(path)):
            mv = memoryview(chunk)
            while len(mv) > 0:
                if i >= len(targets):
                    raise spillfmt.FormatCorrupt(f"{path}: more bytes than the offloaded tensors hold")
                k = min(len(mv), len(targets[i]) - pos)
                targets[i][pos : pos + k] = mv[:k]
                pos += k
                total += k
                mv = mv[k:]
                if pos == len(targets[i]):
                    i, pos = i + 1, 0
    if i != len(targets):
        raise spillfmt.FormatCorrupt(f"{path}: {total} B do not fill the offloaded tensors")
    return total


def _return_freed_memory() -> None:
    """Best effort: hand freed host memory back to the kernel (cached pinned blocks; glibc's heap)."""
    empty_host_cache = getattr(torch._C, "_host_emptyCache", None)
    if empty_host_cache is not None and torch.cuda.is_available():
        with contextlib.suppress(Exception):
            empty_host_cache()
    libc_name = ctypes.util.find_library("c")
    if libc_name:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(libc_name).malloc_trim(0)


def tensors_equal(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Deep bit-exact comparison of two nested state dicts (tensors by torch.equal)."""
    if a.keys() != b.keys():
        return False
    return all(_values_equal(a[k], b[k]) for k in a)


def _values_equal(x: Any, y: Any) -> bool:
    """One entry of :func:`tensors_equal`: tensors bit-exact, mappings and sequences recursively."""
    if isinstance(x, torch.Tensor):
        if not isinstance(y, torch.Tensor) or x.dtype != y.dtype or x.shape != y.shape:
            return False
        return bool(torch.equal(x.cpu(), y.cpu()))
    if isinstance(x, Mapping):
        return isinstance(y, Mapping) and tensors_equal(x, y)
    if isinstance(x, list | tuple):
        if not isinstance(y, list | tuple) or len(x) != len(y):
            return False
        return tensors_equal({str(i): v for i, v in enumerate(x)}, {str(i): v for i, v in enumerate(y)})
    return bool(x == y)

"""Pre-pinned staging buffers: device memory to a byte sink (the node's disk tier) and back, chunk
by chunk, without a full host copy.

A state that spills to disk needs no DRAM copy of its whole size when a GPU is present: chunks go
device → a few pinned buffers allocated once (pinning is expensive, SUSPEND.md §2.3) → the sink,
and back. On CUDA the copy of chunk *i+1* into the next buffer is issued (``non_blocking`` on a
side stream) before chunk *i* is handed to the sink, so the D2H copy overlaps the disk write; on
the way back the H2D copy of a buffer overlaps filling the next one. Without CUDA the "device" is
the CPU and the buffers are plain memory: the same code path, tested on CPU; the device tier
(``tests/device/suspend/test_spill_staging.py``) runs it on a GPU with pinned buffers.

The chunks are what ``dra_driver.suspend.spill.SpillStore.write`` consumes and ``read`` yields
(any iterable of byte buffers); this module does no file I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch


def _flat_bytes(t: torch.Tensor) -> torch.Tensor:
    if not t.is_contiguous():
        raise ValueError("staging needs a contiguous tensor (call .contiguous() first)")
    return t.reshape(-1).view(torch.uint8)


def _bytes_of(buf: torch.Tensor) -> memoryview:
    """A writable byte view of a host uint8 tensor's memory (no copy)."""
    arr: Any = buf.numpy()
    return memoryview(arr).cast("B")


class PinnedStaging:
    """``buffers`` host buffers of ``chunk_bytes`` each, pinned when CUDA is available (or
    ``pin=True``), allocated once and reused by every move."""

    def __init__(self, chunk_bytes: int, buffers: int = 2, *, pin: bool | None = None) -> None:
        if not 1 << 12 <= chunk_bytes <= 1 << 30:
            raise ValueError(f"staging chunk must be between 4 KiB and 1 GiB, got {chunk_bytes}")
        if not 2 <= buffers <= 16:
            raise ValueError(f"staging needs 2 to 16 buffers (one in flight, one at the sink), got {buffers}")
        cuda = torch.cuda.is_available()
        if pin and not cuda:
            raise ValueError("pin=True needs CUDA; leave it unset on machines without a GPU")
        self.pinned = cuda if pin is None else pin
        self.chunk_bytes = chunk_bytes
        self._bufs = [torch.empty(chunk_bytes, dtype=torch.uint8, pin_memory=self.pinned) for _ in range(buffers)]
        self._stream: Any = torch.cuda.Stream() if cuda else None  # type: ignore[no-untyped-call]

    @property
    def buffers(self) -> list[torch.Tensor]:
        return list(self._bufs)

    def _event(self) -> Any:
        if self._stream is None:
            return None
        ev = torch.cuda.Event()  # type: ignore[no-untyped-call]
        ev.record(self._stream)
        return ev

    def from_device(self, src: torch.Tensor) -> Iterator[memoryview]:
        """The bytes of ``src`` in chunks, each a view of a staging buffer valid until the next
        chunk is asked for (the sink must have written it by then, as ``SpillStore.write`` does)."""
        flat = _flat_bytes(src)
        n, k, c = flat.numel(), len(self._bufs), self.chunk_bytes
        offs = list(range(0, n, c))
        events: list[Any] = [None] * k

        def issue(i: int) -> None:
            off = offs[i]
            m = min(c, n - off)
            buf = self._bufs[i % k]
            if self._stream is not None and flat.is_cuda:
                with torch.cuda.stream(self._stream):
                    buf[:m].copy_(flat[off : off + m], non_blocking=True)
                events[i % k] = self._event()
            else:
                buf[:m].copy_(flat[off : off + m])

        if not offs:
            return
        if flat.is_cuda and self._stream is not None:
            self._stream.wait_stream(torch.cuda.current_stream(flat.device))
        issue(0)
        for i in range(len(offs)):
            if i + 1 < len(offs):
                issue(i + 1)  # the next copy runs while the sink writes this one
            ev = events[i % k]
            if ev is not None:
                ev.synchronize()
            m = min(c, n - offs[i])
            yield _bytes_of(self._bufs[i % k])[:m]

    def to_device(self, chunks: Iterable[bytes | memoryview], dst: torch.Tensor) -> int:
        """Fill ``dst`` from ``chunks`` (any sizes; together exactly ``dst``'s bytes), through the
        staging buffers. Raises ValueError when the chunks do not add up to ``dst``'s size; an
        exception from ``chunks`` (a failed checksum) propagates with ``dst`` partly written — the
        caller must not use it."""
        flat = _flat_bytes(dst)
        n, k, c = flat.numel(), len(self._bufs), self.chunk_bytes
        events: list[Any] = [None] * k
        off = slot = 0
        cuda = flat.is_cuda and self._stream is not None
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            pos = 0
            while pos < len(view):
                m = min(c, len(view) - pos)
                if off + m > n:
                    raise ValueError(f"chunks hold more than the {n} bytes of the destination")
                ev = events[slot]
                if ev is not None:
                    ev.synchronize()  # this buffer's previous H2D copy is done
                buf = self._bufs[slot]
                _bytes_of(buf)[:m] = view[pos : pos + m]
                if cuda:
                    with torch.cuda.stream(self._stream):
                        flat[off : off + m].copy_(buf[:m], non_blocking=True)
                    events[slot] = self._event()
                else:
                    flat[off : off + m].copy_(buf[:m])
                off += m
                pos += m
                slot = (slot + 1) % k
        if cuda:
            self._stream.synchronize()
        if off != n:
            raise ValueError(f"chunks hold {off} bytes, the destination {n}")
        return off

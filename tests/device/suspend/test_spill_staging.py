"""The disk tier's GPU path: a CUDA tensor goes through pre-pinned staging buffers into the real
``SpillStore`` and back, bit-exact, with the device memory overwritten in between (the next
tenant); the staging buffers are pinned and allocated once."""

from __future__ import annotations

from pathlib import Path

import torch

from dra_driver.suspend.spill import SpillStore
from rose_sdk.staging import PinnedStaging

MiB = 1 << 20


def test_cuda_tensor_spills_through_pinned_staging_bit_exact(cuda: str, tmp_path: Path) -> None:
    g = torch.Generator(device=cuda).manual_seed(3)
    state = torch.randn(64 * MiB // 4, device=cuda, generator=g)  # 64 MiB
    original = state.cpu().clone()
    staging = PinnedStaging(8 * MiB, buffers=2)
    assert staging.pinned and all(b.is_pinned() for b in staging.buffers)
    ptrs = [b.data_ptr() for b in staging.buffers]
    store = SpillStore(tmp_path / "spill", 128 * MiB, chunk_bytes=8 * MiB)
    n = store.write("pod-gpu", staging.from_device(state), 64 * MiB)
    assert n == 64 * MiB
    state.view(torch.uint8).fill_(0xFF)
    torch.cuda.synchronize()
    assert staging.to_device(store.read("pod-gpu"), state) == n
    assert torch.equal(state.cpu().view(torch.uint8), original.view(torch.uint8))
    assert [b.data_ptr() for b in staging.buffers] == ptrs  # reused, never re-pinned


def test_cooperative_spill_of_cuda_tensors_through_the_pinned_arena_bit_exact(cuda: str, tmp_path: Path) -> None:
    """The cooperative spill on a GPU: CUDA tensors offloaded into the pinned arena, written by the
    SDK to the driver's hand-over file, verified by the driver, the arena freed, the device memory
    overwritten, then read back (verified) into a new pinned arena and restored, bit-exact."""
    import os

    from rose_sdk.offload import CooperativeOffloader

    g = torch.Generator(device=cuda).manual_seed(5)
    t = torch.randn(32 * MiB // 4, device=cuda, generator=g)
    original = t.cpu().clone()
    off = CooperativeOffloader(tensors={"t": t})
    n = off.offload().bytes_moved
    assert off.pin_memory and t.device.type == "cpu" and t.is_pinned()
    store = SpillStore(tmp_path / "spill", 128 * MiB)
    h = store.hand_over("pod-gpu", os.geteuid(), os.getegid())
    assert off.spill_to(str(h.path)) == n and store.adopt(h, n, n) == n
    assert off.drop_host_copy() >= n and off.host_buffer_bytes == 0
    torch.empty(32 * MiB, dtype=torch.uint8, device=cuda).fill_(0xFF)  # the next tenant
    torch.cuda.synchronize()
    off.load_from(str(store.path("pod-gpu")))
    off.restore()
    assert t.device.type == "cuda" and torch.equal(t.cpu(), original)

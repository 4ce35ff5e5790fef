"""Staging buffers between (device) tensors and the disk tier, on the CPU path: a state goes
through ``rose_sdk.staging.PinnedStaging`` into the real ``SpillStore`` and back bit-exact while
its old memory is overwritten (the next tenant); the GPU path is in tests/device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dra_driver.suspend.spill import SpillCorrupt, SpillStore
from rose_sdk.staging import PinnedStaging


def test_tensor_to_disk_and_back_is_bit_exact(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(7)
    state = torch.randn(50_000, generator=g, dtype=torch.float32)  # 200,000 B: 48+ chunks of 4 KiB
    original = state.clone()
    staging = PinnedStaging(4096, buffers=3)
    store = SpillStore(tmp_path / "spill", 1 << 20, chunk_bytes=4096)
    n = store.write("pod-a", staging.from_device(state), state.numel() * 4)
    assert n == 200_000
    state.view(torch.uint8).fill_(0xFF)  # the next tenant writes over the old memory
    assert torch.isnan(state).all()
    assert staging.to_device(store.read("pod-a"), state) == n
    assert torch.equal(state.view(torch.uint8), original.view(torch.uint8))


def test_a_corrupt_chunk_stops_the_restore(tmp_path: Path) -> None:
    state = torch.arange(10_000, dtype=torch.int64)
    staging = PinnedStaging(4096)
    store = SpillStore(tmp_path / "spill", 1 << 20, chunk_bytes=4096)
    store.write("k", staging.from_device(state), 80_000)
    p = store.path("k")
    raw = bytearray(p.read_bytes())
    raw[-5] ^= 1
    p.write_bytes(bytes(raw))
    with pytest.raises(SpillCorrupt, match="fails its blake2b checksum"):
        staging.to_device(store.read("k"), torch.empty_like(state))


def test_bad_input_is_one_clear_line() -> None:
    with pytest.raises(ValueError, match="between 4 KiB and 1 GiB"):
        PinnedStaging(10)
    with pytest.raises(ValueError, match="2 to 16 buffers"):
        PinnedStaging(4096, buffers=1)
    s = PinnedStaging(4096)
    with pytest.raises(ValueError, match="contiguous"):
        list(s.from_device(torch.zeros(4, 4).t()))
    with pytest.raises(ValueError, match="chunks hold 8 bytes, the destination 16"):
        s.to_device([b"x" * 8], torch.zeros(4, dtype=torch.float32))
    with pytest.raises(ValueError, match="more than the 4 bytes"):
        s.to_device([b"x" * 8], torch.zeros(1, dtype=torch.float32))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="pin=True needs CUDA"):
            PinnedStaging(4096, pin=True)

"""The driver's side of a cooperative spill, without a workload process: the hand-over file the
driver creates, what ``adopt`` accepts (only that inode, the right size, every checksum), the
shared format (``rose_common.spillfmt``), and the pure memory checks of ``cooperative.py``.
Real files in tmp_path; the SDK's writer is the real ``CooperativeOffloader.spill_to``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from dra_driver.suspend.cooperative import rss_from_status, spill_freed
from dra_driver.suspend.spill import SpillCorrupt, SpillError, SpillFull, SpillStore
from rose_common import spillfmt
from rose_sdk.offload import CooperativeOffloader


def _offloaded(nbytes: int) -> tuple[CooperativeOffloader, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    t = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)
    want = t.clone()
    off = CooperativeOffloader(tensors={"t": t}, device="cpu")
    off.offload()
    return off, t, want


def test_sdk_writes_driver_verifies_sdk_reads_back_bit_exact(tmp_path: Path) -> None:
    store = SpillStore(tmp_path / "spill", 1 << 30, chunk_bytes=4096)
    off, t, want = _offloaded(10_000)
    h = store.hand_over("pod-a", os.geteuid(), os.getegid())
    assert h.path.name == "pod-a.spill.tmp" and (h.path.stat().st_mode & 0o777) == 0o600
    n = off.spill_to(str(h.path), chunk_bytes=4096)
    assert n == 10_000
    assert store.adopt(h, 10_000, 10_000) == 10_000 and store.held_bytes("pod-a") == 10_000
    assert off.drop_host_copy() >= 10_000 and off.host_buffer_bytes == 0 and t.numel() == 0
    with pytest.raises(RuntimeError, match="load_from"):
        off.restore()
    off.load_from(str(store.path("pod-a")))
    off.restore()
    assert torch.equal(t, want)


def test_sdk_refuses_to_create_the_file(tmp_path: Path) -> None:
    off, _, _ = _offloaded(100)
    with pytest.raises(FileNotFoundError):
        off.spill_to(str(tmp_path / "chosen-by-the-workload.spill"))
    assert not (tmp_path / "chosen-by-the-workload.spill").exists()


def test_adopt_refuses_a_file_put_in_place_of_the_hand_over(tmp_path: Path) -> None:
    store = SpillStore(tmp_path / "spill", 1 << 30)
    off, _, _ = _offloaded(1000)
    h = store.hand_over("pod-a", os.geteuid(), os.getegid())
    other = tmp_path / "other"
    off.spill_to(str(h.path))
    other.write_bytes(h.path.read_bytes())
    os.replace(other, h.path)  # a valid file, but not the inode the driver created
    with pytest.raises(SpillCorrupt, match="not the file the driver handed over"):
        store.adopt(h, 1000, 1000)
    assert list((tmp_path / "spill").iterdir()) == [] and store.held_bytes() == 0


def test_adopt_refuses_a_symlink(tmp_path: Path) -> None:
    store = SpillStore(tmp_path / "spill", 1 << 30)
    h = store.hand_over("pod-a", os.geteuid(), os.getegid())
    (tmp_path / "secret").write_bytes(b"x" * 100)
    h.path.unlink()
    h.path.symlink_to(tmp_path / "secret")
    with pytest.raises(SpillError):
        store.adopt(h, 100, 100)
    assert list((tmp_path / "spill").iterdir()) == [] and store.held_bytes() == 0
    assert (tmp_path / "secret").read_bytes() == b"x" * 100


def test_adopt_refuses_a_valid_file_of_the_wrong_size(tmp_path: Path) -> None:
    store = SpillStore(tmp_path / "spill", 1 << 30)
    off, _, _ = _offloaded(1000)
    h = store.hand_over("pod-a", os.geteuid(), os.getegid())
    off.spill_to(str(h.path))
    with pytest.raises(SpillCorrupt, match="moved 2000 B"):
        store.adopt(h, 2000, 2000)
    assert list((tmp_path / "spill").iterdir()) == []


def test_adopt_refuses_a_flipped_byte_and_a_full_budget(tmp_path: Path) -> None:
    store = SpillStore(tmp_path / "spill", 1500)
    off, _, _ = _offloaded(1000)
    h = store.hand_over("pod-a", os.geteuid(), os.getegid())
    off.spill_to(str(h.path))
    raw = bytearray(h.path.read_bytes())
    raw[-1] ^= 1
    h.path.write_bytes(bytes(raw))  # same inode: rewritten in place
    with pytest.raises(SpillCorrupt, match="checksum"):
        store.adopt(h, 1000, 1000)
    h = store.hand_over("pod-b", os.geteuid(), os.getegid())
    off.spill_to(str(h.path))
    with pytest.raises(SpillFull):
        store.adopt(h, 1000, 2000)
    assert list((tmp_path / "spill").iterdir()) == []


def test_load_from_a_short_file_keeps_no_arena(tmp_path: Path) -> None:
    store = SpillStore(tmp_path / "spill", 1 << 30)
    off, _, _ = _offloaded(1000)
    h = store.hand_over("pod-a", os.geteuid(), os.getegid())
    off.spill_to(str(h.path))
    store.adopt(h, 1000, 1000)
    off.drop_host_copy()
    short = tmp_path / "short.spill"
    with open(short, "wb") as f:
        spillfmt.write_chunks(f, [b"\0" * 10])
    with pytest.raises(spillfmt.FormatCorrupt, match="do not fill"):
        off.load_from(str(short))
    assert off.host_dropped and off.host_buffer_bytes == 0


def test_rss_and_freed() -> None:
    assert rss_from_status("Name:\tpython\nVmRSS:\t  2048 kB\nVmSwap:\t0 kB\n") == 2 << 20
    assert rss_from_status("Name:\tzombie\n") is None
    assert spill_freed(100 << 20, 36 << 20, 64 << 20)
    assert not spill_freed(100 << 20, 99 << 20, 64 << 20)  # kept its copy
    assert not spill_freed(None, 1, 64) and not spill_freed(1, None, 64)

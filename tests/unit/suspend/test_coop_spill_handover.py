"""The driver's side of a cooperative spill, without a workload process: the hand-over file the
driver creates, what ``adopt`` accepts (only that inode, the right size, every checksum), the
shared format (``rose_common.spillfmt``), and the pure memory checks of ``cooperative.py``.
Real files in tmp_path; the SDK's writer is the real ``CooperativeOffloader.spill_to``."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import torch
from prometheus_client import CollectorRegistry

from dra_driver.suspend.cooperative import CooperativeBackend, rss_from_status, spill_freed
from dra_driver.suspend.engine import EngineConfig, NodeSuspendEngine
from dra_driver.suspend.events import RecordingEventSink
from dra_driver.suspend.metrics import SuspendMetrics
from dra_driver.suspend.model import Ack, Registration
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


def test_a_workload_silent_to_the_spill_is_not_spilled_and_the_suspend_falls_back(tmp_path: Path) -> None:
    """The whole engine path with workloads played by threads (their process: this test's): A is
    suspended, B does not fit DRAM, A is asked to spill and never answers: after the spill deadline
    A is not spilled (file removed, DRAM charge kept) and B takes the fallback as without a disk tier."""
    mib = 1 << 20
    events = RecordingEventSink()
    eng = NodeSuspendEngine(
        EngineConfig(
            host_memory_budget_bytes=15 * mib,
            backends=("cooperative",),
            checkpoint_timeout_seconds=0.5,
            spill_dir=str(tmp_path / "spill"),
            spill_budget_bytes=1 << 30,
            spill_timeout_seconds=0.5,
        ),
        {"cooperative": CooperativeBackend(lambda uid, pid: os.getpid())},
        events=events,
        metrics=SuspendMetrics(CollectorRegistry()),
        spill=SpillStore(tmp_path / "spill", 1 << 30),
    )
    asked: list[str] = []
    for uid in ("pod-a", "pod-b"):
        w = eng.register(
            Registration(uid, os.getpid(), 10 * mib, frozenset({"cooperative"}), claim_uids=frozenset({f"c-{uid}"}))
        )
        w.streams_open = 1  # its command stream is connected (played below)

        def play(w: object = w) -> None:
            while (cmd := w.commands.get()) is not None:  # type: ignore[attr-defined]
                asked.append(cmd.kind)
                if cmd.kind == "suspend":
                    eng.acknowledge(w.pod_uid, w.session_id, Ack(cmd.operation_id, True, 10 * mib), None)  # type: ignore[attr-defined]

        threading.Thread(target=play, daemon=True).start()
    try:
        assert eng.suspend_pod("pod-a", 5).state == "succeeded"
        rec = eng.suspend_pod("pod-b", 5)
        assert "spill" in asked
        assert rec.fallback == "checkpoint-evict" and "did not write its spill file within 0.5s" in rec.message
        assert eng.tier_of("pod-a") == "dram" and eng.budget.held_bytes("pod-a") == 10 * mib
        assert list((tmp_path / "spill").iterdir()) == [] and eng.spill is not None and eng.spill.held_bytes() == 0
        assert eng.metrics.spills.labels("to_disk", "no_answer")._value.get() == 1
        assert "SpillFailed" in events.reasons()
    finally:
        for w in eng.registry.all():
            w.commands.put(None)

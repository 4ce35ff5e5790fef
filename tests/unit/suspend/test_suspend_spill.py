"""Layered memory for suspended state: the disk tier (real files), the spill plan, and the engine
spilling the least recently suspended state when the DRAM budget is full (simulated backend with
real bytes; the GPU is the only thing simulated)."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from dra_driver.nodefacts import node_facts
from dra_driver.state import NodeStateData
from dra_driver.suspend.simulated import NEXT_TENANT_BYTE, SimulatedHostMemory
from dra_driver.suspend.spill import (
    Resident,
    SpillCorrupt,
    SpillError,
    SpillFull,
    SpillStore,
    plan_spill,
)
from rose_common import names
from tests.support.spill_fixtures import DRAM, STATE, reg, spill_engine

MiB = 1 << 20


# ---------------------------------------------------------------------------------- plan_spill


def test_plan_spills_least_recently_suspended_first_and_no_more_than_needed() -> None:
    res = [Resident("young", 3, 9), Resident("old", 3, 1), Resident("mid", 3, 5)]
    assert plan_spill(res, 2, dram_capacity=10, dram_held=9, disk_free=100) == ["old"]
    assert plan_spill(res, 5, dram_capacity=10, dram_held=9, disk_free=100) == ["old", "mid"]
    assert plan_spill(res, 1, dram_capacity=10, dram_held=9, disk_free=100) == []


def test_plan_is_none_when_both_tiers_are_full() -> None:
    res = [Resident("old", 3, 1), Resident("mid", 3, 5)]
    assert plan_spill(res, 5, dram_capacity=10, dram_held=9, disk_free=5) is None  # disk holds one, not two
    assert plan_spill(res, 11, dram_capacity=10, dram_held=0, disk_free=100) is None  # larger than DRAM
    assert plan_spill([], 5, dram_capacity=10, dram_held=9, disk_free=100) is None  # nothing spillable
    with pytest.raises(ValueError, match="need must be >= 0"):
        plan_spill(res, -1, dram_capacity=10, dram_held=0, disk_free=0)


# ---------------------------------------------------------------------------------- SpillStore


class Bytes:
    """A HostCopy of in-memory bytes (for the store alone)."""

    def __init__(self) -> None:
        self.d: dict[str, bytes] = {}

    def host_bytes(self, key: str) -> int | None:
        return len(self.d[key]) if key in self.d else None

    def read_host(self, key: str, chunk_bytes: int) -> Iterator[bytes]:
        b = self.d[key]
        for i in range(0, len(b), chunk_bytes):
            yield b[i : i + chunk_bytes]

    def drop_host(self, key: str) -> None:
        del self.d[key]

    def refill_host(self, key: str, chunks: Iterator[bytes]) -> int:  # type: ignore[override]
        b = b"".join(chunks)  # an exception leaves no copy
        self.d[key] = b
        return len(b)


def test_store_round_trip_is_bit_exact_and_drops_dram_only_after_the_write(tmp_path: Path) -> None:
    host = Bytes()
    data = os.urandom(5 * 4096 + 17)
    host.d["pod-a"] = data
    store = SpillStore(tmp_path / "s", 1 * MiB, chunk_bytes=4096)
    assert store.spill("pod-a", host, len(data)) == len(data)
    assert host.host_bytes("pod-a") is None
    assert store.held_bytes() == len(data) and store.has("pod-a")
    assert [p.name for p in (tmp_path / "s").iterdir()] == ["pod-a.spill"]
    assert store.restore("pod-a", host) == len(data)
    assert host.d["pod-a"] == data
    assert store.held_bytes() == 0 and not list((tmp_path / "s").iterdir())


def test_a_flipped_bit_is_never_restored(tmp_path: Path) -> None:
    host = Bytes()
    host.d["pod-a"] = os.urandom(3 * 4096)
    store = SpillStore(tmp_path / "s", 1 * MiB, chunk_bytes=4096)
    store.spill("pod-a", host, 3 * 4096)
    p = store.path("pod-a")
    raw = bytearray(p.read_bytes())
    raw[-100] ^= 0x01  # in the last chunk: the first two verify, then this one fails
    p.write_bytes(bytes(raw))
    with pytest.raises(SpillCorrupt, match=r"chunk 2 .* fails its blake2b checksum"):
        store.restore("pod-a", host)
    assert host.host_bytes("pod-a") is None  # no DRAM copy of corrupt state
    assert not p.exists() and store.held_bytes() == 0


def test_a_truncated_spill_file_is_corrupt(tmp_path: Path) -> None:
    host = Bytes()
    host.d["k"] = os.urandom(10000)
    store = SpillStore(tmp_path / "s", 1 * MiB, chunk_bytes=4096)
    store.spill("k", host, 10000)
    p = store.path("k")
    p.write_bytes(p.read_bytes()[:-10])
    with pytest.raises(SpillCorrupt, match="chunk 2"):
        list(store.read("k"))


def test_budget_full_is_spillfull_and_leaves_dram_untouched(tmp_path: Path) -> None:
    host = Bytes()
    host.d["a"], host.d["b"] = b"x" * 600, b"y" * 600
    store = SpillStore(tmp_path / "s", 1000)
    store.spill("a", host, 600)
    with pytest.raises(SpillFull, match="spill budget full: 600 B do not fit"):
        store.spill("b", host, 600)
    assert host.d["b"] == b"y" * 600
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["a.spill"]


def test_a_real_enospc_is_spillfull_and_leaves_no_file(tmp_path: Path) -> None:
    """The file system's own ENOSPC (here raised by the chunk source mid-write, as a full disk
    raises it from write()): the temp file goes, the ledger is released, DRAM is untouched."""

    def chunks() -> Iterator[bytes]:
        yield b"z" * 4096
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    store = SpillStore(tmp_path / "s", 1 * MiB, chunk_bytes=4096)
    with pytest.raises(SpillFull, match="is full: No space left on device"):
        store.write("a", chunks(), 8192)
    assert store.held_bytes() == 0 and not list((tmp_path / "s").iterdir())


def test_bad_input_gets_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="absolute path"):
        SpillStore("relative/dir", 1)
    with pytest.raises(ValueError, match=">= 0 bytes"):
        SpillStore(tmp_path, -1)
    store = SpillStore(tmp_path / "s", 1)
    with pytest.raises(ValueError, match=r"spill key '\.\./x'"):
        store.path("../x")
    with pytest.raises(SpillError, match="no spilled state for 'nope'"):
        store.read("nope")


# ---------------------------------------------------------------------------------- the engine


def _device(host: SimulatedHostMemory, uid: str) -> bytes:
    return host.device(uid).read_bytes()


def test_budget_full_spills_the_least_recently_suspended_not_evict(tmp_path: Path) -> None:
    eng, host, events = spill_engine(tmp_path)
    originals = {}
    for uid in ("pod-a", "pod-b"):
        eng.register(reg(uid))
        host.ensure_device(uid, STATE)
        originals[uid] = _device(host, uid)
    assert eng.suspend_pod("pod-a", 30).state == "succeeded"
    assert _device(host, "pod-a") == bytes([NEXT_TENANT_BYTE]) * STATE  # the next tenant took the GPU
    rec = eng.suspend_pod("pod-b", 30)
    assert rec.state == "succeeded" and rec.fallback is None, rec.message
    assert eng.tier_of("pod-a") == "disk" and eng.tier_of("pod-b") == "dram"
    assert host.host_bytes("pod-a") is None  # its DRAM copy was dropped after the disk copy verified
    assert [e.reason for e in events.events if e.pod_uid == "pod-a"][-1] == "SuspendedStateSpilled"
    assert eng.tier_usage() == {"dram": (DRAM, STATE), "disk": (64 * MiB, STATE)}

    # DRAM's next tenant: whatever memory held pod-a's DRAM copy is overwritten (its file is gone);
    # the GPU's next tenant wrote over pod-a's device memory. Resume must come from disk, bit-exact.
    out = eng.resume_pod("pod-a")
    assert out.state == "succeeded", out.message
    assert _device(host, "pod-a") == originals["pod-a"]
    assert eng.tier_of("pod-a") is None and eng.spill is not None and eng.spill.held_bytes() == 0
    assert eng.resume_pod("pod-b").state == "succeeded"
    assert _device(host, "pod-b") == originals["pod-b"]


def test_corrupt_spill_never_resumes_and_falls_back_to_the_durable_checkpoint(tmp_path: Path) -> None:
    eng, host, events = spill_engine(tmp_path)
    for uid in ("pod-a", "pod-b"):
        eng.register(reg(uid))
        eng.suspend_pod(uid, 30)
    assert eng.spill is not None
    p = eng.spill.path("pod-a")
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0x80
    p.write_bytes(bytes(raw))
    device_before = _device(host, "pod-a")
    rec = eng.resume_pod("pod-a")
    assert rec.state == "failed" and rec.fallback == "checkpoint-evict" and rec.reason.value == "fallback"
    assert "failed its checksum" in rec.message and "durable checkpoint" in rec.message
    assert _device(host, "pod-a") == device_before  # nothing corrupt reached the device
    assert events.events[-1].reason == "SpilledStateCorrupt" and events.events[-1].type == "Warning"
    assert eng.registry.get("pod-a").state == "CheckpointedEvicted"  # type: ignore[union-attr]
    assert eng.tier_of("pod-a") is None


def test_both_tiers_full_takes_the_fallback(tmp_path: Path) -> None:
    eng, _, _ = spill_engine(tmp_path, disk=STATE - 1)  # the disk tier cannot hold one state
    for uid in ("pod-a", "pod-b"):
        eng.register(reg(uid))
    assert eng.suspend_pod("pod-a", 30).state == "succeeded"
    rec = eng.suspend_pod("pod-b", 30)
    assert rec.fallback == "checkpoint-evict"
    assert "both tiers full" in rec.message and "does not fit the host-memory budget" in rec.message
    assert eng.tier_of("pod-a") == "dram"  # untouched


def test_enospc_while_spilling_falls_back_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    eng, host, events = spill_engine(tmp_path)
    for uid in ("pod-a", "pod-b"):
        eng.register(reg(uid))
    eng.suspend_pod("pod-a", 30)
    dram_a = host.dram("pod-a").read_bytes()
    real_fsync = os.fsync

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # a full disk's delayed-allocation error

    monkeypatch.setattr(os, "fsync", full)
    rec = eng.suspend_pod("pod-b", 30)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert rec.fallback == "checkpoint-evict" and "No space left on device" in rec.message
    assert host.dram("pod-a").read_bytes() == dram_a and eng.tier_of("pod-a") == "dram"
    assert eng.spill is not None and not list(eng.spill.root.iterdir()) and eng.spill.held_bytes() == 0
    assert any(e.reason == "SpillFailed" for e in events.events)
    assert eng.metrics.spills.labels("to_disk", "full")._value.get() == 1


def test_metrics_per_tier(tmp_path: Path) -> None:
    eng, _, _ = spill_engine(tmp_path)
    for uid in ("pod-a", "pod-b"):
        eng.register(reg(uid))
        eng.suspend_pod(uid, 30)
    r = eng.metrics.registry
    got = {t: r.get_sample_value("rose_driver_host_state_bytes", {"tier": t}) for t in ("dram", "disk")}
    assert got == {"dram": STATE, "disk": STATE}
    assert r.get_sample_value("rose_driver_host_state_budget_bytes", {"tier": "disk"}) == 64 * MiB
    assert r.get_sample_value("rose_suspend_spills_total", {"direction": "to_disk", "result": "ok"}) == 1
    eng.resume_pod("pod-a")
    assert r.get_sample_value("rose_driver_host_state_bytes", {"tier": "disk"}) == 0
    assert r.get_sample_value("rose_suspend_spills_total", {"direction": "to_dram", "result": "ok"}) == 1


def test_a_forgotten_pod_leaves_nothing_on_disk(tmp_path: Path) -> None:
    eng, _, _ = spill_engine(tmp_path)
    for uid in ("pod-a", "pod-b"):
        eng.register(reg(uid))
        eng.suspend_pod(uid, 30)
    eng.forget("pod-a")
    assert eng.spill is not None and eng.spill.held_bytes() == 0 and not list(eng.spill.root.iterdir())
    eng.forget("pod-b")
    assert not list((tmp_path / "host" / "dram").iterdir()) and not list((tmp_path / "host" / "device").iterdir())


def test_a_restarted_engine_finds_spilled_state_and_resumes_it(tmp_path: Path) -> None:
    eng, host, _ = spill_engine(tmp_path)
    for uid in ("pod-a", "pod-b"):
        eng.register(reg(uid))
        host.ensure_device(uid, STATE)
    original = _device(host, "pod-a")
    eng.suspend_pod("pod-a", 30)
    eng.suspend_pod("pod-b", 30)
    again, host2, _ = spill_engine(tmp_path)
    assert again.tier_of("pod-a") == "disk" and again.spill is not None and again.spill.held_bytes() == STATE
    again.register(replace(reg("pod-a"), current_state="Suspended"))
    w = again.registry.get("pod-a")
    assert w is not None and w.suspended_by == "simulated"  # the engine knows which backend holds it
    assert again.budget.held_bytes("pod-a") == 0  # on disk, not in DRAM
    assert again.resume_pod("pod-a").state == "succeeded"
    assert _device(host2, "pod-a") == original


# ---------------------------------------------------------------------------------- node facts


def test_node_facts_publish_both_tiers() -> None:
    data = NodeStateData(boot_id="b")
    facts = node_facts(data, 10 * MiB, spill=(64 * MiB, 3 * MiB))
    assert facts[names.ANNOTATION_HOST_MEM_FREE] == str(10 * MiB)
    assert facts[names.ANNOTATION_SPILL_FREE] == str(61 * MiB)
    assert names.ANNOTATION_SPILL_FREE not in node_facts(data, 10 * MiB)


# ---------------------------------------------------------------------------------- the driver's flags


def test_driver_flags_build_the_disk_tier(tmp_path: Path) -> None:
    from dra_driver import cli
    from dra_driver.suspend.engine import EngineConfig
    from dra_driver.suspend.events import RecordingEventSink
    from dra_driver.suspend.factory import build_engine

    a = cli.build_parser().parse_args(
        [
            "--node-name",
            "n1",
            "--gpu-backend",
            "simulated",
            "--spill-dir",
            str(tmp_path / "spill"),
            "--spill-budget-bytes",
            "1Gi",
        ]
    )
    assert (a.spill_dir, a.spill_budget_bytes) == (str(tmp_path / "spill"), 1 << 30)
    cfg = EngineConfig(
        host_memory_budget_bytes=1,
        backends=("simulated",),
        spill_dir=a.spill_dir,
        spill_budget_bytes=a.spill_budget_bytes,
    )
    eng = build_engine(cfg, events=RecordingEventSink(), simulated_host_dir=str(tmp_path / "host"))
    assert eng.spill is not None and eng.tier_usage()["disk"] == (1 << 30, 0)
    assert cli._disk_tier(eng) == (1 << 30, 0)
    with pytest.raises(ValueError, match="needs a budget > 0"):
        EngineConfig(host_memory_budget_bytes=1, spill_dir=str(tmp_path))
    with pytest.raises(ValueError, match="needs a spill directory"):
        EngineConfig(host_memory_budget_bytes=1, spill_budget_bytes=5)
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--node-name", "n1", "--gpu-backend", "simulated", "--spill-dir", "relative"])


def test_dram_full_of_unspillable_state_falls_back_saying_why(tmp_path: Path) -> None:
    """A state whose backend keeps its DRAM copy in the workload (no HostCopy) cannot spill."""
    eng, _, _ = spill_engine(tmp_path)
    eng._backends["simulated"].host_copy = None  # type: ignore[attr-defined]
    for uid in ("pod-a", "pod-b"):
        eng.register(reg(uid))
    assert eng.suspend_pod("pod-a", 30).state == "succeeded"
    rec = eng.suspend_pod("pod-b", 30)
    assert rec.fallback == "checkpoint-evict" and "no suspended state in DRAM can spill" in rec.message


def test_simulated_host_copy_bytes_keeps_files_small_and_charges_the_state_size(tmp_path: Path) -> None:
    """``--simulated-host-copy-bytes``: a soak's large simulated occupants spill without files of
    their size; the DRAM and disk budgets still charge the whole state."""
    from dra_driver import cli
    from dra_driver.suspend.engine import EngineConfig
    from dra_driver.suspend.events import RecordingEventSink
    from dra_driver.suspend.factory import build_engine

    a = cli.build_parser().parse_args(
        [
            "--node-name",
            "n1",
            "--gpu-backend",
            "simulated",
            "--simulated-host-dir",
            str(tmp_path / "host"),
            "--simulated-host-copy-bytes",
            "1Mi",
        ]
    )
    assert (a.simulated_host_dir, a.simulated_host_copy_bytes) == (str(tmp_path / "host"), MiB)
    state = 64 * MiB
    cfg = EngineConfig(
        host_memory_budget_bytes=state,  # holds one state, not two
        backends=("simulated",),
        spill_dir=str(tmp_path / "spill"),
        spill_budget_bytes=4 * state,
    )
    eng = build_engine(
        cfg,
        events=RecordingEventSink(),
        simulated_host_dir=a.simulated_host_dir,
        simulated_host_copy_bytes=a.simulated_host_copy_bytes,
    )
    for uid in ("pod-a", "pod-b"):
        eng.register(reg(uid, state))
        assert eng.suspend_pod(uid, 30).state == "succeeded"
    assert eng.tier_of("pod-a") == "disk" and eng.tier_usage() == {"dram": (state, state), "disk": (4 * state, state)}
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files and max(p.stat().st_size for p in files) < 2 * MiB, [(p, p.stat().st_size) for p in files]
    assert eng.resume_pod("pod-a").state == "succeeded"
    with pytest.raises(ValueError, match="must be >= 0"):
        SimulatedHostMemory(tmp_path / "x", copy_bytes=-1)

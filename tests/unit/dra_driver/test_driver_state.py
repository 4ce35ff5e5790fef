from __future__ import annotations

import json
import resource
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dra_driver.checkpoint import CheckpointFile
from dra_driver.claims import PodRef, PreparedDevice
from dra_driver.state import (
    PREPARE_COMPLETED,
    SUSPENDED,
    ClaimRecord,
    NodeStateData,
    StateCorruptError,
    Suspension,
    decode,
    encode,
)


def _data() -> NodeStateData:
    dev = PreparedDevice(("gpu",), "n", "gpu-0-lendable", ("gpu.rose.io/gpu=u-gpu-0-lendable",), 0, "GPU-a", "lendable")
    d = NodeStateData(boot_id="b1")
    d.claims["u"] = ClaimRecord("u", "ns", "c", PREPARE_COMPLETED, [dev], [PodRef("ns", "p", "pu")], 12.0)
    d.suspensions["u"] = Suspension("u", SUSPENDED, ["s1"], "simulated", 42, "ok")
    return d


def test_enforced_checkpoint_pids_round_trip_and_old_records_read_without_them() -> None:
    d = _data()
    d.suspensions["u"].pids = [4242, 17]
    assert decode(encode(d)).suspensions["u"].pids == [17, 4242]
    assert "pids" not in _data().body()["suspensions"]["u"]  # unchanged JSON for every other record


def test_roundtrip_and_checksum(tmp_path: Path) -> None:
    raw = encode(_data())
    back = decode(raw)
    assert back.body() == _data().body()
    doc = json.loads(raw)
    doc["claims"]["u"]["state"] = "PrepareStarted"  # tamper without fixing the checksum
    with pytest.raises(StateCorruptError, match="checksum mismatch"):
        decode(json.dumps(doc).encode())
    with pytest.raises(StateCorruptError, match="not JSON"):
        decode(raw[: len(raw) // 2])


def test_file_boot_id_mismatch_discards(tmp_path: Path) -> None:
    f = CheckpointFile(tmp_path / "cp.json")
    assert f.load("b1") == (NodeStateData(boot_id="b1"), False)
    f.save(_data())
    assert (tmp_path / "cp.json").stat().st_mode & 0o777 == 0o600
    same, stale = f.load("b1")
    assert not stale and "u" in same.claims
    fresh, stale = f.load("b2")
    assert stale and not fresh.claims and fresh.boot_id == "b2"


@contextmanager
def disk_full_after(nbytes: int) -> Iterator[None]:
    """Writes past ``nbytes`` into any file fail (EFBIG), as on a full disk, whatever the writer
    (os.write, file objects): RLIMIT_FSIZE is enforced by the kernel, SIGXFSZ ignored."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)


def _bigger() -> NodeStateData:
    d = _data()
    for i in range(50):
        d.claims[f"u{i}"] = ClaimRecord(f"u{i}", "ns", f"c{i}", PREPARE_COMPLETED, [], [], float(i))
    return d


def test_a_write_that_fails_part_way_leaves_the_previous_state_intact(tmp_path: Path) -> None:
    """Deterministic: the disk fills half-way through the new state; the previous state file
    must still load, unchanged (an in-place write would leave a truncated, unloadable file)."""
    f = CheckpointFile(tmp_path / "cp.json")
    f.save(_data())
    before = (tmp_path / "cp.json").read_bytes()
    new = _bigger()
    with disk_full_after(len(encode(new)) // 2), pytest.raises(OSError):
        f.save(new)
    assert (tmp_path / "cp.json").read_bytes() == before
    loaded, stale = f.load("b1")
    assert not stale and loaded.body() == _data().body()
    f.save(new)  # the next write (disk has room again) goes through
    assert f.load("b1")[0].body() == new.body()

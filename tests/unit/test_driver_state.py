from __future__ import annotations

import json
from pathlib import Path

import pytest

from dra_driver.claims import PodRef, PreparedDevice
from dra_driver.state import (
    PREPARE_COMPLETED,
    SUSPENDED,
    CheckpointFile,
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

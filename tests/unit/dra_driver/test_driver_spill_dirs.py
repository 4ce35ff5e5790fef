"""The node driver gives a lent claim its own spill directory (the disk tier's ``claims/<UID>``,
a real ``SpillStore``) at prepare and mounts it by the claim's CDI spec; unprepare removes it unless
it holds a verified spill; a restart removes those of claims unprepared meanwhile. Claims in
memory, a recording suspend engine, and an explicit stand-in for the agent's claim sockets."""

from __future__ import annotations

import json
import os
from pathlib import Path

from dra_driver import cdi
from dra_driver.claims import ClaimRef, PodRef
from dra_driver.suspend.spill import SpillStore
from rose_common import spillfmt
from tests.support.driver_fixtures import NS, RecordingEngine, StaticClaims, make_claim, make_driver

L0 = make_claim("uid-l0", "l0", [("gpu", "gpu-0-lendable")], pod=("rl-0", "pod-rl-0"))
S1 = make_claim("uid-s1", "s1", [("gpu", "gpu-1-serving")], pod=("serve-1", "pod-serve-1"))


class SocketDirs:
    """Stands in for the agent's ClaimSockets (no gRPC server here): a directory per claim."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def open_claim(self, claim_uid: str, pods: list[PodRef], max_state_bytes: int) -> Path:
        d = self.root / claim_uid
        d.mkdir(parents=True, exist_ok=True)
        return d

    def close_claim(self, claim_uid: str) -> None:
        (self.root / claim_uid).rmdir()


def _ref(c: dict) -> ClaimRef:  # type: ignore[type-arg]
    return ClaimRef(NS, c["metadata"]["uid"], c["metadata"]["name"])


def _driver(tmp: Path, store: SpillStore):  # type: ignore[no-untyped-def]
    d = make_driver(
        tmp, StaticClaims([L0, S1]), RecordingEngine(), workload_sockets=SocketDirs(tmp / "sock"), spill_dirs=store
    )
    d.recover()
    return d


def _mounts(tmp: Path, uid: str) -> dict[str, str]:
    spec = json.loads((tmp / "cdi" / cdi.spec_filename(uid)).read_text())
    return {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"].get("mounts", [])}


def test_a_lent_claim_gets_a_mounted_spill_directory_gone_at_unprepare(tmp_path: Path) -> None:
    store = SpillStore(tmp_path / "spill", 1 << 20)
    d = _driver(tmp_path, store)
    assert not d.prepare([_ref(L0), _ref(S1)])["uid-l0"].error
    spill_dir = tmp_path / "spill" / "claims" / "uid-l0"
    assert spill_dir.is_dir() and (spill_dir.stat().st_mode & 0o777) == 0o711
    assert _mounts(tmp_path, "uid-l0")["/run/rose/spill/uid-l0"] == str(spill_dir)
    assert "/run/rose/spill/uid-s1" not in _mounts(tmp_path, "uid-s1")  # serving: no socket, no spill
    assert store.claims() == ["uid-l0"]
    assert d.unprepare([_ref(L0)]) == {"uid-l0": ""}
    assert not spill_dir.exists()
    d.close()


def test_unprepare_keeps_a_directory_holding_a_verified_spill(tmp_path: Path) -> None:
    store = SpillStore(tmp_path / "spill", 1 << 20)
    d = _driver(tmp_path, store)
    assert not d.prepare([_ref(L0)])["uid-l0"].error
    h = store.hand_over("pod-rl-0", os.geteuid(), os.getegid(), "uid-l0")
    with open(h.path, "r+b") as f:  # what the workload's SDK writes into the file handed over
        spillfmt.write_chunks(f, [b"x" * 100], 64)
    assert store.adopt(h, 100, 100) == 100
    assert d.unprepare([_ref(L0)]) == {"uid-l0": ""}
    assert store.path("pod-rl-0").exists() and store.verify("pod-rl-0") == 100  # RL state kept
    d.close()
    # a restart: the claim is gone from the node state; its directory stays while the spill does
    again = SpillStore(tmp_path / "spill", 1 << 20)
    assert again.recover() == {"pod-rl-0": 100}
    d = _driver(tmp_path, again)
    assert again.path("pod-rl-0").exists()
    again.remove("pod-rl-0")
    d.close()
    d = _driver(tmp_path, again)  # the next start removes the now empty directory
    assert again.claims() == []
    d.close()


def test_a_claim_whose_spill_directory_cannot_be_made_still_prepares_without_the_mount(tmp_path: Path) -> None:
    store = SpillStore(tmp_path / "spill", 1 << 20)
    (tmp_path / "spill" / "claims").mkdir()
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "f").write_text("kept")
    (tmp_path / "spill" / "claims" / "uid-l0").symlink_to(tmp_path / "target")  # not the driver's directory
    d = _driver(tmp_path, store)
    assert d.prepare([_ref(L0)])["uid-l0"].error == ""
    assert "/run/rose/spill/uid-l0" not in _mounts(tmp_path, "uid-l0")
    assert d.unprepare([_ref(L0)]) == {"uid-l0": ""}
    assert (tmp_path / "target" / "f").read_text() == "kept"  # the link's target untouched
    d.close()


def test_the_driver_wires_claim_spill_directories_only_for_cooperative_workloads_with_a_tier(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    from dra_driver import cli
    from dra_driver.suspend.engine import EngineConfig
    from dra_driver.suspend.factory import build_engine

    def engine(backends: tuple[str, ...], spill: bool):  # type: ignore[no-untyped-def]
        tier = {"spill_dir": str(tmp_path / "spill"), "spill_budget_bytes": 1 << 20} if spill else {}
        cfg = EngineConfig(host_memory_budget_bytes=1 << 20, backends=backends, **tier)  # type: ignore[arg-type]
        return build_engine(cfg, metrics_registry=CollectorRegistry())

    agent = object()  # the node agent's server: only whether there is one matters here
    coop = engine(("cooperative",), True)
    assert cli._spill_dirs(coop, agent) is coop.spill
    assert cli._spill_dirs(coop, None) is None  # no agent: no workload can be told a path
    assert cli._spill_dirs(engine(("cooperative",), False), agent) is None  # no disk tier
    assert cli._spill_dirs(engine(("simulated",), True), agent) is None  # the driver writes those itself

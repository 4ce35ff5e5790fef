"""The checked-in stubs in rose_common/proto/ are what hack/gen-protos.sh generates now."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PROTO = REPO / "rose_common" / "proto"


def test_generated_stubs_are_current(tmp_path: Path) -> None:
    subprocess.run([str(REPO / "hack" / "gen-protos.sh"), str(tmp_path)], check=True, capture_output=True)
    fresh = tmp_path / "rose_common" / "proto"
    protos = sorted(p.stem for p in PROTO.glob("*.proto"))
    assert {"k8s_dra_v1", "k8s_dra_v1beta1", "k8s_pluginregistration"} <= set(protos)
    stale = []
    for stem in protos:
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            name = stem + suffix
            checked_in = PROTO / name
            if not checked_in.exists() or checked_in.read_bytes() != (fresh / name).read_bytes():
                stale.append(name)
    assert not stale, f"stale generated stubs {stale}: run hack/gen-protos.sh and commit the result"


def test_check_mode_agrees() -> None:
    r = subprocess.run([str(REPO / "hack" / "gen-protos.sh"), "--check"], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr

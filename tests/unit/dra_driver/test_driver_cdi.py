from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dra_driver import cdi
from dra_driver.claims import PreparedDevice

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*[A-Za-z0-9]$")


def _dev(i: int, role: str) -> PreparedDevice:
    return PreparedDevice(
        ("gpu",), "n", f"gpu-{i}-{role}", (f"gpu.rose.io/gpu=u1-gpu-{i}-{role}",), i, f"GPU-{i}", role
    )


def test_spec_shape_and_ids_match() -> None:
    spec = cdi.build_spec("u1", [_dev(0, "serving"), _dev(3, "lendable")], {0: 0, 3: 5}, simulated=False)
    assert spec["cdiVersion"] == "0.6.0" and spec["kind"] == "gpu.rose.io/gpu"
    names = [d["name"] for d in spec["devices"]]
    assert names == ["u1-gpu-0-serving", "u1-gpu-3-lendable"]
    assert all(NAME_RE.match(n) for n in names)
    # the CDI id returned to the kubelet is <kind>=<device name>
    assert f"{spec['kind']}={names[1]}" == "gpu.rose.io/gpu=u1-gpu-3-lendable"
    assert spec["devices"][1]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia5"}]
    assert set(spec) == {"cdiVersion", "kind", "annotations", "devices", "containerEdits"}


def test_simulated_spec_has_no_device_nodes() -> None:
    spec = cdi.build_spec("u1", [_dev(0, "serving")], {}, simulated=True)
    assert "deviceNodes" not in json.dumps(spec)


def test_write_list_delete(tmp_path: Path) -> None:
    p = cdi.write_spec(tmp_path, "u1", cdi.build_spec("u1", [_dev(0, "serving")], {}, True))
    assert p.name == "gpu.rose.io-gpu_u1.json"
    assert json.loads(p.read_text())["devices"][0]["name"] == "u1-gpu-0-serving"
    (tmp_path / "other-vendor.json").write_text("{}")
    assert cdi.list_specs(tmp_path) == ["u1"]
    assert cdi.delete_spec(tmp_path, "u1") and not cdi.delete_spec(tmp_path, "u1")


def test_a_lent_claims_spec_names_its_simulated_device_memory() -> None:
    env = {"ROSE_SIMULATED_DEVICE_MEMORY": "/run/rose/claims/u1/device-memory"}
    spec = cdi.build_spec(
        "u1", [_dev(0, "lendable")], {}, simulated=True, agent_socket_dir=Path("/p/u1"), extra_env=env
    )
    assert "ROSE_SIMULATED_DEVICE_MEMORY=/run/rose/claims/u1/device-memory" in spec["containerEdits"]["env"]
    assert spec["containerEdits"]["mounts"][0]["containerPath"] == "/run/rose/claims/u1"  # the same directory


def test_a_lent_claims_spec_mounts_its_spill_directory_beside_its_socket() -> None:
    spec = cdi.build_spec(
        "u1",
        [_dev(0, "lendable")],
        {},
        simulated=True,
        agent_socket_dir=Path("/p/claims/u1"),
        spill_dir=Path("/var/lib/rose/spill/claims/u1"),
    )
    edits = spec["containerEdits"]
    assert "ROSE_SPILL_DIR=/run/rose/spill/u1" in edits["env"]
    assert "ROSE_AGENT_SOCKET=/run/rose/claims/u1/workload.sock" in edits["env"]
    assert [(m["hostPath"], m["containerPath"]) for m in edits["mounts"]] == [
        ("/p/claims/u1", "/run/rose/claims/u1"),
        ("/var/lib/rose/spill/claims/u1", "/run/rose/spill/u1"),
    ]
    assert edits["mounts"][1]["options"] == ["rbind", "rw", "nosuid", "nodev", "noexec"]
    assert "ROSE_SPILL_DIR" not in json.dumps(cdi.build_spec("u1", [_dev(0, "lendable")], {}, simulated=True))


def test_spill_dir_edits_refuse_a_relative_host_path() -> None:
    with pytest.raises(ValueError, match="must be an absolute host path"):
        cdi.spill_dir_edits("u1", Path("spill/claims/u1"))
    with pytest.raises(ValueError, match="spill key"):
        cdi.spill_dir_edits("../u1", Path("/s/claims/u1"))

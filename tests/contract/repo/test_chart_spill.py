"""The driver's disk tier for suspended state from the install paths (issue 27 §4): the Helm chart's
``driver.spill`` values and the kustomize Component ``manifests/components/spill``.

I/O: the pinned ``helm`` and the venv's ``kubectl kustomize`` as subprocesses rendering the
repository's chart and manifests; no cluster (test_install.py checks the API server accepts them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver import cli
from rose_common.cli import byte_size
from tests.support.helm import REPO, helm, helm_run

BASE = ("template", "r", "charts/rose", "-n", "ai-infra", "--kube-version", "v1.37.2")
KUBECTL = shutil.which("kubectl") or str(Path(sys.executable).with_name("kubectl"))


def driver_pod(rendered: str) -> dict[str, Any]:
    ds = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "DaemonSet"]
    assert [d["metadata"]["name"] for d in ds] == ["rose-dra-driver"], ds
    pod: dict[str, Any] = ds[0]["spec"]["template"]["spec"]
    return pod


def driver_container(pod: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any] = next(c for c in pod["containers"] if c["name"] == "driver")
    return c


def render(tmp: Path, *values: str) -> dict[str, Any]:
    sets = [a for v in values for a in ("--set", v)]
    return driver_pod(helm(tmp, *BASE, "--show-only", "templates/manifests.yaml", *sets).stdout)


def spill_parts(pod: dict[str, Any]) -> tuple[list[Any], list[Any], dict[str, str]]:
    c = driver_container(pod)
    env = {e["name"]: e.get("value") for e in c["env"] if e["name"].startswith("ROSE_DRIVER_SPILL")}
    vols = [v for v in pod["volumes"] if v["name"] == "spill"]
    mounts = [m for m in c["volumeMounts"] if m["name"] == "spill"]
    return vols, mounts, env


def test_spill_enabled_mounts_the_node_directory_and_sets_the_driver_flags(tmp_path: Path) -> None:
    for mode in ("nvidia", "simulated"):
        pod = render(
            tmp_path,
            f"gpus.mode={mode}",
            "driver.spill.enabled=true",
            "driver.spill.hostPath=/mnt/nvme0/rose-spill/",
            "driver.spill.budget=1.5Ti",
        )
        vols, mounts, env = spill_parts(pod)
        path = "/mnt/nvme0/rose-spill"
        assert vols == [{"name": "spill", "hostPath": {"path": path, "type": "DirectoryOrCreate"}}], vols
        assert mounts == [{"name": "spill", "mountPath": path}], mounts
        assert env == {"ROSE_DRIVER_SPILL_DIR": path, "ROSE_DRIVER_SPILL_BUDGET_BYTES": "1.5Ti"}, env
        # `rose driver` reads the container's environment as its flags' twins
        with pytest.MonkeyPatch.context() as mp:
            for e in driver_container(pod)["env"]:
                if "value" in e:
                    mp.setenv(e["name"], e["value"])
            args = cli.build_parser().parse_args(["--node-name", "n"])
        assert (args.spill_dir, args.spill_budget_bytes) == (path, int(1.5 * 2**40))
        # the pod's protections are those of the manifests (no privilege) plus CHOWN: the driver
        # gives each spill file to the workload's uid
        sc = driver_container(pod)["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and "privileged" not in sc, sc
        assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE", "DAC_READ_SEARCH", "CHOWN"]}, sc
    # a plain number of bytes in a values file (helm reads YAML numbers as floats) stays an integer
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"driver": {"spill": {"enabled": True, "budget": 214748364800}}}))
    pod = driver_pod(helm(tmp_path, *BASE, "--show-only", "templates/manifests.yaml", "-f", str(values)).stdout)
    vols, mounts, env = spill_parts(pod)
    assert vols[0]["hostPath"]["path"] == mounts[0]["mountPath"] == "/var/lib/rose/spill", (vols, mounts)
    assert env["ROSE_DRIVER_SPILL_BUDGET_BYTES"] == "214748364800"
    assert byte_size(env["ROSE_DRIVER_SPILL_BUDGET_BYTES"]) == 214748364800


def test_spill_disabled_by_default_renders_the_driver_as_before(tmp_path: Path) -> None:
    default = helm(tmp_path, *BASE, "--show-only", "templates/manifests.yaml").stdout
    off = helm(
        tmp_path,
        *BASE,
        "--show-only",
        "templates/manifests.yaml",
        "--set",
        "driver.spill.enabled=false",
        "--set",
        "driver.spill.hostPath=/mnt/elsewhere",
        "--set",
        "driver.spill.budget=1Ti",
    ).stdout
    assert off == default
    pod = driver_pod(default)
    assert spill_parts(pod) == ([], [], {})
    manifest = yaml.safe_load((REPO / "manifests/driver/daemonset.yaml").read_text())["spec"]["template"]["spec"]
    assert pod["volumes"] == manifest["volumes"]
    assert driver_container(pod)["volumeMounts"] == driver_container(manifest)["volumeMounts"]


def test_bad_spill_values_are_refused_at_render_time(tmp_path: Path) -> None:
    cases = (
        ("driver.spill.budget=lots", "/driver/spill/budget"),
        ("driver.spill.budget=-5Gi", "/driver/spill/budget"),
        ("driver.spill.budget=0Gi", 'driver.spill.budget is "0Gi": set the bytes the disk tier may hold'),
        ("driver.spill.budget=0", 'driver.spill.budget is "0"'),
        ("driver.spill.hostPath=spill", "/driver/spill/hostPath"),
        ("driver.spill.hostPath=/", "other than /"),
        ("driver.spill.hostPath=/var/lib/kubelet", "overlaps the driver's mount /var/lib/kubelet/plugins_registry"),
        ("driver.spill.hostPath=/var/lib/rose/agent/spill", "overlaps the driver's mount /var/lib/rose/agent"),
        ("driver.spill.size=1Gi", "size"),  # a typo: the schema refuses unknown keys
    )
    for value, why in cases:
        r = helm_run(tmp_path, *BASE, "--set", "driver.spill.enabled=true", "--set", value)
        assert r.returncode != 0 and why in r.stderr, (value, r.stderr)
    # the schema checks the values even where the tier is off
    r = helm_run(tmp_path, *BASE, "--set", "driver.spill.budget=lots")
    assert r.returncode != 0 and "/driver/spill/budget" in r.stderr, r.stderr


def test_kustomize_component_adds_the_same_tier_to_an_overlay(tmp_path: Path) -> None:
    rel = Path(os.path.relpath(REPO, tmp_path))
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [str(rel / "manifests/overlays/kind")],
                "components": [str(rel / "manifests/components/spill")],
            }
        )
    )
    out = subprocess.run(
        [KUBECTL, "kustomize", str(tmp_path)], text=True, capture_output=True, check=True, timeout=120
    ).stdout
    pod = driver_pod(out)
    vols, mounts, env = spill_parts(pod)
    assert vols == [{"name": "spill", "hostPath": {"path": "/var/lib/rose/spill", "type": "DirectoryOrCreate"}}]
    assert mounts == [{"name": "spill", "mountPath": "/var/lib/rose/spill"}]
    assert env == {"ROSE_DRIVER_SPILL_DIR": "/var/lib/rose/spill", "ROSE_DRIVER_SPILL_BUDGET_BYTES": "200Gi"}
    sc = driver_container(pod)["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE", "DAC_READ_SEARCH", "CHOWN"]}, sc
    assert sc["runAsUser"] == 0 and sc["allowPrivilegeEscalation"] is False, sc  # the rest merged, not replaced
    kind_env = {e["name"]: e.get("value") for e in driver_container(pod)["env"]}
    assert kind_env["ROSE_DRIVER_GPU_BACKEND"] == "simulated"  # the overlay's patch still applies

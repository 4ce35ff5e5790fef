"""The SDK finds its claims in the environment the driver's CDI specs actually inject.

End to end through the files: the real node driver prepares two claims of one container and
writes their CDI spec files; the container environment is built from those files the way a CDI
runtime applies them (for each referenced device: its spec's ``containerEdits``, then the
device's; a later ``env`` entry of the same name replaces the earlier one); the SDK reads it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from dra_driver.claims import ClaimRef
from rose_common import names
from rose_sdk import Workload
from tests.support.driver_fixtures import NS, RecordingEngine, StaticClaims, make_claim, make_driver

# Kubernetes UIDs are RFC 4122 UUIDs (dashes do not fit an environment variable name)
UID_A = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
UID_B = "0b5f8a3e-12cd-4e6f-8a9b-0123456789ab"


def _load_specs(cdi_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(cdi_dir.glob("*.json"))]


def container_env(cdi_dir: Path, cdi_ids: list[str]) -> dict[str, str]:
    """The environment a CDI runtime gives a container that references ``cdi_ids``."""
    specs = _load_specs(cdi_dir)
    env: dict[str, str] = {}
    applied: set[int] = set()

    def edit(edits: dict[str, Any]) -> None:
        for kv in edits.get("env") or []:
            key, _, value = kv.partition("=")
            env[key] = value

    for cdi_id in cdi_ids:
        kind, _, device = cdi_id.partition("=")
        found = [
            (i, s, d) for i, s in enumerate(specs) if s["kind"] == kind for d in s["devices"] if d["name"] == device
        ]
        assert len(found) == 1, f"CDI device {cdi_id} resolves to {len(found)} spec devices"
        i, spec, dev = found[0]
        if i not in applied:
            applied.add(i)
            edit(spec.get("containerEdits") or {})
        edit(dev["containerEdits"])
    return env


@pytest.fixture
def prepared(tmp_path: Path) -> Iterator[tuple[Path, list[str]]]:
    claims = [
        make_claim(UID_A, "a", [("gpu", "gpu-0-serving")], pod=("serve-0", "pod-serve-0")),
        make_claim(UID_B, "b", [("gpu", "gpu-1-serving")], pod=("serve-0", "pod-serve-0")),
    ]
    d = make_driver(tmp_path, StaticClaims(claims), RecordingEngine())
    d.recover()
    out = d.prepare([ClaimRef(NS, UID_A, "a"), ClaimRef(NS, UID_B, "b")])
    assert not out[UID_A].error and not out[UID_B].error
    ids = [i for uid in (UID_A, UID_B) for dev in out[uid].devices for i in dev.cdi_ids]
    yield tmp_path / "cdi", ids
    d.close()


def test_sdk_reads_every_claim_the_cdi_specs_inject(
    prepared: tuple[Path, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    cdi_dir, ids = prepared
    env = container_env(cdi_dir, ids)
    for key in [k for k in os.environ if k.startswith("ROSE_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    wl = Workload(model=torch.nn.Linear(1, 1))
    assert wl.claim_uids == sorted([UID_A, UID_B])
    assert env[names.ENV_SIMULATED_GPU] == "1"


def test_one_claim_one_variable() -> None:
    assert names.claim_uid_env(UID_A) == f"ROSE_CLAIM_UID_{UID_A.upper().replace('-', '_')}={UID_A}"
    assert names.claim_uids_from_env({"ROSE_CLAIM_UID_X": "x", "ROSE_CLAIM_UID_Y": "", "OTHER": "z"}) == ["x"]


def test_a_uid_that_cannot_name_a_variable_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot name an environment variable"):
        names.claim_uid_env("a/b")

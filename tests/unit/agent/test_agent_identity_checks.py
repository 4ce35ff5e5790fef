"""Issue 11 (node part): the pure decisions behind the node agent's identity checks, the eviction
request, the checkpoint check, the CDI socket mount, and the DaemonSet's privileges."""

from __future__ import annotations

import hashlib
import io
import time
from pathlib import Path

import pytest
import yaml

from dra_driver import cdi
from dra_driver.kube import eviction_body
from dra_driver.suspend.engine import unverified_bytes_counted
from dra_driver.suspend.model import Registration
from dra_driver.suspend.registry import (
    ClaimScope,
    RegistrationRefused,
    RegistryFull,
    TrustedPod,
    WorkloadRegistry,
    scoped_registration,
)
from dra_driver.suspend.verify import Problem, check_stream

SCOPE = ClaimScope("claim-1", (TrustedPod("rl", "worker-0", "uid-0"),), 80 << 30)
DS = Path(__file__).resolve().parents[3] / "manifests" / "driver" / "daemonset.yaml"


def reg(pod_uid: str = "uid-0", **kw: object) -> Registration:
    fields: dict[str, object] = {"pid": 7, "state_bytes": 10, "backends": frozenset({"cooperative"})}
    fields.update(kw)
    return Registration(pod_uid=pod_uid, **fields)  # type: ignore[arg-type]


def test_scope_takes_names_and_claim_from_the_records_not_the_body() -> None:
    r = scoped_registration(
        reg(pod_namespace="kube-system", pod_name="coredns", claim_uids=frozenset({"victim"})), SCOPE
    )
    assert (r.pod_namespace, r.pod_name, r.claim_uids) == ("rl", "worker-0", frozenset({"claim-1"}))


def test_scope_refuses_other_pods_and_oversized_state() -> None:
    with pytest.raises(RegistrationRefused, match="not a pod of claim claim-1"):
        scoped_registration(reg("uid-victim"), SCOPE)
    with pytest.raises(RegistrationRefused, match="device memory"):
        scoped_registration(reg(state_bytes=(80 << 30) + 1), SCOPE)


def test_registry_caps_and_keeps_trusted_bindings() -> None:
    r = WorkloadRegistry(max_workloads=2)
    r.bind_claim("claim-v", "uid-v")
    r.register(reg("a", claim_uids=frozenset({"claim-v"})))
    assert r.pod_for_claim("claim-v") == "uid-v"  # a body cannot re-bind the driver's claim
    r.register(reg("b"))
    with pytest.raises(RegistryFull):
        r.register(reg("c"))
    r.register(reg("a"))  # a re-registration is not a new entry
    r2 = WorkloadRegistry()
    r2.register(reg("uid-0"), scope=SCOPE)
    with pytest.raises(RegistrationRefused, match="claim's socket"):
        r2.register(reg("uid-0"))  # taken over from a shared socket


def test_unverified_bytes_count_only_up_to_the_claims_device_memory() -> None:
    assert unverified_bytes_counted(1 << 50, None) == 0
    assert unverified_bytes_counted(1 << 50, SCOPE) == 80 << 30
    assert unverified_bytes_counted(5, SCOPE) == 5


def test_eviction_names_the_uid_precondition() -> None:
    assert eviction_body("rl", "worker-0", "uid-0") == {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "worker-0", "namespace": "rl"},
        "deleteOptions": {"preconditions": {"uid": "uid-0"}},
    }
    with pytest.raises(ValueError, match="UID"):
        eviction_body("rl", "worker-0", "")


def test_verify_checkpoint_reads_the_sdk_format() -> None:
    payload = b"x" * 3_000_000
    digest = hashlib.sha256(payload).hexdigest()
    good = b"ROSECKPT1\n" + digest.encode() + b"\n" + payload
    end = time.monotonic() + 60

    def check(data: bytes, want: str = digest, cap: int = 1 << 30) -> Problem:
        return check_stream(io.BytesIO(data).read, want, cap, end).problem

    assert check(good) is Problem.NONE
    assert check(good, "0" * 64) is Problem.MISMATCH
    assert check(good[:-1]) is Problem.MISMATCH
    assert check(b"root:x:0:0:root:/root:/bin/bash\n") is Problem.NOT_CHECKPOINT
    assert check(good, cap=1 << 20) is Problem.TOO_LARGE  # a file growing past the cap while read
    assert check_stream(io.BytesIO(good).read, digest, 1 << 30, time.monotonic() - 1).problem is Problem.TIMED_OUT


def test_cdi_mounts_the_claims_socket_directory() -> None:
    edits = cdi.agent_socket_edits("c1", Path("/var/lib/kubelet/plugins/gpu.rose.io/claims/c1"))
    assert edits["env"] == ["ROSE_AGENT_SOCKET=/run/rose/claims/c1/workload.sock"]
    assert edits["mounts"][0]["containerPath"] == "/run/rose/claims/c1"


def test_daemonset_is_not_privileged_and_mounts_only_its_plugin_dir() -> None:
    ds = yaml.safe_load(DS.read_text())
    spec = ds["spec"]["template"]["spec"]
    c = spec["containers"][0]
    sc = c["securityContext"]
    assert "privileged" not in sc and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE", "DAC_READ_SEARCH"]}
    paths = {v["hostPath"]["path"] for v in spec["volumes"]}
    assert paths == {
        "/var/lib/kubelet/plugins/gpu.rose.io",
        "/var/lib/kubelet/plugins_registry",
        "/var/run/cdi",
        "/var/lib/rose/agent",
    }
    env = {e["name"]: e.get("value") for e in c["env"]}
    control = Path(env["ROSE_DRIVER_AGENT_CONTROL_SOCKET"])
    assert not control.is_relative_to(env["ROSE_DRIVER_PLUGIN_DIR"])  # not in what claims mount

"""The disk tier for a cooperative workload in its own container (issue 27 §4): the real node
driver prepares two lent claims (a real engine, the real node agent's claim sockets, a real
``SpillStore``); each claim's CDI spec mounts the claim's socket directory and its spill directory.
Each workload (``spill_coop_workload.py``, a real rose_sdk process) runs in its own mount namespace
with only what the spec mounts (``tests.support.cdi_runtime``: the host's spill root and the test's
directories are hidden from it), so it can open its spill file only through the CDI mount.

Serving claims arrive on both GPUs; the DRAM budget holds one suspended state, so the second
suspend spills the first workload's host copy through its mounted directory (no fallback); when
serving leaves, that workload resumes from the file bit-exact (the digest it prints at its suspend
equals the one after its resume); unpreparing the lent claims removes their spill directories.
On a driver that names the host path (before per-claim directories) the workload cannot open the
file and the second suspend falls back instead. A container without the spill mount (started
before its claim had a spill directory) is never asked to spill: its state stays in host memory."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver import cdi
from dra_driver.claims import ClaimRef
from tests.support import cdi_runtime
from tests.support.agent_fixtures import REPO, WorkloadProc, reaped, running_agent, start_workload, wait_registered
from tests.support.driver_fixtures import NS, StaticClaims, make_claim, make_driver

pytestmark = [
    pytest.mark.slow,  # ~20 s: two torch workloads, a 64 MiB spill and its read-back
    pytest.mark.skipif(not cdi_runtime.available(), reason="needs root and unshare (a mount namespace)"),
]

SCRIPT = REPO / "tests" / "support" / "spill_coop_workload.py"
MIB = 1 << 20
L0 = make_claim("0a1b2c3d-0000-4000-8000-00000000aa00", "l0", [("gpu", "gpu-0-lendable")], pod=("rl-0", "pod-rl-0"))
L1 = make_claim("0a1b2c3d-0000-4000-8000-00000000aa01", "l1", [("gpu", "gpu-1-lendable")], pod=("rl-1", "pod-rl-1"))
S0 = make_claim("0a1b2c3d-0000-4000-8000-00000000bb00", "s0", [("gpu", "gpu-0-serving")], pod=("srv-0", "pod-srv-0"))
S1 = make_claim("0a1b2c3d-0000-4000-8000-00000000bb01", "s1", [("gpu", "gpu-1-serving")], pod=("srv-1", "pod-srv-1"))


def _ref(c: dict) -> ClaimRef:  # type: ignore[type-arg]
    return ClaimRef(NS, c["metadata"]["uid"], c["metadata"]["name"])


def _uid(c: dict) -> str:  # type: ignore[type-arg]
    return str(c["metadata"]["uid"])


def _in_container(tmp: Path, claim: dict, mib: int, without_spill_mount: bool = False) -> WorkloadProc:  # type: ignore[type-arg]
    """Start the claim's workload as its CDI spec's container would see the node
    (``without_spill_mount``: as a container started before the driver gave claims spill directories)."""
    spec = json.loads((tmp / "node" / "cdi" / cdi.spec_filename(_uid(claim))).read_text())
    if without_spill_mount:
        edits = spec["containerEdits"]
        edits["mounts"] = [m for m in edits["mounts"] if not m["containerPath"].startswith("/run/rose/spill/")]
        edits["env"] = [e for e in edits["env"] if not e.startswith("ROSE_SPILL_DIR=")]
    env = cdi_runtime.container_env(spec)
    pod_name, pod_uid = (claim["status"]["reservedFor"][0][k] for k in ("name", "uid"))
    return start_workload(
        tmp,
        pod_name,
        socket=Path(env["ROSE_AGENT_SOCKET"]),  # the container path: the host one is hidden
        pod_uid=pod_uid,
        namespace=NS,
        extra=["--state-mib", str(mib)],
        script=SCRIPT,
        env_extra=env,
        argv_prefix=cdi_runtime.container_argv(spec, hide=[tmp]),
    )


@pytest.fixture
def tmp() -> Iterator[Path]:
    """A short directory: unix socket paths must stay under 108 bytes."""
    d = Path(tempfile.mkdtemp(prefix="rsc-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _spills(eng: object, direction: str, result: str) -> float:
    return eng.metrics.spills.labels(direction, result)._value.get()  # type: ignore[attr-defined,no-any-return]


def test_a_workload_in_its_own_container_spills_through_its_claims_mount_and_resumes_bit_exact(tmp: Path) -> None:
    tmp_path = tmp
    spill_root = tmp_path / "spill"
    with running_agent(
        tmp_path, host_memory_budget_bytes=80 * MIB, spill_dir=str(spill_root), spill_budget_bytes=1 << 30
    ) as agent:
        eng = agent.engine
        driver = make_driver(
            tmp_path / "node",
            StaticClaims([L0, L1, S0, S1]),
            eng,
            workload_sockets=agent.server.claims,  # type: ignore[attr-defined]
            spill_dirs=eng.spill,  # type: ignore[attr-defined]
        )
        driver.recover()
        try:
            for c in (L0, L1):
                assert driver.prepare([_ref(c)])[_uid(c)].error == ""
            claim_dir = spill_root / "claims" / _uid(L0)
            assert claim_dir.is_dir() and (claim_dir.stat().st_mode & 0o777) == 0o711
            a, b = _in_container(tmp_path, L0, 64), _in_container(tmp_path, L1, 24)
            with reaped(a, b):
                a.wait_ready()
                b.wait_ready()
                wait_registered(eng, "pod-rl-0")
                wait_registered(eng, "pod-rl-1")
                view = Path(f"/proc/{a.proc.pid}/root")
                assert not (view / str(spill_root).lstrip("/")).exists()  # the host's spill root: not there
                assert (view / "run/rose/spill" / _uid(L0)).is_dir()  # its claim's, where the spec mounts it

                assert driver.prepare([_ref(S0)])[_uid(S0)].error == ""  # workload A suspended into DRAM
                before = a.wait_line("DIGEST-SUSPEND ")
                assert eng.tier_of("pod-rl-0") == "dram"  # type: ignore[attr-defined]

                # B's suspend does not fit beside A: A's host copy spills through its mounted dir.
                assert driver.prepare([_ref(S1)])[_uid(S1)].error == ""
                assert eng.occupant_state(_uid(L1)) == "suspended"  # type: ignore[attr-defined]
                assert eng.tier_of("pod-rl-0") == "disk", [e.message for e in agent.events.events]  # type: ignore[attr-defined]
                assert _spills(eng, "to_disk", "ok") == 1
                assert sum(c._value.get() for c in eng.metrics.fallbacks._metrics.values()) == 0  # type: ignore[attr-defined]
                f = claim_dir / "pod-rl-0.spill"
                assert f.stat().st_size > 64 * MIB and list(spill_root.glob("*.spill")) == []

                assert driver.unprepare([_ref(S1)])[_uid(S1)] == ""  # B resumes from DRAM
                assert driver.unprepare([_ref(S0)])[_uid(S0)] == ""  # A resumes from its spill file
                assert a.wait_line("DIGEST-RESUME ") == before  # bit-exact
                assert not f.exists() and _spills(eng, "to_dram", "ok") == 1
                assert eng.spill.held_bytes() == 0 and eng.budget.held_bytes() == 0  # type: ignore[attr-defined]
                assert a.wait_line("DONE ").split()[1] == "1"  # it freed its host copy once, after the verified spill
                a.finish()
                b.finish()
            for c in (L0, L1):
                assert driver.unprepare([_ref(c)])[_uid(c)] == ""
            assert list((spill_root / "claims").iterdir()) == []  # nothing spilled: both directories gone
        finally:
            driver.close()


def test_a_container_without_the_spill_mount_is_not_spilled_and_keeps_its_state(tmp: Path) -> None:
    """A container started before its claim had a spill directory (an upgraded driver rewrote the
    spec; a running container's mounts do not change): the driver sees that the process cannot
    reach the file, asks it nothing, and the state stays in host memory, resumed bit-exact."""
    from rose_common.proto import rose_agent_v1_pb2 as pb

    with running_agent(tmp, spill_dir=str(tmp / "spill"), spill_budget_bytes=1 << 30) as agent:
        eng = agent.engine
        driver = make_driver(
            tmp / "node",
            StaticClaims([L0]),
            eng,
            workload_sockets=agent.server.claims,  # type: ignore[attr-defined]
            spill_dirs=eng.spill,  # type: ignore[attr-defined]
        )
        driver.recover()
        try:
            assert driver.prepare([_ref(L0)])[_uid(L0)].error == ""
            a = _in_container(tmp, L0, 8, without_spill_mount=True)
            with reaped(a):
                a.wait_ready()
                wait_registered(eng, "pod-rl-0")
                req = pb.SuspendRequest(pod_uid="pod-rl-0", grace_seconds=60)
                assert agent.control.Suspend(req, timeout=120).state == pb.OPERATION_STATE_SUCCEEDED  # type: ignore[attr-defined]
                before = a.wait_line("DIGEST-SUSPEND ")
                held = eng.budget.held_bytes("pod-rl-0")  # type: ignore[attr-defined]
                wl = eng.registry.get("pod-rl-0")  # type: ignore[attr-defined]
                with wl.op_lock:  # what _make_room does for each state it spills
                    err = eng.spill_workload(wl)  # type: ignore[attr-defined]
                assert f"(pid {a.proc.pid}) cannot reach the spill file pod-rl-0.spill.tmp" in err, err
                assert _spills(eng, "to_disk", "failed") == 1
                assert eng.tier_of("pod-rl-0") == "dram" and eng.budget.held_bytes("pod-rl-0") == held  # type: ignore[attr-defined]
                assert list((tmp / "spill" / "claims" / _uid(L0)).iterdir()) == []  # the hand-over went
                op = agent.control.Resume(pb.ResumeRequest(pod_uid="pod-rl-0"), timeout=120)  # type: ignore[attr-defined]
                assert op.state == pb.OPERATION_STATE_SUCCEEDED, op.message
                assert a.wait_line("DIGEST-RESUME ") == before
                assert a.wait_line("DONE ").split()[1] == "0"  # never told to free its host copy
                a.finish()
            assert driver.unprepare([_ref(L0)])[_uid(L0)] == ""
        finally:
            driver.close()

"""Cooperative spill: a real rose_sdk workload process parks its state in its own host memory; when
the node's DRAM budget is full the engine has it write that copy to a file the driver created in
the disk tier, verifies the file from disk, and only then lets it free the copy. Real agent
(gRPC over unix sockets), real processes, real files; ``/proc`` for the process's memory.

* the full path: workload A (64 MiB) suspended; B's suspend does not fit the DRAM budget, so A
  spills (no fallback); A's memory was overwritten by the next tenant; A resumes from disk
  bit-exact (digest before the suspend == digest after the resume);
* a workload that lies (keeps its host copy after the commit, or writes garbage) is not counted as
  spilled: its DRAM charge stays; it still resumes bit-exact from its own memory;
* SIGKILL mid-spill: no partial file stays, nothing is counted on disk.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.agent_fixtures import (
    REPO,
    Agent,
    WorkloadProc,
    reaped,
    running_agent,
    start_workload,
    wait_registered,
)

SCRIPT = REPO / "tests" / "support" / "spill_coop_workload.py"
MIB = 1 << 20


def _agent(tmp: Path, budget: int, **cfg: object) -> Iterator[Agent]:
    return running_agent(  # type: ignore[return-value]
        tmp,
        host_memory_budget_bytes=budget,
        spill_dir=str(tmp / "spill"),
        spill_budget_bytes=1 << 30,
        **cfg,
    )


def _start(agent: Agent, tmp: Path, name: str, mib: int, lie: str = "") -> tuple[WorkloadProc, str]:
    uid = f"uid-{name}"
    sock = agent.claim_socket(f"claim-{name}", uid, name=name)
    extra = ["--state-mib", str(mib)] + (["--lie", lie] if lie else [])
    w = start_workload(tmp, name, socket=sock, pod_uid=uid, extra=extra, script=SCRIPT)
    return w, uid


def _suspend(agent: Agent, uid: str) -> object:
    from rose_common.proto import rose_agent_v1_pb2 as pb

    return agent.control.Suspend(pb.SuspendRequest(pod_uid=uid, grace_seconds=60), timeout=120)  # type: ignore[attr-defined]


def _resume(agent: Agent, uid: str) -> object:
    from rose_common.proto import rose_agent_v1_pb2 as pb

    return agent.control.Resume(pb.ResumeRequest(pod_uid=uid), timeout=120)  # type: ignore[attr-defined]


def _spills(agent: Agent, direction: str, result: str) -> float:
    return agent.engine.metrics.spills.labels(direction, result)._value.get()  # type: ignore[attr-defined,no-any-return]


def test_cooperative_workload_spills_and_resumes_bit_exact_from_disk(tmp_path: Path) -> None:
    from rose_common.proto import rose_agent_v1_pb2 as pb

    with _agent(tmp_path, 80 * MIB) as agent:
        eng = agent.engine
        a, ua = _start(agent, tmp_path, "a", 64)
        b, ub = _start(agent, tmp_path, "b", 24)
        with reaped(a, b):
            a.wait_ready()
            b.wait_ready()
            wait_registered(eng, ua)
            wait_registered(eng, ub)
            op = _suspend(agent, ua)
            assert op.state == pb.OPERATION_STATE_SUCCEEDED, op.message  # type: ignore[attr-defined]
            before = a.wait_line("DIGEST-SUSPEND ")
            held_a = eng.budget.held_bytes(ua)  # type: ignore[attr-defined]
            assert held_a >= 64 * MIB and eng.tier_of(ua) == "dram"  # type: ignore[attr-defined]

            # B does not fit next to A: A's host copy spills to disk instead of a fallback.
            op = _suspend(agent, ub)
            assert op.state == pb.OPERATION_STATE_SUCCEEDED and not op.fallback, op.message  # type: ignore[attr-defined]
            assert eng.tier_of(ua) == "disk" and eng.budget.held_bytes(ua) == 0  # type: ignore[attr-defined]
            assert eng.spill.held_bytes(ua) >= 64 * MIB  # type: ignore[attr-defined]
            f = tmp_path / "spill" / f"{ua}.spill"
            assert f.stat().st_size > 64 * MIB and f.stat().st_uid == os.getuid()
            assert _spills(agent, "to_disk", "ok") == 1
            assert any(e.reason == "SuspendedStateSpilled" and e.pod_uid == ua for e in agent.events.events)  # type: ignore[attr-defined]

            # B resumes (frees DRAM); A resumes from its spill file, bit-exact.
            assert _resume(agent, ub).state == pb.OPERATION_STATE_SUCCEEDED  # type: ignore[attr-defined]
            op = _resume(agent, ua)
            assert op.state == pb.OPERATION_STATE_SUCCEEDED, op.message  # type: ignore[attr-defined]
            assert a.wait_line("DIGEST-RESUME ") == before
            assert not f.exists() and eng.spill.held_bytes() == 0 and eng.budget.held_bytes() == 0  # type: ignore[attr-defined]
            assert _spills(agent, "to_dram", "ok") == 1
            assert a.wait_line("DONE ").split()[1] == "1"  # one host copy freed after a verified spill
            b.finish()
            a.finish()


@pytest.mark.parametrize("lie", ["keep", "garbage"])
def test_a_lying_workload_is_not_counted_as_spilled(tmp_path: Path, lie: str) -> None:
    from rose_common.proto import rose_agent_v1_pb2 as pb

    with _agent(tmp_path, 1 << 30, spill_timeout_seconds=60.0) as agent:
        eng = agent.engine
        w, uid = _start(agent, tmp_path, f"liar-{lie}", 64, lie)
        with reaped(w):
            w.wait_ready()
            wait_registered(eng, uid)
            assert _suspend(agent, uid).state == pb.OPERATION_STATE_SUCCEEDED  # type: ignore[attr-defined]
            before = w.wait_line("DIGEST-SUSPEND ")
            held = eng.budget.held_bytes(uid)  # type: ignore[attr-defined]
            wl = eng.registry.get(uid)  # type: ignore[attr-defined]
            with wl.op_lock:  # what _make_room does for each state it spills
                err = eng.spill_workload(wl)  # type: ignore[attr-defined]
            assert err, "a lying workload was counted as spilled"
            assert eng.tier_of(uid) == "dram" and eng.budget.held_bytes(uid) == held  # type: ignore[attr-defined]
            spill_dir = tmp_path / "spill"
            if lie == "keep":
                assert "did not free its host copy" in err
                assert _spills(agent, "to_disk", "not_freed") == 1
                assert (spill_dir / f"{uid}.spill").exists()  # the verified copy, kept as a spare
            else:
                assert "failed the driver's verification (corrupt)" in err
                assert _spills(agent, "to_disk", "corrupt") == 1
                assert list(spill_dir.iterdir()) == [] and eng.spill.held_bytes() == 0  # type: ignore[attr-defined]
            assert _spills(agent, "to_disk", "ok") == 0
            op = _resume(agent, uid)
            assert op.state == pb.OPERATION_STATE_SUCCEEDED, op.message  # type: ignore[attr-defined]
            assert w.wait_line("DIGEST-RESUME ") == before
            assert eng.budget.held_bytes() == 0 and eng.spill.held_bytes() == 0  # type: ignore[attr-defined]
            w.finish()


def test_sigkill_mid_spill_leaves_no_partial_file_and_nothing_counted(tmp_path: Path) -> None:
    from rose_common.proto import rose_agent_v1_pb2 as pb

    with _agent(tmp_path, 1 << 30, spill_timeout_seconds=4.0) as agent:
        eng = agent.engine
        w, uid = _start(agent, tmp_path, "killed", 16, "stall")
        with reaped(w):
            w.wait_ready()
            wait_registered(eng, uid)
            assert _suspend(agent, uid).state == pb.OPERATION_STATE_SUCCEEDED  # type: ignore[attr-defined]
            held = eng.budget.held_bytes(uid)  # type: ignore[attr-defined]
            wl = eng.registry.get(uid)  # type: ignore[attr-defined]
            out: list[str] = []

            def spill() -> None:
                with wl.op_lock:
                    out.append(eng.spill_workload(wl))  # type: ignore[attr-defined]

            t = threading.Thread(target=spill)
            t.start()
            w.wait_line("SPILLING")  # the first bytes are in the driver's file
            assert (tmp_path / "spill" / f"{uid}.spill.tmp").stat().st_size > 0
            os.kill(w.proc.pid, signal.SIGKILL)
            t.join(timeout=30)
            assert not t.is_alive()
            assert "did not write its spill file" in out[0]
            assert list((tmp_path / "spill").iterdir()) == []  # no partial file
            assert eng.spill.held_bytes() == 0 and eng.tier_of(uid) == "dram"  # type: ignore[attr-defined]
            assert eng.budget.held_bytes(uid) == held  # its charge stays until the pod is forgotten
            assert _spills(agent, "to_disk", "no_answer") == 1

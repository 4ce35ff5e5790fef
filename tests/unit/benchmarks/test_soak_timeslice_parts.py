"""The soak's judgements of its time-slice group and of the checkpoint-dir-full fault
(benchmarks/soak.py, issue 25 §2): who holds the group's devices by the drivers' word, when the
group has converged after a fault by the orchestrator's Lease, and when a member is settled."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.soak import (
    FAULT_KINDS,
    Params,
    group_converged,
    group_holders,
    group_member_ready,
    registered_since,
    serving_waiting,
    shared_claim_complete,
)
from rose_common import timeslice_lease as tl


def _w(state: str, fenced: bool = True, node: str = "n0", name: str = "w0", prepared: bool = True) -> dict[str, Any]:
    return {"name": name, "state": state, "node": node, "fenced": fenced, "prepared": prepared}


def test_a_hand_over_seen_step_by_step_never_has_two_holders() -> None:
    # a recorded A -> B hand-over as the pods' annotations show it, one list per observation:
    # A asked to suspend (still holds), A suspended by its driver, B's request removed (the driver
    # has not acted: still Suspended), B resumed
    steps = [
        {"a": [_w("Running")], "b": [_w("Suspended")]},
        {"a": [_w("Requested")], "b": [_w("Suspended")]},
        {"a": [_w("Suspended")], "b": [_w("Suspended")]},
        {"a": [_w("Suspended")], "b": [_w("Running")]},
    ]
    assert [group_holders(s) for s in steps] == [["a"], ["a"], [], ["b"]]
    # a member never handed over (no fencing token) is not judged: the driver never moved it
    assert group_holders({"a": [_w("Running")], "b": [_w("Running", fenced=False)]}) == ["a"]
    # a broken hand-over: B resumed while A still runs -> both named
    assert group_holders({"a": [_w("Running")], "b": [_w("Requested"), _w("Suspended", name="w1")]}) == ["a", "b"]
    assert group_holders({"a": [_w("CheckpointedEvicted")], "b": []}) == []
    # a member's worker recreated and not bound yet (Pending, the fencing token kept) holds nothing
    assert group_holders({"a": [_w("Requested")], "b": [_w("Pending", node="")]}) == ["a"]
    # the shared claim not prepared on the node (the driver refused it: serving holds that GPU): nobody
    # holds the device, whatever the fencing tokens say
    assert group_holders({"a": [_w("Requested", prepared=False)], "b": [_w("Running", prepared=False)]}) == []


def _lease(token: int, switching: bool = False, holder: str = "soak/ts-a") -> dict[str, Any]:
    return {
        "metadata": {
            "name": "ts-soak-tsg-x",
            "annotations": {
                tl.A_GROUP: "tsg",
                tl.A_NAMESPACE: "soak",
                tl.A_RESIDENT: holder,
                tl.A_SWITCHING: "true" if switching else "false",
                tl.A_TTL: "10",
            },
        },
        "spec": {"holderIdentity": holder, "leaseTransitions": token, "renewTime": "2026-12-02T01:00:00.000000Z"},
    }


def test_group_converged_needs_a_settled_grant_after_the_fault() -> None:
    assert group_converged(_lease(7), 6, 2) == ""
    assert group_converged(_lease(7), 7, 2) == "no grant since the fault (fencing token 7)"
    assert group_converged(_lease(8, switching=True), 6, 1) == "hand-over to soak/ts-a in flight (token 8)"
    assert group_converged(None, -1, 1) == "no Lease of the group yet"
    # nobody placed (the planner gave the group no GPU): nothing can be granted, the group is idle
    assert group_converged(None, 3, 0) == ""
    assert group_converged({"metadata": {"name": "other"}, "spec": {}}, 0, 1) == "the group's Lease carries no group"


def test_group_member_ready_follows_its_target_not_which_member_runs() -> None:
    def job(target: int | None, gen: int = 2, seen: int = 2) -> dict[str, Any]:
        return {
            "metadata": {"generation": gen},
            "spec": {"gpusPerWorker": 1, "maxGPUs": 1},
            "status": {"observedGeneration": seen, "targetGPUs": target, "activeGPUs": 0},
        }

    assert group_member_ready(job(1), [_w("Suspended")]) == ""  # waiting for the group: suspended at its target
    assert group_member_ready(job(0), []) == ""
    assert group_member_ready(job(1), []) == "0 workers, target 1"
    assert group_member_ready(job(1, seen=1), [_w("Running")]) == "status at generation 1, spec at 2"
    assert group_member_ready(job(None), []) == "no target yet"
    assert group_member_ready(job(1), [_w("Running", node="")]) == "workers not bound: w0"


def test_a_group_member_waiting_for_serving_is_outside_its_target() -> None:
    """Soak T2's remainder: the controller plans a member whose shared claim serving blocks as
    waiting (target 0) and names it in the ``ServingHoldsGPU`` condition."""

    def job(status: str, message: str = "w0: claim ts-g-w0-gpus on gpu-0-lendable of n, held by serving") -> Any:
        cond = {"type": "ServingHoldsGPU", "status": status, "message": message}
        st = {"observedGeneration": 2, "targetGPUs": 0, "activeGPUs": 0, "conditions": [cond]}
        return {"metadata": {"generation": 2}, "spec": {"gpusPerWorker": 1}, "status": st}

    assert group_member_ready(job("True"), [_w("Running")]) == ""
    assert group_member_ready(job("False"), [_w("Running")]) == "1 workers, target 0"  # serving left: not waiting
    assert group_member_ready(job("True", "w1: ..."), [_w("Running")]) == "1 workers, target 0"  # another worker
    assert group_member_ready(job("True"), [_w("Running"), _w("Running", name="w1")]) == (
        "2 workers, target 0 (1 waiting for serving)"
    )
    # the group's convergence counts a waiting member as not placed (nothing can be granted on it)
    assert serving_waiting(job("True"), [_w("Running"), _w("Running", name="w1")]) == ["w0"]
    assert serving_waiting(job("False"), [_w("Running")]) == []


def test_the_new_fault_kinds_are_known_and_kill_orchestrator_needs_the_group(tmp_path: Path) -> None:
    assert {"kill-orchestrator", "checkpoint-dir-full"} <= set(FAULT_KINDS)
    with pytest.raises(ValueError, match="kill-orchestrator needs the time-slice group"):
        Params(tmp_path / "s.csv", 1, 96, 1, 1, tmp_path, kinds=("kill-orchestrator",), timeslice=False)
    Params(tmp_path / "s.csv", 1, 96, 0, 1, tmp_path, timeslice=False)  # no faults: nothing to refuse


def test_a_shared_claim_is_prepared_once_every_bound_member_is_reserved() -> None:
    claim = {"status": {"reservedFor": [{"resource": "pods", "name": "ts-a-w0", "uid": "a"}]}}
    assert shared_claim_complete(claim, {"a"})
    assert not shared_claim_complete(claim, {"a", "b"})  # ts-b's worker bound, not reserved yet: wait
    assert shared_claim_complete({"status": {}}, set())  # a template's claim: nobody references it by name


def test_registered_since_reads_the_drivers_log_past_the_restart(tmp_path: Path) -> None:
    log = tmp_path / "driver.log"
    before = {"msg": "workload registered", "podUID": "u1", "backends": ["cooperative"]}
    log.write_text(json.dumps(before) + "\n")
    offset = log.stat().st_size  # the driver restarted here: what it said before does not count
    assert not registered_since(log, offset, "u1")
    with log.open("a") as f:
        f.write(json.dumps({"msg": "workload registered", "podUID": "u2", "backends": ["cooperative"]}) + "\n")
        f.write(json.dumps({"msg": "workload registered", "podUID": "u1", "backends": ["simulated"]}) + "\n")
    assert not registered_since(log, offset, "u1")  # another pod; no checkpoint channel
    with log.open("a") as f:
        f.write(json.dumps({"msg": "workload registered", "podUID": "u1", "backends": ["cooperative"]}) + "\n")
    assert registered_since(log, offset, "u1")
    assert not registered_since(tmp_path / "missing.log", 0, "u1")

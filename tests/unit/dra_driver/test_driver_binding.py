"""Serving waits in the scheduler (issue 27 §1): the pure decisions of dra_driver/binding.py, and
the node's binding holds (free, take over at prepare, release) with the recording engine."""

from __future__ import annotations

import copy
import datetime
from pathlib import Path
from typing import Any

import pytest

from dra_driver import binding
from dra_driver.claims import ClaimRef, PodRef
from dra_driver.node import BINDING_HOLDER_PREFIX
from dra_driver.state import SUSPENDED
from rose_common import names, slices
from tests.support.driver_fixtures import (
    NODE,
    NS,
    RecordingEngine,
    RecordingNotifier,
    StaticClaims,
    make_claim,
    make_driver,
)

NOW = datetime.datetime(2026, 12, 1, 12, 0, 0, tzinfo=datetime.UTC)
FREED, FAILED = names.BINDING_CONDITION_FREED, names.BINDING_CONDITION_FREE_FAILED


def _with_conditions(claim: dict[str, Any]) -> dict[str, Any]:
    """The claim as the scheduler allocates it from a slice whose serving devices carry ROSE's conditions."""
    c = copy.deepcopy(claim)
    for r in c["status"]["allocation"]["devices"]["results"]:
        if r["device"].endswith("-serving"):
            r["bindingConditions"], r["bindingFailureConditions"] = [FREED], [FAILED]
    c["metadata"]["resourceVersion"] = "42"
    return c


L0 = make_claim("uid-l0", "l0", [("gpu", "gpu-0-lendable")], pod=("rl-0", "pod-rl-0"))
L1 = make_claim("uid-l1", "l1", [("gpu", "gpu-1-lendable")], pod=("rl-1", "pod-rl-1"))
S0 = _with_conditions(make_claim("uid-s0", "s0", [("gpu", "gpu-0-serving")], pod=("serve-0", "pod-serve-0")))
L0B = make_claim("uid-l0b", "l0b", [("gpu", "gpu-0-lendable")], pod=("rl-2", "pod-rl-2"))


def test_serving_devices_carry_the_binding_conditions_only_when_asked() -> None:
    gpus = slices.simulated_gpus("n", 2)
    plain = slices.resource_slice("n", gpus, 1)
    assert not any("bindingConditions" in d for d in plain["spec"]["devices"])
    bound = {d["name"]: d for d in slices.resource_slice("n", gpus, 1, binding_conditions=True)["spec"]["devices"]}
    assert bound["gpu-1-serving"]["bindingConditions"] == [FREED]
    assert bound["gpu-1-serving"]["bindingFailureConditions"] == [FAILED]  # the API refuses one without the other
    assert "bindingConditions" not in bound["gpu-1-lendable"]  # lent claims never wait


def test_demand_is_a_reserved_serving_allocation_here_not_yet_reported() -> None:
    d = binding.demand(S0, names.DRIVER_NAME, NODE)
    assert d == binding.Demand("uid-s0", NS, "s0", ("gpu-0-serving",), (0,), (PodRef(NS, "serve-0", "pod-serve-0"),))
    assert binding.bound_here(S0, names.DRIVER_NAME, NODE) == (0,)
    assert binding.demand(S0, names.DRIVER_NAME, "other-node") is None  # another node's pool
    assert binding.demand(S0, "other.example.com", NODE) is None
    assert binding.demand(L0, names.DRIVER_NAME, NODE) is None  # lendable: no condition
    plain = make_claim("uid-p", "p", [("gpu", "gpu-0-serving")], pod=("s", "u"))
    assert binding.demand(plain, names.DRIVER_NAME, NODE) is None  # allocated without the conditions (prepare path)
    unreserved = copy.deepcopy(S0)
    unreserved["status"].pop("reservedFor")
    assert binding.demand(unreserved, names.DRIVER_NAME, NODE) is None
    deleting = copy.deepcopy(S0)
    deleting["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    assert binding.demand(deleting, names.DRIVER_NAME, NODE) is None
    assert binding.bound_here(deleting, names.DRIVER_NAME, NODE) == ()
    for outcome in (binding.Outcome(True, "Freed", "ok"), binding.Outcome(False, "NotFreed", "held")):
        reported = copy.deepcopy(S0)
        reported["status"].update(
            binding.status_patch(S0, names.DRIVER_NAME, NODE, ("gpu-0-serving",), outcome, NOW)["status"]
        )
        assert binding.demand(reported, names.DRIVER_NAME, NODE) is None  # reported: nothing owed
        assert binding.bound_here(reported, names.DRIVER_NAME, NODE) == (0,)  # still held until deallocated


def test_status_patch_keeps_other_entries_and_conditions_and_guards_the_version() -> None:
    claim = copy.deepcopy(S0)
    other = {"driver": "net.example.com", "pool": NODE, "device": "nic-0", "conditions": []}
    mine = {
        "driver": names.DRIVER_NAME,
        "pool": NODE,
        "device": "gpu-0-serving",
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    claim["status"]["devices"] = [other, mine]
    patch = binding.status_patch(
        claim, names.DRIVER_NAME, NODE, ("gpu-0-serving",), binding.Outcome(False, "NotFreed", "x" * 5000), NOW
    )
    assert patch["metadata"] == {"resourceVersion": "42"}
    got = patch["status"]["devices"]
    assert got[0] == other
    assert got[1]["conditions"][0] == {"type": "Ready", "status": "True"}
    cond = got[1]["conditions"][1]
    assert (cond["type"], cond["status"], cond["reason"]) == (FAILED, "True", "NotFreed")
    assert cond["lastTransitionTime"] == "2026-12-01T12:00:00Z" and len(cond["message"]) == binding.MESSAGE_MAX
    assert claim["status"]["devices"][1]["conditions"] == [{"type": "Ready", "status": "True"}]  # input untouched
    with pytest.raises(ValueError, match=r"gpu-1-serving.*not allocated here"):
        binding.status_patch(
            claim, names.DRIVER_NAME, NODE, ("gpu-1-serving",), binding.Outcome(True, "Freed", ""), NOW
        )


def test_the_serving_wait_mode_follows_the_api_and_says_why() -> None:
    assert binding.resolve_mode("auto", True)[0] == "prebind"
    mode, why = binding.resolve_mode("auto", False)
    assert mode == "prepare" and "drops device bindingConditions" in why and "DRADeviceBindingConditions" in why
    assert binding.resolve_mode("auto", None) == (
        "prepare",
        "serving waits in NodePrepareResources: probing the API server for device bindingConditions failed",
    )
    assert binding.resolve_mode("prepare", None)[0] == "prepare"
    assert binding.resolve_mode("prebind", True)[0] == "prebind"
    with pytest.raises(ValueError, match="--serving-wait=prebind: the API server drops device bindingConditions"):
        binding.resolve_mode("prebind", False)
    with pytest.raises(ValueError, match="must be one of auto, prebind, prepare"):
        binding.resolve_mode("kubelet", True)


@pytest.fixture
def env(tmp_path: Path):  # type: ignore[no-untyped-def]
    claims = StaticClaims([L0, L1, S0, L0B])
    engine, notifier = RecordingEngine(), RecordingNotifier()
    d = make_driver(tmp_path, claims, engine, notifier)
    d.recover()
    assert d.prepare([ClaimRef(NS, "uid-l0", "l0"), ClaimRef(NS, "uid-l1", "l1")])["uid-l0"].error == ""
    yield d, engine, notifier, tmp_path
    d.close()


def _demand() -> binding.Demand:
    d = binding.demand(S0, names.DRIVER_NAME, NODE)
    assert d is not None
    return d


def test_an_allocation_frees_the_gpu_and_the_prepare_takes_the_hold_over(env) -> None:  # type: ignore[no-untyped-def]
    d, engine, _, _ = env
    heard: list[list[str]] = []
    out = d.free_for_binding(_demand(), heard.append)
    assert out.freed and out.reason == binding.REASON_FREED
    assert heard == [[f"{NS}/l0"]]
    assert engine.calls == [("suspend", "uid-l0", 30.0)]  # GPU 0's occupant only
    s = d.snapshot().suspensions["uid-l0"]
    assert s.state == SUSPENDED and s.held_by == [BINDING_HOLDER_PREFIX + "uid-s0"]
    assert d.binding_claims() == {"uid-s0"}
    # the kubelet's prepare: immediate, no second suspend; the hold is now the claim's own
    assert d.prepare([ClaimRef(NS, "uid-s0", "s0")])["uid-s0"].error == ""
    assert engine.calls == [("suspend", "uid-l0", 30.0)]
    assert d.snapshot().suspensions["uid-l0"].held_by == ["uid-s0"]
    assert d.binding_claims() == set()
    assert d.unprepare([ClaimRef(NS, "uid-s0", "s0")]) == {"uid-s0": ""}
    assert engine.calls[-1] == ("resume", "uid-l0", 0.0)


def test_a_gpu_with_no_occupant_is_free_at_once(env) -> None:  # type: ignore[no-untyped-def]
    d, engine, _, _ = env
    assert d.unprepare([ClaimRef(NS, "uid-l0", "l0")]) == {"uid-l0": ""}
    out = d.free_for_binding(_demand())
    assert (out.freed, out.reason) == (True, binding.REASON_NO_OCCUPANT)
    assert engine.calls == []


def test_a_deallocated_claim_releases_its_hold_and_the_occupant_resumes(env) -> None:  # type: ignore[no-untyped-def]
    d, engine, _, _ = env
    assert d.free_for_binding(_demand()).freed
    d.release_binding("uid-s0")
    assert engine.calls[-1] == ("resume", "uid-l0", 0.0)
    assert "uid-l0" not in d.snapshot().suspensions and d.binding_claims() == set()


def test_no_new_lent_claim_is_prepared_on_a_gpu_the_scheduler_is_binding(env) -> None:  # type: ignore[no-untyped-def]
    d, _, _, _ = env
    assert d.free_for_binding(_demand()).freed
    assert d.unprepare([ClaimRef(NS, "uid-l0", "l0")]) == {"uid-l0": ""}  # the RL pod left meanwhile
    err = d.prepare([ClaimRef(NS, "uid-l0b", "l0b")])["uid-l0b"].error  # its lendable device re-allocated
    assert "allocated to serving claim uid-s0, which the scheduler is binding" in err
    d.release_binding("uid-s0")  # the binding failed: the GPU is lendable again
    assert d.prepare([ClaimRef(NS, "uid-l0b", "l0b")])["uid-l0b"].error == ""


def test_a_restart_keeps_binding_holds_and_the_relist_drops_stale_ones(env) -> None:  # type: ignore[no-untyped-def]
    d, engine, notifier, tmp = env
    assert d.free_for_binding(_demand()).freed
    d.close()
    again = make_driver(tmp, d.claims, engine, notifier)
    again.recover()  # a binding holder is not a claim of this node: kept anyway
    assert again.snapshot().suspensions["uid-l0"].held_by == [BINDING_HOLDER_PREFIX + "uid-s0"]
    again.sync_bindings({"uid-s0": frozenset({0})})  # still allocated: kept, GPU 0 kept from lent prepares
    assert "uid-l0" in again.snapshot().suspensions and again.binding_claims() == {"uid-s0"}
    again.sync_bindings({})  # the relist no longer shows it allocated here: released, resumed
    assert "uid-l0" not in again.snapshot().suspensions
    assert engine.calls[-1] == ("resume", "uid-l0", 0.0)
    again.close()


def test_a_failed_engine_with_a_free_device_still_frees(env) -> None:  # type: ignore[no-untyped-def]
    """No enforcer observes here (state-machine stand-in): the engine's failure is then recorded and,
    as at prepare time, serving proceeds; the observed-occupied verdict is the e2e test's."""
    d, engine, notifier, _ = env
    engine.fail = True
    out = d.free_for_binding(_demand())
    assert out.freed
    assert ("rl-0", "SuspendFailed", True) in notifier.events

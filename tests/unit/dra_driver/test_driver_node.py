"""The node driver core with explicit stand-ins: claims in memory, a recording suspend engine."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from dra_driver import cdi
from dra_driver.claims import ClaimRef, PodRef
from dra_driver.state import CHECKPOINTED_EVICTED, PREPARE_STARTED, SUSPEND_FAILED, SUSPENDED, UNPREPARE_STARTED
from rose_common import names
from tests.support.driver_fixtures import NS, RecordingEngine, RecordingNotifier, StaticClaims, make_claim, make_driver

L0 = make_claim("uid-l0", "l0", [("gpu", "gpu-0-lendable")], pod=("rl-0", "pod-rl-0"))
S0 = make_claim("uid-s0", "s0", [("gpu", "gpu-0-serving")], pod=("serve-0", "pod-serve-0"))
S1 = make_claim("uid-s1", "s1", [("gpu", "gpu-1-serving")])
RL_POD = {
    "metadata": {"namespace": NS, "name": "rl-0", "uid": "pod-rl-0", "annotations": {names.ANNOTATION_GRACE: "7"}}
}


def ref(c: dict) -> ClaimRef:  # type: ignore[type-arg]
    return ClaimRef(NS, c["metadata"]["uid"], c["metadata"]["name"])


@pytest.fixture
def env(tmp_path: Path):  # type: ignore[no-untyped-def]
    claims = StaticClaims([L0, S0, S1], pods=[RL_POD])
    engine, notifier = RecordingEngine(), RecordingNotifier()
    d = make_driver(tmp_path, claims, engine, notifier)
    d.recover()
    yield d, engine, notifier, tmp_path
    d.close()


def test_prepare_writes_cdi_and_is_idempotent(env) -> None:  # type: ignore[no-untyped-def]
    d, engine, _, tmp = env
    out = d.prepare([ref(S1)])["uid-s1"]
    assert not out.error and [x.device for x in out.devices] == ["gpu-1-serving"]
    spec = json.loads((tmp / "cdi" / cdi.spec_filename("uid-s1")).read_text())
    assert spec["devices"][0]["name"] == "uid-s1-gpu-1-serving"
    assert d.prepare([ref(S1)])["uid-s1"] == out  # repeated call: same answer, nothing redone
    assert engine.calls == []
    assert d.metrics.prepare_total.labels("ok")._value.get() == 2
    assert d.unprepare([ref(S1)]) == {"uid-s1": ""}
    assert cdi.list_specs(tmp / "cdi") == []
    assert d.unprepare([ref(S1)]) == {"uid-s1": ""}  # unknown claim: not an error


def test_bad_claims_get_per_claim_errors_and_good_ones_still_prepare(env) -> None:  # type: ignore[no-untyped-def]
    d, _, _, _ = env
    d.claims.add(make_claim("uid-x", "x", [("gpu", "gpu-0")], driver="other.example.com"))
    d.claims.add(make_claim("uid-y", "y", [("gpu", "gpu-1-lendable")], allocated=False))
    out = d.prepare([ClaimRef(NS, "uid-nope", "nope"), ref(S1), ClaimRef(NS, "uid-x", "x"), ClaimRef(NS, "uid-y", "y")])
    assert "not found" in out["uid-nope"].error
    assert "no devices of driver gpu.rose.io" in out["uid-x"].error
    assert "not allocated" in out["uid-y"].error
    assert not out["uid-s1"].error
    assert set(d.snapshot().claims) == {"uid-s1"}  # nothing half-recorded for the bad ones


def test_serving_wins_suspends_occupant_first_and_resumes_after(env) -> None:  # type: ignore[no-untyped-def]
    d, engine, notifier, _ = env
    assert not d.prepare([ref(L0)])["uid-l0"].error
    assert d.snapshot().claims["uid-l0"].grace_seconds == 7.0  # from the pod's annotation
    out = d.prepare([ref(S0)])["uid-s0"]
    assert not out.error
    assert engine.calls == [("suspend", "uid-l0", 7.0)]
    snap = d.snapshot()
    assert snap.suspensions["uid-l0"].state == SUSPENDED and snap.suspensions["uid-l0"].held_by == ["uid-s0"]
    assert notifier.states == [("rl-0", "Suspending"), ("rl-0", "Suspended")]
    assert d.metrics.residency.labels("0", "serving")._value.get() == 1
    assert d.unprepare([ref(S0)]) == {"uid-s0": ""}
    assert engine.calls[-1] == ("resume", "uid-l0", 0.0)
    assert d.snapshot().suspensions == {}
    assert notifier.states[-2:] == [("rl-0", "Resuming"), ("rl-0", "Running")]
    assert d.metrics.residency.labels("0", "lent")._value.get() == 1


def test_lendable_prepare_refused_while_serving_holds_gpu(env) -> None:  # type: ignore[no-untyped-def]
    d, _, _, _ = env
    assert not d.prepare([ref(S0)])["uid-s0"].error
    err = d.prepare([ref(L0)])["uid-l0"].error
    assert "serving wins" in err and "s0" in err


def test_device_already_prepared_for_another_claim(env) -> None:  # type: ignore[no-untyped-def]
    d, _, _, _ = env
    d.prepare([ref(S1)])
    d.claims.add(make_claim("uid-dup", "dup", [("gpu", "gpu-1-serving")]))
    assert "already prepared for claim" in d.prepare([ClaimRef(NS, "uid-dup", "dup")])["uid-dup"].error


def test_fallback_and_failure_are_recorded_and_serving_proceeds(tmp_path: Path) -> None:
    claims = StaticClaims([L0, S0])
    notifier = RecordingNotifier()
    d = make_driver(tmp_path, claims, RecordingEngine(fallback="checkpoint-evict"), notifier)
    d.prepare([ref(L0)])
    assert not d.prepare([ref(S0)])["uid-s0"].error
    assert d.snapshot().suspensions["uid-l0"].state == CHECKPOINTED_EVICTED
    assert ("rl-0", "SuspendFallback", True) in notifier.events
    d.unprepare([ref(S0)])
    assert d.snapshot().suspensions == {}  # nothing to resume: it was evicted

    d2 = make_driver(tmp_path / "b", StaticClaims([L0, S0]), RecordingEngine(fail=True), RecordingNotifier())
    d2.prepare([ref(L0)])
    assert not d2.prepare([ref(S0)])["uid-s0"].error
    assert d2.snapshot().suspensions["uid-l0"].state == SUSPEND_FAILED

    # a fallback that could not be taken (no SDK checkpoint channel): the workload still runs on
    # the GPU, nothing was evicted — a failed suspend, never recorded as checkpointed-and-evicted
    n3 = RecordingNotifier()
    engine3 = RecordingEngine(fallback="checkpoint-evict", fallback_fails=True)
    d3 = make_driver(tmp_path / "c", StaticClaims([L0, S0]), engine3, n3)
    d3.prepare([ref(L0)])
    assert not d3.prepare([ref(S0)])["uid-s0"].error
    assert d3.snapshot().suspensions["uid-l0"].state == SUSPEND_FAILED
    assert ("rl-0", "SuspendFallback", True) not in n3.events


def test_engine_that_never_finishes_is_bounded_by_grace(tmp_path: Path) -> None:
    d = make_driver(
        tmp_path,
        StaticClaims([L0, S0]),
        RecordingEngine(suspend_seconds=3.0),
        default_grace_seconds=0.2,
        grace_slack_seconds=0.1,
    )
    d.prepare([ref(L0)])
    t0 = time.monotonic()
    assert not d.prepare([ref(S0)])["uid-s0"].error
    assert time.monotonic() - t0 < 1.5
    s = d.snapshot().suspensions["uid-l0"]
    assert s.state == SUSPEND_FAILED and "within" in s.message
    assert d.metrics.occupant_suspend_total.labels("timeout")._value.get() == 1
    d.close()


def test_suspend_request_holds_until_cancelled_and_shares_with_serving(env) -> None:  # type: ignore[no-untyped-def]
    d, engine, _, _ = env
    d.prepare([ref(L0)])
    pod = PodRef(NS, "rl-0", "pod-rl-0")
    assert d.request_suspend(pod, 3.0) == "Suspended"
    assert d.held_pods() == {"pod-rl-0"}
    d.prepare([ref(S0)])  # already suspended: no second suspend
    assert [c[0] for c in engine.calls] == ["suspend"]
    assert d.cancel_suspend(pod) == "Running"
    assert d.snapshot().suspensions["uid-l0"].held_by == ["uid-s0"]  # serving still holds it
    d.unprepare([ref(S0)])
    assert [c[0] for c in engine.calls] == ["suspend", "resume"]
    assert d.request_suspend(PodRef(NS, "x", "no-such-pod"), 1.0) == ""


@pytest.mark.parametrize("leftover", [PREPARE_STARTED, UNPREPARE_STARTED])
def test_recovery_rolls_back_or_completes_and_resumes(tmp_path: Path, leftover: str) -> None:
    engine = RecordingEngine()
    d = make_driver(tmp_path, StaticClaims([L0, S0]), engine)
    d.prepare([ref(L0)])
    d.prepare([ref(S0)])
    # simulate a crash that left the serving claim mid-way
    with d._locked() as data:
        data.claims["uid-s0"].state = leftover
        d._save()
    d.close()
    d2 = make_driver(tmp_path, StaticClaims([L0, S0]), engine)
    d2.recover()
    snap = d2.snapshot()
    assert set(snap.claims) == {"uid-l0"} and snap.suspensions == {}
    assert engine.calls[-1][0] == "resume"
    assert cdi.list_specs(tmp_path / "cdi") == ["uid-l0"]


def test_recovery_rewrites_missing_cdi_and_removes_strays(tmp_path: Path) -> None:
    d = make_driver(tmp_path, StaticClaims([S1]), RecordingEngine())
    d.prepare([ref(S1)])
    cdi.delete_spec(tmp_path / "cdi", "uid-s1")
    cdi.write_spec(tmp_path / "cdi", "stray", {"x": 1})
    d.recover()
    assert cdi.list_specs(tmp_path / "cdi") == ["uid-s1"]


def test_reconcile_retries_resume_and_resuspends_after_engine_restart(env) -> None:  # type: ignore[no-untyped-def]
    d, engine, _, _ = env
    d.prepare([ref(L0)])
    d.prepare([ref(S0)])
    engine.states.clear()  # the engine restarted; the workload re-registered as running
    d.reconcile()
    assert [c[0] for c in engine.calls] == ["suspend", "suspend"]
    engine.fail_resume = True
    d.unprepare([ref(S0)])
    s = d.snapshot().suspensions["uid-l0"]
    assert s.held_by == [] and s.state == SUSPENDED  # kept: state is still in host memory
    engine.fail_resume = False
    d.reconcile()
    assert d.snapshot().suspensions == {} and engine.calls[-1][0] == "resume"

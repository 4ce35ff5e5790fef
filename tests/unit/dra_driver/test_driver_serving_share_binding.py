"""Serving's fraction of a GPU waits in the scheduler too (issue 27 §1 with §3): under
``--serving-wait=prebind`` the device ``gpu-N-servingshare`` carries ROSE's binding condition, the
pure decision of what an allocated fraction owes (``binding.demand`` with what it consumed, the
status entry naming its share), and the node freeing only the RL shares that no longer fit while the
scheduler waits, so the prepare is immediate (claims in memory, a recording suspend engine; the e2e
tier runs it on the real API server and scheduler:
tests/e2e/dra_driver/test_driver_serving_share_bind_e2e.py)."""

from __future__ import annotations

import copy
import datetime
from pathlib import Path
from typing import Any

from dra_driver import binding
from dra_driver.claims import ClaimRef
from dra_driver.node import BINDING_HOLDER_PREFIX
from rose_common import names
from rose_common.slices import gpu_devices, simulated_gpus
from tests.support.driver_fixtures import (
    NODE,
    NS,
    RecordingEngine,
    RecordingNotifier,
    StaticClaims,
    make_claim,
    make_driver,
)

GiB = 1024**3
FREED, FAILED = names.BINDING_CONDITION_FREED, names.BINDING_CONDITION_FREE_FAILED
NOW = datetime.datetime(2026, 12, 1, 12, 0, 0, tzinfo=datetime.UTC)


def share_claim(uid: str, memory: str, compute: str, device: str, conditions: bool = False) -> dict[str, Any]:
    """A claim allocated one share of ``device`` (as the scheduler writes it: consumedCapacity and a
    shareID), with ROSE's binding conditions on the result when the slice carried them."""
    c: dict[str, Any] = make_claim(uid, uid, [("gpu", device)], pod=(f"pod-{uid}", f"pod-uid-{uid}"))
    res = c["status"]["allocation"]["devices"]["results"][0]
    res["consumedCapacity"] = {"memory": memory, "compute": compute}
    res["shareID"] = f"share-{uid}"
    if conditions:
        res["bindingConditions"], res["bindingFailureConditions"] = [FREED], [FAILED]
    c["metadata"]["resourceVersion"] = "7"
    return c


def test_the_serving_fraction_device_carries_the_binding_condition_only_with_it() -> None:
    gpus = simulated_gpus("n", 1)
    on = {d["name"]: d for d in gpu_devices(gpus, binding_conditions=True, shares=True)}
    assert on["gpu-0-servingshare"]["bindingConditions"] == [FREED]
    assert on["gpu-0-servingshare"]["bindingFailureConditions"] == [FAILED]
    assert on["gpu-0-servingshare"]["allowMultipleAllocations"] is True
    assert "bindingConditions" not in on["gpu-0-share"]  # RL shares never wait
    assert "bindingConditions" not in on["gpu-0-lendable"]
    off = gpu_devices(gpus, binding_conditions=False, shares=True)  # --serving-wait=prepare: as before
    assert not any("bindingConditions" in d for d in off)


def test_an_allocated_fraction_owes_a_condition_with_what_it_consumed_and_the_report_names_its_share() -> None:
    c = share_claim("srv", "40Gi", "30", "gpu-2-servingshare", conditions=True)
    d = binding.demand(c, names.DRIVER_NAME, NODE)
    assert d is not None
    assert (d.devices, d.gpus) == (("gpu-2-servingshare",), (2,))
    assert d.fractions == (binding.Fraction(2, 40 * GiB, 30),)
    assert binding.bound_here(c, names.DRIVER_NAME, NODE) == (2,)
    # an RL share never owes one (no condition on its device), nor a fraction allocated without it
    assert binding.demand(share_claim("rl", "1Gi", "5", "gpu-2-share"), names.DRIVER_NAME, NODE) is None
    assert binding.demand(share_claim("p", "1Gi", "5", "gpu-2-servingshare"), names.DRIVER_NAME, NODE) is None
    # a fraction without a usable consumedCapacity is still owed a report, but counts for nothing
    bad = copy.deepcopy(c)
    bad["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"] = {"memory": "x"}
    got = binding.demand(bad, names.DRIVER_NAME, NODE)
    assert got is not None and got.fractions == ()
    # the report's entry names the allocation's share (the API server checks it against the allocation)
    patch = binding.status_patch(c, names.DRIVER_NAME, NODE, d.devices, binding.Outcome(True, "Freed", "ok"), NOW)
    (entry,) = patch["status"]["devices"]
    assert (entry["device"], entry["shareID"], entry["conditions"][0]["type"]) == (
        "gpu-2-servingshare", "share-srv", FREED
    )  # fmt: skip
    reported = copy.deepcopy(c)
    reported["status"].update(patch["status"])
    assert binding.demand(reported, names.DRIVER_NAME, NODE) is None  # reported: nothing owed


def test_fractions_being_bound_reclaim_only_the_share_that_no_longer_fits_and_prepare_at_once(
    tmp_path: Path,
) -> None:
    claims = StaticClaims(
        [
            share_claim("rl-s", "60Gi", "40", "gpu-0-share"),
            make_claim("rl-w", "rl-w", [("gpu", "gpu-1-lendable")], pod=("rl-w", "pod-rl-w")),
            share_claim("srv-a", "60Gi", "40", "gpu-0-servingshare", conditions=True),
            share_claim("srv-b", "40Gi", "30", "gpu-0-servingshare", conditions=True),
        ]
    )
    engine = RecordingEngine()
    d = make_driver(tmp_path, claims, engine, RecordingNotifier())  # simulated GPUs of 141 GiB
    d.recover()
    try:
        out = d.prepare([ClaimRef(NS, u, u) for u in ("rl-s", "rl-w")])
        assert all(o.error == "" for o in out.values()), out

        def demand(uid: str) -> binding.Demand:
            got = binding.demand(claims.get_claim(NS, uid), names.DRIVER_NAME, NODE)
            assert got is not None
            return got

        # the first fraction fits beside the share: free at once, nothing suspended
        first = d.free_for_binding(demand("srv-a"))
        assert (first.freed, first.reason) == (True, binding.REASON_NO_OCCUPANT)
        # the second, while the first is still being bound (not prepared): both count, the share no
        # longer fits and is suspended; GPU 1's whole occupant is left alone
        heard: list[list[str]] = []
        second = d.free_for_binding(demand("srv-b"), heard.append)
        assert (second.freed, second.reason) == (True, binding.REASON_FREED)
        assert heard == [[f"{NS}/rl-s"]]
        assert [c[1] for c in engine.calls if c[0] == "suspend"] == ["rl-s"]
        assert d.snapshot().suspensions["rl-s"].held_by == [BINDING_HOLDER_PREFIX + "srv-b"]
        assert d.binding_claims() == {"srv-a", "srv-b"}
        # the kubelet's prepares: immediate, no second suspend; the hold becomes srv-b's own
        out = d.prepare([ClaimRef(NS, u, u) for u in ("srv-a", "srv-b")])
        assert all(o.error == "" for o in out.values()), out
        assert [c[1] for c in engine.calls if c[0] == "suspend"] == ["rl-s"]
        assert d.snapshot().suspensions["rl-s"].held_by == ["srv-b"] and d.binding_claims() == set()
        assert d.unprepare([ClaimRef(NS, "srv-b", "srv-b")]) == {"srv-b": ""}
        assert [c[1] for c in engine.calls if c[0] == "resume"] == ["rl-s"]
    finally:
        d.close()


def test_a_fraction_deallocated_while_bound_releases_the_share_it_suspended(tmp_path: Path) -> None:
    claims = StaticClaims(
        [
            share_claim("rl-s", "100Gi", "40", "gpu-0-share"),
            share_claim("srv", "60Gi", "40", "gpu-0-servingshare", conditions=True),
        ]
    )
    engine = RecordingEngine()
    d = make_driver(tmp_path, claims, engine, RecordingNotifier())
    d.recover()
    try:
        assert d.prepare([ClaimRef(NS, "rl-s", "rl-s")])["rl-s"].error == ""
        got = binding.demand(claims.get_claim(NS, "srv"), names.DRIVER_NAME, NODE)
        assert got is not None and d.free_for_binding(got).freed
        assert [c[1] for c in engine.calls if c[0] == "suspend"] == ["rl-s"]
        d.release_binding("srv")  # the scheduler failed or timed out the binding
        assert [c[1] for c in engine.calls if c[0] == "resume"] == ["rl-s"]
        assert d.binding_claims() == set() and d.snapshot().suspensions == {}
    finally:
        d.close()

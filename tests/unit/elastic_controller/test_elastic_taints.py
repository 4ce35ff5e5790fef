"""The planner's intent as device taints (issue 27 §2): elastic_controller/taints.py, pure."""

from __future__ import annotations

import pytest

from elastic_controller import taints
from elastic_controller.planner import Forecast, Job, PlanInput, Pool, Settings, Worker, plan
from rose_common import names

NOW = 1_000.0


def _pool(name: str, need: float | list[float], capacity: int = 4, frozen: bool = False) -> Pool:
    upper = tuple(need) if isinstance(need, list) else (need,) * 60
    return Pool(name, capacity, Forecast(NOW, 60.0, upper), frozen=frozen)


def _decide(*pools: Pool, jobs: tuple[Job, ...] = (), workers: tuple[Worker, ...] = (), lead: float = 60.0):  # type: ignore[no-untyped-def]
    inp = PlanInput(NOW, pools, jobs, workers, Settings(dwell_s=0, interval_s=10.0))
    return taints.decide(inp, plan(inp), lead)


def test_a_pool_serving_will_fill_within_the_lead_is_tainted_and_one_with_room_is_not() -> None:
    d = _decide(_pool("busy", 4), _pool("quiet", 0), _pool("three", 3))
    assert d[
        "busy"
    ].taint and "serving may need 4 of 4 GPUs within 70s (0 lent after this plan, 0 of them being placed): 0 left" in (
        d["busy"].reason
    )
    assert not d["quiet"].taint and "4 left to lend" in d["quiet"].reason
    assert not d["three"].taint  # one GPU left: a new lent claim there would not be reclaimed at once


def test_only_need_inside_the_window_counts_and_an_occupants_longer_lead_widens_it() -> None:
    later = [0.0, 0.0, 4.0] + [4.0] * 57  # serving fills the pool from t+120 s
    assert not _decide(_pool("p", later), lead=60.0)["p"].taint  # window 70 s: nothing yet
    assert _decide(_pool("p", later), lead=150.0)["p"].taint
    job = Job("ns/slow", 1, 1, grace_s=140.0)  # its own lead reaches the rise
    assert _decide(_pool("p", later), jobs=(job,), workers=(Worker("w0", "ns/slow", "active", "p"),))["p"].taint


def test_gpus_lent_after_the_plan_count_against_the_room() -> None:
    job = Job("ns/a", 1, 3)
    workers = tuple(Worker(f"w{i}", "ns/a", "active", "p") for i in range(3))
    assert _decide(_pool("p", 1), jobs=(job,), workers=workers)["p"].taint  # 4 - 1 - 3 = 0 left
    assert not _decide(_pool("p", 0), jobs=(job,), workers=workers)["p"].taint


def test_the_planners_own_new_workers_are_not_kept_off_the_gpus_it_gave_them() -> None:
    """A pool the plan grows into (or whose workers are still pending) is not tainted for them: a
    NoSchedule taint would keep their claims from being allocated (rose demo's act 4 stalled so)."""
    job = Job("ns/a", 2, 4)
    grown = _decide(_pool("p", 0), jobs=(job,))
    assert not grown["p"].taint and "(4 lent after this plan, 4 of them being placed): 4 left" in grown["p"].reason
    pending = tuple(Worker(f"w{i}", "ns/a", "pending", "p") for i in range(4))
    assert not _decide(_pool("p", 0), jobs=(job,), workers=pending)["p"].taint
    active = tuple(Worker(f"w{i}", "ns/a", "active", "p") for i in range(4))
    assert _decide(_pool("p", 0), jobs=(job,), workers=active)["p"].taint  # settled: nothing left to lend


def test_no_forecast_no_decision() -> None:
    assert _decide(_pool("f", 4, frozen=True)) == {}
    assert _decide(_pool("short", [4.0])) == {}  # the horizon ends before the window does
    with pytest.raises(ValueError, match="taint lead must be >= 0"):
        _decide(_pool("p", 0), lead=-1)


def test_rules_name_each_lendable_device_and_only_owned_rules_of_decided_pools_go() -> None:
    decisions = {"busy": taints.Decision("busy", True, "full"), "quiet": taints.Decision("quiet", False, "room")}
    devices = {"busy": [("node-1", "gpu-0-lendable")], "quiet": [("node-0", "gpu-0-lendable")]}
    rules = taints.desired_rules(decisions, devices)
    assert list(rules) == ["rose-reclaim-node-1.gpu-0-lendable"]
    body = rules["rose-reclaim-node-1.gpu-0-lendable"]
    assert body["spec"] == {
        "deviceSelector": {"driver": "gpu.rose.io", "pool": "node-1", "device": "gpu-0-lendable"},
        "taint": {"key": names.TAINT_RECLAIM_PLANNED, "value": "busy", "effect": "NoSchedule"},
    }
    assert body["metadata"]["labels"] == {names.LABEL_TAINT_POOL: "busy"}
    stale = {"metadata": {"name": "rose-reclaim-node-0.gpu-0-lendable", "labels": {names.LABEL_TAINT_POOL: "quiet"}}}
    frozen = {"metadata": {"name": "rose-reclaim-node-9.gpu-0-lendable", "labels": {names.LABEL_TAINT_POOL: "cold"}}}
    create, delete = taints.diff([stale, frozen], rules, decisions)
    assert [c["metadata"]["name"] for c in create] == ["rose-reclaim-node-1.gpu-0-lendable"]
    assert delete == ["rose-reclaim-node-0.gpu-0-lendable"]  # the frozen pool's rule stays
    create, delete = taints.diff([rules["rose-reclaim-node-1.gpu-0-lendable"]], rules, decisions)
    assert (create, delete) == ([], [])


def test_long_names_stay_valid_and_distinct() -> None:
    a, b = taints.rule_name("n" * 300, "gpu-0-lendable"), taints.rule_name("n" * 300, "gpu-1-lendable")
    assert len(a) <= 253 and len(b) <= 253 and a != b
    assert taints.rule_name("Node_A", "gpu-0-lendable") == "rose-reclaim-node-a.gpu-0-lendable"

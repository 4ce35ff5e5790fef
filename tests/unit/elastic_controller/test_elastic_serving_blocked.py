"""Workers whose lent claim is allocated on a GPU serving holds, never prepared there (soak finding
T2's remainder, issue 25): the driver refuses such a claim at prepare for as long as serving stays.

What the controller reads (pure): the driver's slice taint ``rose.io/serving-holds``, the claim's
allocation and the node's ``rose.io/lent-gpus`` (:func:`observe.serving_blocks`). A worker of its
own claim that never ran is replaced (deleted by UID, Event ``BlockedWorkerReplaced``, added back by
the planner); a time-slice group's shared claim waits: the planner's ``waiting`` state (not active,
not resumed, its job not grown) and the ``ServingHoldsGPU`` condition."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from elastic_controller import observe as obs
from elastic_controller import pools
from elastic_controller.controller import Controller, ControllerSettings
from elastic_controller.desired import EVENT_BLOCKED_REPLACED, desired
from elastic_controller.metrics import ControllerMetrics
from elastic_controller.planner import Forecast, Job, PlanInput, Pool, plan
from elastic_controller.status import SERVING_HOLDS
from rose_common import names
from rose_common.elasticrljob import ElasticRLJob
from tests.support.controller_fakes import RAW_JOB, Forecasts, Recorder, drain, inventory

NOW = dt.datetime(2026, 11, 30, 14, 0, tzinfo=dt.UTC)
T = NOW.timestamp()
HELD = frozenset({("n1", "gpu-0-lendable")})
WHERE = "claim c0 on gpu-0-lendable of n1, held by serving (never prepared there)"


def block(since: float = T, prepared: bool = False, where: str = WHERE) -> obs.ServingBlock:
    return obs.ServingBlock(where, prepared, since)


TAINT = {"key": names.TAINT_SERVING_HOLDS, "value": "x", "effect": "NoSchedule"}


def pod(name: str, job: str = "grpo", claim: str = "c0", node: str = "n1", **ann: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "rl",
            "uid": f"uid-{name}",
            "labels": {names.LABEL_JOB: job},
            "annotations": ann,
        },
        "spec": {"nodeName": node, "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": f"{job}-gpus"}]},
        "status": {"phase": "Running", "resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": claim}]},
    }


def worker(name: str = "grpo-w0", **ann: str) -> obs.ObservedWorker:
    w = obs.observe("rl/grpo".partition("/")[2], pod(name, **ann))
    assert w is not None
    return w


# ---------------------------------------------------------------- what the API server says


def test_the_workers_claim_is_read_from_its_pod() -> None:
    assert worker().claim == "c0"  # generated from the template: status.resourceClaimStatuses
    shared = pod("grpo-w0")
    shared["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": "ts-g1-w0-gpus"}]
    shared["status"] = {"phase": "Running"}
    assert obs.observe("grpo", shared).claim == "ts-g1-w0-gpus"  # type: ignore[union-attr]


BLOCK_CASES = [
    # (allocation, lent GPUs of n1, blocked, prepared)
    ((("n1", "gpu-0-lendable"),), frozenset(), True, False),  # on the held GPU, never prepared there
    ((("n1", "gpu-0-lendable"),), frozenset({0}), True, True),  # prepared before serving: suspended for it
    ((("n1", "gpu-0-lendable"),), None, True, True),  # the node publishes no facts: counted as prepared
    ((("n1", "gpu-1-lendable"),), frozenset(), False, False),  # another GPU
    ((("n2", "gpu-0-lendable"),), frozenset(), False, False),  # another node's GPU 0
    (None, frozenset(), False, False),  # not allocated (yet)
]


@pytest.mark.parametrize(("allocation", "lent", "blocked", "prepared"), BLOCK_CASES)
def test_serving_blocks_a_claim_allocated_on_a_held_gpu(
    allocation: tuple[tuple[str, str], ...] | None, lent: frozenset[int] | None, blocked: bool, prepared: bool
) -> None:
    b = obs.serving_blocks(worker(), allocation, HELD, lent)
    assert (b is not None) is blocked
    if b is not None:
        assert b.prepared is prepared
        assert b.where.startswith("claim c0 on gpu-0-lendable of n1, held by serving (")


def test_slices_and_nodes_say_which_gpus_serving_holds_and_which_are_prepared() -> None:
    sl = {
        "metadata": {"name": "n1-rose"},
        "spec": {
            "driver": names.DRIVER_NAME,
            "nodeName": "n1",
            "pool": {"name": "n1"},
            "devices": [
                {
                    "name": f"gpu-{i}-{role}",
                    "attributes": {names.ATTR_ROLE: {"string": role}},
                    "taints": [{"key": names.TAINT_SERVING_HOLDS, "value": "x", "effect": "NoSchedule"}]
                    if i == 0
                    else [],
                }
                for i in (0, 1)
                for role in (names.ROLE_LENDABLE, names.ROLE_SERVING)
            ],
        },
    }
    assert pools.serving_held(sl) == HELD  # the serving device itself is not a lent one
    assert pools.serving_held({**sl, "spec": {**sl["spec"], "driver": "other"}}) == frozenset()
    assert pools.lent_gpus({"metadata": {"annotations": {names.ANNOTATION_LENT: "1,3"}}}) == frozenset({1, 3})
    assert pools.lent_gpus({"metadata": {"annotations": {names.ANNOTATION_LENT: ""}}}) == frozenset()
    assert pools.lent_gpus({"metadata": {}}) is None
    assert pools.lent_gpus({"metadata": {"annotations": {names.ANNOTATION_LENT: "x"}}}) is None


# ---------------------------------------------------------------- who is replaced, who waits


REPLACE_CASES = [
    # (grouped, seconds blocked, the pod's annotations, replaced)
    (False, 20.0, {}, True),
    (False, 20.0, {"prepared": "yes"}, False),  # its claim was prepared there: it ran (the driver suspends it)
    (False, 5.0, {}, False),  # within the grace: the driver republishes its prepared GPUs every 5 s
    (False, 20.0, {names.ANNOTATION_SUSPEND_STATE: "Suspended"}, False),  # the driver knew it: it ran
    (False, 20.0, {names.ANNOTATION_WORKLOAD_PHASE: "train"}, False),  # it reported: it ran
    (False, 20.0, {names.ANNOTATION_FENCING_TOKEN: "g1:3"}, False),  # a hand-over fenced it
    (True, 600.0, {}, False),  # a group's shared claim: its members wait
]


@pytest.mark.parametrize(("grouped", "blocked_s", "ann", "replaced"), REPLACE_CASES)
def test_only_a_worker_of_its_own_claim_that_never_ran_is_replaced(
    grouped: bool, blocked_s: float, ann: dict[str, str], replaced: bool
) -> None:
    prepared = ann.pop("prepared", "") == "yes"
    w = worker(**ann)
    (out,) = obs.with_serving([w], {w.uid: block(T - blocked_s, prepared, "there")}, grouped, T, 15.0)
    assert out.serving_held == "there"
    assert out.replace_blocked is replaced and out.lost is replaced
    assert obs.planner_state(out) == "suspended"  # not active: it runs nowhere
    assert obs.to_planner("rl/grpo", out) is None if replaced else obs.holding_state(out) == "waiting"
    (other,) = obs.with_serving([worker("grpo-w1")], {w.uid: block(where="there")}, grouped, T, 15.0)
    assert other.serving_held == "" and obs.holding_state(other) == "active"


def test_a_replaced_worker_is_deleted_by_uid_with_an_event() -> None:
    job = ElasticRLJob.model_validate(RAW_JOB)
    w = worker()
    (blocked,) = obs.with_serving([w], {w.uid: block(T - 20)}, False, T, 15)
    d = desired(job, [blocked, worker("grpo-w1")], None, NOW)
    assert [(p.name, p.uid) for p in d.delete] == [("grpo-w0", "uid-grpo-w0")]
    (ev,) = [e for e in d.events if e.reason == EVENT_BLOCKED_REPLACED]
    assert ev.type == "Warning" and "grpo-w0" in ev.message and "gpu-0-lendable of n1" in ev.message
    cond = {c.type: c for c in d.status.conditions or []}[SERVING_HOLDS]
    assert cond.status == "True" and "recreated elsewhere" in cond.message


# ---------------------------------------------------------------- the group waits


def _plan(workers: list[obs.ObservedWorker], min_gpus: int = 1, max_gpus: int = 2) -> Any:
    forecast = Forecast(T - 60, 60, (0.0,) * 120)
    job = Job("rl/ts-a", min_gpus, max_gpus, min_useful_run_s=10)
    planned = tuple(pw for pw in (obs.to_planner("rl/ts-a", w) for w in workers) if pw is not None)
    return plan(PlanInput(T, (Pool("pool-a", 4, forecast),), (job,), planned)).targets["rl/ts-a"]


def test_a_group_member_waiting_for_serving_is_neither_active_nor_resumed_nor_grown() -> None:
    w = obs.observe("ts-a", pod("ts-a-w0", job="ts-a"))
    assert w is not None
    w = obs.ObservedWorker(**{**w.__dict__, "pool": "pool-a"})
    # serving's forecast is 0 of 4 GPUs: without the wait the planner counts w0 active and grows to 2
    t = _plan([w])
    assert (t.active_gpus, len(t.add), t.waiting) == (2, 1, ())
    (held,) = obs.with_serving([w], {w.uid: block()}, True, T, 15.0)
    t = _plan([held])
    assert (t.active_gpus, t.add, t.resume, t.suspend, t.remove) == (0, (), (), (), ())
    assert t.waiting == ("ts-a-w0",)
    # serving left: the taint is gone, the worker holds its GPU again and the job may grow
    assert _plan([w]).active_gpus == 2


def test_a_waiting_worker_counts_against_max_gpus() -> None:
    w = obs.observe("ts-a", pod("ts-a-w0", job="ts-a"))
    assert w is not None
    (held,) = obs.with_serving([w], {w.uid: block(where="x")}, True, T, 15.0)
    t = _plan([held], min_gpus=1, max_gpus=1)
    assert (t.active_gpus, t.add) == (0, ())  # no second worker beside the one that waits


def test_the_group_members_status_shows_the_wait() -> None:
    raw = {**RAW_JOB, "spec": {**RAW_JOB["spec"], "timesliceGroup": "g1", "minGPUs": 1}}
    job = ElasticRLJob.model_validate(raw)
    w = obs.observe("grpo", pod("grpo-w0"))
    assert w is not None
    (held,) = obs.with_serving([w], {w.uid: block()}, True, T, 15)
    d = desired(job, [held], None, NOW)
    assert d.delete == ()  # a shared claim's member is never deleted for it
    assert (d.status.active_gpus, d.status.suspended_gpus) == (0, 1)
    cond = {c.type: c for c in d.status.conditions or []}[SERVING_HOLDS]
    assert cond.status == "True" and "grpo-w0" in cond.message and "waits until serving leaves" in cond.message
    assert any(e.reason == SERVING_HOLDS and e.type == "Warning" for e in d.events)
    # serving leaves: the condition turns False once (an Event), and stays shown
    later = ElasticRLJob.model_validate({**raw, "status": d.status.model_dump(by_alias=True, mode="json")})
    d2 = desired(later, [w], None, NOW)
    cond2 = {c.type: c for c in d2.status.conditions or []}[SERVING_HOLDS]
    assert cond2.status == "False" and any(e.reason == f"Not{SERVING_HOLDS}" for e in d2.events)
    # a job serving never blocked has no such condition
    assert SERVING_HOLDS not in {c.type for c in desired(job, [w], None, NOW).status.conditions or []}


def test_a_worker_the_driver_suspended_for_serving_is_in_neither_the_target_nor_the_active_gpus() -> None:
    """Soak run g1 (groupwait): ``elastic-a-w1`` prepared, then suspended by its driver inside a
    serving claim's prepare (no suspend request). Without a request a worker counts as holding its
    GPU (issue 22 §6), so the target said 3 GPUs while the status counted 2 active, for as long as
    serving stayed ("not converged"). The slice's serving-holds taint, which only the driver writes,
    says the GPU is serving's: the worker waits, in neither count, and is never replaced (it ran)."""
    ws = [worker(f"grpo-w{i}") for i in range(3)]
    ws[1] = worker("grpo-w1", **{names.ANNOTATION_SUSPEND_STATE: "Suspended"})
    ws = [obs.ObservedWorker(**{**w.__dict__, "pool": "pool-a"}) for w in ws]
    forecast = Forecast(T - 60, 60, (1.0,) * 120)  # serving needs 1 of 4: 3 may be lent, no growth
    job = Job("rl/grpo", 1, 3, min_useful_run_s=10)

    def target_and_active(observed: list[obs.ObservedWorker]) -> tuple[int, int]:
        planned = tuple(pw for pw in (obs.to_planner("rl/grpo", w) for w in observed) if pw is not None)
        t = plan(PlanInput(T, (Pool("pool-a", 4, forecast),), (job,), planned)).targets["rl/grpo"]
        return t.active_gpus, sum(1 for w in observed if obs.planner_state(w) == "active" and not w.lost)

    assert target_and_active(ws) == (3, 2)  # the mismatch, as before
    seen = obs.with_serving(ws, {ws[1].uid: block(T - 60, prepared=True)}, False, T, 15.0)
    assert target_and_active(seen) == (2, 2)
    assert not seen[1].replace_blocked and obs.holding_state(seen[1]) == "waiting"


# ---------------------------------------------------------------- the controller's round


def test_the_controller_replaces_a_blocked_worker_and_reads_claims_only_where_serving_holds() -> None:
    api = Recorder()
    clock = [NOW]
    ctl = Controller(api, Forecasts(0.0), inventory, ControllerMetrics(), ControllerSettings(), clock=lambda: clock[0])
    reads: list[tuple[str, str]] = []
    held: list[frozenset[tuple[str, str]]] = [frozenset()]

    def claims(ns: str, name: str) -> tuple[tuple[str, str], ...] | None:
        reads.append((ns, name))
        return (("n1", "gpu-0-lendable"),) if name == "c0" else (("n1", "gpu-1-lendable"),)

    ctl.claims, ctl.serving_held, ctl.lent_gpus = claims, lambda: held[0], lambda node: frozenset({1})
    ctl.on_job_list([RAW_JOB])
    ctl.on_pod_list([pod("grpo-w0", claim="c0"), pod("grpo-w1", claim="c1")])
    ctl.plan_once()
    assert reads == []  # serving holds nothing: no claim read
    held[0] = HELD
    ctl.plan_once()
    assert sorted(reads) == [("rl", "c0"), ("rl", "c1")]
    assert ctl.metrics.serving_held._value.get() == 1
    drain(ctl)
    assert not [c for c in api.calls if c[0] == "delete"]  # within the grace: not yet
    clock[0] = NOW + dt.timedelta(seconds=16)
    ctl.plan_once()
    drain(ctl)
    assert api.names("delete") == ["grpo-w0"]
    assert ctl.metrics.blocked_replaced._value.get() == 1
    assert EVENT_BLOCKED_REPLACED in api.names("event")

"""A granted worker kube-scheduler keeps refusing for serving's forecast is removed, and its job
cools down in that pool (issue 25, group soak g7 on branch ``suspalloc``).

The planner and the extender read a reply by one rule (``rose_common.lending``), but each fetches
the predictor on its own, so they may still judge a pool apart for a while. In g7 ``elastic-a-w3``
stayed Pending for 100 s with kube-scheduler's condition "0/4 nodes are available: ... 1 serving
forecast (at risk 0.05) needs pool 'pool-b' within 0s < min useful run 10s ..." while the planner
kept it as the job's target: the job never converged. The scheduler's condition is written through
the API server (a fact, not a workload's claim): ``observe`` reads it into ``Worker.refused_since``;
past ``Settings.refused_after_s`` the planner removes the worker (an Event says why) and the job
gets no new worker in that pool for ``Settings.refused_cooldown_s``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from elastic_controller import observe
from elastic_controller.controller import Controller, ControllerSettings
from elastic_controller.metrics import ControllerMetrics
from elastic_controller.planner import Forecast, Job, PlanInput, Pool, Settings, Worker, plan
from rose_common import names
from rose_common.informer import ADDED
from tests.support.controller_fakes import NOW as CTL_NOW
from tests.support.controller_fakes import RAW_JOB, Forecasts, Recorder, drain, inventory, running_pod

NOW = 1_000_000.0
# the condition kube-scheduler wrote on elastic-a-w3 in g7 (diagnose.json), verbatim
G7_MESSAGE = (
    "0/4 nodes are available: 1 cannot allocate all claims, 1 serving forecast (at risk 0.05) needs pool "
    "'pool-b' within 0s < min useful run 10s, 2 node(s) didn't match Pod's node affinity/selector. "
    "preemption: not eligible due to preemptionPolicy=Never."
)
SETTINGS = Settings(dwell_s=3, interval_s=1, refused_after_s=20, refused_cooldown_s=60)


def pools(need_p: float = 3.0, need_q: float = 5.0) -> tuple[Pool, ...]:
    return (Pool("p", 6, Forecast(NOW, 60.0, (need_p,) * 60)), Pool("q", 6, Forecast(NOW, 60.0, (need_q,) * 60)))


def workers(refused_since: float | None) -> tuple[Worker, ...]:
    """Job a: two running in p, a granted one not placed yet (refused since ``refused_since``)."""
    return (
        Worker("a-w0", "rl/a", "active", "p", "rl/a-w0-gpus"),
        Worker("a-w1", "rl/a", "active", "p", "rl/a-w1-gpus"),
        Worker("a-w2", "rl/a", "pending", "p", None, bound=False, refused_since=refused_since),
    )


JOB = (Job("rl/a", 1, 4, grace_s=5, min_useful_run_s=10),)


def test_a_worker_refused_past_the_bound_is_removed_and_its_pool_cools_down() -> None:
    """p leaves a-w2 room by the planner's reading (6 - 3 - 2 claimed = 1), yet the scheduler has
    refused it there for 21 s: removed, reported for the cool-down, and not granted again in p this
    round (the job shrank: no growth elsewhere either)."""
    result = plan(PlanInput(NOW, pools(), JOB, workers(NOW - 21), SETTINGS))
    t = result.targets["rl/a"]
    assert t.remove == ("a-w2",) and t.add == ()
    assert result.refused == (("rl/a", "p"),)
    assert any("kube-scheduler has refused it in p for serving's forecast for 21s" in r for r in t.reasons), t.reasons
    assert t.active_gpus == 2


def test_a_worker_refused_for_less_than_the_bound_is_kept() -> None:
    result = plan(PlanInput(NOW, pools(need_q=6), JOB, workers(NOW - 19), SETTINGS))
    t = result.targets["rl/a"]
    assert t.remove == () and result.refused == ()
    assert t.active_gpus == 3  # still the job's target: the scheduler may place it yet


def test_a_job_cooling_down_in_a_pool_gets_its_new_worker_elsewhere_or_not_at_all() -> None:
    """Job a at 2 in p, p roomier than q: a new worker would go to p; within the cool-down it goes
    to q; with q full too, nowhere; after the cool-down, to p again."""
    running = workers(None)[:2]
    free = plan(PlanInput(NOW, pools(need_p=2), JOB, running, SETTINGS))
    assert free.targets["rl/a"].add == ("p", "p")  # not vacuous: p is where it grows
    cooling = (("rl/a", "p", NOW + 30),)
    elsewhere = plan(PlanInput(NOW, pools(need_p=2), JOB, running, SETTINGS, cooling))
    assert elsewhere.targets["rl/a"].add == ("q",)
    nowhere = plan(PlanInput(NOW, pools(need_p=2, need_q=6), JOB, running, SETTINGS, cooling))
    assert nowhere.targets["rl/a"].add == ()
    over = plan(PlanInput(NOW, pools(need_p=2), JOB, running, SETTINGS, (("rl/a", "p", NOW),)))
    assert over.targets["rl/a"].add == ("p", "p")


def test_another_job_is_not_cooled_down_by_a_refusal() -> None:
    jobs = (*JOB, Job("rl/b", 1, 1, grace_s=5, min_useful_run_s=10))
    result = plan(PlanInput(NOW, pools(need_p=2), jobs, workers(None)[:2], SETTINGS, (("rl/a", "p", NOW + 30),)))
    assert result.targets["rl/b"].add == ("p",)


def pending_pod(name: str, message: str, since: str, node: str | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": {names.LABEL_JOB: "elastic-a"}},
        "spec": {"nodeSelector": {names.LABEL_POOL: "pool-b"}, **({"nodeName": node} if node else {})},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                    "lastTransitionTime": since,
                }
            ],
        },
    }


def test_observe_reads_the_schedulers_forecast_refusal_into_the_planners_worker() -> None:
    since = "2026-12-02T08:56:59Z"
    w = observe.observe("elastic-a", pending_pod("elastic-a-w3", G7_MESSAGE, since))
    assert w is not None and w.forecast_refused
    pw = observe.to_planner("soak/elastic-a", w)
    assert pw is not None and not pw.bound
    assert pw.refused_since == dt.datetime(2026, 12, 2, 8, 56, 59, tzinfo=dt.UTC).timestamp()
    other = "0/4 nodes are available: 4 cannot allocate all claims."
    ow = observe.observe("elastic-a", pending_pod("elastic-a-w3", other, since))
    assert ow is not None and not ow.forecast_refused
    assert observe.to_planner("soak/elastic-a", ow).refused_since is None  # type: ignore[union-attr]
    # bound since (the scheduler placed it): no longer refused, whatever the stale condition says
    bw = observe.observe("elastic-a", pending_pod("elastic-a-w3", G7_MESSAGE, since, node="n1"))
    assert bw is not None and observe.to_planner("soak/elastic-a", bw).refused_since is None  # type: ignore[union-attr]


def test_the_controller_removes_the_refused_worker_and_does_not_grant_it_again() -> None:
    """Through the controller: a job grown to 4 in pool-a (4 GPUs, serving needs none), one worker
    left Pending by the scheduler with the extender's refusal for 70 s (default bound 60 s): the
    next plan deletes it with an Event saying why, counts it, and the round after grants no new
    worker in pool-a (the cool-down) though the job is below its maxGPUs."""
    api = Recorder()
    ctl = Controller(
        api, Forecasts(0.0), inventory, ControllerMetrics(), ControllerSettings(dwell_s=0), clock=lambda: CTL_NOW
    )
    ctl.on_job_list([RAW_JOB])
    ctl.plan_once()
    drain(ctl)
    assert len(api.names("create")) == 4
    since = (CTL_NOW - dt.timedelta(seconds=70)).strftime("%Y-%m-%dT%H:%M:%SZ")
    for i, body in enumerate(api.created):
        pod = running_pod(body, f"uid-{i}")
        if i == 3:
            cond = pending_pod("x", G7_MESSAGE.replace("pool-b", "pool-a"), since)["status"]
            pod = {**pod, "status": cond}
        ctl.on_pod_event(ADDED, pod)
    result = ctl.plan_once()
    assert result is not None and result.refused == (("rl/grpo", "pool-a"),)
    drain(ctl)
    assert api.names("delete") == ["grpo-w3"]
    assert any("kube-scheduler has refused it in pool-a" in m for m in api.messages), api.messages
    assert ctl.metrics.forecast_refused.labels("pool-a")._value.get() == 1
    ctl.on_pod_event("DELETED", {**api.created[3], "metadata": {**api.created[3]["metadata"], "uid": "uid-3"}})
    again = ctl.plan_input(CTL_NOW)[0]
    assert again.cooldowns == (("rl/grpo", "pool-a", CTL_NOW.timestamp() + 300.0),)
    result = ctl.plan_once()
    assert result is not None and result.targets["rl/grpo"].add == ()

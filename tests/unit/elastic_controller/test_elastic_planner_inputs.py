"""What one job's inputs may do to the other tenants (issue 22 §4, §5, §6 and the lows), on the
pure planner and on the controller's loops (the recording ``JobApi`` of ``tests/support/controller_fakes.py``).

- §4: a job whose lead reaches past the forecast horizon (a long grace period, huge state bytes,
  a forged ``rose.io/reported-state-bytes``) is reclaimed alone; the reports are bounded.
- §5: a pool without a fresh forecast is frozen: no grants, no planned reclaims, a gauge and an Event.
- §6: ``rose.io/suspend-state: Suspended`` without a suspend request does not release a GPU.
- Lows: ``spec.priority`` orders only a namespace's own jobs; the class priority comes from the pods;
  the reported minimums are bounded.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

from elastic_controller.controller import Controller
from elastic_controller.observe import (
    DEVICE_MEMORY_MAX_BYTES,
    HOST_MEMORY_MAX_BYTES,
    holding_state,
    observe,
    planner_job,
    workload_report,
)
from elastic_controller.planner import Forecast, Job, PlanInput, Pool, Settings, Worker, plan
from rose_common import names
from rose_common.elasticrljob import ElasticRLJob
from rose_common.informer import ADDED, MODIFIED
from tests.support.controller_fakes import NOW, RAW_JOB, drain, make_controller, running_pod

T = 100_000.0
HOUR = Forecast(start=T, step=60.0, upper=(0.0,) * 60)  # serving needs nothing for an hour, then unknown


def _workers(key: str, n: int, pool: str = "p", state: str = "active") -> tuple[Worker, ...]:
    return tuple(Worker(f"{key}-w{i}", key, state, pool) for i in range(n))  # type: ignore[arg-type]


def _job(key: str, **kw: Any) -> Job:
    return Job(key=key, min_gpus=1, max_gpus=4, **kw)


# ---------------------------------------------------------------------- §4: one job's lead
def test_a_job_whose_lead_passes_the_horizon_is_reclaimed_alone() -> None:
    """Before: the pool's lead was the longest of its occupants', past the horizon the need was
    infinite, and every lent GPU of the pool was reclaimed (lent 5 -> 0)."""
    a, b = _job("t1/a", grace_s=30), _job("t2/b", grace_s=3600)
    workers = _workers("t1/a", 3) + _workers("t2/b", 2)
    p = plan(PlanInput(T, (Pool("p", 8, HOUR),), (a, b), workers, Settings(dwell_s=0, interval_s=10)))
    assert sorted(p.targets["t2/b"].suspend) == ["t2/b-w0", "t2/b-w1"]
    assert p.targets["t1/a"].suspend == () and p.targets["t1/a"].active_gpus >= 3
    assert "forecast horizon" in p.targets["t2/b"].reasons[0]
    assert p.lent["p"] >= 3


def test_a_job_whose_lead_passes_the_horizon_is_never_lent() -> None:
    b = _job("t2/b", grace_s=3600)
    p = plan(PlanInput(T, (Pool("p", 8, HOUR),), (b, _job("t1/a")), (), Settings(dwell_s=0, interval_s=10)))
    assert p.targets["t2/b"].add == () and len(p.targets["t1/a"].add) == 4


def test_the_pool_lead_uses_only_the_jobs_that_fit() -> None:
    """Serving needs the pool from minute 50: a 20-min lead (it fits) reclaims; a job whose lead
    passes the horizon does not drag the pool's lead (and the other tenants) with it."""
    fc = Forecast(start=T, step=60.0, upper=(0.0,) * 50 + (8.0,) * 10)
    a, b, c = _job("t1/a", grace_s=30), _job("t2/b", grace_s=1200), _job("t3/c", grace_s=7200)
    workers = _workers("t1/a", 2) + _workers("t2/b", 2) + _workers("t3/c", 2)
    p = plan(PlanInput(T, (Pool("p", 8, fc),), (a, b, c), workers, Settings(dwell_s=0, interval_s=10)))
    assert p.targets["t1/a"].suspend == ()  # 20 min + 10 s of lead: serving not needed yet
    assert p.targets["t2/b"].suspend == ()
    assert sorted(p.targets["t3/c"].suspend) == ["t3/c-w0", "t3/c-w1"]


def _erj(spec: dict[str, Any], ns: str = "rl", name: str = "grpo") -> ElasticRLJob:
    meta = {"name": name, "namespace": ns, "uid": f"u-{name}", "generation": 1}
    return ElasticRLJob.model_validate({**RAW_JOB, "metadata": meta, "spec": {**RAW_JOB["spec"], **spec}})


def _pod(name: str, ann: dict[str, str], phase: str = "Running", priority: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeSelector": {names.LABEL_POOL: "p"}}
    if priority is not None:
        spec["priority"] = priority
    return {
        "metadata": {"name": name, "uid": f"u-{name}", "labels": {names.LABEL_JOB: "grpo"}, "annotations": ann},
        "spec": spec,
        "status": {"phase": phase},
    }


def test_reported_state_bytes_and_seconds_to_safe_point_are_bounded_by_the_spec() -> None:
    job = _erj({"gpusPerWorker": 2, "minGPUs": 2, "maxGPUs": 4, "gracefulShutdownPeriod": 20})
    ann = {
        names.ANNOTATION_REPORTED_STATE_BYTES: str(10**18),
        names.ANNOTATION_SECONDS_TO_SAFE_POINT: "1e9",
        names.ANNOTATION_REPORTED_MIN_GPUS: "1000",
        names.ANNOTATION_REPORTED_MIN_HOST_MEMORY: str(10**20),
    }
    w = observe("grpo", _pod("grpo-w0", ann))
    assert w is not None
    rep = workload_report([w], job.spec)
    assert rep.state_bytes == 2 * DEVICE_MEMORY_MAX_BYTES and rep.seconds_to_safe_point == 20.0
    assert rep.min_gpus == 64 and rep.min_host_memory_bytes == HOST_MEMORY_MAX_BYTES
    pj = planner_job(job, 10**18, 1e9)  # unbounded inputs straight to the planner's view: bounded there too
    assert pj.state_bytes == 2 * DEVICE_MEMORY_MAX_BYTES and pj.seconds_to_safe_point == 20.0
    assert pj.lead_s < 60.0  # 20 s grace + 512 GiB over PCIe: the lead fits any horizon


def test_a_forged_state_report_no_longer_reclaims_the_pool() -> None:
    """The tenant writes rose.io/reported-state-bytes on its own pod: 10^18 bytes would be a
    40,000 s suspend; bounded, it is a few seconds, and nobody is reclaimed."""
    ctl, api = make_controller(need=0.0)
    other = {**RAW_JOB, "metadata": {**RAW_JOB["metadata"], "namespace": "other", "uid": "u-2"}}
    ctl.on_job_list([RAW_JOB, other])
    ctl.plan_once()
    drain(ctl)
    assert len(api.created) == 8  # 4 + 4 lent in the 8-GPU pool
    for i, body in enumerate(api.created):
        ctl.on_pod_event(ADDED, running_pod(body, f"uid-{i}"))
    drain(ctl)
    forged = running_pod(api.created[0], "uid-0")
    forged["metadata"]["annotations"] = {
        **forged["metadata"]["annotations"],
        names.ANNOTATION_REPORTED_STATE_BYTES: str(10**18),
    }
    ctl.on_pod_event(MODIFIED, forged)
    ctl.plan_once()
    drain(ctl)
    assert api.names("request") == []


# ---------------------------------------------------------------------- §5: stale forecasts
def test_a_frozen_pool_grants_nothing_and_reclaims_nothing() -> None:
    a = _job("t1/a")
    workers = (*_workers("t1/a", 2), Worker("t1/a-w2", "t1/a", "suspended", "p"))
    empty = Forecast(start=T, step=60.0, upper=())
    for pool in (Pool("p", 8, empty, frozen=True), Pool("p", 8, empty)):  # marked, or nothing known
        p = plan(PlanInput(T, (pool,), (a, _job("t2/b")), workers, Settings(dwell_s=0, interval_s=10)))
        assert p.reclaims == () and p.targets["t1/a"].suspend == () and p.targets["t1/a"].resume == ()
        assert p.targets["t2/b"].add == () and p.lent["p"] == 2


class _NoForecast:
    def get(self, pool: str) -> Forecast | None:
        return None


def _grown(ctl: Controller, api: Any) -> None:
    ctl.on_job_list([RAW_JOB])
    ctl.plan_once()
    drain(ctl)
    for i, body in enumerate(api.created):
        ctl.on_pod_event(ADDED, running_pod(body, f"uid-{i}"))
    drain(ctl)


def test_a_stale_forecast_freezes_lending_with_a_gauge_and_an_event() -> None:
    """Before: a pool without a fresh forecast was infinite need; every lent GPU was reclaimed."""
    ctl, api = make_controller(need=0.0)
    _grown(ctl, api)
    fresh = ctl.forecasts
    ctl.forecasts = _NoForecast()  # the predictor starved: the cache's max age passed
    for _ in range(3):
        ctl.plan_once()
        drain(ctl)
    assert api.names("request") == [] and api.names("delete") == []
    assert ctl.metrics.forecast_stale.labels("pool-a")._value.get() == 1
    assert api.names("event").count("ForecastStale") == 1  # once per change, not per round
    ctl.forecasts = fresh
    ctl.plan_once()
    assert ctl.metrics.forecast_stale.labels("pool-a")._value.get() == 0
    assert api.names("event").count("ForecastFresh") == 1


# ---------------------------------------------------------------------- §6: forged suspend-state
def test_suspend_state_without_a_request_does_not_release_the_gpu() -> None:
    forged = observe("grpo", _pod("grpo-w0", {names.ANNOTATION_SUSPEND_STATE: "Suspended"}))
    ours = '{"by": "rose-elastic-controller"}'
    asked = observe(
        "grpo", _pod("grpo-w1", {names.ANNOTATION_SUSPEND_STATE: "Suspended", names.ANNOTATION_SUSPEND_REQUEST: ours})
    )
    assert forged is not None and asked is not None
    assert holding_state(forged) == "active" and holding_state(asked) == "suspended"


def test_a_forged_suspended_annotation_does_not_skip_the_reclaim() -> None:
    """Before: the planner counted the worker as not holding a GPU and left it running when
    serving needed the pool."""
    ctl, api = make_controller(need=0.0)
    _grown(ctl, api)
    for i, body in enumerate(api.created):
        pod = running_pod(body, f"uid-{i}")
        pod["metadata"]["annotations"] = {**pod["metadata"]["annotations"], names.ANNOTATION_SUSPEND_STATE: "Suspended"}
        ctl.on_pod_event(MODIFIED, pod)
    drain(ctl)
    ctl.forecasts = type(ctl.forecasts)(8.0)  # serving needs the whole pool
    ctl.plan_once()
    drain(ctl)
    assert sorted(api.names("request")) == ["grpo-w0", "grpo-w1", "grpo-w2", "grpo-w3"]


# ---------------------------------------------------------------------- lows: priority
def _two_tenants(prio_b: int, class_a: int = 0, class_b: int = 0) -> str:
    """Two gangs of one pool, serving needs one gang's GPUs back: who is suspended?"""
    a = Job("ns-a/a", 2, 2, priority=0, class_priority=class_a, grace_s=0)
    b = Job("ns-b/b", 2, 2, priority=prio_b, class_priority=class_b, grace_s=0)
    fc = Forecast(start=T, step=60.0, upper=(2.0,) * 60)
    p = plan(PlanInput(T, (Pool("p", 4, fc),), (a, b), _workers("ns-a/a", 2) + _workers("ns-b/b", 2)))
    (victim,) = {r.job for r in p.reclaims}
    return victim


def test_spec_priority_does_not_order_other_tenants() -> None:
    assert _two_tenants(prio_b=0) == _two_tenants(prio_b=1000)  # before: the big number moved b last


def test_class_priority_orders_tenants_and_spec_priority_orders_a_namespace() -> None:
    assert _two_tenants(prio_b=1000, class_a=100, class_b=0) == "ns-b/b"
    assert _two_tenants(prio_b=0, class_a=0, class_b=100) == "ns-a/a"
    a, b = Job("ns/a", 2, 2, priority=5, grace_s=0), Job("ns/b", 2, 2, priority=1, grace_s=0)
    fc = Forecast(start=T, step=60.0, upper=(2.0,) * 60)
    p = plan(PlanInput(T, (Pool("p", 4, fc),), (a, b), _workers("ns/a", 2) + _workers("ns/b", 2)))
    assert {r.job for r in p.reclaims} == {"ns/b"}  # inside one namespace the hint decides


def test_class_priority_comes_from_the_pods_priority() -> None:
    from elastic_controller.observe import class_priority

    ws = [observe("grpo", _pod(f"grpo-w{i}", {}, priority=p)) for i, p in enumerate((1000, 10))]
    assert class_priority([w for w in ws if w is not None]) == 10
    assert class_priority([]) == 0
    job = replace(planner_job(_erj({"priority": 1000})), class_priority=10)
    assert job.cost()[0] == 10 and job.grow_order()[0] == -10


def test_plan_input_carries_class_priority_and_bounded_reports() -> None:
    ctl, api = make_controller(need=0.0)
    _grown(ctl, api)
    for i, body in enumerate(api.created):
        pod = running_pod(body, f"uid-{i}")
        pod["spec"] = {**pod["spec"], "priority": 7}
        pod["metadata"]["annotations"] = {
            **pod["metadata"]["annotations"],
            names.ANNOTATION_REPORTED_STATE_BYTES: str(10**18),
        }
        ctl.on_pod_event(MODIFIED, pod)
    inp, _ = ctl.plan_input(NOW + dt.timedelta(seconds=1))
    (job,) = inp.jobs
    assert job.class_priority == 7 and job.state_bytes == DEVICE_MEMORY_MAX_BYTES


def test_the_stale_forecast_alert_names_the_controllers_gauge() -> None:
    from pathlib import Path

    import yaml

    from elastic_controller.metrics import ControllerMetrics

    rules = yaml.safe_load((Path(__file__).resolve().parents[3] / "manifests/prometheus/rules.yaml").read_text())
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}
    exported = {m.name for m in ControllerMetrics().registry.collect()}
    assert "rose_controller_forecast_stale" in alerts["RoseForecastStale"]["expr"]
    assert "rose_controller_forecast_stale" in exported


def test_state_bytes_are_bounded_by_the_device_memory_the_driver_publishes() -> None:
    from elastic_controller import pools
    from elastic_controller.kube import InventoryStore
    from rose_common.slices import GpuInfo, resource_slice

    store = InventoryStore()
    gpus = [GpuInfo(i, f"GPU-{i}", "sim", 141 << 30) for i in range(2)]
    store.handler("ResourceSlice").on_list([resource_slice("n0", gpus, 1)])
    assert pools.lendable_memory(resource_slice("n0", gpus, 1)) == 141 << 30
    assert store.device_memory() == 141 << 30
    job = _erj({"gpusPerWorker": 2, "minGPUs": 2, "maxGPUs": 4})
    assert planner_job(job, 10**18, device_memory=store.device_memory()).state_bytes == 2 * (141 << 30)
    assert planner_job(job, 10**18, device_memory=1 << 50).state_bytes == 2 * DEVICE_MEMORY_MAX_BYTES
    ctl, _ = make_controller()
    ctl.device_memory = store.device_memory
    ctl.on_job_list([RAW_JOB])
    inp, _ = ctl.plan_input(NOW)
    assert inp.jobs[0].state_bytes == 0  # nothing reported, no stateBytesPerWorker

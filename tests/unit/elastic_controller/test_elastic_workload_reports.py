"""Elastic metadata in the controller: the workers' reports (pod annotations the driver writes)
reach the job's status and the planner's Job, and the job's world is written on every worker."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

from elastic_controller.observe import (
    ObservedWorker,
    observe,
    schedule_retries,
    workload_report,
    world_updates,
    world_value,
)
from elastic_controller.status import compute_status
from rose_common import names
from rose_common.elasticrljob import ElasticRLJob
from rose_common.informer import ADDED, MODIFIED
from tests.support.controller_fakes import NOW, RAW_JOB, drain, make_controller, running_pod

JOB = ElasticRLJob.model_validate(RAW_JOB)


def _pod(i: int, phase: str = "Running", **ann: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"grpo-w{i}",
            "namespace": "rl",
            "uid": f"uid-{i}",
            "labels": {names.LABEL_JOB: "grpo"},
            "annotations": ann,
        },
        "spec": {},
        "status": {"phase": phase},
    }


def _reported(i: int, phase: str, secs: str, size: str, **extra: str) -> dict[str, Any]:
    return _pod(
        i,
        **{
            names.ANNOTATION_WORKLOAD_PHASE: phase,
            names.ANNOTATION_SECONDS_TO_SAFE_POINT: secs,
            names.ANNOTATION_REPORTED_STATE_BYTES: size,
        },
        **extra,
    )


def _observed(*pods: dict[str, Any]) -> list[ObservedWorker]:
    return [w for w in (observe("grpo", p) for p in pods) if w is not None]


def test_annotations_parse_and_junk_is_not_reported() -> None:
    w = _observed(_reported(0, "rollout", "12.5", "1048576"))[0]
    assert (w.workload_phase, w.seconds_to_safe_point, w.reported_state_bytes) == ("rollout", 12.5, 1 << 20)
    junk = _observed(_reported(0, "no spaces allowed", "-1", "1.5"), _reported(1, "x" * 64, "nan", "lots"))
    for j in junk:
        assert (j.workload_phase, j.seconds_to_safe_point, j.reported_state_bytes) == (None, None, None)


def test_reports_combine_slowest_active_and_largest_state() -> None:
    suspended = _reported(2, "idle", "999", "5", **{names.ANNOTATION_SUSPEND_STATE: "Suspended"})
    obs = _observed(_reported(1, "train", "8", "300"), _reported(0, "rollout", "3", "200"), suspended)
    rep = workload_report(obs)
    assert rep.phase == "rollout"  # the lowest-index active worker
    assert rep.seconds_to_safe_point == 8.0  # a suspended worker's report does not count
    assert rep.state_bytes == 300
    assert workload_report(_observed(_pod(0))) == type(rep)()  # nothing reported yet


def test_world_is_active_over_live_workers_and_only_stale_pods_are_updated() -> None:
    suspended = _pod(2, **{names.ANNOTATION_SUSPEND_STATE: "Suspended"})
    failed = _pod(3, phase="Failed")
    obs = _observed(_pod(0, **{names.ANNOTATION_WORLD: "2/3"}), _pod(1), suspended, failed)
    assert world_value(obs) == "2/3"
    assert [w.name for w in world_updates(obs)] == ["grpo-w1", "grpo-w2"]
    assert world_value(_observed(failed)) is None and world_updates(_observed(failed)) == []


def test_status_shows_the_reports() -> None:
    status, _ = compute_status(JOB, _observed(_reported(0, "train", "4.0", "4096")), None, None, NOW)
    doc = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert (doc["workloadPhase"], doc["secondsToSafePoint"], doc["stateBytes"]) == ("train", 4.0, 4096)
    empty, _ = compute_status(JOB, _observed(_pod(0)), None, None, NOW)
    assert "workloadPhase" not in empty.model_dump(by_alias=True, exclude_none=True)


def test_the_planner_gets_the_reported_seconds_to_safe_point_and_state_bytes() -> None:
    ctl, api = make_controller(need=0.0)
    ctl.on_job_list([RAW_JOB])
    ctl.plan_once()
    drain(ctl)
    # within the job's grace period (30 s): a longer report is bounded by it (issue 22 §4)
    ann = {names.ANNOTATION_SECONDS_TO_SAFE_POINT: "22.0", names.ANNOTATION_REPORTED_STATE_BYTES: str(7 << 30)}
    for i, body in enumerate(api.created):
        pod = running_pod(body, f"uid-{i}")
        pod["metadata"]["annotations"] = {**pod["metadata"].get("annotations", {}), **ann}
        ctl.on_pod_event(ADDED, pod)
    inp, _ = ctl.plan_input(NOW)
    (job,) = inp.jobs
    assert job.seconds_to_safe_point == 22.0 and job.state_bytes == 7 << 30


def test_reconcile_writes_the_world_on_each_worker_then_stops() -> None:
    ctl, api = make_controller(need=0.0)
    ctl.on_job_list([RAW_JOB])
    ctl.plan_once()
    drain(ctl)
    pods = [running_pod(body, f"uid-{i}") for i, body in enumerate(api.created)]
    for pod in pods:
        ctl.on_pod_event(ADDED, pod)
    drain(ctl)
    written = dict(api.names("annotate"))
    assert written == {p["metadata"]["name"]: {names.ANNOTATION_WORLD: "4/4"} for p in pods}
    before = len(api.names("annotate"))
    for i, pod in enumerate(pods):  # the informer shows the annotation: nothing more to write
        pod = pods[i] = copy.deepcopy(pod)
        pod["metadata"]["annotations"] = {**pod["metadata"].get("annotations", {}), names.ANNOTATION_WORLD: "4/4"}
        ctl.on_pod_event(MODIFIED, pod)
    drain(ctl)
    assert len(api.names("annotate")) == before
    suspended = copy.deepcopy(pods[3])  # the informer delivers a new object
    suspended["metadata"]["annotations"][names.ANNOTATION_SUSPEND_STATE] = "Suspended"  # one worker suspended
    ctl.on_pod_event(MODIFIED, suspended)
    drain(ctl)
    assert dict(api.names("annotate")[before:]) == {f"grpo-w{i}": {names.ANNOTATION_WORLD: "3/4"} for i in range(4)}


def test_the_minimum_resources_a_worker_reports_reach_the_jobs_status() -> None:
    """Issue 10 §3: the workload reports the least it can run with through the node agent (the SDK's
    ReportRequest min_gpus / min_host_memory_bytes); the driver publishes them on the pod and the
    controller shows them in the status (largest over live workers). Regression: the driver dropped
    them and the status had no field for them."""
    from dra_driver.agent.convert import report_from_pb
    from dra_driver.agent.reports import annotations_of
    from rose_sdk.workload import Progress

    def reported(i: int, gpus: int, mem: int) -> dict[str, Any]:
        req = Progress(phase="train", min_gpus=gpus, min_host_memory_bytes=mem).request(f"uid-{i}", "s", 0)
        return _pod(i, **annotations_of(report_from_pb(req)))

    obs = _observed(reported(0, 1, 8 << 30), reported(1, 2, 4 << 30), _pod(2))
    status, _ = compute_status(JOB, obs, None, None, NOW)
    doc = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert (doc["minGPUsPerWorker"], doc["minHostMemoryBytes"]) == (2, 8 << 30)
    unreported = compute_status(JOB, _observed(reported(0, 0, 0)), None, None, NOW)[0]
    assert "minGPUsPerWorker" not in unreported.model_dump(by_alias=True, exclude_none=True)
    assert ElasticRLJob.model_validate({**RAW_JOB, "status": doc}).status == status


def test_a_pending_worker_gets_no_world_until_it_runs() -> None:
    """Regression (controller_scale benchmark): a job growing to 8 wrote each intermediate world
    on every worker, pending ones included (72 writes; 36 without the pending ones)."""
    obs = _observed(_pod(0), _pod(1, phase="Pending"))
    assert world_value(obs) == "1/2"
    assert [w.name for w in world_updates(obs)] == ["grpo-w0"]
    assert world_updates(_observed(_pod(0, phase="Pending"), _pod(1, phase="Pending"))) == []


def _unschedulable(i: int, since: dt.datetime, **ann: str) -> dict[str, Any]:
    pod = _pod(i, phase="Pending", **ann)
    pod["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "lastTransitionTime": since.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    ]
    return pod


def test_a_worker_left_unschedulable_is_nudged_once_per_period() -> None:
    """A worker pod an extender refused on a forecast that has changed since waits in kube-scheduler's
    unschedulable queue (the refusal is no cluster event): after ``after_s`` the controller updates
    the pod (rose.io/schedule-retry), which re-queues it; never more often than once per period,
    never a bound, deleted or merely pending pod."""
    since = NOW - dt.timedelta(seconds=20)
    stale = _unschedulable(0, since)
    fresh = _unschedulable(1, NOW - dt.timedelta(seconds=5))
    nudged = _unschedulable(2, since, **{names.ANNOTATION_SCHEDULE_RETRY: "2026-11-30T13:59:55Z"})
    old_nudge = _unschedulable(3, since, **{names.ANNOTATION_SCHEDULE_RETRY: "2026-11-30T13:59:40Z"})
    bound = _unschedulable(4, since)
    bound["spec"]["nodeName"] = "n0"
    waiting = _pod(5, phase="Pending")  # no Unschedulable condition: the scheduler has not refused it
    obs = _observed(stale, fresh, nudged, old_nudge, bound, waiting)
    assert [w.name for w in schedule_retries(obs, NOW, 15.0)] == ["grpo-w0", "grpo-w3"]
    assert schedule_retries(obs, NOW, 60.0) == []


def test_reconcile_nudges_an_unschedulable_worker_and_counts_it() -> None:
    ctl, api = make_controller(need=0.0)
    ctl.on_job_list([RAW_JOB])
    ctl.plan_once()
    drain(ctl)
    body = copy.deepcopy(api.created[0])
    body["metadata"]["uid"] = "uid-0"
    refused = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "lastTransitionTime": "2026-11-30T13:59:00Z",
    }
    body["status"] = {"phase": "Pending", "conditions": [refused]}
    ctl.on_pod_event(ADDED, body)
    drain(ctl)
    nudges = [a for name, a in api.names("annotate") if names.ANNOTATION_SCHEDULE_RETRY in a and name == "grpo-w0"]
    assert nudges == [{names.ANNOTATION_SCHEDULE_RETRY: "2026-11-30T14:00:00Z"}]
    assert ctl.metrics.schedule_retries.labels("ok")._value.get() == 1

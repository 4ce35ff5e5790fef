"""Observe, desired and status: from pods and the planner's target to actions, status and Events."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from elastic_controller import observe as obs
from elastic_controller.desired import PodRef, desired
from elastic_controller.planner import JobTarget
from elastic_controller.status import compute_status
from elastic_controller.workers import CONTROLLER
from rose_common import names
from rose_common.elasticrljob import ElasticRLJob, ElasticRLJobStatus

NOW = datetime(2026, 11, 30, 14, 0, tzinfo=UTC)
TEMPLATE = {"spec": {"containers": [{"name": "t", "image": "t:1"}]}}


def make_job(status: dict[str, Any] | None = None, generation: int = 2) -> ElasticRLJob:
    return ElasticRLJob.model_validate(
        {
            "metadata": {"name": "grpo", "namespace": "rl", "uid": "u-1", "generation": generation},
            "spec": {"minGPUs": 2, "maxGPUs": 4, "template": TEMPLATE, "gracefulShutdownPeriod": 45},
            "status": status,
        }
    )


def pod(
    i: int, phase: str = "Running", request_by: str | None = None, state: str | None = None, **meta: Any
) -> dict[str, Any]:
    ann: dict[str, str] = {}
    if request_by is not None:
        ann[names.ANNOTATION_SUSPEND_REQUEST] = json.dumps({"by": request_by, "reason": "r"})
    if state is not None:
        ann[names.ANNOTATION_SUSPEND_STATE] = state
    return {
        "metadata": {
            "name": f"grpo-w{i}",
            "uid": f"uid-{i}",
            "labels": {names.LABEL_JOB: "grpo"},
            "annotations": ann,
            **meta,
        },
        "spec": {"nodeName": "n1", "nodeSelector": {names.LABEL_POOL: "pool-a"}},
        "status": {"phase": phase},
    }


def observed(*pods: dict[str, Any]) -> list[obs.ObservedWorker]:
    out = [obs.observe("grpo", p) for p in pods]
    return [w for w in out if w is not None]


def test_observe_reads_pool_request_owner_and_state() -> None:
    (w,) = observed(pod(1, request_by=CONTROLLER, state="Suspending"))
    assert (w.index, w.pool, w.ours, obs.planner_state(w)) == (1, "pool-a", True, "suspending")
    assert obs.observe("grpo", {"metadata": {"name": "grpo-w1", "labels": {}}}) is None, "not labelled: not ours"
    assert obs.to_planner("rl/grpo", observed(pod(2, phase="Failed"))[0]) is None


def test_a_request_that_is_not_json_still_counts_as_someone_elses() -> None:
    p = pod(0)
    p["metadata"]["annotations"][names.ANNOTATION_SUSPEND_REQUEST] = "{oops"
    (w,) = observed(p)
    assert w.request_by == "" and not w.ours and obs.planner_state(w) == "suspending"


def test_desired_creates_new_workers_at_free_indexes_pinned_to_the_planned_pool() -> None:
    t = JobTarget("rl/grpo", 4, add=("pool-a", "pool-b"))
    d = desired(make_job(), observed(pod(0), pod(2)), t, NOW)
    assert [p["metadata"]["name"] for p in d.create] == ["grpo-w1", "grpo-w3"]
    assert [p["spec"]["nodeSelector"][names.LABEL_POOL] for p in d.create] == ["pool-a", "pool-b"]
    assert d.claim_template["metadata"]["name"] == "grpo-gpus"


def test_desired_sets_suspend_requests_in_the_drivers_format_and_clears_only_its_own() -> None:
    ws = observed(
        pod(0),
        pod(1, request_by="rose-scheduler-extender"),
        pod(2, request_by=CONTROLLER),
        pod(3, request_by="rose-scheduler-extender", state="Suspended"),
    )
    t = JobTarget(
        "rl/grpo",
        2,
        suspend=("grpo-w0", "grpo-w1"),
        resume=("grpo-w2", "grpo-w3"),
        reasons=("PlannedShrink: grpo-w0 in pool-a; serving p90 needs 7",),
    )
    d = desired(make_job(), ws, t, NOW)
    (req,) = d.set_requests
    assert req.pod == PodRef("grpo-w0", "uid-0")
    assert json.loads(req.value) == {
        "by": CONTROLLER,
        "reason": "planned reclaim of grpo-w0",
        "graceSeconds": 45,
        "at": "2026-11-30T14:00:00Z",
    }
    assert d.clear_requests == (PodRef("grpo-w2", "uid-2"),), "the extender's request is the extender's to clear"
    assert any(e.reason == "PlannedShrink" and "serving p90" in e.message for e in d.events)


def test_desired_deletes_removed_and_lost_workers_once_with_their_uid() -> None:
    ws = observed(pod(0, phase="Failed"), pod(1), pod(2, deletionTimestamp="2026-11-30T13:00:00Z"))
    d = desired(make_job(), ws, JobTarget("rl/grpo", 0, remove=("grpo-w1", "grpo-w0", "grpo-w2")), NOW)
    assert d.delete == (PodRef("grpo-w0", "uid-0"), PodRef("grpo-w1", "uid-1"))
    assert desired(make_job(), ws, None, NOW).delete == (PodRef("grpo-w0", "uid-0"),)


def test_status_counts_phase_and_conditions() -> None:
    ws = observed(pod(0), pod(1), pod(2, request_by=CONTROLLER, state="Suspended"))
    st, events = compute_status(make_job(), ws, JobTarget("rl/grpo", 2), None, NOW)
    assert (st.phase, st.active_gpus, st.suspended_gpus, st.target_gpus, st.observed_generation) == (
        "Running",
        2,
        1,
        2,
        2,
    )
    cond = {c.type: c.status for c in st.conditions or []}
    assert cond == {"Ready": "True", "Scaling": "False", "Suspended": "False", "Degraded": "False"}
    assert [e.reason for e in events] == ["Running", "Ready"]


def test_last_transition_time_moves_only_on_change() -> None:
    ws = observed(pod(0), pod(1))
    first, _ = compute_status(make_job(), ws, JobTarget("rl/grpo", 2), None, NOW)
    later = NOW + timedelta(minutes=5)
    again, events = compute_status(make_job(), ws, JobTarget("rl/grpo", 2), first, later)
    assert [c.last_transition_time for c in again.conditions or []] == [NOW] * 4 and events == []
    scaling, events = compute_status(make_job(), ws, JobTarget("rl/grpo", 4), again, later)
    times = {c.type: c.last_transition_time for c in scaling.conditions or []}
    assert times == {"Ready": later, "Scaling": later, "Suspended": NOW, "Degraded": NOW}
    assert scaling.phase == "Scaling" and {e.reason for e in events} == {"Scaling", "NotReady"}


def test_gang_suspend_counts_once_and_adds_its_time_when_it_ends() -> None:
    job = make_job()
    running, _ = compute_status(job, observed(pod(0), pod(1)), JobTarget("rl/grpo", 2), None, NOW)
    parked = observed(*(pod(i, request_by=CONTROLLER, state="Suspended") for i in (0, 1)))
    gang = JobTarget("rl/grpo", 0, suspend=("grpo-w0", "grpo-w1"))
    s1, _ = compute_status(job, parked, gang, running, NOW + timedelta(seconds=10))
    assert (s1.phase, s1.suspend_count, s1.last_shrink_time) == ("Suspended", 1, NOW + timedelta(seconds=10))
    s2, _ = compute_status(job, parked, JobTarget("rl/grpo", 0), s1, NOW + timedelta(seconds=70))
    assert s2.suspend_count == 1 and s2.total_suspended_seconds == 0
    s3, _ = compute_status(job, observed(pod(0), pod(1)), JobTarget("rl/grpo", 2), s2, NOW + timedelta(seconds=130))
    assert s3.total_suspended_seconds == 120 and s3.phase == "Running"


def test_a_lost_worker_marks_the_job_degraded_with_a_warning() -> None:
    st, events = compute_status(
        make_job(), observed(pod(0), pod(1, phase="Failed")), JobTarget("rl/grpo", 2), None, NOW
    )
    assert any(c.type == "Degraded" and c.status == "True" for c in st.conditions or [])
    assert any(e.reason == "Degraded" and e.type == "Warning" for e in events)


def test_status_round_trips_through_the_crd_model() -> None:
    st, _ = compute_status(make_job(), observed(pod(0), pod(1)), JobTarget("rl/grpo", 2), None, NOW)
    body = st.model_dump(mode="json", exclude_none=True)
    assert body["activeGPUs"] == 2 and body["conditions"][0]["lastTransitionTime"] == "2026-11-30T14:00:00Z"
    assert ElasticRLJobStatus.model_validate(body) == st


def test_planner_job_takes_bounds_from_the_spec_and_dwell_from_the_status() -> None:
    job = make_job(status={"lastShrinkTime": "2026-11-30T14:00:00Z"})
    j = obs.planner_job(job, state_bytes=50 * 10**9, seconds_to_safe_point=3.0)
    assert (j.key, j.min_gpus, j.max_gpus, j.grace_s, j.min_useful_run_s) == ("rl/grpo", 2, 4, 45.0, 600.0)
    assert j.state_bytes == 50 * 10**9 and j.suspend_s == 2.0 and j.seconds_to_safe_point == 3.0
    assert j.last_shrink_at == NOW.timestamp()
    assert obs.planner_job(make_job()).last_shrink_at is None and obs.planner_job(make_job()).state_bytes == 0

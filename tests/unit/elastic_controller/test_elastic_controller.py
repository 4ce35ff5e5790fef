"""The controller's loops without threads: informer handlers → plan → reconcile, through a
recording ``JobApi`` (an explicit fake for ``kube.py``, whose requests the e2e test makes for
real), an in-memory forecast map and an in-memory Lease."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from elastic_controller import leader
from elastic_controller.controller import Controller, ControllerSettings, reclaim_kind
from elastic_controller.desired import PodRef
from elastic_controller.kube import annotation_patch, job_event
from elastic_controller.metrics import ControllerMetrics
from elastic_controller.status import EventSpec
from rose_common import names
from rose_common.elasticrljob import ElasticRLJob
from rose_common.informer import ADDED, DELETED, MODIFIED
from tests.support.controller_fakes import (
    NOW,
    RAW_JOB,
    Forecasts,
    Recorder,
    drain,
    inventory,
    make_controller,
    running_pod,
)


def test_a_new_job_grows_to_max_once_even_if_planned_again_before_the_pods_are_seen() -> None:
    ctl, api = make_controller(need=0.0)
    ctl.on_job_list([RAW_JOB])
    ctl.plan_once()
    drain(ctl)
    assert api.names("create") == ["grpo-w0", "grpo-w1", "grpo-w2", "grpo-w3"]
    assert api.names("status")[-1] == 4
    ctl.plan_once()  # the informer has not shown the pods yet: no second set of workers
    drain(ctl)
    assert len(api.names("create")) == 4
    for i, body in enumerate(api.created):
        ctl.on_pod_event(ADDED, running_pod(body, f"uid-{i}"))
    ctl.plan_once()
    drain(ctl)
    assert len(api.names("create")) == 4


def test_forecast_rise_writes_planned_suspend_requests_and_counts_them() -> None:
    ctl, api = make_controller(need=0.0)
    ctl.on_job_list([RAW_JOB])
    ctl.plan_once()
    drain(ctl)
    for i, body in enumerate(api.created):
        ctl.on_pod_event(ADDED, running_pod(body, f"uid-{i}"))
    drain(ctl)
    ctl.forecasts = Forecasts(need=8.0)  # serving needs the whole pool
    ctl.plan_once()
    drain(ctl)
    assert sorted(api.names("request")) == ["grpo-w0", "grpo-w1", "grpo-w2", "grpo-w3"]
    assert ctl.metrics.reclaims.labels("planned")._value.get() == 4
    assert "delete" not in dict(api.calls)  # suspended, not removed
    assert ctl.metrics.stale_targets._value.get() == 0  # each target planned for the workers it met


def test_a_pod_of_another_job_or_label_is_ignored_and_invalid_jobs_are_skipped() -> None:
    ctl, api = make_controller()
    bad = {**RAW_JOB, "metadata": {**RAW_JOB["metadata"], "name": "bad"}, "spec": {"minGPUs": 5, "maxGPUs": 1}}
    ctl.on_job_list([bad])
    ctl.on_pod_event(ADDED, {"metadata": {"name": "web", "namespace": "rl"}})
    ctl.plan_once()
    drain(ctl)
    assert api.calls == [("event", "InvalidSpec")]  # once, though planned and reconciled
    assert api.messages[0].startswith("not reconciled until fixed: spec")


def test_a_deleted_job_has_its_workers_and_template_deleted_by_uid() -> None:
    ctl, api = make_controller(need=0.0)
    ctl.on_job_list([RAW_JOB])
    ctl.plan_once()
    drain(ctl)
    for i, body in enumerate(api.created):
        ctl.on_pod_event(ADDED, running_pod(body, f"uid-{i}"))
    stranger = running_pod(
        {
            **api.created[0],
            "metadata": {**api.created[0]["metadata"], "name": "grpo-w9", "ownerReferences": [{"uid": "other"}]},
        },
        "uid-9",
    )
    ctl.on_pod_event(ADDED, stranger)
    drain(ctl)
    api.calls.clear()
    ctl.on_job_event(DELETED, RAW_JOB)
    drain(ctl)
    assert sorted(api.names("delete")) == ["grpo-w0", "grpo-w1", "grpo-w2", "grpo-w3"]
    assert api.names("delete-template") == [("grpo-gpus", "u-1")]


def test_reclaim_kind_tells_planned_unplanned_and_fallback_apart() -> None:
    ours = json.dumps({"by": "rose-elastic-controller", "reason": "x"})
    ext = json.dumps({"by": "rose-extender", "reason": "x"})

    def pod(**ann: str) -> dict[str, Any]:
        return {"metadata": {"annotations": ann}}

    req, state = names.ANNOTATION_SUSPEND_REQUEST, names.ANNOTATION_SUSPEND_STATE
    assert reclaim_kind(pod(), pod(**{req: ext})) == "unplanned"
    assert reclaim_kind(pod(), pod(**{req: ours})) is None
    assert reclaim_kind(pod(**{req: ext}), pod(**{req: ext})) is None
    assert reclaim_kind(pod(), pod(**{state: "CheckpointedEvicted"})) == "fallback"


def test_an_unplanned_request_is_counted_when_the_pod_event_shows_it() -> None:
    ctl, _api = make_controller()
    ctl.on_job_list([RAW_JOB])
    pod = {"metadata": {"name": "grpo-w0", "namespace": "rl", "uid": "u", "labels": {names.LABEL_JOB: "grpo"}}}
    ctl.on_pod_event(ADDED, pod)
    ann = {names.ANNOTATION_SUSPEND_REQUEST: json.dumps({"by": "rose-extender"})}
    ctl.on_pod_event(MODIFIED, {**pod, "metadata": {**pod["metadata"], "annotations": ann}})
    assert ctl.metrics.reclaims.labels("unplanned")._value.get() == 1


def test_annotation_patch_is_guarded_by_the_pod_uid() -> None:
    add = annotation_patch(PodRef("grpo-w0", "uid-0"), "v")
    assert add[0] == {"op": "test", "path": "/metadata/uid", "value": "uid-0"}
    assert add[1] == {"op": "add", "path": "/metadata/annotations/rose.io~1suspend-request", "value": "v"}
    assert annotation_patch(PodRef("grpo-w0", "uid-0"), None)[1]["op"] == "remove"


def test_job_event_names_the_job() -> None:
    job = ElasticRLJob.model_validate(RAW_JOB)
    ev = job_event(job, EventSpec("Running", "phase Pending -> Running"), NOW)
    assert ev["involvedObject"] == {
        "apiVersion": "elastic.rose.io/v1alpha1",
        "kind": "ElasticRLJob",
        "name": "grpo",
        "namespace": "rl",
        "uid": "u-1",
    }
    assert ev["metadata"]["namespace"] == "rl" and ev["type"] == "Normal"


class MemoryLease:
    """One Lease with resourceVersion semantics, shared by two controllers (stands in for the API server)."""

    def __init__(self) -> None:
        self.record: leader.LeaseRecord | None = None
        self.rv = 0

    def get(self) -> tuple[leader.LeaseRecord | None, str]:
        return self.record, str(self.rv) if self.record else ""

    def write(self, record: leader.LeaseRecord, resource_version: str) -> bool:
        if (str(self.rv) if self.record else "") != resource_version:
            return False
        self.record, self.rv = record, self.rv + 1
        return True


def test_two_replicas_never_both_lead_and_a_follower_does_nothing() -> None:
    lease = MemoryLease()
    now = [NOW]
    replicas = []
    for ident in ("a", "b"):
        s = ControllerSettings(identity=ident, lease_duration_s=15, lease_renew_s=5)
        ctl = Controller(Recorder(), Forecasts(0.0), inventory, ControllerMetrics(), s, lease, clock=lambda: now[0])
        replicas.append(ctl)
    a, b = replicas
    assert a.elect_once() and not b.elect_once()
    b.on_job_list([RAW_JOB])
    assert b.plan_once() is None
    drain(b)
    assert b.api.calls == []  # type: ignore[attr-defined]
    now[0] += dt.timedelta(seconds=10)
    assert a.elect_once() and not b.elect_once()  # renewed in time
    now[0] += dt.timedelta(seconds=20)  # a stops renewing (crashed)
    assert b.elect_once()
    assert not a.elect_once()  # a comes back: the lease is b's now
    assert b.metrics.leader._value.get() == 1 and a.metrics.leader._value.get() == 0

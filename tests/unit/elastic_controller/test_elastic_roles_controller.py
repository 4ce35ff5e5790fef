"""A job with roles through the controller's loops without threads (informer handlers → plan →
reconcile) and the recording ``JobApi`` of ``tests/support/controller_fakes.py``, plus the trainer's Service."""

from __future__ import annotations

from typing import Any

from rose_common.informer import ADDED
from tests.support.controller_fakes import RAW_JOB, Forecasts, Recorder, drain, make_controller, running_pod

POD = {"spec": {"containers": [{"name": "t", "image": "t"}]}}
ROLES_JOB: dict[str, Any] = {
    **RAW_JOB,
    "spec": {
        "roles": {
            "trainer": {"workers": 2, "template": POD},
            "rollout": {"minWorkers": 1, "maxWorkers": 4, "template": POD},
        }
    },
}


class RolesRecorder(Recorder):
    def ensure_service(self, body: dict[str, Any]) -> None:
        self.calls.append(("service", body["metadata"]["name"]))


def _controller(need: float) -> tuple[Any, RolesRecorder]:
    ctl, _ = make_controller(need)
    api = RolesRecorder()
    ctl.api = api
    return ctl, api


def test_trainer_first_then_rollouts_and_a_forecast_rise_removes_rollouts_not_the_trainer() -> None:
    ctl, api = _controller(need=0.0)  # the pool: 8 GPUs
    ctl.on_job_list([ROLES_JOB])
    ctl.plan_once()
    drain(ctl)
    assert api.names("create") == [
        "grpo-trainer-0",
        "grpo-trainer-1",
        "grpo-rollout-0",
        "grpo-rollout-1",
        "grpo-rollout-2",
        "grpo-rollout-3",
    ]
    assert api.names("template") == ["grpo-trainer-gpus", "grpo-rollout-gpus"]
    assert api.names("service") == ["grpo-trainer"]
    assert api.names("status")[-1] == 6
    for i, body in enumerate(api.created):
        ctl.on_pod_event(ADDED, running_pod(body, f"uid-{i}"))
    drain(ctl)
    worlds = {name: ann["rose.io/world"] for name, ann in api.names("annotate")}
    assert worlds == {
        "grpo-trainer-0": "2/2",
        "grpo-trainer-1": "2/2",
        "grpo-rollout-0": "4/4",
        "grpo-rollout-1": "4/4",
        "grpo-rollout-2": "4/4",
        "grpo-rollout-3": "4/4",
    }
    ctl.plan_once()
    gauge = ctl.metrics.role_workers
    assert gauge.labels("rl/grpo", "trainer", "active")._value.get() == 2
    assert gauge.labels("rl/grpo", "rollout", "active")._value.get() == 4
    api.calls.clear()
    ctl.forecasts = Forecasts(need=4.0)  # room for 4 of 8: two rollouts go, the trainer stays
    ctl.plan_once()
    drain(ctl)
    assert api.names("delete") == ["grpo-rollout-3", "grpo-rollout-2"]
    assert api.names("request") == []
    assert gauge.labels("rl/grpo", "rollout", "desired")._value.get() == 2
    assert ctl.metrics.reclaims.labels("planned")._value.get() == 2

"""A controller SIGKILLed in the middle of a reconcile's actions (a ``BaseException`` raised by
the API fake stands for the kill: nothing after it runs) must not lose what the restarted
controller cannot decide again: the ``lastShrinkTime`` of a planned reclaim, the dwell's start."""

from __future__ import annotations

from typing import Any

import pytest

from elastic_controller.desired import PodRef, desired
from elastic_controller.observe import observe, planner_job
from elastic_controller.planner import JobTarget
from elastic_controller.reconciler import converge
from elastic_controller.status import EventSpec
from rose_common.elasticrljob import ElasticRLJob, ElasticRLJobStatus
from tests.support.controller_fakes import JOB, NOW, job_pod


class Killed(BaseException):
    """The process is gone: converge() must not catch it (it catches Exception only)."""


class DiesAtFirstRequest:
    """The API server's view: what was written before the kill."""

    def __init__(self) -> None:
        self.status: ElasticRLJobStatus | None = None
        self.requests: list[str] = []

    def ensure_claim_template(self, body: dict[str, Any]) -> None:
        pass

    def create_pod(self, body: dict[str, Any]) -> None:
        pass

    def delete_pod(self, namespace: str, pod: PodRef) -> None:
        pass

    def set_suspend_request(self, namespace: str, pod: PodRef, value: str | None) -> None:
        self.requests.append(pod.name)
        raise Killed

    def patch_status(self, job: ElasticRLJob, status: ElasticRLJobStatus) -> None:
        self.status = status

    def record_event(self, job: ElasticRLJob, event: EventSpec) -> None:
        pass


def test_a_kill_after_the_first_suspend_request_keeps_the_dwell_start() -> None:
    workers = [w for w in (observe("grpo", job_pod(i)) for i in range(2)) if w is not None]
    shrink = JobTarget("rl/grpo", 1, suspend=("grpo-w1",), reasons=("PlannedShrink: grpo-w1 in pool-a",))
    api = DiesAtFirstRequest()
    with pytest.raises(Killed):
        converge(api, JOB, desired(JOB, workers, shrink, NOW))
    assert api.requests == ["grpo-w1"], "the request reached the API server before the kill"
    assert api.status is not None and api.status.last_shrink_time == NOW, "the dwell start was lost with the kill"
    restarted = JOB.model_copy(update={"status": api.status})
    assert planner_job(restarted).last_shrink_at == NOW.timestamp()  # the restarted planner keeps the dwell

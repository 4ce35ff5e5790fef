"""A resume the driver keeps failing is not a stream of new suspends (docs/bench/soak.md, T5).

In the soak the trainer's process had ended while the driver held its GPU for serving; when
serving left, the driver's resume failed (``ResumeFailed: no workload registered for claim``)
and its repair loop retried it every ~2 s, each try writing ``rose.io/suspend-state`` Resuming,
then Suspended. The status counted every try as another whole-gang suspend (suspendCount 29)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from elastic_controller import observe as obs
from elastic_controller.planner import JobTarget
from elastic_controller.status import compute_status
from rose_common import names
from rose_common.elasticrljob import ElasticRLJob, ElasticRLJobStatus

NOW = datetime(2026, 12, 2, 1, 39, tzinfo=UTC)
TARGET = JobTarget("soak/trainer", 1)
JOB = ElasticRLJob.model_validate(
    {
        "metadata": {"name": "trainer", "namespace": "soak", "uid": "u", "generation": 1},
        "spec": {"minGPUs": 1, "maxGPUs": 1, "template": {"spec": {"containers": [{"name": "t", "image": "t"}]}}},
    }
)


def _worker(state: str | None) -> list[obs.ObservedWorker]:
    ann = {names.ANNOTATION_SUSPEND_STATE: state} if state else {}
    pod: dict[str, Any] = {
        "metadata": {"name": "trainer-w0", "uid": "p0", "labels": {names.LABEL_JOB: "trainer"}, "annotations": ann},
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Running"},
    }
    w = obs.observe("trainer", pod)
    assert w is not None
    return [w]


def _suspended(s: ElasticRLJobStatus) -> tuple[str, datetime | None]:
    (c,) = [c for c in s.conditions or [] if c.type == "Suspended"]
    return c.status, c.last_transition_time


def test_a_resume_that_keeps_failing_counts_one_suspend_and_keeps_the_condition() -> None:
    status, _ = compute_status(JOB, _worker(None), TARGET, None, NOW)
    status, _ = compute_status(JOB, _worker("Suspended"), TARGET, status, NOW + timedelta(seconds=1))
    assert (status.phase, status.suspend_count) == ("Suspended", 1)
    since = _suspended(status)
    reasons: list[str] = []
    t = 1
    for _ in range(10):  # the driver's repair loop: Resuming, ResumeFailed -> Suspended, every ~2 s
        for state in ("Resuming", "Suspended"):
            t += 1
            status, events = compute_status(JOB, _worker(state), TARGET, status, NOW + timedelta(seconds=t))
            reasons += [e.reason for e in events]
    assert status.suspend_count == 1
    assert _suspended(status) == since  # True all along, never a new transition
    assert "NotSuspended" not in reasons and reasons.count("Suspended") == 10  # only the phase's Events
    assert reasons.count("Resuming") == 10  # each try still shows as a phase transition
    status, events = compute_status(JOB, _worker(None), TARGET, status, NOW + timedelta(seconds=30))
    assert (status.phase, status.suspend_count, _suspended(status)[0]) == ("Running", 1, "False")
    assert status.total_suspended_seconds == 29  # from the suspend to the resume that worked
    assert "NotSuspended" in [e.reason for e in events]


def test_a_worker_resuming_without_having_been_suspended_is_not_a_suspended_gang() -> None:
    """Suspending straight to Resuming (the suspend failed, the request withdrawn): never Suspended."""
    status, _ = compute_status(JOB, _worker("Suspending"), TARGET, None, NOW)
    status, events = compute_status(JOB, _worker("Resuming"), TARGET, status, NOW + timedelta(seconds=1))
    assert (status.phase, status.suspend_count, _suspended(status)[0]) == ("Resuming", 0, "False")
    assert "Suspended" not in [e.reason for e in events]

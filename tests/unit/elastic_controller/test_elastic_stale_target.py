"""A planner target is applied only to the workers it was planned for.

The planner (its own thread) reads a snapshot of the jobs and their workers; the work queue's
reconcile (another thread) may create workers between that snapshot and the moment the plan
stores its targets. The CI run of 2 Dec saw it as a time-slice group of two jobs of 2 workers
whose shared claims went up to ``ts-g1-w3``: the stale target's adds were applied on top of the
workers just created. Here the interleaving is forced: the plan's snapshot is taken, then the
reconcile of the previous target creates the workers and the informer shows them, then the plan
stores its (stale) target.
"""

from __future__ import annotations

from typing import Any

from rose_common.informer import ADDED
from tests.support.controller_fakes import RAW_JOB, drain, make_controller, running_pod


def test_a_target_planned_before_the_last_creates_is_dropped_not_applied_on_top() -> None:
    ctl, api = make_controller(need=0.0)
    ctl.on_job_list([RAW_JOB])
    ctl.plan_once()  # the job's first target: grow to maxGPUs (4)
    snapshot = ctl.plan_input

    def reconcile_between_snapshot_and_store(now: Any) -> Any:
        got = snapshot(now)  # the plan's view: no workers yet
        drain(ctl)  # the reconcile takes the first target and creates 4 workers
        for i, body in enumerate(api.created):
            ctl.on_pod_event(ADDED, running_pod(body, f"uid-{i}"))  # the informer shows them
        return got

    ctl.plan_input = reconcile_between_snapshot_and_store  # type: ignore[method-assign]
    ctl.plan_once()  # plans "add 4" again from the stale view
    ctl.plan_input = snapshot  # type: ignore[method-assign]
    drain(ctl)
    assert api.names("create") == ["grpo-w0", "grpo-w1", "grpo-w2", "grpo-w3"]
    assert ctl.metrics.stale_targets._value.get() == 1
    ctl.plan_once()  # the next round plans for the 4 workers as they are: nothing to add
    drain(ctl)
    assert len(api.names("create")) == 4

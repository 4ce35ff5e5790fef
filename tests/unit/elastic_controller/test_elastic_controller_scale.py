"""The controller's hot spots found by ``benchmarks/controller_scale.py`` (200 jobs x 8 workers on
1,000 nodes): only jobs whose planned target changed are queued, a pod is observed once per event,
a reconcile's suspend requests are in flight together, and the client keeps enough connections."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from elastic_controller import controller as controller_mod
from elastic_controller.controller import Controller, ControllerSettings, ParallelCalls
from elastic_controller.desired import desired
from elastic_controller.metrics import ControllerMetrics
from elastic_controller.observe import observe
from elastic_controller.planner import JobTarget
from elastic_controller.reconciler import converge, run_serially
from rose_common.informer import ADDED
from rose_common.kube.client import api_client
from tests.support.controller_fakes import (
    JOB,
    NOW,
    RAW_JOB,
    CallRecorder,
    Forecasts,
    Recorder,
    drain,
    inventory,
    job_pod,
    running_pod,
)

PPO = {**RAW_JOB, "metadata": {**RAW_JOB["metadata"], "name": "ppo", "uid": "u-2"}}


def _queued(ctl: Controller) -> list[str]:
    out = []
    while (key := ctl.queue.get(timeout=0)) is not None:
        out.append(key)
        ctl.queue.done(key)
    return out


def _grown(settings: ControllerSettings) -> tuple[Controller, Recorder]:
    """Two jobs (min 2, max 4) each running 4 workers on the 8 GPUs of pool-a."""
    api = Recorder()
    ctl = Controller(api, Forecasts(0.0), inventory, ControllerMetrics(), settings, clock=lambda: NOW)
    ctl.on_job_list([RAW_JOB, PPO])
    ctl.plan_once()
    drain(ctl)
    for i, body in enumerate(api.created):
        ctl.on_pod_event(ADDED, running_pod(body, f"uid-{i}"))
    drain(ctl)
    ctl.plan_once()  # the targets of running jobs replace those that created the workers
    drain(ctl)
    return ctl, api


def test_a_plan_round_queues_only_the_jobs_whose_target_changed() -> None:
    """Regression: every plan round queued every job (200 no-op reconciles a second in the
    benchmark, ahead of the jobs with suspend requests to write)."""
    ctl, _api = _grown(ControllerSettings(resync_s=3600))
    ctl.plan_once()
    assert _queued(ctl) == []  # nothing changed
    ctl.forecasts = Forecasts(need=2.0)  # 2 GPUs back: the cheapest job (rl/grpo) shrinks by two
    ctl.plan_once()
    assert _queued(ctl) == ["rl/grpo"]


def test_a_stored_target_is_still_taken_by_the_next_reconcile_and_every_job_is_resynced() -> None:
    ctl, api = _grown(ControllerSettings(resync_s=3600))
    ctl.forecasts = Forecasts(need=2.0)
    ctl.plan_once()
    ctl.plan_once()  # the same target again: stored, not queued again
    api.calls.clear()
    ctl.reconcile("rl/grpo")
    assert sorted(api.names("request")) == ["grpo-w2", "grpo-w3"]
    ctl2, _ = _grown(ControllerSettings(resync_s=1e-9))
    ctl2.plan_once()
    assert sorted(_queued(ctl2)) == ["rl/grpo", "rl/ppo"]  # level-triggered: the resync queues all


def test_a_worker_pod_is_observed_once_per_event_not_per_plan_or_reconcile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: the plan observed all 1,600 pods every round and each reconcile its job's again."""
    ctl, _api = _grown(ControllerSettings(resync_s=1e-9))
    seen: list[str] = []
    monkeypatch.setattr(controller_mod, "observe", lambda job, pod: seen.append(job) or observe(job, pod))
    ctl.plan_once()
    drain(ctl)
    assert seen == []
    ctl.on_pod_event("MODIFIED", running_pod(_api.created[0], "uid-0") | {"spec": {"nodeName": "n1"}})
    assert len(seen) == 1  # that pod, once
    assert len(ctl.observed("rl/grpo")) == len(ctl.observed("rl/ppo")) == 4


def test_converge_hands_the_requests_of_a_job_to_the_runner_together() -> None:
    """Regression: the suspend requests of one reconcile went one after another."""
    ws = [w for w in (observe("grpo", job_pod(i)) for i in range(4)) if w is not None]
    target = JobTarget("rl/grpo", 1, suspend=("grpo-w1", "grpo-w2", "grpo-w3"), reasons=("PlannedShrink: x",))
    api = CallRecorder()
    groups: list[int] = []

    def run(calls: list[Any]) -> list[Exception | None]:
        groups.append(len(calls))
        return run_serially(calls)

    assert converge(api, JOB, desired(JOB, ws, target, NOW), run) == []
    kinds = [k for k, _ in api.calls]
    assert kinds[:4] == ["status", "request", "request", "request"] and set(kinds[4:]) == {"event"}
    assert groups[:2] == [1, 3]  # the status first, alone; then the three requests at once


def test_parallel_calls_run_a_group_at_once_and_return_each_error() -> None:
    barrier = threading.Barrier(3, timeout=30)  # one after another, the first call would break it

    def fail() -> None:
        barrier.wait()
        raise RuntimeError("refused")

    errors = ParallelCalls(4)([barrier.wait, fail, barrier.wait])
    assert errors[0] is None and errors[2] is None
    assert isinstance(errors[1], RuntimeError)


def test_parallel_calls_let_a_kill_through() -> None:
    class Killed(BaseException):
        pass

    def die() -> None:
        raise Killed

    with pytest.raises(Killed):
        ParallelCalls(2)([lambda: None, die])


def test_the_client_keeps_as_many_connections_as_asked(tmp_path: Path) -> None:
    """Regression: the client's default pool (5 per CPU: 10 here) had 16 reconcile workers, 8
    concurrent writes and 4 watches to serve; urllib3 opened and dropped a connection for each
    request beyond it."""
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    api = api_client(path, connections=30)
    assert api.rest_client.pool_manager.connection_pool_kw["maxsize"] == 30

"""Status counters never go back (docs/bench/soak.md, T5): the status is written under the
resourceVersion of the job it was computed from, and a refused write stops the reconcile.

The controller runs without threads through the real ``kube.KubeJobApi`` on ``JobServer``, an
explicit in-memory stand-in for the API server's object store that keeps only what these tests
decide on: one ElasticRLJob whose status subresource takes JSON merge patches and refuses (409)
a patch whose ``metadata.resourceVersion`` is not the stored one, as the API server does
(``tests/e2e/elastic_controller/test_elastic_status_conflict_e2e.py`` does it on the real one).
The informer's lag is the test's: it hands the controller the stored job only when it says so.
"""

from __future__ import annotations

import copy
import datetime as dt
import random
from typing import Any

import pytest

from elastic_controller import pools
from elastic_controller.controller import Controller, ControllerSettings
from elastic_controller.kube import KubeJobApi, status_patch
from elastic_controller.metrics import ControllerMetrics
from elastic_controller.planner import Forecast
from elastic_controller.status import compute_status
from rose_common import names
from rose_common.elasticrljob import ElasticRLJob
from rose_common.informer import ADDED, MODIFIED
from rose_common.kube.errors import Conflict, Status
from rose_common.slices import GpuInfo, resource_slice

NOW = dt.datetime(2026, 12, 2, 4, 0, tzinfo=dt.UTC)
JOB: dict[str, Any] = {
    "apiVersion": names.API_VERSION,
    "kind": names.KIND,
    "metadata": {"name": "grpo", "namespace": "rl", "uid": "u-1", "generation": 1, "resourceVersion": "1"},
    "spec": {
        "minGPUs": 2,
        "maxGPUs": 2,
        "gpusPerWorker": 1,
        "template": {"spec": {"containers": [{"name": "t", "image": "t"}]}},
    },
}


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge(out.get(k), v)
    return out


class JobServer:
    """The one job's object store (see the module docstring); every other request is recorded."""

    def __init__(self) -> None:
        self.job: dict[str, Any] = copy.deepcopy(JOB)
        self.counts: list[int] = []  # status.suspendCount after each accepted status write
        self.requests: list[tuple[str, str]] = []

    def json(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        self.requests.append((method, path))
        if not path.endswith("/grpo/status"):
            return {}
        assert method == "PATCH" and content_type == "application/merge-patch+json"
        rv = self.job["metadata"]["resourceVersion"]
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != rv:
            raise Conflict(Status(409, "Conflict", "the object has been modified"))
        self.job = _merge(self.job, {"status": body["status"]})
        self.job["metadata"]["resourceVersion"] = str(int(rv) + 1)
        self.counts.append(int(self.job["status"].get("suspendCount", 0)))
        return copy.deepcopy(self.job)

    def creates(self) -> int:
        return sum(1 for m, p in self.requests if m == "POST" and p.endswith("/pods"))


class Need:
    def __init__(self, need: float) -> None:
        self.need = need

    def get(self, pool: str) -> Forecast | None:
        return Forecast(start=NOW.timestamp() - 60, step=60, upper=(self.need,) * 120)


def _inventory() -> dict[str, int]:
    nodes = [{"metadata": {"name": "n0", "labels": {names.LABEL_POOL: "pool-a"}}}]
    gpus = [GpuInfo(i, f"GPU-{i}", "sim", 80 << 30) for i in range(2)]
    return pools.capacities(nodes, [resource_slice("n0", gpus, 1)])


def _controller(server: JobServer) -> Controller:
    api = KubeJobApi(server)  # type: ignore[arg-type]  # JobServer stands in for Raw
    return Controller(api, Need(0.0), _inventory, ControllerMetrics(), ControllerSettings(), clock=lambda: NOW)


def _drain(ctl: Controller) -> None:
    while (key := ctl.queue.get(timeout=0)) is not None:
        ctl.reconcile(key)
        ctl.queue.done(key)


def _pod(i: int, state: str | None) -> dict[str, Any]:
    ann = {names.ANNOTATION_SUSPEND_STATE: state} if state else {}
    return {
        "metadata": {"name": f"grpo-w{i}", "namespace": "rl", "uid": f"p{i}", "labels": {names.LABEL_JOB: "grpo"}}
        | ({"annotations": ann} if ann else {}),
        "spec": {"nodeName": "n0"},
        "status": {"phase": "Running"},
    }


def _set_workers(ctl: Controller, state: str | None) -> None:
    for i in range(2):
        ctl.on_pod_event(MODIFIED, _pod(i, state))


def test_the_status_patch_carries_the_resource_version_it_was_computed_from() -> None:
    job = ElasticRLJob.model_validate({**JOB, "metadata": {**JOB["metadata"], "resourceVersion": "42"}})
    status, _ = compute_status(job, [], None, None, NOW)
    assert status_patch(job, status)["metadata"] == {"resourceVersion": "42"}
    unread = ElasticRLJob.model_validate({**JOB, "metadata": {"name": "grpo", "namespace": "rl"}})
    assert "metadata" not in status_patch(unread, status)  # no version known: no precondition


def test_a_status_computed_from_a_stale_job_is_refused_and_the_count_never_goes_back() -> None:
    """The soak's T5: the controller wrote suspendCount 1 (Suspended), the workers began resuming
    before the informer delivered that write, and the reconcile from the stale job (count 0, never
    suspended) wrote phase Resuming with count 0 over it. Now that write is refused, counted, and
    the next pass from the delivered job keeps 1."""
    server = JobServer()
    ctl = _controller(server)
    ctl.on_job_list([copy.deepcopy(server.job)])
    ctl.on_pod_list([_pod(0, None), _pod(1, None)])
    _drain(ctl)
    ctl.on_job_event(MODIFIED, copy.deepcopy(server.job))  # the informer delivers Running
    _drain(ctl)
    _set_workers(ctl, "Suspended")
    _drain(ctl)
    assert server.counts[-1] == 1  # the whole gang suspended once
    _set_workers(ctl, "Resuming")  # the informer has not delivered the Suspended write yet
    _drain(ctl)
    assert server.counts == sorted(server.counts), f"suspendCount went back: {server.counts}"
    assert ctl.metrics.status_conflicts._value.get() == 1
    assert ctl.queue.failures("rl/grpo") == 1  # requeued with backoff
    ctl.on_job_event(MODIFIED, copy.deepcopy(server.job))  # the fresh view
    _drain(ctl)
    assert server.job["status"]["phase"] == "Resuming"
    assert server.counts[-1] == 1
    assert ctl.queue.failures("rl/grpo") == 0


def test_a_conflict_does_nothing_else_and_keeps_the_planners_target() -> None:
    """Nothing computed from the stale view is carried out (no pods, no Events); the target the
    pass took is put back, so the pass from the fresh view still creates the workers."""
    server = JobServer()
    server.job["metadata"]["resourceVersion"] = "2"  # written since the informer's copy (version 1)
    ctl = _controller(server)
    ctl.on_job_list([copy.deepcopy(JOB)])
    ctl.plan_once()
    _drain(ctl)
    assert server.creates() == 0
    assert [m for m, p in server.requests if p.endswith("/events")] == []
    assert ctl.metrics.reconciles.labels("conflict")._value.get() == 1
    ctl.on_job_event(MODIFIED, copy.deepcopy(server.job))
    _drain(ctl)
    assert server.creates() == 2


@pytest.mark.parametrize("seed", range(20))
def test_two_stale_writers_never_make_the_suspend_count_decrease(seed: int) -> None:
    """Two controllers (a leader hand-over, or one controller's two stale views) reconcile the same
    job, each informer delivering the stored job at its own random lag, while the workers suspend
    and resume: every accepted status write keeps suspendCount at or above the one before."""
    rng = random.Random(seed)
    server = JobServer()
    ctls = [_controller(server), _controller(server)]
    for ctl in ctls:
        ctl.on_job_list([copy.deepcopy(server.job)])
        ctl.on_pod_list([_pod(0, None), _pod(1, None)])
    for _ in range(40):
        state = rng.choice([None, "Suspended", "Resuming"])
        for ctl in ctls:
            _set_workers(ctl, state)
            if rng.random() < 0.4:
                ctl.on_job_event(MODIFIED, copy.deepcopy(server.job))
        for ctl in rng.sample(ctls, 2):
            _drain(ctl)
    assert server.counts == sorted(server.counts), f"suspendCount went back: {server.counts}"
    assert max(server.counts) >= 1


def test_pods_added_to_the_cache_requeue_without_a_status_write_when_nothing_changed() -> None:
    """An unchanged status is not written, so a job whose view is merely old makes no conflict."""
    server = JobServer()
    ctl = _controller(server)
    ctl.on_job_list([copy.deepcopy(server.job)])
    ctl.on_pod_list([_pod(0, None), _pod(1, None)])
    _drain(ctl)
    ctl.on_job_event(MODIFIED, copy.deepcopy(server.job))
    _drain(ctl)
    writes = len(server.counts)
    ctl.on_pod_event(ADDED, _pod(0, None))
    _drain(ctl)
    assert len(server.counts) == writes
    assert ctl.metrics.status_conflicts._value.get() == 0

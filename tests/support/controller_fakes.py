"""The elastic controller's unit-tier stand-ins: recording ``JobApi`` fakes (explicit fakes for
``elastic_controller/kube.py``, whose requests the e2e tier makes for real), a fixed forecast map,
a two-node inventory, the jobs they act on, and the helpers that drive the controller's loops
without threads (``make_controller``, ``drain``, ``running_pod``).

Two recorders, for two layers: :class:`Recorder` for a whole ``Controller`` (it keeps the pods
it created so a test can feed them back as watch events), :class:`CallRecorder` for
``reconciler.converge`` alone (every call in order; ``fail`` names the calls that raise)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from elastic_controller import pools
from elastic_controller.controller import Controller, ControllerSettings
from elastic_controller.desired import PodRef
from elastic_controller.metrics import ControllerMetrics
from elastic_controller.planner import Forecast
from elastic_controller.status import EventSpec
from rose_common import names
from rose_common.elasticrljob import ElasticRLJob, ElasticRLJobStatus
from rose_common.slices import GpuInfo, resource_slice
from tests.support.erj_manifests import elastic_rl_job

NOW = dt.datetime(2026, 11, 30, 14, 0, tzinfo=dt.UTC)
RAW_JOB: dict[str, Any] = elastic_rl_job(
    "grpo",
    "rl",
    {"uid": "u-1", "generation": 1, "resourceVersion": "1"},
    minGPUs=2,
    maxGPUs=4,
    gpusPerWorker=1,
    template={"spec": {"containers": [{"name": "t", "image": "t"}]}},
)
# The reconciler's job, parsed: min 1, max 4 GPUs (the converge tests' Desired is built from it).
JOB = ElasticRLJob.model_validate(
    {
        "metadata": {"name": "grpo", "namespace": "rl", "uid": "u-1", "generation": 1},
        "spec": {"minGPUs": 1, "maxGPUs": 4, "template": {"spec": {"containers": [{"name": "t", "image": "t"}]}}},
    }
)


class Recorder:
    """Records every JobApi call; created pods are kept so a test can feed them back as watch events."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.created: list[dict[str, Any]] = []
        self.messages: list[str] = []

    def ensure_claim_template(self, body: dict[str, Any]) -> None:
        self.calls.append(("template", body["metadata"]["name"]))

    def create_pod(self, body: dict[str, Any]) -> None:
        self.calls.append(("create", body["metadata"]["name"]))
        self.created.append(body)

    def delete_pod(self, namespace: str, pod: PodRef) -> None:
        self.calls.append(("delete", pod.name))

    def delete_claim_template(self, namespace: str, name: str, owner_uid: str) -> None:
        self.calls.append(("delete-template", (name, owner_uid)))

    def set_suspend_request(self, namespace: str, pod: PodRef, value: str | None) -> None:
        self.calls.append(("request" if value else "clear", pod.name))

    def annotate_pod(self, namespace: str, pod: PodRef, annotations: dict[str, str]) -> None:
        self.calls.append(("annotate", (pod.name, annotations)))

    def patch_status(self, job: ElasticRLJob, status: ElasticRLJobStatus) -> None:
        self.calls.append(("status", status.target_gpus))

    def record_event(self, job: ElasticRLJob, event: EventSpec) -> None:
        self.calls.append(("event", event.reason))
        self.messages.append(event.message)

    def names(self, kind: str) -> list[Any]:
        return [a for k, a in self.calls if k == kind]


class CallRecorder:
    """Records every call in order; ``fail`` names the calls that raise (as an API error would)."""

    def __init__(self, fail: frozenset[str] = frozenset()) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail = fail

    def _do(self, name: str, arg: Any) -> None:
        self.calls.append((name, arg))
        if name in self.fail:
            raise RuntimeError(f"{name} refused")

    def ensure_claim_template(self, body: dict[str, Any]) -> None:
        self._do("template", body["metadata"]["name"])

    def create_pod(self, body: dict[str, Any]) -> None:
        self._do("create", body["metadata"]["name"])

    def delete_pod(self, namespace: str, pod: PodRef) -> None:
        self._do("delete", (namespace, pod.name, pod.uid))

    def set_suspend_request(self, namespace: str, pod: PodRef, value: str | None) -> None:
        self._do("request" if value is not None else "clear", pod.name)

    def patch_status(self, job: ElasticRLJob, status: ElasticRLJobStatus) -> None:
        self._do("status", status.phase)

    def record_event(self, job: ElasticRLJob, event: EventSpec) -> None:
        self._do("event", event.reason)


class Forecasts:
    """The forecast cache: every pool's upper bound is ``need`` GPUs for the next two hours."""

    def __init__(self, need: float) -> None:
        self.need = need

    def get(self, pool: str) -> Forecast | None:
        return Forecast(start=NOW.timestamp() - 60, step=60, upper=(self.need,) * 120)


def inventory() -> dict[str, int]:
    """Pool ``pool-a``: two nodes of two GPUs each."""
    nodes = [{"metadata": {"name": f"n{i}", "labels": {names.LABEL_POOL: "pool-a"}}} for i in range(2)]
    gpus = [GpuInfo(i, f"GPU-{i}", "sim", 80 << 30) for i in range(4)]
    return pools.capacities(nodes, [resource_slice(f"n{i}", gpus, 1) for i in range(2)])


def make_controller(need: float = 0.0) -> tuple[Controller, Recorder]:
    api = Recorder()
    ctl = Controller(api, Forecasts(need), inventory, ControllerMetrics(), ControllerSettings(), clock=lambda: NOW)
    return ctl, api


def running_pod(body: dict[str, Any], uid: str) -> dict[str, Any]:
    """A created pod as the informer shows it once it runs."""
    return {**body, "metadata": {**body["metadata"], "uid": uid}, "status": {"phase": "Running"}}


def drain(ctl: Controller) -> None:
    """Reconcile every queued key, as the worker threads would."""
    while (key := ctl.queue.get(timeout=0)) is not None:
        ctl.reconcile(key)
        ctl.queue.done(key)


def job_pod(i: int, phase: str = "Running") -> dict[str, Any]:
    """Worker ``grpo-w<i>`` of :data:`JOB` in ``phase``."""
    return {
        "metadata": {"name": f"grpo-w{i}", "uid": f"uid-{i}", "labels": {names.LABEL_JOB: "grpo"}},
        "spec": {},
        "status": {"phase": phase},
    }

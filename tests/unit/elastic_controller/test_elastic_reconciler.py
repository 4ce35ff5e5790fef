"""converge(): the Desired carried out through the JobApi Protocol (a recording fake stands in for kube.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from elastic_controller.desired import PodRef, desired
from elastic_controller.observe import observe
from elastic_controller.planner import JobTarget
from elastic_controller.reconciler import converge
from elastic_controller.status import EventSpec
from rose_common import names
from rose_common.elasticrljob import ElasticRLJob, ElasticRLJobStatus

NOW = datetime(2026, 11, 30, 14, 0, tzinfo=UTC)
JOB = ElasticRLJob.model_validate(
    {
        "metadata": {"name": "grpo", "namespace": "rl", "uid": "u-1", "generation": 1},
        "spec": {"minGPUs": 1, "maxGPUs": 4, "template": {"spec": {"containers": [{"name": "t", "image": "t"}]}}},
    }
)


class Recorder:
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


def _pod(i: int, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": f"grpo-w{i}", "uid": f"uid-{i}", "labels": {names.LABEL_JOB: "grpo"}},
        "spec": {},
        "status": {"phase": phase},
    }


def test_converge_acts_in_order_status_pods_requests_events() -> None:
    ws = [w for w in (observe("grpo", _pod(0)), observe("grpo", _pod(1, "Failed"))) if w is not None]
    t = JobTarget("rl/grpo", 2, suspend=("grpo-w0",), add=("pool-a", "pool-a"), reasons=("Grow: 1 -> 2",))
    api = Recorder()
    assert converge(api, JOB, desired(JOB, ws, t, NOW)) == []
    kinds = [c[0] for c in api.calls]
    assert kinds[:6] == ["status", "template", "create", "create", "delete", "request"]
    assert set(kinds[6:]) == {"event"}
    assert ("create", "grpo-w2") in api.calls and ("delete", ("rl", "grpo-w1", "uid-1")) in api.calls


def test_one_failed_action_does_not_stop_the_others() -> None:
    api = Recorder(fail=frozenset({"create"}))
    failures = converge(api, JOB, desired(JOB, [], JobTarget("rl/grpo", 2, add=("p", "p")), NOW))
    assert [(f.action, f.target) for f in failures] == [("create_pod", "grpo-w0"), ("create_pod", "grpo-w1")]
    assert any(c[0] == "status" for c in api.calls), "status is still written"


def test_a_no_op_reconcile_makes_no_api_call() -> None:
    """Regression (controller_scale benchmark): every plan round reconciles every job, and each
    reconcile POSTed the claim template (409) and PATCHed an unchanged status — two API calls per
    job per round for nothing. The template is only needed when a pod is created."""
    ws = [w for w in (observe("grpo", _pod(i)) for i in range(2)) if w is not None]
    first = desired(JOB, ws, JobTarget("rl/grpo", 2), NOW)
    raw = JOB.model_dump(mode="json", by_alias=True, exclude_none=True)
    raw["status"] = first.status.model_dump(mode="json", exclude_none=True, by_alias=True)
    written = ElasticRLJob.model_validate(raw)  # the job as the informer sees it after the write
    api = Recorder()
    assert converge(api, written, desired(written, ws, None, NOW)) == []
    assert api.calls == []
    converge(api, written, desired(written, ws, JobTarget("rl/grpo", 3, add=("p",)), NOW))
    assert [c[0] for c in api.calls][:3] == ["status", "template", "create"]  # the grow changes the status

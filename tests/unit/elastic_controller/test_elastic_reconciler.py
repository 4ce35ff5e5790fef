"""converge(): the Desired carried out through the JobApi Protocol (a recording fake stands in for kube.py)."""

from __future__ import annotations

from elastic_controller.desired import desired
from elastic_controller.observe import observe
from elastic_controller.planner import JobTarget
from elastic_controller.reconciler import converge
from rose_common.elasticrljob import ElasticRLJob
from tests.support.controller_fakes import JOB, NOW, CallRecorder, job_pod


def test_converge_acts_in_order_status_pods_requests_events() -> None:
    ws = [w for w in (observe("grpo", job_pod(0)), observe("grpo", job_pod(1, "Failed"))) if w is not None]
    t = JobTarget("rl/grpo", 2, suspend=("grpo-w0",), add=("pool-a", "pool-a"), reasons=("Grow: 1 -> 2",))
    api = CallRecorder()
    assert converge(api, JOB, desired(JOB, ws, t, NOW)) == []
    kinds = [c[0] for c in api.calls]
    assert kinds[:6] == ["status", "template", "create", "create", "delete", "request"]
    assert set(kinds[6:]) == {"event"}
    assert ("create", "grpo-w2") in api.calls and ("delete", ("rl", "grpo-w1", "uid-1")) in api.calls


def test_one_failed_action_does_not_stop_the_others() -> None:
    api = CallRecorder(fail=frozenset({"create"}))
    failures = converge(api, JOB, desired(JOB, [], JobTarget("rl/grpo", 2, add=("p", "p")), NOW))
    assert [(f.action, f.target) for f in failures] == [("create_pod", "grpo-w0"), ("create_pod", "grpo-w1")]
    assert any(c[0] == "status" for c in api.calls), "status is still written"


def test_a_no_op_reconcile_makes_no_api_call() -> None:
    """Regression (controller_scale benchmark): every plan round reconciles every job, and each
    reconcile POSTed the claim template (409) and PATCHed an unchanged status — two API calls per
    job per round for nothing. The template is only needed when a pod is created."""
    ws = [w for w in (observe("grpo", job_pod(i)) for i in range(2)) if w is not None]
    first = desired(JOB, ws, JobTarget("rl/grpo", 2), NOW)
    raw = JOB.model_dump(mode="json", by_alias=True, exclude_none=True)
    raw["status"] = first.status.model_dump(mode="json", exclude_none=True, by_alias=True)
    written = ElasticRLJob.model_validate(raw)  # the job as the informer sees it after the write
    api = CallRecorder()
    assert converge(api, written, desired(written, ws, None, NOW)) == []
    assert api.calls == []
    converge(api, written, desired(written, ws, JobTarget("rl/grpo", 3, add=("p",)), NOW))
    assert [c[0] for c in api.calls][:3] == ["status", "template", "create"]  # the grow changes the status

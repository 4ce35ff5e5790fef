"""The extender's suspend requester on its work queue: one write per pod, refusals final,
transient failures retried with backoff (the transport is a recording stand-in for Raw)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from kubernetes import client

from rose_common import names
from rose_common.kube.errors import NotFound, Status
from rose_common.workqueue import Backoff
from scheduler_extender.kube import MAX_SUSPEND_ATTEMPTS, KubeSuspender
from scheduler_extender.model import PodInfo, PodKind


class Recording:
    def __init__(self, fail: list[Exception], gate: threading.Event | None = None) -> None:
        self.fail = fail
        self.gate = gate
        self.calls: list[tuple[str, str, Any]] = []

    def json(self, method: str, path: str, query: Any = None, body: Any = None, content_type: str = "") -> Any:
        if self.gate is not None:
            self.gate.wait(5)
        self.calls.append((method, path, body))
        if self.fail:
            raise self.fail.pop(0)
        return {}


def suspender(raw: Recording) -> tuple[KubeSuspender, list[str]]:
    results: list[str] = []
    s = KubeSuspender(client.ApiClient(client.Configuration()), results.append, backoff=Backoff(0.01, 0.02))
    s._raw = raw  # type: ignore[assignment]
    return s, results


def pod(uid: str = "u-1") -> PodInfo:
    return PodInfo(namespace="ml", name="rl-0", uid=uid, kind=PodKind.RL, grace_s=12)


PREEMPTOR = PodInfo(namespace="ml", name="llm-0", uid="u-llm", kind=PodKind.SERVING, priority=1000)


def wait(cond: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_patch_with_uid_precondition_then_event() -> None:
    raw = Recording([])
    s, results = suspender(raw)
    s.request(pod(), "serving needs the GPU", PREEMPTOR)
    wait(lambda: results)
    s.stop()
    (m1, p1, patch), (m2, p2, event) = raw.calls
    assert (m1, p1, m2, p2) == ("PATCH", "/api/v1/namespaces/ml/pods/rl-0", "POST", "/api/v1/namespaces/ml/events")
    assert patch["metadata"]["uid"] == "u-1"
    req = json.loads(patch["metadata"]["annotations"][names.ANNOTATION_SUSPEND_REQUEST])
    assert req["reason"] == "serving needs the GPU" and req["graceSeconds"] == 12
    assert req["preemptor"] == {"namespace": "ml", "name": "llm-0", "uid": "u-llm"}  # who withdraws it
    assert event["reason"] and results == ["ok"]


def test_requests_for_a_pod_still_queued_collapse_into_the_latest() -> None:
    gate = threading.Event()
    raw = Recording([], gate)
    s, results = suspender(raw)
    s.request(pod("u-0"), "first pod", PREEMPTOR)  # the worker blocks on this one
    wait(lambda: not s.queue.idle() and len(s.queue) == 0)
    for i in range(5):
        s.request(pod(), f"reason {i}", PREEMPTOR)
    gate.set()
    wait(lambda: len(results) == 2)
    s.stop()
    patches = [b for m, _, b in raw.calls if m == "PATCH"]
    assert len(patches) == 2 and results == ["ok", "ok"]
    assert json.loads(patches[1]["metadata"]["annotations"][names.ANNOTATION_SUSPEND_REQUEST])["reason"] == "reason 4"


def test_a_refusal_is_final_and_a_transient_failure_is_retried_a_bounded_number_of_times() -> None:
    raw = Recording([NotFound(Status(404, "NotFound", 'pods "rl-0" not found'))])
    s, results = suspender(raw)
    s.request(pod(), "r", PREEMPTOR)
    wait(lambda: results)
    time.sleep(0.1)
    assert results == ["error"] and len(raw.calls) == 1  # not retried

    raw2 = Recording([ConnectionResetError("api server gone")] * (MAX_SUSPEND_ATTEMPTS + 2))
    s._raw = raw2  # type: ignore[assignment]
    s.request(pod("u-2"), "r", PREEMPTOR)
    wait(lambda: len(results) == 1 + MAX_SUSPEND_ATTEMPTS)
    time.sleep(0.1)
    s.stop()
    assert results[1:] == ["error"] * MAX_SUSPEND_ATTEMPTS and len(raw2.calls) == MAX_SUSPEND_ATTEMPTS


def test_a_full_queue_drops_the_request_and_keeps_nothing_pending() -> None:
    """The queue is bounded and what it refuses leaves no trace: 20 floods cannot build a backlog."""
    gate = threading.Event()
    raw = Recording([], gate=gate)
    s, results = suspender(raw)
    try:
        for i in range(s.queue.max_len + 50):
            s.request(pod(f"u-{i}"), "r", PREEMPTOR)
        assert len(s._pending) <= s.queue.max_len + 1  # +1: the one the blocked worker holds
        assert results.count("error") >= 49
    finally:
        gate.set()
        s.stop()


def test_the_withdrawer_removes_only_its_own_request_once_the_preemptor_is_bound() -> None:
    from datetime import UTC, datetime

    from rose_common import extender_names
    from scheduler_extender.kube import Withdrawer
    from tests.support.extender_fixtures import cluster_cache
    from tests.support.extender_fixtures import pod as pod_json

    ours = json.dumps(
        {
            "by": extender_names.EXTENDER_COMPONENT,
            "at": "2026-01-01T12:00:00Z",
            "preemptor": {"namespace": "ml", "name": "llm-0", "uid": "u-llm"},
        }
    )
    planner = json.dumps({"by": "rose-planner", "at": "2026-01-01T12:00:00Z"})
    cache = cluster_cache(
        {"p": ["n1"]},
        objects=[
            (
                "Pod",
                pod_json(
                    "rl-0",
                    "u-1",
                    ns="ml",
                    node_name="n1",
                    job="j",
                    annotations={names.ANNOTATION_SUSPEND_REQUEST: ours},
                ),
            ),
            (
                "Pod",
                pod_json(
                    "rl-1",
                    "u-2",
                    ns="ml",
                    node_name="n1",
                    job="j",
                    annotations={names.ANNOTATION_SUSPEND_REQUEST: planner},
                ),
            ),
        ],
    )

    class Pods:
        node = ""

        def get(self, namespace: str, name: str) -> PodInfo | None:
            return PodInfo(namespace, name, "u-llm", PodKind.SERVING, priority=1000, node=self.node)

    pods = Pods()
    raw = Recording([])
    reasons: list[str] = []
    w = Withdrawer(client.ApiClient(client.Configuration()), cache, pods, ttl_s=600, on_withdrawn=reasons.append)  # type: ignore[arg-type]
    w._raw = raw  # type: ignore[assignment]
    now = datetime(2026, 1, 1, 12, 1, tzinfo=UTC)
    assert w.sweep(now) == [] and raw.calls == []  # preemptor still pending, TTL not reached
    pods.node = "n1"
    assert w.sweep(now) == [("ml/rl-0", "preemptor-bound")]  # rl-1's request is the planner's
    (m1, p1, patch), (m2, _, event) = raw.calls
    assert (m1, p1, m2) == ("PATCH", "/api/v1/namespaces/ml/pods/rl-0", "POST")
    key = "/metadata/annotations/rose.io~1suspend-request"
    assert patch == [
        {"op": "test", "path": "/metadata/uid", "value": "u-1"},
        {"op": "test", "path": key, "value": ours},
        {"op": "remove", "path": key},
    ]
    assert event["reason"] == "SuspendWithdrawn" and reasons == ["preemptor-bound"]

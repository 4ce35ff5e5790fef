from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from dra_driver.claims import ClaimRef, PodRef
from dra_driver.podwatch import Action, BadSuspendRequestError, PodWatcher, decide, parse_request
from dra_driver.suspend.engine import EngineConfig, NodeSuspendEngine
from dra_driver.suspend.metrics import SuspendMetrics
from dra_driver.suspend.model import Registration
from dra_driver.suspend.simulated import SimulatedBackend
from rose_common import names
from rose_common.informer import InformerSettings
from tests.support.driver_fixtures import NS, StaticClaims, make_claim, make_driver


def pod(ann: dict[str, str] | None = None, job: bool = True, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "namespace": "ml",
        "name": "rl-0",
        "uid": "u",
        "annotations": ann or {},
        "labels": {names.LABEL_JOB: "j"} if job else {},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta}


REQ = '{"by": "extender", "reason": "serving", "graceSeconds": 12, "at": "2026-01-01T00:00:00Z"}'


def test_request_on_rl_pod_suspends_with_its_grace() -> None:
    a = decide(pod({names.ANNOTATION_SUSPEND_REQUEST: REQ}), set())
    assert a == Action("suspend", a.pod, 12.0) and a.pod.uid == "u"  # type: ignore[union-attr]


def test_request_acted_on_is_left_alone_and_withdrawal_resumes() -> None:
    ann = {names.ANNOTATION_SUSPEND_REQUEST: REQ, names.ANNOTATION_SUSPEND_STATE: "Suspended"}
    assert decide(pod(ann), {"u"}) is None
    # a failed suspend (the state stays Suspending) is not retried on every pod event
    failed = {names.ANNOTATION_SUSPEND_REQUEST: REQ, names.ANNOTATION_SUSPEND_STATE: "Suspending"}
    assert decide(pod(failed), {"u"}) is None
    assert decide(pod({names.ANNOTATION_SUSPEND_STATE: "Suspended"}), {"u"}).kind == "resume"  # type: ignore[union-attr]
    assert decide(pod(), set()) is None
    assert decide(pod({names.ANNOTATION_SUSPEND_REQUEST: REQ}, job=False), set()) is None  # serving pods
    assert decide(pod({names.ANNOTATION_SUSPEND_REQUEST: REQ}, deleting=True), set()) is None


@pytest.mark.parametrize(
    ("raw", "frag"),
    [("nope", "not JSON"), ("[1]", "JSON object"), ('{"graceSeconds": -1}', ">= 0"), ('{"graceSeconds": "5"}', ">= 0")],
)
def test_malformed_requests_are_refused_clearly(raw: str, frag: str) -> None:
    with pytest.raises(BadSuspendRequestError, match=frag):
        parse_request(raw)
    assert parse_request("{}") is None


# ------------------------------------------------------------------ a deleted pod's host memory
class OneDeletion:
    """The node's pods as the API server streams them: an empty list, then one watch that delivers
    ``DELETED`` for ``pod`` and ends. Speaks both the informer's requests (``json``/``watch`` by
    path) and the older list/watch pair, so the same test runs against either watcher."""

    def __init__(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        self.stop: Callable[[], None] = lambda: None  # the watcher's stop, once it exists
        self.settings = InformerSettings(kind="Pod", path="/api/v1/pods", field_selector="spec.nodeName=node-a")
        self.watches = 0

    def json(self, method: str, path: str, query: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"metadata": {"resourceVersion": "10"}, "items": []}

    def list(self) -> tuple[list[dict[str, Any]], str]:
        return [], "10"

    def watch(self, *args: Any) -> Iterator[tuple[str, dict[str, Any]]]:
        self.watches += 1
        deleted = copy.deepcopy(self.pod)
        deleted["metadata"]["resourceVersion"] = "11"
        yield "DELETED", deleted
        self.stop()


def test_deleted_suspended_pod_releases_its_host_memory(tmp_path: Path) -> None:
    """Regression (issue 9 §2.2): a pod deleted while suspended kept its host-memory budget until
    the driver restarted, because the pod watch dropped DELETED and nothing called engine.forget."""
    mib = 1 << 20
    engine = NodeSuspendEngine(
        EngineConfig(host_memory_budget_bytes=100 * mib, backends=("simulated",)),
        {"simulated": SimulatedBackend(1e12, sleep=lambda s: None)},
        metrics=SuspendMetrics(CollectorRegistry()),
    )
    engine.register(Registration("pod-rl-0", 4242, 60 * mib, frozenset({"simulated"}), NS, "rl-0", frozenset()))
    rl_pod = {"metadata": {"namespace": NS, "name": "rl-0", "uid": "pod-rl-0", "labels": {names.LABEL_JOB: "j"}}}
    lent = make_claim("uid-l0", "l0", [("gpu", "gpu-0-lendable")], pod=("rl-0", "pod-rl-0"))
    driver = make_driver(tmp_path, StaticClaims([lent], pods=[rl_pod]), engine)
    driver.recover()
    driver.prepare([ClaimRef(NS, "uid-l0", "l0")])
    assert driver.request_suspend(PodRef(NS, "rl-0", "pod-rl-0"), 1.0) == "Suspended"
    assert engine.budget.held_bytes("pod-rl-0") == 60 * mib  # its state sits in host memory

    source = OneDeletion(rl_pod)
    watcher = PodWatcher(source, driver)  # type: ignore[arg-type]
    source.stop = watcher.stop
    t = threading.Thread(target=watcher.run, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive() and source.watches == 1
    assert engine.budget.held_bytes() == 0  # released at once, not at the next driver restart
    assert engine.registry.get("pod-rl-0") is None
    driver.close()

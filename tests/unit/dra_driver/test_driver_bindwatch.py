"""The binding watch's I/O rules (dra_driver/bindwatch.py) with explicit stand-ins: an in-memory
ResourceClaim store in place of the API server (the e2e tier uses the real one) and a recording
node in place of NodeDriver (tests/unit/dra_driver/test_driver_binding.py runs the real one)."""

from __future__ import annotations

import copy
import datetime
from collections.abc import Callable, Iterator
from typing import Any

from dra_driver import binding
from dra_driver.bindwatch import BindingWatcher
from dra_driver.claims import PodRef
from dra_driver.metrics import DriverMetrics
from rose_common import names
from rose_common.kube.errors import Conflict, Status
from tests.support.driver_fixtures import NODE, make_claim


def _serving(uid: str = "uid-s0", rv: str = "7") -> dict[str, Any]:
    c = make_claim(uid, "s0", [("gpu", "gpu-0-serving")], pod=("serve-0", "pod-s0"))
    r = c["status"]["allocation"]["devices"]["results"][0]
    r["bindingConditions"] = [names.BINDING_CONDITION_FREED]
    r["bindingFailureConditions"] = [names.BINDING_CONDITION_FREE_FAILED]
    c["metadata"]["resourceVersion"] = rv
    return c


class ClaimStore:
    """Stands in for the API server's ResourceClaims: GET and the status merge patch, with the
    resourceVersion precondition; ``conflicts`` refuses that many patches first."""

    settings: Any = None  # never listed or watched here: the tests hand the events in

    def __init__(self, claim: dict[str, Any] | None, conflicts: int = 0) -> None:
        self.claim = claim
        self.conflicts = conflicts
        self.patches: list[dict[str, Any]] = []

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.claim)

    def patch_status(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        assert self.claim is not None
        if self.conflicts:
            self.conflicts -= 1
            self.claim["metadata"]["resourceVersion"] = str(int(self.claim["metadata"]["resourceVersion"]) + 1)
            raise Conflict(Status(409, "Conflict", "the object has been modified"))
        assert body["metadata"]["resourceVersion"] == self.claim["metadata"]["resourceVersion"]
        self.patches.append(body)
        self.claim["status"].update(body["status"])

    def json(self, method: str, path: str, query: dict[str, Any] | None = None) -> dict[str, Any]:
        raise AssertionError("not listed here")

    def watch(self, path: str, query: dict[str, Any], timeout_seconds: int) -> Iterator[tuple[str, dict[str, Any]]]:
        raise AssertionError("not watched here")


class RecordingNode:
    def __init__(self, outcome: binding.Outcome) -> None:
        self.outcome = outcome
        self.freed: list[binding.Demand] = []
        self.released: list[str] = []
        self.synced: list[dict[str, frozenset[int]]] = []
        self.held: set[str] = set()

    def free_for_binding(
        self, d: binding.Demand, started: Callable[[list[str]], None] | None = None
    ) -> binding.Outcome:
        self.freed.append(d)
        self.held.add(d.claim_uid)
        if started is not None:
            started(["ml/l0"])
        return self.outcome

    def release_binding(self, claim_uid: str) -> None:
        self.released.append(claim_uid)
        self.held.discard(claim_uid)

    def sync_bindings(self, allocated: dict[str, frozenset[int]]) -> None:
        self.synced.append(allocated)

    def binding_claims(self) -> set[str]:
        return set(self.held)


def _watcher(store: ClaimStore, node: RecordingNode) -> tuple[BindingWatcher, list[tuple[str, str, bool]]]:
    events: list[tuple[str, str, bool]] = []

    def event(p: PodRef, reason: str, message: str, warning: bool) -> None:
        events.append((p.name, reason, warning))

    w = BindingWatcher(
        store,  # type: ignore[arg-type]
        node,
        NODE,
        DriverMetrics([0, 1]),
        event,
        clock=lambda: datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC),
    )
    return w, events


def _drain(w: BindingWatcher) -> None:
    while (key := w.queue.get(timeout=0.1)) is not None:
        try:
            w._work(key)
        finally:
            w.queue.done(key)


def test_an_allocation_is_freed_reported_once_and_told_to_the_pod() -> None:
    store = ClaimStore(_serving(), conflicts=2)
    node = RecordingNode(binding.Outcome(True, binding.REASON_FREED, "reclaimed", 0.2))
    w, events = _watcher(store, node)
    w.on_list([copy.deepcopy(store.claim)])
    assert node.synced == [{"uid-s0": frozenset({0})}]
    _drain(w)
    assert [d.claim_uid for d in node.freed] == ["uid-s0"]
    (patch,) = store.patches  # two conflicts, re-read, written once
    cond = patch["status"]["devices"][0]["conditions"][0]
    assert (cond["type"], cond["reason"]) == (names.BINDING_CONDITION_FREED, "Freed")
    assert events == [("serve-0", names.EVENT_DEVICE_FREEING, False), ("serve-0", names.EVENT_DEVICE_FREED, False)]
    assert w.metrics.binding_total.labels("freed")._value.get() == 1
    w.on_event("MODIFIED", copy.deepcopy(store.claim))  # now reported: nothing owed
    assert w.queue.get(timeout=0.05) is None


def test_a_failure_is_reported_as_the_failure_condition_with_a_warning() -> None:
    store = ClaimStore(_serving())
    node = RecordingNode(binding.Outcome(False, binding.REASON_NOT_FREED, "4096 B resident", 9.0))
    w, events = _watcher(store, node)
    w.on_event("ADDED", copy.deepcopy(store.claim))
    _drain(w)
    cond = store.patches[0]["status"]["devices"][0]["conditions"][0]
    assert (cond["type"], cond["reason"], cond["message"]) == (
        names.BINDING_CONDITION_FREE_FAILED,
        "NotFreed",
        "4096 B resident",
    )
    assert ("serve-0", names.EVENT_DEVICE_NOT_FREED, True) in events
    assert w.metrics.binding_total.labels("failed")._value.get() == 1


def test_a_claim_replaced_or_deallocated_meanwhile_gets_nothing_written() -> None:
    store = ClaimStore(_serving())
    node = RecordingNode(binding.Outcome(True, binding.REASON_FREED, "ok"))
    w, events = _watcher(store, node)
    w.on_event("ADDED", copy.deepcopy(store.claim))
    store.claim = _serving(uid="uid-other")  # deleted and re-created under the name
    _drain(w)
    assert store.patches == [] and not any(r == names.EVENT_DEVICE_FREED for _, r, _ in events)
    # the allocation goes (a failed or timed-out binding): the hold is released
    gone = copy.deepcopy(store.claim)
    gone["metadata"]["uid"] = "uid-s0"
    gone["status"].pop("allocation")
    w.on_event("MODIFIED", gone)
    assert node.released == ["uid-s0"]
    w.on_event("DELETED", _serving(uid="uid-unknown"))  # never held here: nothing to release
    assert node.released == ["uid-s0"]

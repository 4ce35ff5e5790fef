"""Fencing of time-slice hand-overs on the node: the suspend-request path refuses a command whose
``rose.io/fencing-token`` is older than the last one seen for its group, across a driver restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra_driver import fencing
from dra_driver.claims import ClaimRef
from dra_driver.fencebook import FenceBook
from dra_driver.fencing import judge
from dra_driver.node import NodeDriver
from dra_driver.podwatch import BadSuspendRequestError, PodWatcher, decide
from rose_common import names
from rose_common.informer import InformerSettings
from tests.support.driver_fixtures import NS, RecordingEngine, RecordingNotifier, StaticClaims, make_claim, make_driver

REQ = '{"by": "timeslice", "reason": "hand-over", "graceSeconds": 5, "at": "2026-01-01T00:00:00Z"}'


def rl_pod(token: str | None, request: bool) -> dict[str, Any]:
    ann = {names.ANNOTATION_SUSPEND_REQUEST: REQ} if request else {}
    if token is not None:
        ann[names.ANNOTATION_FENCING_TOKEN] = token
    labels = {names.LABEL_JOB: "j", names.LABEL_TIMESLICE_GROUP: "g"}
    return {"metadata": {"namespace": NS, "name": "rl-0", "uid": "pod-rl-0", "labels": labels, "annotations": ann}}


def test_token_format_round_trips_and_bad_ones_are_refused_clearly() -> None:
    assert names.parse_fencing_token(names.fencing_token("ml/grp:a", 7)) == ("ml/grp:a", 7)
    for bad in ("g", "g:", ":3", "g:-1", "g:x"):
        with pytest.raises(ValueError, match="'<group>:<token>'"):
            names.parse_fencing_token(bad)
    with pytest.raises(BadSuspendRequestError, match="fencing-token"):
        decide(rl_pod("g:x", request=True), set())


def test_book_admits_equal_or_newer_and_refuses_older_per_group() -> None:
    book = FenceBook()
    assert book.admit("g:3").ok and book.admit("g:3").ok and book.admit("g:4").ok
    v = book.admit("g:2")
    assert not v.ok and v.last == 4 and "older than 4" in v.message()
    assert book.admit("h:1").ok  # groups are independent
    assert not judge({"g": 9}, "g:8").ok


class NoPods:
    """A pod source that is never listed: the test hands pods to ``PodWatcher.handle`` itself."""

    settings = InformerSettings(kind="Pod", path="/api/v1/pods")


def _driver(tmp: Path, notifier: RecordingNotifier, engine: RecordingEngine) -> NodeDriver:
    lent = make_claim("uid-l0", "l0", [("gpu", "gpu-0-lendable")], pod=("rl-0", "pod-rl-0"))
    d = make_driver(tmp, StaticClaims([lent], pods=[rl_pod(None, False)]), engine, notifier)
    d.recover()
    return d


def test_stale_hand_over_is_refused_on_the_pod_path_even_after_a_restart(tmp_path: Path) -> None:
    notifier, engine = RecordingNotifier(), RecordingEngine()
    d = _driver(tmp_path, notifier, engine)
    assert not d.prepare([ClaimRef(NS, "uid-l0", "l0")])["uid-l0"].error
    w = PodWatcher(NoPods(), d)  # type: ignore[arg-type]
    w.handle(rl_pod("g:5", request=True))  # hand-over 5 suspends this job
    assert engine.states["uid-l0"] == "suspended" and d.held_pods() == {"pod-rl-0"}
    d.close()

    d = _driver(tmp_path, notifier, engine)  # the driver restarts; the book is in its checkpoint
    w = PodWatcher(NoPods(), d)  # type: ignore[arg-type]
    w.handle(rl_pod("g:4", request=False))  # a stale orchestrator tries to resume it
    assert engine.states["uid-l0"] == "suspended" and d.held_pods() == {"pod-rl-0"}
    assert ("rl-0", names.EVENT_FENCING_REJECTED, True) in notifier.events
    assert d.metrics.fencing_rejections_total.labels("pod")._value.get() == 1
    w.handle(rl_pod("g:6", request=False))  # the next hand-over resumes it
    assert engine.states["uid-l0"] == "running" and d.held_pods() == set()
    assert d.snapshot().fences == {"g": 6}
    d.close()


# --- the fence book is bounded and fed only by this node's hand-overs (issue 22, finding 6) ------


def tenant_pod(token: str, group: str | None = "victim", uid: str = "pod-tenant") -> dict[str, Any]:
    """A pod that holds no lent claim on this node, annotated with a forged hand-over."""
    labels = {names.LABEL_JOB: "mine", **({names.LABEL_TIMESLICE_GROUP: group} if group else {})}
    ann = {names.ANNOTATION_SUSPEND_REQUEST: REQ, names.ANNOTATION_FENCING_TOKEN: token}
    return {"metadata": {"namespace": NS, "name": "tenant", "uid": uid, "labels": labels, "annotations": ann}}


def test_a_forged_token_on_a_pod_without_a_claim_here_does_not_move_the_fence(tmp_path: Path) -> None:
    """Finding 6: a tenant pod annotated ``<victim group>:2147483647`` with a suspend request raised
    the node's fence for that group, and every real hand-over after it was refused (also after a
    restart). A pod with no lent claim prepared on this node is no part of a hand-over here."""
    notifier, engine = RecordingNotifier(), RecordingEngine()
    d = _driver(tmp_path, notifier, engine)
    assert not d.prepare([ClaimRef(NS, "uid-l0", "l0")])["uid-l0"].error
    w = PodWatcher(NoPods(), d)  # type: ignore[arg-type]
    w.handle(tenant_pod("g:2147483647", group="g"))
    assert d.snapshot().fences == {}
    assert ("tenant", names.EVENT_FENCING_REJECTED, True) in notifier.events
    w.handle(rl_pod("g:5", request=True))  # the real hand-over still passes
    assert engine.states["uid-l0"] == "suspended" and d.snapshot().fences == {"g": 5}
    d.close()


def test_a_token_for_another_group_than_the_pods_own_is_refused() -> None:
    with pytest.raises(BadSuspendRequestError, match="names group 'victim' but the pod is in group 'g'"):
        decide(rl_pod("victim:9", request=True), set())
    with pytest.raises(BadSuspendRequestError, match="in no time-slice group"):
        decide(tenant_pod("victim:9", group=None), set())


def test_group_names_and_tokens_are_validated() -> None:
    for bad in ("Victim:1", "a/B:1", "a/b/c:1", "/b:1", "-a:1", "a" * 64 + ":1", f"a/{'b' * 64}:1", f"g:{2**63}"):
        with pytest.raises(ValueError, match=r"time-slice group key|exceeds 2"):
            judge({}, bad)
    assert judge({}, f"{'a' * 63}:{2**63 - 1}").ok
    assert judge({}, f"{'a' * 63}/{'b' * 63}:7").ok  # the orchestrator's key: <namespace>/<group>


def test_the_orchestrators_namespaced_token_is_the_pods_own_group_only_in_its_namespace() -> None:
    """The orchestrator writes ``<namespace>/<group>:N`` (timeslice.state.group_key): it is the pod's
    own group when the namespace is the pod's; another namespace's group of the same name is not."""
    action = decide(rl_pod(f"{NS}/g:9", request=True), set())
    assert action is not None and action.fencing_token == f"{NS}/g:9"
    with pytest.raises(BadSuspendRequestError, match="names group 'other-ns/g'"):
        decide(rl_pod("other-ns/g:9", request=True), set())


def test_the_book_is_bounded_and_keeps_groups_in_use() -> None:
    book = FenceBook()
    for i in range(fencing.MAX_GROUPS):
        assert book.admit(f"g{i}:1").ok
    assert book.admit("g0:2").ok  # g0 is now the most recent; g1 the least
    v = book.admit("new:1", in_use={"g2"})
    assert v.ok and v.dropped == "g1" and len(book.last_seen) == fencing.MAX_GROUPS
    v = book.admit("newer:1", in_use={"g3"})
    assert v.ok and v.dropped == "g2"  # in use last time, not now: the least recent goes
    full = book.admit("more:1", in_use=set(book.last_seen))
    assert not full.ok and full.reason == fencing.FULL and "already remembers" in full.message()
    assert "more" not in book.last_seen and len(book.last_seen) == fencing.MAX_GROUPS
    over = {f"x{i}": 1 for i in range(fencing.MAX_GROUPS + 10)}  # a checkpoint written before the cap
    assert fencing.admit(over, "y:1").ok and len(over) == fencing.MAX_GROUPS and "y" in over


def test_the_driver_keeps_the_fences_of_groups_with_a_pod_on_its_node(tmp_path: Path) -> None:
    """The pod watcher tells the driver which groups have a pod here; a flood of new groups (each
    from a pod with a lent claim) drops the others, never those, and the book stays bounded."""
    notifier, engine = RecordingNotifier(), RecordingEngine()
    d = _driver(tmp_path, notifier, engine)
    assert not d.prepare([ClaimRef(NS, "uid-l0", "l0")])["uid-l0"].error
    w = PodWatcher(NoPods(), d)  # type: ignore[arg-type]
    w.on_list([rl_pod(None, False)])  # the worker of group g is on this node
    assert d.admit_fence("g:5", [], "agent").ok
    for i in range(fencing.MAX_GROUPS + 5):
        assert d.admit_fence(f"flood-{i}:1", [], "agent").ok
    fences = d.snapshot().fences
    assert len(fences) == fencing.MAX_GROUPS and fences["g"] == 5
    assert not d.admit_fence("g:4", [], "agent").ok  # g's fence still holds
    w.deleted(rl_pod(None, False))
    assert w.groups_in_use() == frozenset()
    d.close()

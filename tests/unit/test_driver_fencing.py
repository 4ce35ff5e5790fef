"""Fencing of time-slice hand-overs on the node: the suspend-request path refuses a command whose
``rose.io/fencing-token`` is older than the last one seen for its group, across a driver restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from driver_fixtures import NS, RecordingEngine, RecordingNotifier, StaticClaims, make_claim, make_driver

from dra_driver.claims import ClaimRef
from dra_driver.fencing import FenceBook, judge
from dra_driver.node import NodeDriver
from dra_driver.podwatch import BadSuspendRequestError, PodWatcher, decide
from rose_common import names
from rose_common.informer import InformerSettings

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

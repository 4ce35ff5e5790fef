"""A lent claim prepared after its pods' suspend requests came (issue 25, group soak g6).

A time-slice group's shared claim allocated on a GPU serving held was refused at prepare while
serving stayed; meanwhile the orchestrator's hand-overs wrote ``rose.io/suspend-request`` (with
fencing tokens 5 and 7) on both members, which the driver refused (``no-claim``: nothing prepared
here to suspend). Serving left, the claim was prepared with both members bound and both requests
standing, and no pod event came again: on the previous driver both members' workloads were left
running on the shared GPU. Only the holder of the current token may run on a shared claim; a member
carrying a suspend request must be suspended before it may run. The real driver, suspend engine
(simulated backend: there is no GPU here) and pod watcher's decisions; the API server's pods and
claims are the driver fixtures' in-memory ones (as in ``test_driver_member_pods.py``)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from dra_driver import fencing
from dra_driver.claims import ClaimRef
from dra_driver.node import POD_SUSPENDED, NodeDriver
from dra_driver.podwatch import PodWatcher
from dra_driver.suspend.engine import EngineConfig, NodeSuspendEngine
from dra_driver.suspend.metrics import SuspendMetrics
from dra_driver.suspend.simulated import SimulatedBackend
from rose_common import names
from rose_common.informer import InformerSettings
from tests.support.driver_fixtures import NS, RecordingNotifier, StaticClaims, make_claim, make_driver

MIB = 1 << 20
SHARED = make_claim("uid-tsg", "ts-tsg-w0-gpus", [("gpu", "gpu-0-lendable")], pod=("ts-a-w0", "pod-a"))
SHARED["status"]["reservedFor"].append({"resource": "pods", "name": "ts-b-w0", "uid": "pod-b"})
SERVING = make_claim("uid-s0", "serve-0-gpu", [("gpu", "gpu-0-serving")], pod=("serve-0", "pod-s"))
TSG, S0 = ClaimRef(NS, "uid-tsg", "ts-tsg-w0-gpus"), ClaimRef(NS, "uid-s0", "serve-0-gpu")
REQUEST = '{"at": "2026-12-02T08:53:00Z", "by": "timeslice", "reason": "time-slice hand-over"}'


def member(name: str, uid: str, token: int | None, request: bool = True) -> dict[str, Any]:
    ann = {names.ANNOTATION_SUSPEND_REQUEST: REQUEST} if request else {}
    if token is not None:
        ann[names.ANNOTATION_FENCING_TOKEN] = names.fencing_token(f"{NS}/tsg", token)
    job = name.rpartition("-w")[0]
    labels = {names.LABEL_JOB: job, names.LABEL_TIMESLICE_GROUP: "tsg"}
    return {"metadata": {"namespace": NS, "name": name, "uid": uid, "annotations": ann, "labels": labels}}


class NoPods:
    """The watcher's list-watch, unused: these tests hand it the pod events themselves."""

    settings = InformerSettings(kind="Pod", path="/api/v1/pods", field_selector="spec.nodeName=node-a")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[NodeDriver, PodWatcher, StaticClaims, NodeSuspendEngine, RecordingNotifier]]:
    engine = NodeSuspendEngine(
        EngineConfig(host_memory_budget_bytes=100 * MIB, backends=("simulated",), simulated_occupant_bytes=MIB),
        {"simulated": SimulatedBackend(1e12, sleep=lambda s: None)},
        metrics=SuspendMetrics(CollectorRegistry()),
    )
    pods = [member("ts-a-w0", "pod-a", 5), member("ts-b-w0", "pod-b", 7)]
    claims = StaticClaims([copy.deepcopy(SHARED), copy.deepcopy(SERVING)], pods=pods)
    notifier = RecordingNotifier()
    d = make_driver(tmp_path, claims, engine, notifier)
    d.recover()
    watcher = PodWatcher(NoPods(), d)  # type: ignore[arg-type]
    yield d, watcher, claims, engine, notifier
    d.close()


def _serving_held_then_left(d: NodeDriver, watcher: PodWatcher, claims: StaticClaims) -> None:
    """g6's sequence: serving on GPU 0; the shared claim refused; both hand-overs' requests refused
    (nothing prepared here); serving leaves; the shared claim prepared with both members bound."""
    assert not d.prepare([S0])["uid-s0"].error
    assert "serving wins" in d.prepare([TSG])["uid-tsg"].error
    before = d.metrics.fencing_rejections_total.labels("pod")._value.get()
    for key in sorted(claims.pods):  # the orchestrator's hand-overs reach the node: refused, no-claim
        watcher.handle(claims.pods[key])
    assert d.metrics.fencing_rejections_total.labels("pod")._value.get() == before + 2
    assert d.held_pods() == set()
    assert d.unprepare([S0]) == {"uid-s0": ""}
    assert not d.prepare([TSG])["uid-tsg"].error


def test_members_with_standing_requests_are_suspended_at_the_shared_claims_prepare(
    node: tuple[NodeDriver, PodWatcher, StaticClaims, NodeSuspendEngine, RecordingNotifier],
) -> None:
    d, watcher, claims, engine, notifier = node
    _serving_held_then_left(d, watcher, claims)
    # before the prepare returned (so before the kubelet starts them), both parked members are suspended
    assert d.held_pods() == {"pod-a", "pod-b"}
    assert engine.pods_state("uid-tsg", ["pod-a"]) == "suspended"
    assert engine.pods_state("uid-tsg", ["pod-b"]) == "suspended"
    assert ("ts-a-w0", POD_SUSPENDED) in notifier.states and ("ts-b-w0", POD_SUSPENDED) in notifier.states
    # both hand-overs admitted, oldest first: the node's fence is the newest token
    assert d.snapshot().fences == {f"{NS}/tsg": 7}

    # the orchestrator's next grant (token 8) restores ts-b alone: one member runs
    claims.pods[(NS, "ts-b-w0")] = member("ts-b-w0", "pod-b", 8, request=False)
    watcher.handle(claims.pods[(NS, "ts-b-w0")])
    assert engine.pods_state("uid-tsg", ["pod-b"]) == "running"
    assert engine.pods_state("uid-tsg", ["pod-a"]) == "suspended"
    assert d.held_pods() == {"pod-a"}


def test_a_stale_standing_request_is_still_refused(
    node: tuple[NodeDriver, PodWatcher, StaticClaims, NodeSuspendEngine, RecordingNotifier],
) -> None:
    """The replay goes through the same fence: a request older than the node's last token for the
    group (a stale orchestrator's) is refused at the prepare as it would be at any time."""
    d, watcher, claims, _engine, _notifier = node
    assert d.admit_fence(names.fencing_token(f"{NS}/tsg", 9), []).ok  # a newer hand-over seen on this node
    _serving_held_then_left(d, watcher, claims)
    assert d.held_pods() == set()
    assert d.snapshot().fences == {f"{NS}/tsg": 9}
    assert fencing.judge({f"{NS}/tsg": 9}, names.fencing_token(f"{NS}/tsg", 7)).reason == fencing.STALE


def test_a_claim_prepared_with_no_standing_request_runs_its_members(
    node: tuple[NodeDriver, PodWatcher, StaticClaims, NodeSuspendEngine, RecordingNotifier],
) -> None:
    d, _watcher, claims, engine, _notifier = node
    for key in list(claims.pods):
        meta = claims.pods[key]["metadata"]
        claims.pods[key] = member(meta["name"], meta["uid"], None, request=False)
    assert not d.prepare([TSG])["uid-tsg"].error
    assert d.held_pods() == set() and engine.pods_state("uid-tsg", None) != "suspended"

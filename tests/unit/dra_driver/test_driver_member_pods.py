"""A time-slice group member reserved in the shared claim after its first prepare (soak finding
T6): the kubelet does not prepare a prepared claim again, so the driver reads the claim's
``reservedFor`` afresh when a pod it does not know asks for a hand-over or a suspend."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver import fencing
from dra_driver.claims import ClaimRef, PodRef
from dra_driver.node import POD_SUSPENDED, NodeDriver
from tests.support.driver_fixtures import NS, RecordingEngine, StaticClaims, make_claim, make_driver

SHARED = make_claim("uid-tsg", "tsg-gpus", [("gpu", "gpu-0-lendable")], pod=("ts-a-w0", "pod-a"))
REF = ClaimRef(NS, "uid-tsg", "tsg-gpus")
A, B = PodRef(NS, "ts-a-w0", "pod-a"), PodRef(NS, "ts-b-w0", "pod-b")


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[NodeDriver, StaticClaims]]:
    claims = StaticClaims([copy.deepcopy(SHARED)])
    d = make_driver(tmp_path, claims, RecordingEngine())
    d.recover()
    assert not d.prepare([REF])["uid-tsg"].error  # the first member's prepare: the record has pod-a
    yield d, claims
    d.close()


def _reserve(claims: StaticClaims, *pods: PodRef) -> None:
    claims.claims[(NS, "tsg-gpus")]["status"]["reservedFor"] = [
        {"resource": "pods", "name": p.name, "uid": p.uid} for p in pods
    ]


def test_a_member_reserved_later_is_admitted_for_a_hand_over(env: tuple[NodeDriver, StaticClaims]) -> None:
    d, claims = env
    assert d.admit_fence("ml/tsg:1", [A]).ok
    v = d.admit_fence("ml/tsg:2", [B])  # not reserved (yet): not part of a hand-over here
    assert not v.ok and v.reason == fencing.NO_CLAIM
    _reserve(claims, A, B)  # the scheduler reserved the claim for the later member
    assert d.admit_fence("ml/tsg:2", [B]).ok
    assert [p.uid for p in d.snapshot().claims["uid-tsg"].pods] == ["pod-a", "pod-b"]  # kept in the checkpoint


def test_a_member_reserved_later_can_be_suspended_and_no_pod_is_dropped(env: tuple[NodeDriver, StaticClaims]) -> None:
    d, claims = env
    _reserve(claims, B)  # pod-a left the reservation; pod-b joined
    assert d.request_suspend(B, 1.0) == POD_SUSPENDED
    assert [p.uid for p in d.snapshot().claims["uid-tsg"].pods] == ["pod-a", "pod-b"]
    assert d.cancel_suspend(B)  # its hold is released through the same record


def test_an_unreadable_claim_keeps_its_pods(env: tuple[NodeDriver, StaticClaims]) -> None:
    d, claims = env
    claims.claims.clear()  # the API no longer has it
    assert not d.admit_fence("ml/tsg:1", [B]).ok
    assert [p.uid for p in d.snapshot().claims["uid-tsg"].pods] == ["pod-a"]

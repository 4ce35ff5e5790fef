"""Where Events about lent occupants go (the claim records' pods, never a reported name) and what
an eviction's Event says (dra_driver.suspend.events.event_pods, dra_driver.evictions)."""

from __future__ import annotations

import pytest

from dra_driver.claims import PodRef
from dra_driver.evictions import STATE_LOST, STATE_SAVED, ReportingEvictor, eviction_message, eviction_state
from dra_driver.metrics import DriverMetrics
from dra_driver.suspend.events import event_pods
from dra_driver.suspend.model import stand_in_claim, stand_in_pod_uid

A = PodRef("rl", "w-0", "uid-a")
B = PodRef("rl", "w-1", "uid-b")
C = PodRef("other", "x", "uid-c")
CLAIMS = {"claim-1": (A, B), "claim-2": (C,), "claim-empty": ()}


@pytest.mark.parametrize(
    ("pod_uid", "want"),
    [
        ("uid-b", [B]),  # a registered pod: that pod only
        ("uid-c", [C]),
        (stand_in_pod_uid("claim-1"), [A, B]),  # the claim's simulated stand-in: its reservedFor pods
        (stand_in_pod_uid("claim-2"), [C]),
        (stand_in_pod_uid("claim-empty"), []),  # no pod bound: logged only
        (stand_in_pod_uid("claim-gone"), []),  # no record of the claim
        ("uid-unknown", []),  # a pod no claim lists: whatever it reported, no Event
        ("", []),
    ],
)
def test_engine_events_go_to_the_claim_records_pods(pod_uid: str, want: list[PodRef]) -> None:
    assert event_pods(pod_uid, CLAIMS) == want


def test_stand_in_names_round_trip() -> None:
    assert stand_in_pod_uid("c-9") == "simulated-claim-c-9"
    assert stand_in_claim("simulated-claim-c-9") == "c-9"
    assert stand_in_claim("c-9") is None
    assert stand_in_claim("") is None


def test_eviction_message_says_why_and_what_became_of_the_state() -> None:
    lost = eviction_message("cooperative suspend failed (failed): suspend refused: budget full", saved=False)
    saved = eviction_message("fallback: durable checkpoint /ckpt/a verified", saved=True)
    assert "suspend refused: budget full" in lost and "state was lost" in lost and "saved" not in lost
    assert "/ckpt/a" in saved and "saved by its SDK durable checkpoint" in saved and "lost" not in saved
    assert (eviction_state(False), eviction_state(True)) == (STATE_LOST, STATE_SAVED)


class _Pods:
    """Records what reaches the API boundary: evictions and Events (the driver's KubeEvictor and
    KubeNotifier are exercised against a real API server in test_driver_evict_event_e2e.py)."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.evicted: list[PodRef] = []
        self.events: list[tuple[PodRef, str, bool]] = []

    def evict(self, pod: PodRef, reason: str) -> None:
        if self.refuse:
            raise RuntimeError("409 Conflict: the UID precondition failed")
        self.evicted.append(pod)

    def event(self, pod: PodRef, reason: str, message: str, warning: bool) -> None:
        self.events.append((pod, reason, warning))


def test_engine_evictions_are_reported_saved_and_failed_ones_not_at_all() -> None:
    metrics = DriverMetrics([0])
    api = _Pods()
    ev = ReportingEvictor(api, api, metrics.count_lent_eviction)
    ev.evict(A, "fallback: durable checkpoint /ckpt/a verified")
    assert api.evicted == [A] and api.events == [(A, "LentWorkloadEvicted", True)]
    refused = _Pods(refuse=True)
    with pytest.raises(RuntimeError):
        ReportingEvictor(refused, refused, metrics.count_lent_eviction).evict(B, "fallback")
    assert refused.events == []
    count = metrics.lent_evictions_total.labels
    assert (count(STATE_SAVED)._value.get(), count(STATE_LOST)._value.get()) == (1, 0)

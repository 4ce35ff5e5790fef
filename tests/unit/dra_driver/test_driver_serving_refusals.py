"""A lent claim refused because serving holds its GPU (dra_driver/refusals.py): counted every
time, told once per (claim, serving claim) on its pods, told again after the claim was unprepared."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.claims import ClaimRef, PodRef
from dra_driver.node import NodeDriver
from dra_driver.refusals import EVENT_LENT_PREPARE_REFUSED, RefusalBook, ServingHoldsError, event_message
from tests.support.driver_fixtures import NS, RecordingEngine, RecordingNotifier, StaticClaims, make_claim, make_driver

L0 = make_claim("uid-l0", "l0", [("gpu", "gpu-0-lendable")], pod=("rl-0", "pod-rl-0"))
S0 = make_claim("uid-s0", "s0", [("gpu", "gpu-0-serving")], pod=("serve-0", "pod-serve-0"))
S0B = make_claim("uid-s0b", "s0b", [("gpu", "gpu-0-serving")], pod=("serve-1", "pod-serve-1"))


def ref(c: dict[str, Any]) -> ClaimRef:
    return ClaimRef(NS, c["metadata"]["uid"], c["metadata"]["name"])


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[NodeDriver, RecordingNotifier]]:
    notifier = RecordingNotifier()
    d = make_driver(tmp_path, StaticClaims([L0, S0, S0B]), RecordingEngine(), notifier)
    d.recover()
    yield d, notifier
    d.close()


def _refused(d: NodeDriver) -> float:
    return float(d.metrics.lent_prepare_refused_total._value.get())


def test_book_tells_each_pair_once_and_forgets_the_oldest_past_its_limit() -> None:
    book = RefusalBook(limit=2)
    assert book.first("a", "ns/s") and not book.first("a", "ns/s")
    assert book.first("a", "ns/t")  # another serving claim on it: news
    assert book.first("b", "ns/s")  # the third pair: ("a", "ns/s") forgotten
    assert book.first("a", "ns/s")
    book.forget("a")
    assert book.first("a", "ns/t")
    with pytest.raises(ValueError, match="at least 1"):
        RefusalBook(limit=0)


def test_event_message_names_the_claim_gpu_node_and_serving_claim() -> None:
    e = ServingHoldsError("x", 3, "ml/serve-a", (PodRef(NS, "rl-0", "u"),))
    msg = event_message("ml/l0", "node-a", e)
    assert "ResourceClaim ml/l0" in msg and "GPU 3 of node-a" in msg and "serving claim ml/serve-a" in msg


def test_a_refused_lent_prepare_is_counted_each_time_and_told_once(
    env: tuple[NodeDriver, RecordingNotifier],
) -> None:
    d, notifier = env
    assert not d.prepare([ref(S0)])["uid-s0"].error
    for _ in range(4):  # the kubelet retries
        err = d.prepare([ref(L0)])["uid-l0"].error
        assert "held by serving claim ml/s0" in err and "serving wins" in err
    assert _refused(d) == 4
    assert [e for e in notifier.events if e[1] == EVENT_LENT_PREPARE_REFUSED] == [
        ("rl-0", EVENT_LENT_PREPARE_REFUSED, True)
    ]
    # the kubelet gives up on the claim (its pod went): a later refusal of it is news again
    assert d.unprepare([ref(L0)]) == {"uid-l0": ""}
    d.prepare([ref(L0)])
    assert [e[1] for e in notifier.events].count(EVENT_LENT_PREPARE_REFUSED) == 2
    assert _refused(d) == 5


def test_serving_gone_the_refused_claim_prepares_and_no_refusal_is_counted(
    env: tuple[NodeDriver, RecordingNotifier],
) -> None:
    d, notifier = env
    assert not d.prepare([ref(S0)])["uid-s0"].error
    assert d.prepare([ref(L0)])["uid-l0"].error
    assert d.unprepare([ref(S0)]) == {"uid-s0": ""}
    assert not d.prepare([ref(L0)])["uid-l0"].error
    assert _refused(d) == 1
    assert [e[1] for e in notifier.events].count(EVENT_LENT_PREPARE_REFUSED) == 1

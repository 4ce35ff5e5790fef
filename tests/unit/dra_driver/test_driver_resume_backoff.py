"""A resume that keeps failing is retried with a growing delay (docs/bench/soak.md, T5).

In the soak the trainer's process had ended while the driver held its GPU for serving; when
serving left, its resume failed (``no workload registered for claim``) and the repair loop
retried it on every pass (~2 s), forever: the pod's suspend state flipped Resuming -> Suspended
with a ResumeFailed Event each time. The node driver runs with the recording engine's failing
resume and a test clock; the repair loop runs every 2 s of that clock."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from dra_driver.claims import ClaimRef, PodRef
from dra_driver.node import NodeDriver
from rose_common.workqueue import Backoff
from tests.support.driver_fixtures import NS, RecordingEngine, StaticClaims, make_claim, make_driver

L0 = make_claim("uid-l0", "l0", [("gpu", "gpu-0-lendable")], pod=("rl-0", "pod-rl-0"))
S0 = make_claim("uid-s0", "s0", [("gpu", "gpu-0-serving")], pod=("serve-0", "pod-serve-0"))


@dataclass
class Notes:
    """The driver's Notifier, keeping each Event's message."""

    events: list[tuple[str, str]] = field(default_factory=list)

    def suspend_state(self, pod: PodRef, state: str, message: str) -> None:
        return None

    def event(self, pod: PodRef, reason: str, message: str, warning: bool) -> None:
        self.events.append((reason, message))


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _ref(c: dict) -> ClaimRef:  # type: ignore[type-arg]
    return ClaimRef(NS, c["metadata"]["uid"], c["metadata"]["name"])


def _driver(tmp: Path) -> tuple[NodeDriver, RecordingEngine, Notes, Clock]:
    engine, notes, clock = RecordingEngine(), Notes(), Clock()
    d = make_driver(tmp, StaticClaims([L0, S0]), engine, notes, resume_backoff=Backoff(2.0, 60.0), clock=clock)
    d.recover()
    assert not d.prepare([_ref(L0)])["uid-l0"].error
    assert not d.prepare([_ref(S0)])["uid-s0"].error  # serving takes the GPU: the occupant is suspended
    return d, engine, notes, clock


def _resumes(engine: RecordingEngine) -> int:
    return sum(1 for c in engine.calls if c[0] == "resume")


def test_a_failing_resume_is_retried_with_a_growing_delay_and_says_when(tmp_path: Path) -> None:
    d, engine, notes, clock = _driver(tmp_path)
    engine.fail_resume = True  # the workload is gone: "no workload registered for claim"
    assert d.unprepare([_ref(S0)]) == {"uid-s0": ""}  # serving leaves: the first resume fails
    tries = [clock.t]
    for _ in range(150):  # five minutes of repair passes, every 2 s
        clock.t += 2.0
        before = _resumes(engine)
        d.reconcile()
        if _resumes(engine) > before:
            tries.append(clock.t)
    gaps = [round(b - a) for a, b in itertools.pairwise(tries)]
    assert gaps[:6] == [2, 2, 4, 8, 16, 32]  # the next pass, then the backoff's delays
    assert set(gaps[6:]) == {60}  # at most a minute apart
    assert len(tries) <= 11  # was 151: one a pass
    failed = [m for r, m in notes.events if r == "ResumeFailed"]
    assert len(failed) == len(tries)
    assert failed[0].endswith("retried at the next repair pass (failure 1)")
    assert failed[2].endswith("retried in 4s (failure 3)")
    assert d.snapshot().suspensions["uid-l0"].held_by == []  # still kept: its state may be in host memory


def test_a_resume_that_works_at_last_clears_the_backoff(tmp_path: Path) -> None:
    d, engine, _, clock = _driver(tmp_path)
    engine.fail_resume = True
    d.unprepare([_ref(S0)])
    for _ in range(10):
        clock.t += 2.0
        d.reconcile()
    engine.fail_resume = False  # the workload registered again
    for _ in range(31):  # within the longest delay
        clock.t += 2.0
        d.reconcile()
    assert d.snapshot().suspensions == {}
    assert engine.calls[-1][0] == "resume"
    # serving comes and goes again: that occupant's next failed resume starts from the first delay
    assert not d.prepare([_ref(S0)])["uid-s0"].error
    engine.fail_resume = True
    d.unprepare([_ref(S0)])
    clock.t += 2.0
    before = _resumes(engine)
    d.reconcile()
    assert _resumes(engine) == before + 1

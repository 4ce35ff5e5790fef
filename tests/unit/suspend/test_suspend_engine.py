"""The suspend engine's decisions with in-process backends (no network, no GPU)."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from dra_driver.engine_api import ClaimBinder, SuspendEngine, SuspendResult
from dra_driver.suspend.budget import HostMemoryBudget, fits
from dra_driver.suspend.cooperative import CooperativeBackend
from dra_driver.suspend.engine import (
    EngineConfig,
    NodeSuspendEngine,
    UnknownOccupantError,
    choose_backend,
    occupant_state_of,
)
from dra_driver.suspend.events import RecordingEventSink
from dra_driver.suspend.metrics import SuspendMetrics
from dra_driver.suspend.model import Ack, BackendOutcome, OpContext, Registration
from dra_driver.suspend.registry import (
    ClaimScope,
    RegistrationError,
    TrustedPod,
    Workload,
    validate_registration,
)
from dra_driver.suspend.simulated import SimulatedBackend, transfer_seconds
from dra_driver.suspend.verify import CheckpointVerifier, StaticCheckpointPaths

MiB = 1 << 20


def reg(
    uid: str = "pod-a",
    nbytes: int = 10 * MiB,
    backends: tuple[str, ...] = ("simulated",),
    claims: tuple[str, ...] = ("claim-a",),
) -> Registration:
    return Registration(uid, 4242, nbytes, frozenset(backends), "rl", uid, frozenset(claims))


def sim_engine(budget: int = 100 * MiB, **cfg: object) -> tuple[NodeSuspendEngine, RecordingEventSink, list[float]]:
    slept: list[float] = []
    events = RecordingEventSink()
    config = EngineConfig(host_memory_budget_bytes=budget, backends=("simulated",), **cfg)  # type: ignore[arg-type]
    eng = NodeSuspendEngine(
        config,
        {"simulated": SimulatedBackend(1e9, sleep=slept.append)},
        events=events,
        metrics=SuspendMetrics(CollectorRegistry()),
    )
    return eng, events, slept


def test_engine_satisfies_the_driver_protocol() -> None:
    eng, _, _ = sim_engine()
    e: SuspendEngine = eng  # mypy checks the structural match
    assert callable(e.suspend) and callable(e.resume) and callable(e.occupant_state)
    assert isinstance(eng, ClaimBinder)  # the driver binds claims to pods only when this holds


def test_pure_decisions() -> None:
    assert choose_backend({"cooperative", "cuda-checkpoint"}, ("cuda-checkpoint", "cooperative")) == "cuda-checkpoint"
    assert choose_backend({"cooperative"}, ("cuda-checkpoint",)) is None
    assert occupant_state_of("Suspended") == "suspended" and occupant_state_of("Suspending") == "running"
    assert fits(10, 4, 6) and not fits(10, 4, 7)
    with pytest.raises(ValueError, match=">= 0"):
        fits(10, 0, -1)
    assert transfer_seconds(55_000_000_000, 55e9) == pytest.approx(1.0)


def test_budget_ledger() -> None:
    b = HostMemoryBudget(100)
    assert b.try_reserve("a", 60) and not b.try_reserve("b", 50) and b.try_reserve("b", 40)
    assert b.try_reserve("a", 60)  # re-reserving replaces, does not double count
    assert b.held_bytes() == 100
    b.force("c", 10)  # existing state after a restart is recorded even past the budget
    assert b.held_bytes() == 110 and b.release("a") == 60 and b.held_bytes("b") == 40


def test_suspend_resume_idempotent_with_simulated_timings() -> None:
    eng, events, slept = sim_engine()
    eng.register(reg())
    assert eng.occupant_state("claim-a") == "running"
    r = eng.suspend("claim-a", grace_seconds=5)
    assert r == SuspendResult(True, "simulated", 10 * MiB, r.seconds, None, r.message)
    assert slept == [pytest.approx(10 * MiB / 1e9)]
    assert eng.occupant_state("claim-a") == "suspended"
    assert eng.budget.held_bytes() == 10 * MiB
    again = eng.suspend("claim-a", 5)
    assert again.ok and again.bytes_moved == 0 and "already" in again.message
    back = eng.resume("claim-a")
    assert back.ok and back.bytes_moved == 10 * MiB and eng.budget.held_bytes() == 0
    assert eng.resume("claim-a").bytes_moved == 0
    assert events.reasons() == ["Suspended", "Resumed"]
    m = eng.metrics
    assert m.moved_bytes.labels("simulated", "to_host")._value.get() == 10 * MiB
    assert m.operations.labels("suspend", "simulated", "ok")._value.get() == 1


def test_simulated_move_longer_than_grace_times_out() -> None:
    eng, events, _ = sim_engine(budget=20_000 * MiB)
    eng.register(reg(nbytes=10_000 * MiB))  # 10.5 s at 1 GB/s
    r = eng.suspend("claim-a", grace_seconds=1)
    assert not r.ok and r.fallback == "checkpoint-evict"
    assert "no SDK checkpoint channel" in r.message and "did not evict" in r.message
    assert eng.occupant_state("claim-a") == "running" and eng.budget.held_bytes() == 0
    assert events.reasons() == ["SuspendFailed", "SuspendFallbackCheckpointFailed"]
    assert eng.metrics.fallbacks.labels("deadline_exceeded")._value.get() == 1


def test_budget_refusal_moves_nothing() -> None:
    eng, _, slept = sim_engine(budget=MiB)
    eng.register(reg())
    r = eng.suspend("claim-a", 5)
    assert not r.ok and r.fallback == "checkpoint-evict" and "host-memory budget" in r.message
    assert slept == [] and eng.budget.held_bytes() == 0
    assert eng.metrics.fallbacks.labels("host_memory_budget")._value.get() == 1


def test_unknown_claim_and_pod() -> None:
    eng, _, _ = sim_engine()
    r = eng.suspend("nope", 1)
    assert not r.ok and r.backend == "none" and "no workload registered for claim nope" in r.message
    assert eng.occupant_state("nope") == "unknown"
    assert not eng.resume("nope").ok
    with pytest.raises(UnknownOccupantError, match="pod UID 'ghost'"):
        eng.suspend_pod("ghost", 1)


def test_simulated_occupant_for_unregistered_claims_only_when_configured() -> None:
    eng, _, _ = sim_engine(simulated_occupant_bytes=2 * MiB)
    r = eng.suspend("kwok-claim", 5)
    assert r.ok and r.backend == "simulated" and r.bytes_moved == 2 * MiB
    assert eng.occupant_state("kwok-claim") == "suspended"
    assert eng.resume("kwok-claim").ok and eng.occupant_state("kwok-claim") == "running"


def test_a_bound_claims_simulated_occupant_is_one_and_stays_one() -> None:
    eng, _, _ = sim_engine(simulated_occupant_bytes=2 * MiB)
    eng.bind_claim("kwok-claim", "pod-w0")  # the driver binds reservedFor; nothing registers on KWOK
    for _ in range(2):
        r = eng.suspend("kwok-claim", 5)
        assert r.ok and r.bytes_moved in (0, 2 * MiB)
        assert eng.occupant_state("kwok-claim") == "suspended"
        assert eng.resume("kwok-claim").ok
        assert eng.occupant_state("kwok-claim") == "running"
    assert [w.pod_uid for w in eng.registry.all()] == ["simulated-claim-kwok-claim"]
    assert eng.budget.held_bytes() == 0


def test_shared_claim_members_are_simulated_one_each() -> None:
    eng, _, _ = sim_engine(simulated_occupant_bytes=2 * MiB)
    eng.bind_claim("ts-claim", "pod-a")
    eng.bind_claim("ts-claim", "pod-b")
    assert eng.suspend_pods("ts-claim", ["pod-b"], 5).bytes_moved == 2 * MiB  # b parked
    assert eng.pods_state("ts-claim", ["pod-b"]) == "suspended" and eng.occupant_state("ts-claim") == "running"
    r = eng.suspend("ts-claim", 5)  # serving: a moves, b is already off the GPU
    assert r.ok and r.bytes_moved == 2 * MiB and eng.occupant_state("ts-claim") == "suspended"
    assert eng.resume_pods("ts-claim", ["pod-a"]).ok
    assert eng.pods_state("ts-claim", ["pod-a"]) == "running" and eng.pods_state("ts-claim", ["pod-b"]) == "suspended"
    assert sorted(w.pod_uid for w in eng.registry.all()) == ["pod-a", "pod-b"]


def test_bind_claim_maps_a_claim_to_a_pod() -> None:
    eng, _, _ = sim_engine()
    eng.register(reg(claims=()))
    assert eng.occupant_state("late-claim") == "unknown"
    eng.bind_claim("late-claim", "pod-a")
    assert eng.suspend("late-claim", 5).ok


def test_metrics_series_start_at_zero() -> None:
    eng, _, _ = sim_engine()
    text = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for mf in eng.metrics.registry.collect() for s in mf.samples
    }
    for b in ("cuda-checkpoint", "cooperative", "simulated"):
        assert text[("rose_suspend_duration_seconds_count", (("backend", b),))] == 0
        assert text[("rose_resume_duration_seconds_count", (("backend", b),))] == 0
        assert text[("rose_suspend_moved_bytes_total", (("backend", b), ("direction", "to_host")))] == 0
    assert text[("rose_suspend_host_memory_held_bytes", ())] == 0
    assert text[("rose_suspend_host_memory_budget_bytes", ())] == 100 * MiB
    assert text[("rose_suspend_fallbacks_total", (("reason", "host_memory_budget"),))] == 0


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        (Registration("", 1, 0, frozenset({"cooperative"})), "pod_uid"),
        (Registration("u", 0, 0, frozenset({"cooperative"})), "pid must be"),
        (Registration("u", 1, -1, frozenset({"cooperative"})), "state_bytes"),
        (Registration("u", 1, 0, frozenset()), "supported_backends"),
        (Registration("u", 1, 0, frozenset({"magic"})), "unknown backend"),
        (Registration("u", 1, 0, frozenset({"cooperative"}), current_state="Resuming"), "current_state"),
    ],
)
def test_malformed_registration(bad: Registration, needle: str) -> None:
    with pytest.raises(RegistrationError, match=needle):
        validate_registration(bad)


def test_config_errors_say_what_to_fix() -> None:
    with pytest.raises(ValueError, match="unknown suspend backend"):
        EngineConfig(host_memory_budget_bytes=1, backends=("gpu-magic",))
    with pytest.raises(ValueError, match="backend instance"):
        NodeSuspendEngine(EngineConfig(host_memory_budget_bytes=1, backends=("simulated",)), {})


# ---------------------------------------------------------------- cooperative, in-process workload


def play_workload(eng: NodeSuspendEngine, w: Workload, answer: Callable[[str], Ack | None]) -> threading.Thread:
    def run() -> None:
        while True:
            cmd = w.commands.get()
            if cmd is None:
                return
            ack = answer(cmd.kind)
            if ack is not None:
                eng.acknowledge(
                    w.pod_uid,
                    w.session_id,
                    Ack(
                        cmd.operation_id,
                        ack.ok,
                        ack.bytes_moved,
                        message=ack.message,
                        checkpoint_path=ack.checkpoint_path,
                        checkpoint_sha256=ack.checkpoint_sha256,
                    ),
                    w.scope,
                )

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.fixture
def coop() -> Iterator[tuple[NodeSuspendEngine, RecordingEventSink]]:
    events = RecordingEventSink()
    eng = NodeSuspendEngine(
        EngineConfig(host_memory_budget_bytes=100 * MiB, backends=("cooperative",), checkpoint_timeout_seconds=2),
        {"cooperative": CooperativeBackend()},
        events=events,
        metrics=SuspendMetrics(CollectorRegistry()),
    )
    yield eng, events
    for w in eng.registry.all():
        w.commands.put(None)


def test_cooperative_round_trip(coop: tuple[NodeSuspendEngine, RecordingEventSink]) -> None:
    eng, events = coop
    w = eng.register(reg(backends=("cooperative",)))
    play_workload(eng, w, lambda k: Ack("", True, 7 * MiB))
    r = eng.suspend("claim-a", 2)
    assert r.ok and r.backend == "cooperative" and r.bytes_moved == 7 * MiB
    assert eng.budget.held_bytes() == 10 * MiB  # accounted at the registered size (the larger)
    assert eng.resume("claim-a").ok and eng.budget.held_bytes() == 0
    assert events.reasons() == ["Suspended", "Resumed"]


def test_cooperative_refusal_then_checkpoint(
    coop: tuple[NodeSuspendEngine, RecordingEventSink], tmp_path: Path
) -> None:
    eng, events = coop
    scope = ClaimScope("claim-a", (TrustedPod("rl", "pod-a", "pod-a"),), 1 << 30)
    w = eng.register(reg(backends=("cooperative",)), scope)
    # the pod's job checkpoints under tmp_path; its process is this test's (same root)
    paths = StaticCheckpointPaths(default=str(tmp_path))
    eng.verifier = CheckpointVerifier(paths=paths, resolve_pid=lambda u, p: os.getpid())
    ckpt, digest = tmp_path / "x.rose", hashlib.sha256(b"state").hexdigest()
    ckpt.write_bytes(b"ROSECKPT1\n" + digest.encode() + b"\nstate")  # rose_sdk.checkpoint's layout
    answers = {
        "suspend": Ack("", False, message="out of pinned memory"),
        "checkpoint": Ack("", True, 123, checkpoint_path=str(ckpt), checkpoint_sha256=digest),
    }
    play_workload(eng, w, lambda k: answers[k])
    r = eng.suspend("claim-a", 2)
    assert r.ok and r.fallback == "checkpoint-evict" and str(ckpt) in r.message
    assert "out of pinned memory" in r.message and "caller must evict" in r.message
    assert eng.occupant_state("claim-a") == "suspended"  # off the GPU, in its durable checkpoint
    res = eng.resume("claim-a")
    assert not res.ok and "restart it from its durable checkpoint" in res.message
    assert events.reasons() == ["SuspendFailed", "SuspendFallbackCheckpoint"]


def test_failed_resume_keeps_state(coop: tuple[NodeSuspendEngine, RecordingEventSink]) -> None:
    eng, events = coop
    w = eng.register(reg(backends=("cooperative",)))
    fail = {"resume": True}
    play_workload(eng, w, lambda k: Ack("", not (k == "resume" and fail["resume"]), 5, message="device OOM"))
    assert eng.suspend("claim-a", 2).ok
    bad = eng.resume("claim-a")
    assert not bad.ok and "state kept in host memory" in bad.message
    assert eng.occupant_state("claim-a") == "suspended" and eng.budget.held_bytes() == 10 * MiB
    fail["resume"] = False
    assert eng.resume("claim-a").ok and eng.budget.held_bytes() == 0
    assert events.reasons() == ["Suspended", "ResumeFailed", "Resumed"]


def test_reregistration_as_suspended_is_remembered(coop: tuple[NodeSuspendEngine, RecordingEventSink]) -> None:
    eng, _ = coop
    r = Registration("pod-a", 9, 3 * MiB, frozenset({"cooperative"}), current_state="Suspended")
    eng.register(replace(r, pod_uid="pod-unscoped"))  # a shared socket: its size is not counted
    assert eng.budget.held_bytes() == 0
    eng.register(r, ClaimScope("c", (TrustedPod("rl", "a", "pod-a"),), 80 * 1024 * MiB))
    assert eng.occupant_state("c") == "suspended" and eng.budget.held_bytes() == 3 * MiB
    w = eng.registry.get("pod-a")
    assert w is not None
    play_workload(eng, w, lambda k: Ack("", True, 3 * MiB))
    assert eng.resume("c").ok and eng.budget.held_bytes() == 0


def test_a_registration_as_suspended_does_not_skip_the_command(
    coop: tuple[NodeSuspendEngine, RecordingEventSink],
) -> None:
    """Its current_state is a hint (issue 22 finding 1): the engine still sends SUSPEND, and only a
    suspend the engine itself ran makes the next one a no-op."""
    eng, _ = coop
    r = Registration("pod-a", 9, 3 * MiB, frozenset({"cooperative"}), current_state="Suspended")
    eng.register(r, ClaimScope("c", (TrustedPod("rl", "a", "pod-a"),), 80 * 1024 * MiB))
    w = eng.registry.get("pod-a")
    assert w is not None
    kinds: list[str] = []
    play_workload(eng, w, lambda k: kinds.append(k) or Ack("", True, 3 * MiB))  # type: ignore[func-returns-value]
    res = eng.suspend("c", 5.0)
    assert res.ok and kinds == ["suspend"] and "already suspended" not in res.message
    again = eng.suspend("c", 5.0)
    assert again.ok and kinds == ["suspend"] and again.message == "already suspended; nothing moved"


def test_the_ledger_of_simulated_occupants_is_what_the_engine_itself_moved() -> None:
    eng, _, _ = sim_engine(simulated_occupant_bytes=2 * MiB)
    assert eng.simulated_resident_bytes("claim-z") == 2 * MiB  # no workload: the simulated occupant
    assert eng.suspend("claim-z", 5.0).ok and eng.simulated_resident_bytes("claim-z") == 0
    assert eng.resume("claim-z").ok and eng.simulated_resident_bytes("claim-z") == 2 * MiB
    eng.free_simulated("claim-z")  # the driver evicted it
    assert eng.simulated_resident_bytes("claim-z") == 0 and eng.occupant_state("claim-z") == "unknown"
    assert not eng.suspend("claim-z", 5.0).ok  # not re-created behind the driver's back
    eng.register(reg(claims=("claim-r",)))  # a real process: its bytes are in its device memory file
    assert eng.simulated_resident_bytes("claim-r") == 0
    off, _, _ = sim_engine()
    assert off.simulated_resident_bytes("claim-z") == 0


def test_operations_on_one_workload_are_serialised() -> None:
    order: list[str] = []

    class Slow:
        name = "simulated"

        def suspend(self, w: Workload, deadline: float, op: OpContext) -> BackendOutcome:
            order.append("s-start")
            time.sleep(0.2)
            order.append("s-end")
            return BackendOutcome(True, 1, "")

        def resume(self, w: Workload, deadline: float, op: OpContext) -> BackendOutcome:
            order.append("r")
            return BackendOutcome(True, 1, "")

    eng = NodeSuspendEngine(
        EngineConfig(100, backends=("simulated",)),
        {"simulated": Slow()},
        metrics=SuspendMetrics(CollectorRegistry()),
        events=RecordingEventSink(),
    )
    eng.register(reg(nbytes=1))
    t = threading.Thread(target=eng.suspend, args=("claim-a", 5))
    t.start()
    time.sleep(0.05)
    assert eng.resume("claim-a").ok
    t.join()
    assert order == ["s-start", "s-end", "r"]


def test_notifier_sink_writes_pod_events_and_survives_api_errors() -> None:
    from dra_driver.claims import PodRef
    from dra_driver.suspend.events import EngineEvent, NotifierEventSink

    class Notifier:
        def __init__(self) -> None:
            self.got: list[tuple[PodRef, str, bool]] = []
            self.fail = False

        def event(self, pod: PodRef, reason: str, message: str, warning: bool) -> None:
            if self.fail:
                raise RuntimeError("apiserver down")
            self.got.append((pod, reason, warning))

    n = Notifier()
    sink = NotifierEventSink(n)
    sink.record(EngineEvent("u1", "rl", "w-0", "SuspendFallbackCheckpoint", "m", "Warning"))
    sink.record(EngineEvent("u2", "", "", "Suspended", "simulated occupant", "Normal"))  # log only
    assert n.got == [(PodRef("rl", "w-0", "u1"), "SuspendFallbackCheckpoint", True)]
    n.fail = True
    sink.record(EngineEvent("u1", "rl", "w-0", "Resumed", "m", "Normal"))  # does not raise


def test_notifier_sink_with_claim_records_ignores_the_reported_pod() -> None:
    from dra_driver.claims import PodRef
    from dra_driver.suspend.events import EngineEvent, NotifierEventSink

    class Notifier:
        def __init__(self) -> None:
            self.got: list[tuple[PodRef, str]] = []

        def event(self, pod: PodRef, reason: str, message: str, warning: bool) -> None:
            self.got.append((pod, reason))

    real = PodRef("rl", "w-0", "u1")
    n = Notifier()
    sink = NotifierEventSink(n, claim_pods=lambda: {"c1": (real,)})
    sink.record(EngineEvent("simulated-claim-c1", "", "", "SuspendFallbackCheckpointFailed", "m", "Warning"))
    sink.record(EngineEvent("u1", "rl", "spoofed", "Suspended", "m", "Normal"))  # the record's name wins
    sink.record(EngineEvent("u9", "rl", "w-9", "Suspended", "m", "Normal"))  # no claim lists it: log only
    assert n.got == [(real, "SuspendFallbackCheckpointFailed"), (real, "Suspended")]


@given(
    pod_uid=st.text(max_size=200),
    pid=st.integers(-(2**31), 2**31 - 1),
    state_bytes=st.integers(-(2**63), 2**63 - 1),
    backends=st.lists(st.integers(0, 2**31 - 1), max_size=4),
    state=st.integers(0, 2**31 - 1),
    claims=st.lists(st.text(max_size=200), max_size=3),
)
@settings(max_examples=200, deadline=None)
def test_any_register_request_is_accepted_or_refused_clearly(
    pod_uid: str, pid: int, state_bytes: int, backends: list[int], state: int, claims: list[str]
) -> None:
    from dra_driver.agent.convert import registration_from_pb
    from rose_common.proto import rose_agent_v1_pb2 as pb

    req = pb.RegisterRequest(pod_uid=pod_uid, pid=pid, state_bytes=state_bytes, claim_uids=claims)
    req.supported_backends.extend(backends)
    req.current_state = state  # type: ignore[assignment]
    try:
        validate_registration(registration_from_pb(req))
    except RegistrationError as e:
        assert str(e).startswith("invalid registration: ")


def test_state_size_updates_drive_budget_admission() -> None:
    eng, _, _ = sim_engine(budget=20 * MiB)
    w = eng.register(reg(nbytes=MiB))
    ok, msg = eng.update_state_bytes("pod-a", "stale-session", 5 * MiB)
    assert not ok and "register again" in msg
    with pytest.raises(RegistrationError, match="state_bytes"):
        eng.update_state_bytes("pod-a", w.session_id, -1)
    assert eng.update_state_bytes("pod-a", w.session_id, 30 * MiB) == (True, "")
    r = eng.suspend("claim-a", 5)  # 30 MiB no longer fits the 20 MiB budget
    assert not r.ok and f"{30 * MiB} B of state does not fit" in r.message


def test_abandon_ends_the_engines_wait_for_an_occupant_the_driver_stopped() -> None:
    """A hung occupant (never acks) holds an engine thread through its grace and then the fallback
    checkpoint's wait; once the driver has stopped its processes (enforcement), ``abandon`` ends
    that wait at once, so the thread is free for an honest occupant's suspend on another GPU."""
    eng = NodeSuspendEngine(
        EngineConfig(host_memory_budget_bytes=100 * MiB, backends=("cooperative",), checkpoint_timeout_seconds=30),
        {"cooperative": CooperativeBackend()},
        events=RecordingEventSink(),
        metrics=SuspendMetrics(CollectorRegistry()),
    )
    w = eng.register(reg(backends=("cooperative",)))
    play_workload(eng, w, lambda k: None)  # hangs before its safe point: no ack, ever
    done: list[SuspendResult] = []
    t = threading.Thread(target=lambda: done.append(eng.suspend("claim-a", 0.3)), daemon=True)
    t0 = time.monotonic()
    t.start()
    time.sleep(1.0)  # past the grace: the engine now waits for the fallback checkpoint (30 s)
    assert not done
    eng.abandon("claim-a")
    t.join(timeout=5)
    assert done and not done[0].ok, "the wait ended, with no checkpoint confirmed"
    assert time.monotonic() - t0 < 5, "abandon must end the checkpoint wait, not its 30 s deadline"
    w.commands.put(None)

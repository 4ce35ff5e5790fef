"""Serving wins, enforced: the observation decisions, the NVML watch and the enforcement sequence.

Stand-ins, each named for what it replaces: ``FakeNvml`` for libnvidia-ml at its ctypes boundary
(``tests/support/nvml_fakes.py``), ``ScriptedWatch`` for a device watch that
returns the observations a test scripts, ``Signals`` for ``os.kill``, ``Checkpointer`` for
cuda-checkpoint by PID, ``Evictions`` for the API's eviction.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dra_driver.claims import PodRef
from dra_driver.enforce import (
    METHOD_CUDA_CHECKPOINT,
    METHOD_KILL,
    METHOD_NONE,
    PHASE_COOPERATIVE,
    PHASE_ENFORCED,
    PHASE_FALLBACK,
    Enforcer,
    pods_to_evict,
    returned_phase,
)
from dra_driver.engine_api import SuspendReason, SuspendResult
from dra_driver.suspend.devicewatch import (
    ENV_SIMULATED_DEVICE_MEMORY,
    Holder,
    NvmlDeviceWatch,
    Observation,
    SimulatedDeviceMemory,
    Target,
    belongs_to,
    device_free,
    maps_device,
    parse_maps_inodes,
    resident_bytes,
)
from dra_driver.suspend.nvml import NvmlMemoryProbe
from tests.support.nvml_fakes import FakeNvml

T = Target("claim-1", (0,), ("pod-uid-1",))
POD = PodRef("ml", "rl-0", "pod-uid-1")
OTHER = PodRef("ml", "rl-1", "pod-uid-2")
GiB = 1 << 30


# ---------------------------------------------------------------------- pure decisions


def test_free_means_nothing_resident_beyond_the_context_allowance() -> None:
    assert device_free(Observation())
    assert not device_free(Observation(unattributed_bytes=4096))  # the simulated file holds pages
    assert device_free(Observation(holders=(Holder(7, 0),)))  # a holder may keep an empty file open
    ctx = 300 << 20
    assert device_free(Observation(holders=(Holder(7, ctx),)), allowance_bytes=512 << 20)  # a CUDA context
    assert not device_free(Observation(holders=(Holder(7, 2 * GiB),)), allowance_bytes=512 << 20)
    assert resident_bytes(Observation(4096, (Holder(7, 2 * GiB), Holder(8, ctx))), 512 << 20) == 4096 + 2 * GiB
    # NVML could not tell a holder's size: not free, whatever the allowance
    assert not device_free(Observation(holders=(Holder(7, -1),)), allowance_bytes=0)
    assert not device_free(Observation(holders=(Holder(7, -1),)), allowance_bytes=512 << 20)


def test_maps_inodes_and_cgroup_attribution() -> None:
    maps = (
        "7f00-7f10 rw-s 00000000 00:2a 123456 /run/rose/claims/c/device-memory\n"
        "7f10-7f20 r-xp 00000000 08:01 0 \n"
        "garbage\n"
    )
    assert parse_maps_inodes(maps) == {("00:2a", 123456)}
    assert maps_device(os.makedev(0, 0x2A)) == "00:2a"
    cg = "0::/kubepods.slice/kubepods-burstable-podpod_uid_1.slice/cri-containerd-abc.scope\n"
    assert belongs_to(cg, ["pod-uid-1"]) and not belongs_to(cg, ["pod-uid-2"]) and not belongs_to(cg, [""])


def ok(fallback: str | None = None) -> SuspendResult:
    return SuspendResult(True, "cooperative", 1, 0.1, fallback, "ok")


def test_the_phase_that_returned_the_gpu() -> None:
    failed = SuspendResult(False, "none", 0, 0.0, None, "no workload", SuspendReason.NO_WORKLOAD)
    assert returned_phase(ok(), METHOD_NONE) == PHASE_COOPERATIVE
    assert returned_phase(failed, METHOD_NONE) == PHASE_COOPERATIVE  # nothing of it was on the device
    assert returned_phase(ok("checkpoint-evict"), METHOD_NONE) == PHASE_FALLBACK
    assert returned_phase(ok("checkpoint-evict"), METHOD_KILL) == PHASE_FALLBACK  # checkpoint confirmed first
    assert returned_phase(ok(), METHOD_KILL) == PHASE_ENFORCED  # its ok=True was not believed
    assert returned_phase(failed, METHOD_CUDA_CHECKPOINT) == PHASE_ENFORCED


def test_evict_the_pods_of_killed_holders_by_cgroup_else_the_claims_pods() -> None:
    cg = "0::/kubepods/podpod-uid-2/x\n"
    assert pods_to_evict([cg], [POD, OTHER]) == (OTHER,)
    assert pods_to_evict(["0::/user.slice\n"], [POD, OTHER]) == (POD, OTHER)  # no pod cgroups (simulated)


# ---------------------------------------------------------------------- NVML watch


def test_nvml_watch_sees_only_the_claims_pods_processes_on_its_gpus() -> None:
    nvml = FakeNvml()  # GPU 0: pid 1234 (3 GiB), pid 99 (5 GiB); GPU 1: pid 1234 (1 GiB)
    probe = NvmlMemoryProbe(nvml)
    assert probe.gpu_processes(0) == [(1234, 3 * GiB), (99, 5 * GiB)]
    cgroups = {1234: "0::/kubepods/podpod-uid-1/c\n", 99: "0::/kubepods/podserving/c\n"}
    watch = NvmlDeviceWatch(probe, 512 << 20, cgroup_of=lambda pid: cgroups.get(pid, ""))
    obs = watch.observe(T)
    assert obs.holders == (Holder(1234, 3 * GiB),)  # pid 99 belongs to another pod: not ours to judge
    assert not device_free(obs, watch.allowance_bytes)
    both = watch.observe(Target("claim-1", (0, 1), ("pod-uid-1",)))
    assert both.holders == (Holder(1234, 4 * GiB),)
    nvml.procs[0] = [(1234, 200 << 20), (99, 5 * GiB)]  # offloaded: only its CUDA context is left
    assert device_free(watch.observe(T), watch.allowance_bytes)
    with pytest.raises(ValueError, match="allowance"):
        NvmlDeviceWatch(probe, -1)


# ---------------------------------------------------------------------- the simulated file


def test_simulated_device_memory_is_provisioned_in_the_claims_directory_only(tmp_path: Path) -> None:
    watch = SimulatedDeviceMemory(tmp_path, ledger=lambda c: 0)
    assert watch.provision("claim-1") == {}  # no claim directory (no agent): nothing to mount
    (tmp_path / "claim-1").mkdir()
    env = watch.provision("claim-1")
    assert env == {ENV_SIMULATED_DEVICE_MEMORY: "/run/rose/claims/claim-1/device-memory"}
    p = tmp_path / "claim-1" / "device-memory"
    assert (p.stat().st_mode & 0o777) == 0o666 and device_free(watch.observe(T))
    with open(p, "r+b") as f:
        os.posix_fallocate(f.fileno(), 0, 1 << 20)
        obs = watch.observe(Target("claim-1", (0,), ()))
        assert obs.unattributed_bytes >= 1 << 20 and os.getpid() in obs.pids()  # this process holds it
    watch.free_dead(Target("claim-1", (0,), ()))
    assert device_free(watch.observe(Target("claim-1", (0,), ())))
    watch.forget("claim-1")
    assert not p.exists()
    with pytest.raises(ValueError):
        watch.path("../x")


def test_the_ledger_of_process_less_simulated_occupants_counts_until_freed(tmp_path: Path) -> None:
    ledger = {"claim-1": 16 * GiB}

    def evicted(claim_uid: str) -> None:
        del ledger[claim_uid]

    watch = SimulatedDeviceMemory(tmp_path, ledger=lambda c: ledger.get(c, 0), ledger_free=evicted)
    assert watch.observe(T).unattributed_bytes == 16 * GiB and not watch.observe(T).holders
    watch.free_dead(T)
    assert device_free(watch.observe(T))


# ---------------------------------------------------------------------- the enforcement sequence


@dataclass
class ScriptedWatch:
    """Returns the scripted observations in order (the last one repeats); records free_dead."""

    script: list[Observation]
    allowance_bytes: int = 0
    freed: int = 0

    def observe(self, target: Target) -> Observation:
        return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    def free_dead(self, target: Target) -> None:
        self.freed += 1

    def provision(self, claim_uid: str) -> dict[str, str]:
        return {}

    def forget(self, claim_uid: str) -> None:
        return None


@dataclass
class Signals:
    sent: list[tuple[int, int]] = field(default_factory=list)

    def __call__(self, pid: int, sig: int) -> None:
        self.sent.append((pid, sig))


@dataclass
class Checkpointer:
    fail: bool = False
    calls: list[tuple[str, int]] = field(default_factory=list)

    def checkpoint_pid(self, pid: int, deadline_monotonic: float) -> str | None:
        self.calls.append(("checkpoint", pid))
        return "refused" if self.fail else None

    def restore_pid(self, pid: int) -> str | None:
        self.calls.append(("restore", pid))
        return None


@dataclass
class Evictions:
    pods: list[PodRef] = field(default_factory=list)

    def evict(self, pod: PodRef, reason: str) -> None:
        self.pods.append(pod)


HELD = Observation(1 << 20, (Holder(41, 0), Holder(42, 0)), "test")
GONE_BUT_BYTES = Observation(1 << 20, (), "test")
FREE = Observation(0, (), "test")


def test_an_observed_free_device_is_left_alone() -> None:
    sig, ev = Signals(), Evictions()
    r = Enforcer(ScriptedWatch([FREE]), kill=sig, evictor=ev).enforce(T, [POD], "why")
    assert (r.free, r.method, sig.sent, ev.pods) == (True, METHOD_NONE, [], [])


def test_stop_then_kill_the_observed_holders_evict_and_free_what_they_left() -> None:
    sig, ev = Signals(), Evictions()
    watch = ScriptedWatch([HELD, GONE_BUT_BYTES, FREE])
    r = Enforcer(watch, kill=sig, evictor=ev, cgroup_of=lambda pid: "", sleep=lambda s: None).enforce(T, [POD], "w")
    assert sig.sent == [(41, signal.SIGSTOP), (42, signal.SIGSTOP), (41, signal.SIGKILL), (42, signal.SIGKILL)]
    assert (r.free, r.method, r.pids, r.evicted, ev.pods, watch.freed) == (
        True,
        METHOD_KILL,
        (41, 42),
        (POD,),
        [POD],
        1,
    )


def test_no_free_while_a_holder_survives_and_the_bound_holds() -> None:
    sig, ev = Signals(), Evictions()
    watch = ScriptedWatch([HELD])  # signals go nowhere: the holders stay
    e = Enforcer(watch, timeout_seconds=0.2, kill=sig, evictor=ev, cgroup_of=lambda pid: "", poll_seconds=0.01)
    r = e.enforce(T, [POD], "w")
    assert not r.free and r.method == METHOD_KILL and watch.freed == 0  # never truncates under a live holder
    assert "41" in r.message and sig.sent.count((41, signal.SIGKILL)) == 1  # each PID signalled once


def test_cuda_checkpoint_where_enabled_on_the_observed_pids_state_kept() -> None:
    sig, ck = Signals(), Checkpointer()
    r = Enforcer(ScriptedWatch([HELD, FREE]), kill=sig, checkpointer=ck).enforce(T, [POD], "w")
    assert (r.free, r.method, r.pids, sig.sent) == (True, METHOD_CUDA_CHECKPOINT, (41, 42), [])
    assert ck.calls == [("checkpoint", 41), ("checkpoint", 42)]


def test_a_failed_cuda_checkpoint_is_undone_then_the_holders_are_killed() -> None:
    sig, ck = Signals(), Checkpointer(fail=True)
    watch = ScriptedWatch([HELD, HELD, GONE_BUT_BYTES, FREE])
    r = Enforcer(watch, kill=sig, checkpointer=ck, cgroup_of=lambda pid: "", sleep=lambda s: None).enforce(
        T, [POD], "w"
    )
    assert ("restore", 41) in ck.calls and r.method == METHOD_KILL and r.free


def test_no_cuda_checkpoint_for_a_workload_whose_durable_checkpoint_is_confirmed() -> None:
    ck = Checkpointer()
    e = Enforcer(ScriptedWatch([HELD, GONE_BUT_BYTES, FREE]), kill=Signals(), checkpointer=ck, cgroup_of=lambda p: "")
    r = e.enforce(T, [POD], "w", checkpoint=False)
    assert ck.calls == [] and r.method == METHOD_KILL and r.free


def test_enforce_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="enforce timeout"):
        Enforcer(ScriptedWatch([FREE]), timeout_seconds=0)


# ---------------------------------------------------------------------- the driver's decisions


@dataclass
class DeviceOf:
    """A lent claim's device: occupied until its holders are checkpointed or killed."""

    occupied: bool = True
    allowance_bytes: int = 0
    freed: int = 0

    def observe(self, target: Target) -> Observation:
        return HELD if self.occupied else FREE

    def free_dead(self, target: Target) -> None:
        self.freed += 1

    def provision(self, claim_uid: str) -> dict[str, str]:
        return {}

    def forget(self, claim_uid: str) -> None:
        return None


def _driver(tmp: Path, dev: DeviceOf, **enforcer: object) -> tuple[object, object]:
    from tests.support.driver_fixtures import RecordingEngine, RecordingNotifier, StaticClaims, make_claim, make_driver

    claims = StaticClaims(
        [
            make_claim("uid-l0", "l0", [("gpu", "gpu-0-lendable")], pod=("rl-0", "pod-uid-1")),
            make_claim("uid-s0", "s0", [("gpu", "gpu-0-serving")]),
        ]
    )
    engine = RecordingEngine()  # acknowledges every suspend: the driver must not believe it
    e = Enforcer(dev, timeout_seconds=0.3, poll_seconds=0.01, cgroup_of=lambda pid: "", **enforcer)  # type: ignore[arg-type]
    d = make_driver(tmp, claims, engine, RecordingNotifier(), enforcer=e)
    return d, engine


def test_an_acknowledged_suspend_is_checked_and_cuda_checkpoint_enforced_then_restored(tmp_path: Path) -> None:
    from dra_driver.claims import ClaimRef

    dev = DeviceOf()

    @dataclass
    class FreeingCheckpointer(Checkpointer):
        def checkpoint_pid(self, pid: int, deadline_monotonic: float) -> str | None:
            dev.occupied = False
            return super().checkpoint_pid(pid, deadline_monotonic)

    ck = FreeingCheckpointer()
    driver, engine = _driver(tmp_path, dev, checkpointer=ck, kill=Signals())
    d: Any = driver
    assert d.prepare([ClaimRef("ml", "uid-l0", "l0")])["uid-l0"].error == ""
    assert d.prepare([ClaimRef("ml", "uid-s0", "s0")])["uid-s0"].error == ""
    s = d.snapshot().suspensions["uid-l0"]
    assert (s.state, s.backend, s.pids) == ("Suspended", "cuda-checkpoint-enforced", [41, 42])
    assert d.metrics.registry.get_sample_value("rose_driver_gpu_returned_seconds_count", {"phase": "enforced"}) == 1
    engine.states["uid-l0"] = "running"  # type: ignore[attr-defined]  # the engine never saw it suspend
    d.reconcile()  # the driver checkpointed it itself: the engine's view of it does not count
    assert [c[0] for c in engine.calls] == ["suspend"]  # type: ignore[attr-defined]
    assert d.unprepare([ClaimRef("ml", "uid-s0", "s0")])["uid-s0"] == ""
    assert ("restore", 41) in ck.calls and [c[0] for c in engine.calls] == ["suspend"]  # restored by the driver
    d.close()


def test_a_suspended_occupant_that_takes_its_device_back_is_reclaimed_by_the_repair_loop(tmp_path: Path) -> None:
    from dra_driver.claims import ClaimRef

    dev = DeviceOf(occupied=False)  # an honest suspend frees the device
    sig = Signals()
    driver, _ = _driver(tmp_path, dev, kill=sig)
    d: Any = driver
    assert d.prepare([ClaimRef("ml", "uid-l0", "l0")])["uid-l0"].error == ""
    assert d.prepare([ClaimRef("ml", "uid-s0", "s0")])["uid-s0"].error == ""
    assert d.snapshot().suspensions["uid-l0"].state == "Suspended" and sig.sent == []
    d.reconcile()
    assert sig.sent == []  # still free: nothing to do
    dev.occupied = True  # it allocates again behind serving's back

    def killed(pid: int, sig_: int) -> None:
        sig.sent.append((pid, sig_))
        if sig_ == signal.SIGKILL:
            dev.occupied = False

    d.enforcer._kill = killed
    d.reconcile()
    assert (41, signal.SIGKILL) in sig.sent and d.snapshot().suspensions["uid-l0"].state == "EnforcedEvicted"
    d.close()


def test_the_cli_builds_the_simulated_watch_and_reads_the_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    from dra_driver import cli, discovery

    monkeypatch.setenv("ROSE_DRIVER_ENFORCE_TIMEOUT_SECONDS", "7")
    monkeypatch.setenv("ROSE_DRIVER_ALLOW_SERVING_ON_OCCUPIED_DEVICE", "true")
    args = cli.build_parser().parse_args(["--node-name", "n", "--gpu-backend", "simulated", "--plugin-dir", "/p"])
    assert args.enforce_timeout_seconds == 7.0 and args.allow_serving_on_occupied_device is True
    assert args.device_context_allowance == 512 << 20
    gpus = discovery.discover("simulated", "n", discovery.SimulatedConfig(count=1))
    e = cli.build_enforcer(args, gpus, None, Evictions())
    assert isinstance(e.watch, SimulatedDeviceMemory) and e.watch.root == Path("/p/claims") and e.timeout == 7.0
    args.enforce_timeout_seconds = 0
    with pytest.raises(cli.StartupError, match="enforce-timeout-seconds"):
        cli.build_enforcer(args, gpus, None, Evictions())


def test_a_failed_suspend_is_reclaimed_by_the_repair_loop_only_once_its_device_is_occupied(tmp_path: Path) -> None:
    from dra_driver.claims import ClaimRef

    dev = DeviceOf(occupied=False)
    sig = Signals()
    driver, engine = _driver(tmp_path, dev, kill=sig)
    d: Any = driver
    engine.fail = True  # type: ignore[attr-defined]  # e.g. no workload registered: nothing to command
    assert d.prepare([ClaimRef("ml", "uid-l0", "l0")])["uid-l0"].error == ""
    assert d.prepare([ClaimRef("ml", "uid-s0", "s0")])["uid-s0"].error == ""  # nothing on the device: serving in
    assert d.snapshot().suspensions["uid-l0"].state == "SuspendFailed"
    calls = len(engine.calls)  # type: ignore[attr-defined]
    d.reconcile()
    assert len(engine.calls) == calls  # type: ignore[attr-defined]  # not retried blindly
    dev.occupied = True  # a process of the pod starts using the device under serving

    def killed(pid: int, sig_: int) -> None:
        sig.sent.append((pid, sig_))
        dev.occupied = dev.occupied and sig_ != signal.SIGKILL

    d.enforcer._kill = killed
    d.reconcile()
    assert d.snapshot().suspensions["uid-l0"].state == "EnforcedEvicted" and (42, signal.SIGKILL) in sig.sent
    d.close()


def test_a_request_for_one_pod_of_a_shared_claim_is_not_judged_by_the_claim_wide_observation(
    tmp_path: Path,
) -> None:
    """Time-slicing: the other pod of a shared claim may use the device; the simulated file cannot
    tell whose bytes it holds, so the driver neither kills nor evicts on a one-pod request there —
    while serving, which needs the whole GPU, is still enforced."""
    from dra_driver.claims import ClaimRef
    from dra_driver.node import observable
    from dra_driver.state import ClaimRecord, Suspension
    from tests.support.driver_fixtures import RecordingEngine, RecordingNotifier, StaticClaims, make_claim, make_driver

    rec = ClaimRecord("c", "ml", "c", "PrepareCompleted", [], [POD, OTHER])
    assert not observable(rec, Suspension("c", "Suspended", ["request/pod-uid-1"]))
    assert observable(rec, Suspension("c", "Suspended", ["request/pod-uid-1", "uid-s0"]))
    assert observable(ClaimRecord("c", "ml", "c", "PrepareCompleted", [], [POD]), Suspension("c", "x", ["request/u"]))

    shared = make_claim("uid-l0", "l0", [("gpu", "gpu-0-lendable")], pod=("rl-0", "pod-uid-1"))
    shared["status"]["reservedFor"].append({"resource": "pods", "name": "rl-1", "uid": "pod-uid-2"})
    sig = Signals()
    e = Enforcer(DeviceOf(), timeout_seconds=0.2, poll_seconds=0.01, cgroup_of=lambda pid: "", kill=sig)
    d: Any = make_driver(tmp_path, StaticClaims([shared]), RecordingEngine(), RecordingNotifier(), enforcer=e)
    assert d.prepare([ClaimRef("ml", "uid-l0", "l0")])["uid-l0"].error == ""
    assert d.request_suspend(POD, 5.0) == "Suspended" and sig.sent == []
    d.reconcile()
    assert sig.sent == []
    d.close()

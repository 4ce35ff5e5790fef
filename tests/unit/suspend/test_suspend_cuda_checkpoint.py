"""The cuda-checkpoint backend's ctypes layer, without a GPU: struct ABI, call order, clear errors.

The fake libcuda here is an explicit test double of the seven driver symbols (a GPU cannot run on
this machine); it follows the driver's documented state machine (SUSPEND.md §1.2).
"""

from __future__ import annotations

import ctypes
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dra_driver.suspend.cuda_checkpoint import (
    CUcheckpointCheckpointArgs,
    CUcheckpointLockArgs,
    CUcheckpointUnlockArgs,
    CudaCheckpointBackend,
    CudaCheckpointUnavailable,
    CudaDriver,
)
from dra_driver.suspend.model import OpContext, Registration
from dra_driver.suspend.pids import resolve_pid
from dra_driver.suspend.registry import Workload
from dra_driver.suspend.support import ProcessFacts
from tests.support.nvml_fakes import FakeNvml

NOT_READY = 600  # what cuCheckpointProcessLock returns when timeoutMs passes


class FakeLibcuda:
    """RUNNING(0) -lock-> LOCKED(1) -checkpoint-> CHECKPOINTED(2) -restore-> LOCKED -unlock-> RUNNING."""

    def __init__(self, version: int = 12080, fail: dict[str, int] | None = None) -> None:
        self.state = 0
        self.calls: list[str] = []
        self.version = version
        self.fail = fail or {}
        self.lock_timeout_ms = -1

    def _ret(self, name: str) -> int:
        self.calls.append(name)
        return self.fail.get(name, 0)

    def cuInit(self, flags: int) -> int:
        return self._ret("cuInit")

    def cuDriverGetVersion(self, out: Any) -> int:
        ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = self.version
        return self._ret("version")

    def cuCheckpointProcessGetState(self, pid: int, out: Any) -> int:
        ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = self.state
        return 0

    def cuCheckpointProcessLock(self, pid: int, args: Any) -> int:
        self.lock_timeout_ms = ctypes.cast(args, ctypes.POINTER(CUcheckpointLockArgs))[0].timeoutMs
        rc = self._ret("lock")
        if rc == 0:
            self.state = 1
        return rc

    def cuCheckpointProcessCheckpoint(self, pid: int, args: Any) -> int:
        rc = self._ret("checkpoint")
        if rc == 0:
            self.state = 2
        return rc

    def cuCheckpointProcessRestore(self, pid: int, args: Any) -> int:
        assert args is None  # NULL: same GPUs, no remap
        rc = self._ret("restore")
        if rc == 0:
            self.state = 1
        return rc

    def cuCheckpointProcessUnlock(self, pid: int, args: Any) -> int:
        rc = self._ret("unlock")
        if rc == 0:
            self.state = 0
        return rc


def same_pid(pod_uid: str, pid: int) -> int:
    return pid


def plain_process(pid: int) -> ProcessFacts:
    """/proc facts of a single-process CUDA workload (nothing the driver refuses)."""
    return ProcessFacts(maps="7f00-7f01 rw-s 0 00:05 1 /dev/nvidiactl\n", environ={"PATH": "/usr/bin"})


def workload() -> Workload:
    return Workload(Registration("p", 1234, 8 << 30, frozenset({"cuda-checkpoint"})), "s")


def test_arg_structs_are_64_bytes_with_timeout_first() -> None:
    for s in (CUcheckpointLockArgs, CUcheckpointCheckpointArgs, CUcheckpointUnlockArgs):
        assert ctypes.sizeof(s) == 64
    assert CUcheckpointLockArgs.timeoutMs.offset == 0  # type: ignore[attr-defined]


def test_suspend_then_resume_calls_in_driver_order() -> None:
    lib = FakeLibcuda()
    be = CudaCheckpointBackend(CudaDriver(lib), pid_resolver=same_pid, process_facts=plain_process)
    import time

    out = be.suspend(workload(), time.monotonic() + 3.0, OpContext("op"))
    assert out.ok and out.bytes_moved == 8 << 30
    assert 2500 < lib.lock_timeout_ms <= 3000  # the grace period left, in ms
    assert be.process_state(1234) == "checkpointed"
    assert be.suspend(workload(), time.monotonic() + 3, OpContext("op")).bytes_moved == 0  # idempotent
    back = be.resume(workload(), time.monotonic() + 3, OpContext("op2"))
    assert back.ok and be.process_state(1234) == "running"
    assert lib.calls == ["cuInit", "version", "lock", "checkpoint", "restore", "unlock"]
    assert be.resume(workload(), 0, OpContext("op3")).bytes_moved == 0


def test_failed_checkpoint_unlocks_and_reports() -> None:
    lib = FakeLibcuda(fail={"checkpoint": 801})
    be = CudaCheckpointBackend(CudaDriver(lib), pid_resolver=same_pid, process_facts=plain_process)
    import time

    out = be.suspend(workload(), time.monotonic() + 3, OpContext("op"))
    assert not out.ok and "CUDA_ERROR_NOT_SUPPORTED (801)" in out.message and "unlocked" in out.message
    assert lib.calls[-2:] == ["checkpoint", "unlock"] and lib.state == 0


def test_lock_timeout_is_a_deadline_miss() -> None:
    lib = FakeLibcuda(fail={"lock": NOT_READY})
    be = CudaCheckpointBackend(CudaDriver(lib), pid_resolver=same_pid, process_facts=plain_process)
    import time

    out = be.suspend(workload(), time.monotonic() + 1, OpContext("op"))
    assert not out.ok and out.timed_out and "CUDA_ERROR_NOT_READY (600)" in out.message
    assert "checkpoint" not in lib.calls  # the driver left the process RUNNING; nothing more is tried


def test_missing_libcuda_is_a_clear_error() -> None:
    with pytest.raises(CudaCheckpointUnavailable, match="needs the NVIDIA driver's libcuda"):
        CudaDriver.load("libcuda-does-not-exist.so.1")


def test_old_driver_is_refused() -> None:
    class Old:
        def cuInit(self, flags: int) -> int:
            return 0

    with pytest.raises(CudaCheckpointUnavailable, match="r570 or newer"):
        CudaDriver(Old())
    with pytest.raises(CudaCheckpointUnavailable, match="12080"):
        CudaCheckpointBackend(CudaDriver(FakeLibcuda(version=12040)))


def fake_proc(root: Path, pid: int, nspid: list[int], cgroup: str) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    ids = "\t".join(map(str, nspid))
    (d / "status").write_text(f"Name:\tpython\nNSpid:\t{ids}\n")
    (d / "cgroup").write_text(cgroup)


def test_container_pid_is_mapped_to_the_host_pid(tmp_path: Path) -> None:
    uid = "0f1e2d3c-aaaa-bbbb-cccc-123456789abc"
    fake_proc(tmp_path, 7, [7, 1], "0::/kubepods/besteffort/podother/x\n")  # another pod's PID 1
    fake_proc(tmp_path, 4242, [4242, 1], f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri\n")
    fake_proc(tmp_path, 99, [99], "0::/user.slice\n")  # a process in the agent's own namespace
    (tmp_path / "self").mkdir()
    assert resolve_pid(uid, 1, tmp_path) == 4242
    assert resolve_pid("no-such-pod", 1, tmp_path) is None  # never guesses another pod's PID 1
    assert resolve_pid("no-such-pod", 99, tmp_path) is None  # a known pod UID never takes the PID as is
    assert resolve_pid("", 99, tmp_path) == 99  # no pod UID: a process of the agent's own namespace
    assert resolve_pid(uid, 5, tmp_path) is None


def test_unresolvable_pid_is_refused_not_guessed() -> None:
    lib = FakeLibcuda()
    be = CudaCheckpointBackend(CudaDriver(lib), pid_resolver=lambda uid, pid: None)
    import time

    out = be.suspend(workload(), time.monotonic() + 3, OpContext("op"))
    assert not out.ok and "needs hostPID" in out.message and "lock" not in lib.calls


# --------------------------------------------------------------------------- start-up errors


def test_cuinit_failure_is_unavailable_not_a_raw_driver_error() -> None:
    lib = FakeLibcuda(fail={"cuInit": 100})  # CUDA_ERROR_NO_DEVICE
    with pytest.raises(CudaCheckpointUnavailable, match=r"cuInit failed: CUDA_ERROR_NO_DEVICE \(100\)"):
        CudaCheckpointBackend(CudaDriver(lib), pid_resolver=same_pid, process_facts=plain_process)


def test_rose_agent_exits_with_a_message_when_cuinit_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import dra_driver.suspend.cuda_checkpoint as cc
    from dra_driver.agent import cli

    monkeypatch.setattr(cc.ctypes, "CDLL", lambda path: FakeLibcuda(fail={"cuInit": 100}))
    rc = cli.main(
        [
            "--backends", "cuda-checkpoint",
            "--workload-socket", str(tmp_path / "w.sock"),
            "--control-socket", str(tmp_path / "c.sock"),
        ]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "rose-agent: cuInit failed" in err and "Traceback" not in err


# --------------------------------------------------------------------------- what the driver really moves


class FakeProbe:
    """Stands in for NVML: the process holds ``nbytes`` on the GPU (allocator reserve, context...)."""

    def __init__(self, nbytes: int | None) -> None:
        self.nbytes = nbytes

    def process_device_bytes(self, pid: int) -> int | None:
        return self.nbytes


def test_bytes_moved_are_the_measured_device_bytes() -> None:
    lib = FakeLibcuda()
    be = CudaCheckpointBackend(
        CudaDriver(lib), pid_resolver=same_pid, process_facts=plain_process, memory_probe=FakeProbe(11 << 30)
    )
    import time

    assert be.device_bytes(workload()) == 11 << 30
    out = be.suspend(workload(), time.monotonic() + 3, OpContext("op"))
    assert out.ok and out.bytes_moved == 11 << 30 and "NVML-measured" in out.message


def test_budget_is_charged_the_measured_size_not_the_registered_one() -> None:
    from dra_driver.suspend.engine import EngineConfig, NodeSuspendEngine

    lib, probe = FakeLibcuda(), FakeProbe(12 << 30)
    be = CudaCheckpointBackend(CudaDriver(lib), pid_resolver=same_pid, process_facts=plain_process, memory_probe=probe)
    eng = NodeSuspendEngine(EngineConfig(10 << 30, backends=("cuda-checkpoint",)), {"cuda-checkpoint": be})
    eng.register(Registration("p", 1234, 8 << 30, frozenset({"cuda-checkpoint"}), claim_uids=frozenset({"c"})))
    r = eng.suspend("c", 3.0)  # 8 GiB registered would fit 10 GiB; the 12 GiB the process holds does not
    assert not r.ok and "lock" not in lib.calls
    assert f"{12 << 30} B of state does not fit" in r.message
    assert eng.metrics.fallbacks.labels("host_memory_budget")._value.get() == 1

    probe.nbytes = 9 << 30  # the process shrank (e.g. empty_cache): now it fits
    r = eng.suspend("c", 3.0)
    assert r.ok and r.bytes_moved == 9 << 30 and eng.budget.held_bytes("p") == 9 << 30


def test_nvml_probe_sums_a_process_over_gpus() -> None:
    from dra_driver.suspend.nvml import NvmlMemoryProbe, NvmlProcessInfo, NvmlUnavailable

    assert ctypes.sizeof(NvmlProcessInfo) == 24 and NvmlProcessInfo.usedGpuMemory.offset == 8  # type: ignore[attr-defined]
    probe = NvmlMemoryProbe(FakeNvml())
    assert probe.process_device_bytes(1234) == 4 << 30
    assert probe.process_device_bytes(4321) is None
    with pytest.raises(NvmlUnavailable, match="cannot load"):
        NvmlMemoryProbe.load("libnvidia-ml-does-not-exist.so.1")


# --------------------------------------------------------------------------- refusals and serialisation


def test_multi_rank_and_nccl_and_mps_processes_are_refused_before_any_driver_call() -> None:
    import time

    cases = {
        "WORLD_SIZE=4": ProcessFacts(environ={"WORLD_SIZE": "4", "RANK": "1"}),
        "NCCL communicator": ProcessFacts(maps="7f00-7f10 rw-s 0 00:1a 7 /dev/shm/nccl-Ab12Cd\n"),
        "MPS client": ProcessFacts(environ={"CUDA_MPS_PIPE_DIRECTORY": "/tmp/mps"}),
    }
    for what, facts in cases.items():
        lib = FakeLibcuda()
        be = CudaCheckpointBackend(CudaDriver(lib), pid_resolver=same_pid, process_facts=lambda pid, f=facts: f)
        out = be.suspend(workload(), time.monotonic() + 3, OpContext("op"))
        assert not out.ok and out.unsupported, what
        assert "cuda-checkpoint refuses pid 1234" in out.message and "not supported" in out.message, what
        assert lib.calls == ["cuInit", "version"], what  # no GetState, no lock


def test_an_unsupported_workload_takes_the_fallback_with_its_own_reason() -> None:
    from dra_driver.engine_api import SuspendReason
    from dra_driver.suspend.engine import EngineConfig, NodeSuspendEngine

    facts = ProcessFacts(environ={"WORLD_SIZE": "2"})
    be = CudaCheckpointBackend(CudaDriver(FakeLibcuda()), pid_resolver=same_pid, process_facts=lambda pid: facts)
    eng = NodeSuspendEngine(EngineConfig(1 << 40, backends=("cuda-checkpoint",)), {"cuda-checkpoint": be})
    eng.register(Registration("p", 1234, 1 << 30, frozenset({"cuda-checkpoint"}), claim_uids=frozenset({"c"})))
    r = eng.suspend("c", 3.0)
    assert not r.ok and r.reason == SuspendReason.UNSUPPORTED and "WORLD_SIZE=2" in r.message
    assert eng.metrics.fallbacks.labels("unsupported_workload")._value.get() == 1


class SlowCheckpointLib(FakeLibcuda):
    """Per-PID states; the checkpoint call takes a while and records how many ran at once."""

    def __init__(self) -> None:
        super().__init__()
        self.states: dict[int, int] = {}
        self.running = 0
        self.max_running = 0
        self._mu = threading.Lock()
        self.copying_seen: list[bool] = []
        self.backend: CudaCheckpointBackend | None = None

    def cuCheckpointProcessGetState(self, pid: int, out: Any) -> int:
        ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = self.states.get(pid, 0)
        return 0

    def cuCheckpointProcessLock(self, pid: int, args: Any) -> int:
        self.states[pid] = 1
        return 0

    def cuCheckpointProcessCheckpoint(self, pid: int, args: Any) -> int:
        with self._mu:
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        if self.backend is not None:
            w = Workload(Registration(f"pod-{pid}", pid, 1, frozenset({"cuda-checkpoint"})), "s")
            self.copying_seen.append(self.backend.copy_started(w) is not None)
        time.sleep(0.2)
        with self._mu:
            self.running -= 1
        self.states[pid] = 2
        return 0


def _suspend_all(be: CudaCheckpointBackend, pids: list[int]) -> list[bool]:
    results: list[bool] = []

    def one(pid: int) -> None:
        w = Workload(Registration(f"pod-{pid}", pid, 1, frozenset({"cuda-checkpoint"})), "s")
        results.append(be.suspend(w, time.monotonic() + 5, OpContext(f"op{pid}")).ok)

    threads = [threading.Thread(target=one, args=(p,)) for p in pids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_checkpoint_calls_of_one_job_run_one_at_a_time() -> None:
    lib = SlowCheckpointLib()
    job = ProcessFacts(environ={"CUDA_CHECKPOINT_JOB_FILE": "/proc/self/fd/3"})
    be = CudaCheckpointBackend(CudaDriver(lib), pid_resolver=same_pid, process_facts=lambda pid: job)
    lib.backend = be
    assert _suspend_all(be, [11, 12, 13]) == [True, True, True]
    assert lib.max_running == 1  # three processes of one job: strictly sequential
    assert lib.copying_seen == [True, True, True]  # each copy was reported while it ran
    w = Workload(Registration("pod-11", 11, 1, frozenset({"cuda-checkpoint"})), "s")
    assert be.copy_started(w) is None  # and no longer once done

    lib2 = SlowCheckpointLib()
    be2 = CudaCheckpointBackend(CudaDriver(lib2), pid_resolver=same_pid, process_facts=plain_process)
    assert _suspend_all(be2, [21, 22]) == [True, True]
    assert lib2.max_running == 2  # separate pods, no job file: independent, in parallel


def test_a_refused_workload_is_suspended_by_the_next_backend_it_supports() -> None:
    from dra_driver.suspend.engine import EngineConfig, NodeSuspendEngine
    from dra_driver.suspend.simulated import SimulatedBackend

    facts = ProcessFacts(environ={"WORLD_SIZE": "8"})
    lib = FakeLibcuda()
    be = CudaCheckpointBackend(CudaDriver(lib), pid_resolver=same_pid, process_facts=lambda pid: facts)
    eng = NodeSuspendEngine(
        EngineConfig(1 << 40, backends=("cuda-checkpoint", "simulated")),
        {"cuda-checkpoint": be, "simulated": SimulatedBackend(1e12)},
    )
    both = frozenset({"cuda-checkpoint", "simulated"})
    eng.register(Registration("p", 1234, 1 << 20, both, claim_uids=frozenset({"c"})))
    r = eng.suspend("c", 3.0)
    assert r.ok and r.backend == "simulated" and r.fallback is None and "lock" not in lib.calls


def test_process_facts_are_read_from_proc_and_missing_files_are_named(tmp_path: Path) -> None:
    from dra_driver.suspend.support import job_key, read_process_facts, unsupported_reasons

    d = tmp_path / "77"
    d.mkdir()
    (d / "maps").write_text("7f00-7f10 r-xp 0 08:01 5 /usr/lib/libnccl.so.2\n")  # loaded, no communicator
    (d / "environ").write_bytes(b"PATH=/bin\0CUDA_CHECKPOINT_JOB_FILE=/run/job.1\0WORLD_SIZE=1\0")
    facts = read_process_facts(77, tmp_path)
    assert facts.environ["CUDA_CHECKPOINT_JOB_FILE"] == "/run/job.1" and facts.unreadable == ()
    assert unsupported_reasons(facts) == []  # libnccl mapped and WORLD_SIZE=1 alone: not refused
    assert job_key("pod-x", facts) == "job-file:/run/job.1"
    gone = read_process_facts(78, tmp_path)
    assert len(gone.unreadable) == 2 and "78/maps" in gone.unreadable[0]
    assert job_key("pod-x", gone) == "pod:pod-x"

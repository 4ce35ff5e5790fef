"""Serving wins, enforced: what the driver does when a lent GPU is not observed free at the deadline.

The cooperative phase (the suspend engine's command with the occupant's grace period, and its
checkpoint-and-evict fallback) ends at grace + slack. If the driver does not then *observe* the
device free (``dra_driver.suspend.devicewatch``), it enforces, within ``timeout_seconds``
(``--enforce-timeout-seconds``):

1. **cuda-checkpoint** — only where the operator enabled that backend — on every observed holder
   PID (not the PID a workload reported): its device memory moves to host memory and the process
   stays alive, resumable. Observed free → done (method ``cuda-checkpoint``).
2. Otherwise **stop and kill**: SIGSTOP every holder (it stops computing and allocating), then
   SIGKILL; evict the holders' pods (the driver's own claim records, UID precondition; all of the
   claim's pods when no holder can be attributed to one by its cgroup, e.g. on KWOK); once no
   holder is left, free what they left (``free_dead``: as the GPU driver frees a dead process's
   memory); observe again until free or the bound, killing any new holder (a fork) on the way
   (method ``kill``). The workload
   loses what it had not checkpointed durably: its own doing, and the Event says so.

No durable checkpoint is asked for here: the engine's fallback asked while the driver waited (and
when that request is still unanswered at grace + slack, the driver gives it up to
``timeout_seconds`` more before it gets here: ``NodeDriver._await_fallback_checkpoint``); a
workload that answered neither SUSPEND nor CHECKPOINT by then will not answer now.

I/O boundary: signals to observed PIDs (``kill``), the injected watch, checkpointer and evictor.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from dra_driver.claims import PodRef
from dra_driver.engine_api import SuspendResult
from dra_driver.suspend.devicewatch import DeviceWatch, Observation, Target, belongs_to, device_free, read_cgroup

log = logging.getLogger("rose.driver.enforce")

PHASE_COOPERATIVE: Final = "cooperative"
PHASE_FALLBACK: Final = "fallback"
PHASE_ENFORCED: Final = "enforced"
PHASES: Final = (PHASE_COOPERATIVE, PHASE_FALLBACK, PHASE_ENFORCED)

METHOD_NONE: Final = "none"
METHOD_CUDA_CHECKPOINT: Final = "cuda-checkpoint"
METHOD_KILL: Final = "kill"


class PidCheckpointer(Protocol):
    """cuda-checkpoint by host PID (``CudaCheckpointBackend.checkpoint_pid`` / ``restore_pid``)."""

    def checkpoint_pid(self, pid: int, deadline_monotonic: float) -> str | None: ...

    def restore_pid(self, pid: int) -> str | None: ...


class PodEvictor(Protocol):
    """Evicts exactly this pod (UID precondition): ``dra_driver.kube.KubeEvictor``."""

    def evict(self, pod: PodRef, reason: str) -> None: ...


@dataclass(frozen=True)
class EnforceResult:
    free: bool
    method: str  # METHOD_*
    pids: tuple[int, ...]  # checkpointed (cuda-checkpoint) or killed (kill)
    evicted: tuple[PodRef, ...]
    observation: Observation
    message: str


def returned_phase(res: SuspendResult, method: str) -> str:
    """Pure: which phase returned the GPU to serving — the driver's enforcement, the engine's
    confirmed checkpoint-and-evict fallback, or the workload's cooperation."""
    if res.ok and res.fallback is not None:  # confirmed checkpoint: stopping its processes loses nothing
        return PHASE_FALLBACK
    if method != METHOD_NONE:
        return PHASE_ENFORCED
    return PHASE_COOPERATIVE


def pods_to_evict(killed_cgroups: Sequence[str], pods: Sequence[PodRef]) -> tuple[PodRef, ...]:
    """Pure: the claim's pods a killed holder belonged to (by cgroup); all of them when no holder
    can be attributed (simulated nodes: no pod cgroups)."""
    named = tuple(p for p in pods if any(belongs_to(cg, [p.uid]) for cg in killed_cgroups))
    return named or tuple(pods)


class Enforcer:
    def __init__(
        self,
        watch: DeviceWatch,
        *,
        timeout_seconds: float = 10.0,
        evictor: PodEvictor | None = None,
        checkpointer: PidCheckpointer | None = None,
        kill: Callable[[int, int], None] = os.kill,
        cgroup_of: Callable[[int], str] = read_cgroup,
        sleep: Callable[[float], None] = time.sleep,
        poll_seconds: float = 0.05,
    ) -> None:
        if timeout_seconds <= 0:
            raise ValueError(f"enforce timeout must be > 0 seconds, got {timeout_seconds}")
        self.watch = watch
        self.timeout = timeout_seconds
        self.evictor = evictor
        self.checkpointer = checkpointer
        self._kill = kill
        self._cgroup_of = cgroup_of
        self._sleep = sleep
        self._poll = poll_seconds

    def observe(self, t: Target) -> Observation:
        return self.watch.observe(t)

    def is_free(self, obs: Observation) -> bool:
        return device_free(obs, self.watch.allowance_bytes)

    def enforce(self, t: Target, pods: Sequence[PodRef], why: str, *, checkpoint: bool = True) -> EnforceResult:
        """Observe; if not free, free it (``checkpoint``: cuda-checkpoint may be tried first — not
        for a workload whose durable checkpoint was already confirmed and is being evicted)."""
        deadline = time.monotonic() + self.timeout
        obs = self.observe(t)
        if self.is_free(obs):
            return EnforceResult(True, METHOD_NONE, (), (), obs, "device observed free")
        if checkpoint and self.checkpointer is not None and obs.holders:
            got = self._checkpoint(t, obs, deadline)
            if got is not None:
                return got
        return self._kill_and_evict(t, pods, obs, deadline, why)

    def _checkpoint(self, t: Target, obs: Observation, deadline: float) -> EnforceResult | None:
        assert self.checkpointer is not None
        errors = [f"{pid}: {e}" for pid in obs.pids() if (e := self.checkpointer.checkpoint_pid(pid, deadline))]
        after = self.observe(t)
        if not errors and self.is_free(after):
            return EnforceResult(True, METHOD_CUDA_CHECKPOINT, obs.pids(), (), after, "holders checkpointed")
        for pid in obs.pids():  # a partial checkpoint must not stay half-done before the kill
            self.checkpointer.restore_pid(pid)
        log.warning("enforced cuda-checkpoint did not free the device", extra={"claim": t.claim_uid, "err": errors})
        return None

    def _signal(self, pids: Sequence[int], sig: int) -> None:
        for pid in pids:
            try:
                self._kill(pid, sig)
            except (ProcessLookupError, PermissionError) as e:
                log.warning("signal failed", extra={"pid": pid, "signal": int(sig), "err": repr(e)})

    def _kill_and_evict(
        self, t: Target, pods: Sequence[PodRef], obs: Observation, deadline: float, why: str
    ) -> EnforceResult:
        killed: list[int] = []
        cgroups: list[str] = []
        evicted: tuple[PodRef, ...] = ()
        while True:
            new = [p for p in obs.pids() if p not in killed]
            cgroups += [self._cgroup_of(p) for p in new]
            self._signal(new, signal.SIGSTOP)
            self._signal(new, signal.SIGKILL)
            killed += new
            if not evicted:
                evicted = self._evict(pods_to_evict(cgroups, pods) if killed else tuple(pods), why)
            obs = self.observe(t)
            if not obs.holders:  # every holder is gone: free what they left, as the GPU driver does
                self.watch.free_dead(t)
                obs = self.observe(t)
            if self.is_free(obs) or time.monotonic() >= deadline:
                break
            self._sleep(self._poll)
        free = self.is_free(obs)
        msg = f"killed holder PIDs {killed or 'none'}; " + ("device observed free" if free else obs.describe())
        return EnforceResult(free, METHOD_KILL, tuple(killed), evicted, obs, msg)

    def _evict(self, pods: Sequence[PodRef], why: str) -> tuple[PodRef, ...]:
        if self.evictor is None:
            return ()
        done = []
        for p in pods:
            try:
                self.evictor.evict(p, why)
                done.append(p)
            except Exception as e:  # the API being down must not stop freeing the device
                log.warning("eviction failed", extra={"pod": f"{p.namespace}/{p.name}", "err": repr(e)})
        return tuple(done)

"""The workload side of the node agent: register, receive commands, act only at safe points.

    wl = rose_sdk.init(model=policy, optimizer=opt, checkpoint_path="/ckpt/job.rose")
    for step in range(n):
        ...train...
        wl.safe_point(step)          # suspend / resume / checkpoint happen here, never elsewhere

    @wl.on_world_change              # the job shrank or grew: runs inside safe_point
    def adapt(world): batch = world.share(global_batch)

    wl.report("rollout", seconds_to_safe_point=4.0, steps=s, samples=n)   # rate-limited

A background thread keeps the ``WorkloadAgent.Commands`` stream open (reconnecting and
re-registering after an agent restart, reporting ``SUSPENDED`` if it is parked) and queues the
commands; ``safe_point()`` runs them on the training thread. A suspend offloads the job's
tensors (``CooperativeOffloader``), acknowledges, then blocks inside ``safe_point`` until the
resume arrives, restores and returns: the training loop never sees a half-moved state.
While suspended, a ``COMMAND_KIND_SPILL`` (the node's host memory is full) writes the host copy
to the file the driver names (``CooperativeOffloader.spill_to``) and acknowledges; the host copy
is freed only at the ``COMMAND_KIND_SPILL_COMMIT`` that follows once the driver verified the file,
and a resume naming the file reads it back (verified) before restoring to the device.
A ``COMMAND_KIND_WORLD`` (the job's active / total workers, from the pod's ``rose.io/world``)
runs the ``on_world_change`` callbacks at the next safe point. ``report()`` sends the phase,
expected seconds to the next safe point, state bytes, minimum resources and RL progress counters
(``WorkloadAgent.Report``), at most every ``report_interval_s`` unless the phase changed.

Environment: ROSE_AGENT_SOCKET (the node agent's workload socket: set by the lent claim's CDI spec
to that claim's own socket, mounted at /run/rose/claims/<claimUID>/; an explicit ``socket_path``
wins; unset = no agent, safe_point does nothing), ROSE_POD_UID, ROSE_POD_NAMESPACE, ROSE_POD_NAME
(downward API), ROSE_CLAIM_UID_<UID>=<UID> (one per claim, injected by the driver's CDI spec:
``rose_common.names.claim_uids_from_env``), ROSE_CHECKPOINT_PATH (a file path or
``s3://bucket/prefix``), ROSE_RESTORE=latest (``start()`` restores the newest checkpoint there, if
any: ``restored``), ROSE_CHECKPOINT_EVERY=N (a durable checkpoint at every N-th step's safe point,
so a worker whose node is lost has one to restore from), ROSE_SIMULATED_DEVICE_MEMORY (on
simulated GPUs: the claim's device-memory file the driver observes; the workload holds its state
size there while resident and truncates it when it offloads — ``SimulatedDeviceMemory``).
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import grpc
import torch

from rose_common import names
from rose_common.proto import rose_agent_v1_pb2 as pb
from rose_common.proto import rose_agent_v1_pb2_grpc as pb_grpc
from rose_sdk.checkpoint import (
    Checkpoint,
    CheckpointInfo,
    checkpoint_location,
    restore_latest,
    restore_requested,
    save_checkpoint,
)
from rose_sdk.offload import CooperativeOffloader
from rose_sdk.world import World

# The node agent is on this node, behind a unix socket: after a driver restart the workload must be
# reachable again within a second, because a reclaim that finds it unregistered cannot use its
# grace (it is enforced). Both the stream loop's own backoff and gRPC's channel reconnect backoff
# (gRPC's default: 1 s doubling to 120 s) are capped at RECONNECT_MAX_S; a retry costs a connect().
RECONNECT_MAX_S = 1.0
AGENT_CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", int(RECONNECT_MAX_S * 1000)),
)

log = logging.getLogger("rose.sdk")

Hook = Callable[[], None]
H = TypeVar("H", bound=Hook)
WorldHook = Callable[[World], None]
W = TypeVar("W", bound=WorldHook)

_BACKENDS = {
    "cooperative": pb.BACKEND_COOPERATIVE,
    "cuda-checkpoint": pb.BACKEND_CUDA_CHECKPOINT,
    "simulated": pb.BACKEND_SIMULATED,
}


class AgentError(RuntimeError):
    """The node agent refused or could not be reached; the message says why."""


class SimulatedDeviceMemory:
    """The simulated GPU's memory as the driver observes it (``ROSE_SIMULATED_DEVICE_MEMORY``, set
    by the claim's CDI spec on simulated GPUs): the file is kept open, ``hold(n)`` allocates ``n``
    bytes in it (resident state), ``free()`` truncates it to 0 (offloaded). A failure is logged,
    never raised: training goes on, the driver's observation decides."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def hold(self, nbytes: int) -> None:
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDWR)
            os.ftruncate(self._fd, 0)
            if nbytes > 0:
                os.posix_fallocate(self._fd, 0, nbytes)
        except OSError as e:
            log.warning("simulated device memory not allocated", extra={"path": self.path, "err": repr(e)})

    def free(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        except OSError as e:
            log.warning("simulated device memory not freed", extra={"path": self.path, "err": repr(e)})

    def close(self) -> None:
        """Free and let go (a process that exits frees its device memory)."""
        if self._fd is not None:
            self.free()
            os.close(self._fd)
            self._fd = None


class Workload:
    def __init__(
        self,
        *,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        tensors: Mapping[str, torch.Tensor] | None = None,
        checkpoint_path: str | os.PathLike[str] | None = None,
        user_state: Callable[[], Any] | None = None,
        socket_path: str | None = None,
        pod_uid: str | None = None,
        pod_namespace: str | None = None,
        pod_name: str | None = None,
        claim_uids: Sequence[str] | None = None,
        backends: Sequence[str] = ("cooperative",),
        state_bytes: int | None = None,
        offloader: CooperativeOffloader | None = None,
        report_interval_s: float = 5.0,
    ) -> None:
        env = os.environ
        self.model, self.optimizer = model, optimizer
        self.offloader = offloader or CooperativeOffloader(model, optimizer, tensors)
        ck = checkpoint_path if checkpoint_path is not None else env.get("ROSE_CHECKPOINT_PATH")
        self.checkpoint_path: Path | str | None = checkpoint_location(ck) if ck else None
        self.checkpoint_every = _positive_int(env, "ROSE_CHECKPOINT_EVERY")
        self._restore = restore_requested(env)
        self.restored: Checkpoint | None = None  # what start() restored from (ROSE_RESTORE=latest)
        self._user_state = user_state
        self.socket_path = socket_path if socket_path is not None else env.get("ROSE_AGENT_SOCKET", "")
        self.pod_uid = pod_uid if pod_uid is not None else env.get("ROSE_POD_UID", "")
        self.pod_namespace = pod_namespace if pod_namespace is not None else env.get("ROSE_POD_NAMESPACE", "")
        self.pod_name = pod_name if pod_name is not None else env.get("ROSE_POD_NAME", "")
        if claim_uids is None:
            claim_uids = names.claim_uids_from_env(env)
        self.claim_uids = list(claim_uids)
        unknown = [b for b in backends if b not in _BACKENDS]
        if unknown:
            raise ValueError(f"unknown backend(s) {unknown}; choose from {sorted(_BACKENDS)}")
        self.backends = list(backends)
        self._state_bytes = state_bytes
        sim = env.get("ROSE_SIMULATED_DEVICE_MEMORY", "")
        self.device_memory = SimulatedDeviceMemory(sim) if sim else None
        self.step = 0
        self.suspended = False
        self.suspend_count = 0
        self.resume_count = 0
        self.spill_count = 0  # host copies freed after the driver verified their spill file
        self.last_checkpoint: CheckpointInfo | None = None
        self._on_suspend: list[Hook] = []
        self._on_suspended: list[Hook] = []
        self._on_resume: list[Hook] = []
        self._pending: queue.Queue[pb.Command] = queue.Queue()
        self._closing = threading.Event()
        self._session = ""
        self._session_lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: pb_grpc.WorkloadAgentStub | None = None
        self._thread: threading.Thread | None = None
        self._reported_bytes = 0
        self.world: World | None = None
        self.world_changes = 0
        self._on_world: list[WorldHook] = []
        self.report_interval_s = report_interval_s
        self._progress = Progress()
        self._last_report: tuple[float, str] | None = None  # (monotonic time, phase) of the last send

    # ------------------------------------------------------------------ hooks

    def on_suspend(self, fn: H) -> H:
        """Register ``fn`` to run at the safe point before the offload (decorator)."""
        self._on_suspend.append(fn)
        return fn

    def on_suspended(self, fn: H) -> H:
        """Register ``fn`` to run right after the offload, before the suspend is acknowledged:
        the job's tensors live in host memory then (decorator). If it raises, the state is
        restored and the suspend refused."""
        self._on_suspended.append(fn)
        return fn

    def on_resume(self, fn: H) -> H:
        """Register ``fn`` to run at the safe point after the restore (decorator)."""
        self._on_resume.append(fn)
        return fn

    def on_world_change(self, fn: W) -> W:
        """Register ``fn(world)`` to run at the safe point where a new active world arrives
        (decorator). The world is also in ``self.world``; ``world.share(n)`` splits ``n``."""
        self._on_world.append(fn)
        return fn

    # ------------------------------------------------------------------ connection

    @property
    def connected_to_agent(self) -> bool:
        return self._stub is not None

    def _register(self) -> None:
        stub = self._stub
        if stub is None:
            raise ValueError("workload closed")
        req = pb.RegisterRequest(
            pod_uid=self.pod_uid,
            pid=os.getpid(),
            state_bytes=self._state_bytes if self._state_bytes is not None else self.offloader.state_bytes(),
            supported_backends=[_BACKENDS[b] for b in self.backends],
            pod_namespace=self.pod_namespace,
            pod_name=self.pod_name,
            claim_uids=self.claim_uids,
            checkpoint_path=str(self.checkpoint_path or ""),
            current_state=pb.WORKLOAD_STATE_SUSPENDED if self.suspended else pb.WORKLOAD_STATE_RUNNING,
        )
        resp = stub.Register(req, timeout=10)
        with self._session_lock:
            self._session = resp.session_id
        self._reported_bytes = req.state_bytes

    def start(self) -> Workload:
        """Restore from the checkpoint when ROSE_RESTORE asks, register with the node agent and
        start the command stream (no-op without a socket)."""
        if self._restore and self.checkpoint_path is not None and self.restored is None:
            self.restored = restore_latest(self.checkpoint_path, self.model, self.optimizer)
            if self.restored is not None:
                self.step = self.restored.step
                log.info("restored from the durable checkpoint", extra={"step": self.step})
        if not self.socket_path:
            log.info("no node agent socket (ROSE_AGENT_SOCKET unset): safe points do nothing")
            return self
        self._channel = grpc.insecure_channel(f"unix:{self.socket_path}", options=AGENT_CHANNEL_OPTIONS)
        self._stub = pb_grpc.WorkloadAgentStub(self._channel)  # type: ignore[no-untyped-call]
        try:
            self._register()
        except grpc.RpcError as e:
            self.close()
            raise AgentError(f"node agent at {self.socket_path} refused the registration: {e.details()}") from e
        if self.device_memory is not None:
            self.device_memory.hold(self._reported_bytes)
        self._thread = threading.Thread(target=self._stream_loop, name="rose-sdk-commands", daemon=True)
        self._thread.start()
        return self

    def _stream_loop(self) -> None:
        backoff = 0.1
        while not self._closing.is_set():
            stub = self._stub
            if stub is None:  # closed
                return
            try:
                with self._session_lock:
                    session = self._session
                stream = stub.Commands(pb.CommandsRequest(pod_uid=self.pod_uid, session_id=session))
                for cmd in stream:
                    self._pending.put(cmd)
                    backoff = 0.1
                if self._closing.is_set():
                    return
            except (grpc.RpcError, ValueError) as e:  # ValueError: the channel was closed under us
                if self._closing.is_set():
                    return
                log.warning("command stream broken; reconnecting", extra={"err": repr(e)})
            # Stream ended (agent restart, superseded session): register again, then reconnect.
            self._closing.wait(backoff)
            backoff = min(backoff * 2, RECONNECT_MAX_S)
            if self._closing.is_set() or self._stub is None:
                return
            try:
                self._register()
            except (grpc.RpcError, ValueError) as e:
                log.warning("re-registration failed", extra={"err": repr(e)})

    def close(self) -> None:
        """Send the last report (final progress totals), then stop the command stream."""
        if self._stub is not None and self._progress.phase and not self._closing.is_set():
            self._send_report(force=True)
        self._closing.set()
        if self.device_memory is not None:
            self.device_memory.close()
        if self._channel is not None:
            self._channel.close()
        self._channel, self._stub = None, None

    def __enter__(self) -> Workload:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ safe point

    def safe_point(self, step: int | None = None, *, wait_seconds: float = 0.0) -> int:
        """Run pending commands here; returns how many ran.

        ``wait_seconds`` > 0 blocks up to that long for a first command (a phase boundary that
        expects to be suspended). A suspend blocks inside this call until the resume arrives.
        """
        if step is not None:
            self._periodic_checkpoint(step)
            self.step = step
        if self._stub is None:
            return 0
        self._report_size()
        self._send_report(force=False)
        ran = 0
        wait_until = time.monotonic() + wait_seconds
        while True:
            left = wait_until - time.monotonic()
            try:
                cmd = self._pending.get(timeout=left) if left > 0 and ran == 0 else self._pending.get_nowait()
            except queue.Empty:
                return ran
            self._handle(cmd)
            ran += 1

    def _periodic_checkpoint(self, step: int) -> None:
        every = self.checkpoint_every
        if every and step != self.step and step % every == 0 and not self.suspended:
            self.step = step
            try:
                self.checkpoint_now()
            except Exception:  # the storage is down: keep training, the next one may succeed
                log.exception("periodic durable checkpoint failed; training continues", extra={"step": step})

    def _report_size(self) -> None:
        """Tell the agent when the state grew (> 5 %) or shrank (> 20 %): its budget admits on it."""
        if self._state_bytes is not None or self.suspended or self._stub is None:
            return
        n = self.offloader.state_bytes()
        if self._reported_bytes * 0.8 <= n <= self._reported_bytes * 1.05:
            return
        with self._session_lock:
            session = self._session
        try:
            self._stub.UpdateStateSize(
                pb.UpdateStateSizeRequest(pod_uid=self.pod_uid, session_id=session, state_bytes=n), timeout=10
            )
            self._reported_bytes = n
        except grpc.RpcError as e:
            log.warning("state size update failed", extra={"err": str(e.details())})

    def _ack(
        self,
        cmd: pb.Command,
        ok: bool,
        *,
        nbytes: int = 0,
        seconds: float = 0.0,
        message: str = "",
        ckpt: CheckpointInfo | None = None,
    ) -> None:
        assert self._stub is not None
        with self._session_lock:
            session = self._session
        req = pb.AcknowledgeRequest(
            pod_uid=self.pod_uid,
            session_id=session,
            operation_id=cmd.operation_id,
            ok=ok,
            bytes_moved=nbytes,
            seconds=seconds,
            message=message,
            checkpoint_path=str(ckpt.path) if ckpt else "",
            checkpoint_sha256=ckpt.sha256 if ckpt else "",
        )
        try:
            self._stub.Acknowledge(req, timeout=10)
        except grpc.RpcError as e:
            log.warning("acknowledge failed", extra={"op": cmd.operation_id, "err": str(e.details())})

    def _handle(self, cmd: pb.Command) -> None:
        late_ms = int(time.time() * 1000) - cmd.deadline_unix_ms
        if cmd.kind == pb.COMMAND_KIND_SUSPEND:
            if cmd.deadline_unix_ms and late_ms > 0:
                self._ack(cmd, False, message=f"expired: safe point reached {late_ms} ms after the deadline")
                return
            self._suspend(cmd)
        elif cmd.kind == pb.COMMAND_KIND_RESUME:
            if not self.suspended:
                self._ack(cmd, True, message="already running")
                return
            self._resume(cmd)
        elif cmd.kind == pb.COMMAND_KIND_CHECKPOINT:
            self._checkpoint(cmd)
        elif cmd.kind == pb.COMMAND_KIND_WORLD:
            self._world(cmd.world_active, cmd.world_total)
        elif cmd.kind in (pb.COMMAND_KIND_SPILL, pb.COMMAND_KIND_SPILL_COMMIT):
            self._ack(cmd, False, message="not suspended: no host copy to spill")
        else:
            self._ack(cmd, False, message=f"unknown command kind {cmd.kind}; upgrade rose_sdk")

    def _world(self, active: int, total: int) -> None:
        """A new active world: remember it and run the callbacks (a repeat of the current one is a no-op)."""
        try:
            world = World(active, total)
        except ValueError as e:
            log.warning("world command ignored", extra={"err": str(e)})
            return
        if world == self.world:
            return
        self.world = world
        self.world_changes += 1
        log.info("world changed", extra={"world": str(world)})
        for fn in self._on_world:
            fn(world)

    def _suspend(self, cmd: pb.Command) -> None:
        if self.suspended:
            self._ack(cmd, True, message="already suspended")
            return
        t0 = time.perf_counter()
        try:
            for fn in self._on_suspend:
                fn()
            rep = self.offloader.offload()
        except Exception as e:
            log.exception("offload failed")
            self._ack(cmd, False, message=f"offload failed: {e!r}")
            return
        try:
            for fn in self._on_suspended:
                fn()
        except Exception as e:
            log.exception("on_suspended hook failed; restoring")
            self.offloader.restore()
            self._ack(cmd, False, message=f"on_suspended hook failed: {e!r}; state restored, still running")
            return
        if self.device_memory is not None:
            self.device_memory.free()
        self.suspended = True
        self.suspend_count += 1
        self._ack(
            cmd,
            True,
            nbytes=rep.bytes_moved,
            seconds=time.perf_counter() - t0,
            message=f"offloaded {rep.tensors} tensors (arena reused: {rep.arena_reused})",
        )
        self._park()

    def _park(self) -> None:
        """Suspended: block the training thread until a resume (or the agent goes away for good)."""
        while self.suspended:
            try:
                cmd = self._pending.get(timeout=0.5)
            except queue.Empty:
                if self._closing.is_set():
                    return
                continue
            if cmd.kind == pb.COMMAND_KIND_RESUME:
                self._resume(cmd)
            elif cmd.kind == pb.COMMAND_KIND_CHECKPOINT:
                self._checkpoint(cmd)
            elif cmd.kind == pb.COMMAND_KIND_SUSPEND:
                self._ack(cmd, True, message="already suspended")
            elif cmd.kind == pb.COMMAND_KIND_WORLD:
                self._world(cmd.world_active, cmd.world_total)
            elif cmd.kind == pb.COMMAND_KIND_SPILL:
                self._spill(cmd)
            elif cmd.kind == pb.COMMAND_KIND_SPILL_COMMIT:
                self._spill_commit(cmd)
            else:
                self._ack(cmd, False, message=f"unknown command kind {cmd.kind}")

    def _spill(self, cmd: pb.Command) -> None:
        """Write the host copy to the driver's file; keep it until the driver verified the file."""
        if not cmd.spill_path:
            self._ack(cmd, False, message="spill command without a spill_path")
            return
        t0 = time.perf_counter()
        try:
            n = self.offloader.spill_to(cmd.spill_path)
        except Exception as e:
            log.exception("spill failed")
            self._ack(cmd, False, message=f"spill failed: {e!r}; host copy kept")
            return
        self._ack(cmd, True, nbytes=n, seconds=time.perf_counter() - t0, message=f"wrote {n} B to the spill file")

    def _spill_commit(self, cmd: pb.Command) -> None:
        """The driver verified the spill file: free the host copy."""
        if self.offloader.host_dropped:
            self._ack(cmd, True, message="host copy already freed")
            return
        try:
            n = self.offloader.drop_host_copy()
        except Exception as e:
            self._ack(cmd, False, message=f"could not free the host copy: {e!r}")
            return
        self.spill_count += 1
        self._ack(cmd, True, nbytes=n, message=f"freed {n} B of host memory; the state is in the spill file")

    def _resume(self, cmd: pb.Command) -> None:
        t0 = time.perf_counter()
        try:
            if self.offloader.host_dropped:
                if not cmd.spill_path:
                    raise RuntimeError("the host copy was spilled but the resume names no spill file")
                self.offloader.load_from(cmd.spill_path)
            rep = self.offloader.restore()
            if self.device_memory is not None:
                self.device_memory.hold(self._reported_bytes)
            for fn in self._on_resume:
                fn()
        except Exception as e:
            log.exception("restore failed")
            self._ack(cmd, False, message=f"restore failed: {e!r}; state is still in host memory")
            return
        self.suspended = False
        self.resume_count += 1
        self._ack(
            cmd,
            True,
            nbytes=rep.bytes_moved,
            seconds=time.perf_counter() - t0,
            message=f"restored {rep.tensors} tensors",
        )

    # ------------------------------------------------------------------ reports

    def report(
        self,
        phase: str | None = None,
        *,
        seconds_to_safe_point: float | None = None,
        steps: int | None = None,
        samples: int | None = None,
        tokens: int | None = None,
        min_gpus: int | None = None,
        min_host_memory_bytes: int | None = None,
        force: bool = False,
    ) -> bool:
        """Update what the workload reports (``steps``/``samples``/``tokens``: totals since start)
        and send it if due: the phase changed, ``report_interval_s`` passed, or ``force``.
        Returns whether it was sent. Bad values raise ValueError saying which."""
        given: dict[str, Any] = {
            "phase": phase,
            "seconds_to_safe_point": seconds_to_safe_point,
            "steps": steps,
            "samples": samples,
            "tokens": tokens,
            "min_gpus": min_gpus,
            "min_host_memory_bytes": min_host_memory_bytes,
        }
        self._progress = replace(self._progress, **{k: v for k, v in given.items() if v is not None})
        return self._send_report(force=force)

    def add_progress(self, *, steps: int = 0, samples: int = 0, tokens: int | None = None) -> None:
        """Count ``steps`` / ``samples`` / ``tokens`` more (sent with the next report)."""
        p = self._progress
        t = None if tokens is None and p.tokens is None else (p.tokens or 0) + (tokens or 0)
        self._progress = replace(p, steps=p.steps + steps, samples=p.samples + samples, tokens=t)

    @property
    def progress(self) -> Progress:
        return self._progress

    def _send_report(self, *, force: bool) -> bool:
        p, stub = self._progress, self._stub
        if stub is None or not p.phase:
            return False
        now = time.monotonic()
        last = self._last_report
        if not force and last is not None and last[1] == p.phase and now - last[0] < self.report_interval_s:
            return False
        with self._session_lock:
            session = self._session
        size = self._state_bytes if self._state_bytes is not None else self._reported_bytes  # the size sent last
        req = p.request(self.pod_uid, session, size)
        try:
            resp = stub.Report(req, timeout=10)
        except grpc.RpcError as e:
            log.warning("report failed", extra={"err": str(e.details())})
            return False
        self._last_report = (now, p.phase)
        if resp.world_total > 0:
            self._pending.put(
                pb.Command(kind=pb.COMMAND_KIND_WORLD, world_active=resp.world_active, world_total=resp.world_total)
            )
        return True

    def checkpoint_now(self) -> CheckpointInfo:
        """Write the atomic durable checkpoint (model, optimizer, RNG, step, user state)."""
        if self.checkpoint_path is None:
            raise AgentError("no checkpoint path: pass checkpoint_path= or set ROSE_CHECKPOINT_PATH")
        info = save_checkpoint(
            self.checkpoint_path,
            model=self.model,
            optimizer=self.optimizer,
            step=self.step,
            user_state=self._user_state() if self._user_state else None,
        )
        self.last_checkpoint = info
        return info

    def _checkpoint(self, cmd: pb.Command) -> None:
        try:
            info = self.checkpoint_now()
        except Exception as e:
            log.exception("durable checkpoint failed")
            self._ack(cmd, False, message=f"durable checkpoint failed: {e!r}")
            return
        self._ack(
            cmd, True, nbytes=info.nbytes, seconds=info.seconds, message=f"checkpoint at step {self.step}", ckpt=info
        )


def _positive_int(env: Mapping[str, str], name: str) -> int:
    raw = env.get(name, "")
    if not raw:
        return 0
    if not raw.isdigit() or int(raw) == 0:
        raise ValueError(f"{name}={raw!r}: set it to a positive whole number of steps, or leave it unset")
    return int(raw)


@dataclass(frozen=True)
class Progress:
    """What the workload reports: phase, seconds to its next safe point, RL totals since start
    (``tokens`` None: the job counts none) and the least it can run with."""

    phase: str = ""
    seconds_to_safe_point: float = 0.0
    steps: int = 0
    samples: int = 0
    tokens: int | None = None
    min_gpus: int = 0
    min_host_memory_bytes: int = 0

    def __post_init__(self) -> None:
        if not math.isfinite(self.seconds_to_safe_point) or self.seconds_to_safe_point < 0:
            raise ValueError(f"seconds_to_safe_point must be a finite number >= 0, got {self.seconds_to_safe_point}")
        for name in ("steps", "samples", "tokens", "min_gpus", "min_host_memory_bytes"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ValueError(f"{name} must be >= 0, got {v}")

    def request(self, pod_uid: str, session: str, state_bytes: int) -> pb.ReportRequest:
        return pb.ReportRequest(
            pod_uid=pod_uid,
            session_id=session,
            phase=self.phase,
            seconds_to_safe_point=self.seconds_to_safe_point,
            state_bytes=state_bytes,
            min_gpus=self.min_gpus,
            min_host_memory_bytes=self.min_host_memory_bytes,
            steps_total=self.steps,
            samples_total=self.samples,
            tokens_total=self.tokens or 0,
            reports_tokens=self.tokens is not None,
        )


# ---------------------------------------------------------------------- module-level convenience

_default: list[Workload] = []  # the process's workload (at most one)


def init(**kwargs: Any) -> Workload:
    """Create the process's Workload from keyword arguments and the environment, and start it."""
    while _default:
        _default.pop().close()
    w = Workload(**kwargs).start()
    _default.append(w)
    return w


def current() -> Workload:
    if not _default:
        raise RuntimeError("rose_sdk.init(...) must be called before safe_point / on_suspend / on_resume")
    return _default[0]


def safe_point(step: int | None = None, *, wait_seconds: float = 0.0) -> int:
    return current().safe_point(step, wait_seconds=wait_seconds)


def on_suspend(fn: H) -> H:
    return current().on_suspend(fn)


def on_resume(fn: H) -> H:
    return current().on_resume(fn)


def on_world_change(fn: W) -> W:
    return current().on_world_change(fn)


def report(phase: str | None = None, **kwargs: Any) -> bool:
    return current().report(phase, **kwargs)

"""Lent GPU occupants for ``benchmarks.reclaim_adversarial``: one honest, the rest hostile.

    python -m benchmarks.adversaries --behaviour BEHAVIOUR --memory-file F --status-file S \\
        [--socket SOCK --pod-uid UID] [--state-bytes N] [--checkpoint-dir D]

Each runs as a host process (KWOK nodes run no containers), as the lent pod's container would:
it holds "device memory" by keeping the claim's simulated device-memory file
(``<plugin-dir>/claims/<claimUID>/device-memory``, the host path of the claim's CDI mount,
``ROSE_SIMULATED_DEVICE_MEMORY``) open with ``--state-bytes`` allocated in it, and talks to the
node agent over the claim's own ``workload.sock`` (WorkloadAgent: Register / Commands /
Acknowledge) — the real ``rose_sdk`` for ``honest``, raw gRPC for the others. What a hostile one
does is what a buggy or malicious workload could do; the driver must free the GPU anyway.

| behaviour | what |
| --- | --- |
| ``honest`` | case (a): the real rose_sdk, a registered tensor updated each step; frees the file on offload |
| ``unregistered`` | case (b): holds the device, never talks to the agent |
| ``claims-suspended`` | case (c): registers with ``current_state=SUSPENDED`` and keeps holding/computing |
| ``lying-ack`` | case (d): acknowledges SUSPEND with ok=True and frees nothing |
| ``hang`` | case (e): registers, opens the command stream, never acknowledges |
| ``ckpt-fifo`` / ``ckpt-symlink`` / ``ckpt-sparse`` | case (f): refuses SUSPEND, answers CHECKPOINT with |
| | a FIFO, a symlink to /etc/shadow, or a 100 GB sparse file behind a valid header |
| ``crash`` | case (g): on SUSPEND, frees half its memory and dies by SIGKILL without acknowledging |

Progress goes to ``--status-file`` as JSON lines (``{"event": ..., "t": unix seconds, ...}``):
``ready`` once the memory is held (and registered, when it registers); the honest workload adds
``suspended`` / ``resumed`` with the state's sha256 before and after and whether it is intact.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

BEHAVIOURS = (
    "honest",
    "unregistered",
    "claims-suspended",
    "lying-ack",
    "hang",
    "ckpt-fifo",
    "ckpt-symlink",
    "ckpt-sparse",
    "crash",
)
TOUCH_SECONDS = 0.05  # a hostile holder re-allocates its memory this often ("keeps computing")
CKPT_MAGIC = b"ROSECKPT1\n"  # rose_sdk.checkpoint's header (the driver verifies it)


class Status:
    """Appends JSON lines to the status file the benchmark reads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._mu = threading.Lock()

    def emit(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "t": time.time(), "pid": os.getpid(), **fields})
        with self._mu, self.path.open("a") as f:
            f.write(line + "\n")
            f.flush()


class DeviceMemory:
    """The claim's simulated device memory: allocated bytes of an open file (st_blocks * 512)."""

    def __init__(self, path: Path, nbytes: int) -> None:
        self.path = path
        self.nbytes = nbytes
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)

    def hold(self) -> None:
        os.posix_fallocate(self.fd, 0, self.nbytes)

    def touch(self) -> None:
        """Compute on it: make sure it is allocated and write into it."""
        with contextlib.suppress(OSError):
            self.hold()
            os.pwrite(self.fd, os.urandom(64), 0)

    def free(self) -> None:
        os.ftruncate(self.fd, 0)

    def free_half(self) -> None:
        os.ftruncate(self.fd, self.nbytes // 2)


def _hold_forever(mem: DeviceMemory, stop: threading.Event | None = None) -> None:
    ev = stop or threading.Event()
    while not ev.wait(TOUCH_SECONDS):
        mem.touch()


# --------------------------------------------------------------------------- raw agent client


class RawAgent:
    """The WorkloadAgent API without the SDK (what a hostile process can send)."""

    def __init__(self, socket: str, pod_uid: str) -> None:
        import grpc

        from rose_common.proto import rose_agent_v1_pb2 as pb
        from rose_common.proto import rose_agent_v1_pb2_grpc as pb_grpc

        self.pb = pb
        self.pod_uid = pod_uid
        self.channel = grpc.insecure_channel(f"unix:{socket}")
        self.stub = pb_grpc.WorkloadAgentStub(self.channel)  # type: ignore[no-untyped-call]
        self.session = ""

    def register(self, state_bytes: int, *, suspended: bool = False) -> None:
        pb = self.pb
        req = pb.RegisterRequest(
            pod_uid=self.pod_uid,
            pid=os.getpid(),
            state_bytes=state_bytes,
            supported_backends=[pb.BACKEND_COOPERATIVE],
            current_state=pb.WORKLOAD_STATE_SUSPENDED if suspended else pb.WORKLOAD_STATE_RUNNING,
        )
        self.session = self.stub.Register(req, timeout=10).session_id

    def commands(self) -> Any:
        return self.stub.Commands(self.pb.CommandsRequest(pod_uid=self.pod_uid, session_id=self.session))

    def ack(self, cmd: Any, ok: bool, **kw: Any) -> None:
        req = self.pb.AcknowledgeRequest(
            pod_uid=self.pod_uid, session_id=self.session, operation_id=cmd.operation_id, ok=ok, **kw
        )
        with contextlib.suppress(Exception):
            self.stub.Acknowledge(req, timeout=10)


def _fake_sha() -> str:
    return hashlib.sha256(b"not the payload").hexdigest()


def _hostile_checkpoint(kind: str, ckpt_dir: Path) -> Path:
    """The file a hostile CHECKPOINT ack names (made once, before the agent can ask)."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    p = ckpt_dir / f"{kind}.rose"
    with contextlib.suppress(FileNotFoundError):
        p.unlink()
    if kind == "ckpt-fifo":
        os.mkfifo(p, 0o666)  # nobody ever writes: an open() for reading blocks forever
    elif kind == "ckpt-symlink":
        p.symlink_to("/etc/shadow")  # out of the workload's root
    elif kind == "ckpt-sparse":
        size = int(os.environ.get("ROSE_ADVERSARY_SPARSE_BYTES", str(100 * 10**9)))
        with p.open("wb") as f:  # a valid header, then a hole the verifier has to hash through
            f.write(CKPT_MAGIC + _fake_sha().encode() + b"\n")
            f.truncate(size)
    return p


def run_hostile(a: argparse.Namespace, status: Status) -> int:
    mem = DeviceMemory(Path(a.memory_file), a.state_bytes)
    mem.hold()
    if a.behaviour == "unregistered":
        status.emit("ready")
        _hold_forever(mem)
        return 0
    ckpt = _hostile_checkpoint(a.behaviour, Path(a.checkpoint_dir)) if a.behaviour.startswith("ckpt-") else None
    agent = RawAgent(a.socket, a.pod_uid)
    agent.register(a.state_bytes, suspended=a.behaviour == "claims-suspended")
    stop = threading.Event()
    threading.Thread(target=_hold_forever, args=(mem, stop), daemon=True).start()
    pb = agent.pb
    stream = agent.commands()
    status.emit("ready")
    for cmd in stream:
        status.emit("command", kind=int(cmd.kind), operation=cmd.operation_id)
        if cmd.kind == pb.COMMAND_KIND_WORLD:
            continue
        if a.behaviour == "hang":
            continue  # never acknowledges anything
        if a.behaviour == "crash" and cmd.kind == pb.COMMAND_KIND_SUSPEND:
            stop.set()
            mem.free_half()  # the offload had started...
            status.emit("crashing")
            os.kill(os.getpid(), signal.SIGKILL)  # ...and the process died before the ack
        if ckpt is not None and cmd.kind == pb.COMMAND_KIND_SUSPEND:
            agent.ack(cmd, False, message="refusing the suspend")  # drives the engine to its fallback
            continue
        if ckpt is not None and cmd.kind == pb.COMMAND_KIND_CHECKPOINT:
            agent.ack(cmd, True, bytes_moved=1, checkpoint_path=str(ckpt), checkpoint_sha256=_fake_sha())
            continue
        # claims-suspended, lying-ack and the rest: say yes to everything, free nothing
        agent.ack(cmd, True, bytes_moved=a.state_bytes, seconds=0.001, message="done (not really)")
    return 0


# --------------------------------------------------------------------------- the honest workload


def run_honest(a: argparse.Namespace, status: Status) -> int:
    """The real rose_sdk: a registered tensor (``--state-bytes`` of float32) that each step adds 1
    to; the simulated device memory is held while resident and freed at the offload (the SDK does
    the same itself where it knows ``ROSE_SIMULATED_DEVICE_MEMORY``; doing it twice is harmless).
    At each resume the state must be the one it left: same sha256, and ``base + step``."""
    import torch

    import rose_sdk

    gen = torch.Generator().manual_seed(a.seed)
    n = max(1, a.state_bytes // 4)
    base = torch.randint(-(2**20), 2**20, (n,), generator=gen, dtype=torch.int32)  # exact under += 1
    state = base.clone()
    mem = DeviceMemory(Path(a.memory_file), a.state_bytes)
    mem.hold()
    digest: dict[str, str] = {}

    def sha() -> str:
        return hashlib.sha256(state.detach().cpu().numpy().tobytes()).hexdigest()

    wl = rose_sdk.Workload(
        tensors={"state": state},
        socket_path=a.socket,
        pod_uid=a.pod_uid,
        claim_uids=[a.claim_uid] if a.claim_uid else [],
        state_bytes=a.state_bytes,
    )

    @wl.on_suspend
    def before() -> None:
        digest["before"] = sha()

    @wl.on_suspended
    def offloaded() -> None:
        mem.free()
        status.emit("suspended", sha256=digest["before"], step=step)

    @wl.on_resume
    def after() -> None:
        mem.hold()
        now = sha()
        expect = torch.equal(state, base + step)
        status.emit("resumed", sha256=now, intact=now == digest.get("before") and expect, step=step)

    wl.start()
    status.emit("ready")
    step = 0
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.is_set():
        state.add_(1)
        step += 1
        mem.touch()
        wl.safe_point(step)
        time.sleep(a.step_seconds)
    wl.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.adversaries", description=__doc__.split("\n")[0])
    p.add_argument("--behaviour", required=True, choices=BEHAVIOURS)
    p.add_argument("--memory-file", required=True, help="the claim's simulated device-memory file (host path)")
    p.add_argument("--status-file", required=True, help="JSON lines of progress for the benchmark")
    p.add_argument("--socket", default="", help="the claim's workload.sock (host path)")
    p.add_argument("--pod-uid", default="")
    p.add_argument("--claim-uid", default="")
    p.add_argument("--state-bytes", type=int, default=16 << 20)
    p.add_argument("--checkpoint-dir", default="/tmp", help="where case (f) puts its hostile checkpoint")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--step-seconds", type=float, default=0.02, help="honest: seconds between safe points")
    a = p.parse_args(argv)
    if a.behaviour != "unregistered" and not (a.socket and a.pod_uid):
        p.error(f"--behaviour {a.behaviour} talks to the agent: give --socket and --pod-uid")
    status = Status(Path(a.status_file))
    try:
        return run_honest(a, status) if a.behaviour == "honest" else run_hostile(a, status)
    except Exception as e:
        status.emit("error", message=repr(e))
        raise


if __name__ == "__main__":
    sys.exit(main())

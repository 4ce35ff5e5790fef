"""A lent workload that does not give its GPU back, for the enforced-reclaim tests (``--mode``):

* ``registered-suspended``: registers with ``current_state=SUSPENDED`` and keeps computing;
* ``ack-without-freeing``: acknowledges every SUSPEND with ok=True and frees nothing;
* ``never-registers``: no SDK at all (or it crashed): holds device memory, never talks to the agent;
* ``simulated-only``: registers supporting only the ``simulated`` backend (steering away from the
  command channel) and ignores its command stream;
* ``slow-checkpoint`` (honest, slow): ignores SUSPEND, answers CHECKPOINT with a valid durable
  checkpoint after ``--checkpoint-delay`` seconds (``--checkpoint`` path).

Each holds ``--bytes`` of simulated device memory (``ROSE_SIMULATED_DEVICE_MEMORY``, kept open and
mapped) the whole time, keeps "computing" (a busy loop), and prints ``READY <pid>`` once holding.
Speaks the node agent's gRPC (``ROSE_AGENT_SOCKET``) directly, without ``rose_sdk``.
"""

from __future__ import annotations

import argparse
import hashlib
import mmap
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import grpc

from rose_common.proto import rose_agent_v1_pb2 as pb
from rose_common.proto import rose_agent_v1_pb2_grpc as pb_grpc


def hold_device_memory(nbytes: int) -> mmap.mmap:
    fd = os.open(os.environ["ROSE_SIMULATED_DEVICE_MEMORY"], os.O_RDWR)
    os.posix_fallocate(fd, 0, nbytes)
    m = mmap.mmap(fd, nbytes)  # a mapping too: holders are found by fd and by maps
    m[:8] = b"ROSEHELD"
    return m


def register(stub: pb_grpc.WorkloadAgentStub, mode: str, nbytes: int) -> str:
    backends = [pb.BACKEND_SIMULATED] if mode == "simulated-only" else [pb.BACKEND_COOPERATIVE]
    state = pb.WORKLOAD_STATE_SUSPENDED if mode == "registered-suspended" else pb.WORKLOAD_STATE_RUNNING
    resp = stub.Register(
        pb.RegisterRequest(
            pod_uid=os.environ["ROSE_POD_UID"],
            pid=os.getpid(),
            state_bytes=nbytes,
            supported_backends=backends,
            current_state=state,
        ),
        timeout=10,
    )
    return str(resp.session_id)


def write_checkpoint(path: str) -> str:
    """A checkpoint in rose_sdk's format (ROSECKPT1, sha256 of the payload, payload); its sha256."""
    payload = os.urandom(4096)
    digest = hashlib.sha256(payload).hexdigest()
    Path(path).write_bytes(b"ROSECKPT1\n" + digest.encode() + b"\n" + payload)
    return digest


def lie(stub: pb_grpc.WorkloadAgentStub, session: str, mode: str, a: argparse.Namespace) -> None:
    """Read commands; in ``ack-without-freeing`` mode say ok to each, else ignore them."""
    pod = os.environ["ROSE_POD_UID"]
    for cmd in stub.Commands(pb.CommandsRequest(pod_uid=pod, session_id=session)):
        if mode == "slow-checkpoint" and cmd.kind == pb.COMMAND_KIND_CHECKPOINT:
            time.sleep(a.checkpoint_delay)
            digest = write_checkpoint(a.checkpoint)
            stub.Acknowledge(
                pb.AcknowledgeRequest(
                    pod_uid=pod,
                    session_id=session,
                    operation_id=cmd.operation_id,
                    ok=True,
                    checkpoint_path=a.checkpoint,
                    checkpoint_sha256=digest,
                ),
                timeout=10,
            )
        if mode == "ack-without-freeing" and cmd.kind != pb.COMMAND_KIND_WORLD:
            stub.Acknowledge(
                pb.AcknowledgeRequest(
                    pod_uid=pod, session_id=session, operation_id=cmd.operation_id, ok=True, bytes_moved=1 << 20
                ),
                timeout=10,
            )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", required=True)
    ap.add_argument("--bytes", type=int, default=4 << 20)
    ap.add_argument("--checkpoint", default="")
    ap.add_argument("--checkpoint-delay", type=float, default=0.0)
    a = ap.parse_args()
    held = hold_device_memory(a.bytes)
    if a.mode != "never-registers":
        channel = grpc.insecure_channel(f"unix:{os.environ['ROSE_AGENT_SOCKET']}")
        stub = pb_grpc.WorkloadAgentStub(channel)  # type: ignore[no-untyped-call]
        session = register(stub, a.mode, a.bytes)
        threading.Thread(target=lie, args=(stub, session, a.mode, a), daemon=True).start()
    print(f"READY {os.getpid()}", flush=True)
    x = 0
    while True:  # keeps computing on its "device"
        x = (x + 1) % 251
        held[8] = x
        time.sleep(0.001)


if __name__ == "__main__":
    main()

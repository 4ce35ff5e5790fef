"""Demo act 3's hostile RL occupant: it lies to the node agent and keeps its GPU.

Run as ``python -m rose_cli.demo_hostile`` with the lent claim's container env
(``ROSE_AGENT_SOCKET``, ``ROSE_SIMULATED_DEVICE_MEMORY``) and ``ROSE_POD_UID``. It takes
``--bytes`` of the claim's simulated device memory (kept open and mapped, as a CUDA context
would hold it), registers with the claim's node-agent socket claiming it is already SUSPENDED
(``current_state=SUSPENDED``), ignores every command, prints ``READY <pid>`` and keeps
"computing" on its device until it is killed. The driver must not believe it: it decides from the
device memory it observes (``dra_driver/README.md``, serving wins, enforced).
"""

from __future__ import annotations

import argparse
import mmap
import os
import threading
import time

import grpc

from rose_common.proto import rose_agent_v1_pb2 as pb
from rose_common.proto import rose_agent_v1_pb2_grpc as pb_grpc


def _hold_device_memory(nbytes: int) -> mmap.mmap:
    fd = os.open(os.environ["ROSE_SIMULATED_DEVICE_MEMORY"], os.O_RDWR)
    os.posix_fallocate(fd, 0, nbytes)
    m = mmap.mmap(fd, nbytes)
    m[:8] = b"ROSEHELD"
    return m


def _ignore(stub: pb_grpc.WorkloadAgentStub, pod_uid: str, session: str) -> None:
    for _ in stub.Commands(pb.CommandsRequest(pod_uid=pod_uid, session_id=session)):
        pass  # never acknowledges, never frees


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rose_cli.demo_hostile", description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=int, default=64 << 20, help="simulated device memory to hold")
    a = ap.parse_args(argv)
    held = _hold_device_memory(a.bytes)
    pod_uid = os.environ["ROSE_POD_UID"]
    stub = pb_grpc.WorkloadAgentStub(grpc.insecure_channel(f"unix:{os.environ['ROSE_AGENT_SOCKET']}"))  # type: ignore[no-untyped-call]
    resp = stub.Register(
        pb.RegisterRequest(
            pod_uid=pod_uid,
            pid=os.getpid(),
            state_bytes=a.bytes,
            supported_backends=[pb.BACKEND_COOPERATIVE],
            current_state=pb.WORKLOAD_STATE_SUSPENDED,  # the lie
        ),
        timeout=10,
    )
    threading.Thread(target=_ignore, args=(stub, pod_uid, str(resp.session_id)), daemon=True).start()
    print(f"READY {os.getpid()}", flush=True)
    x = 0
    while True:  # keeps computing on its "device"
        x = (x + 1) % 251
        held[8] = x
        time.sleep(0.01)


if __name__ == "__main__":
    raise SystemExit(main())

"""Group duty cycle with two jobs sharing one group vs one job alone, through the real orchestrator.

    python -m benchmarks.timeslice [--gpu-phase 0.2] [--off-phase 0.2] [--cycles 50] [--json OUT.json]
                                   [--kubeconfig FILE --namespace NS]

``rose timeslice serve`` runs as a child process (``--store memory``, or one Lease per group in a
real API server with ``--kubeconfig``; the explicit ``noop`` hand-over: no device state moves, so
every measured switch cost is the orchestrator's own). Each job is a thread in this process that
loops ``--cycles`` times: ``Acquire`` the group over gRPC, hold it for ``--gpu-phase`` seconds
(a sleep standing for the GPU phase), ``Yield``, then ``--off-phase`` seconds off the group (a
sleep standing for the rollout / environment wait). Phases are complementary when they are equal.

Reported: the group's duty cycle (time held / wall time from the first Acquire to the last Yield)
for one job alone and for two jobs sharing, their ratio (goal >= 1.6), and the grant overhead
beyond data movement p50/p95 (goal p95 <= 50 ms), both as the server measures it (from the Yield
that freed the group, or the request if later, to the grant; ``grant_overhead_s``) and as the
waiting client sees it (from the other job's Yield call to its own Acquire's answer).
It exits 1 when a goal is missed. I/O: loopback gRPC, one child process, the API server if given.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from rose_common.proto import rose_timeslice_v1_pb2 as pb
from rose_common.proto import rose_timeslice_v1_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Trace:
    holds: list[tuple[float, float]] = field(default_factory=list)  # (granted, yielded), monotonic
    grants: list[tuple[str, float, float, bool, float]] = field(default_factory=list)  # job, asked, got, resident, oh
    yields: list[tuple[str, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _job(
    stub: pb_grpc.TimeSliceOrchestratorStub, group: str, job: str, gpu: float, off: float, cycles: int, trace: Trace
) -> None:
    for _ in range(cycles):
        asked = time.monotonic()
        r = stub.Acquire(pb.AcquireRequest(group=group, job=job, role="trainer", expected_phase_s=gpu), timeout=120)
        got = time.monotonic()
        time.sleep(gpu)  # the GPU phase
        yielded = time.monotonic()
        stub.Yield(pb.YieldRequest(group=group, job=job, fencing_token=r.fencing_token), timeout=30)
        with trace.lock:
            trace.holds.append((got, yielded))
            trace.grants.append((job, asked, got, r.was_resident, r.grant_overhead_s))
            trace.yields.append((job, yielded))
        time.sleep(off)  # the off-GPU phase (rollout wait)


def _run(stub: pb_grpc.TimeSliceOrchestratorStub, group: str, jobs: int, gpu: float, off: float, cycles: int) -> Trace:
    trace = Trace()
    threads = [
        threading.Thread(target=_job, args=(stub, group, f"bench/job-{i}", gpu, off, cycles, trace))
        for i in range(jobs)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return trace


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def _summary(trace: Trace) -> dict[str, Any]:
    start = min(a for _, a, _, _, _ in trace.grants)
    end = max(y for _, y in trace.holds)
    held = sum(y - g for g, y in trace.holds)
    server_oh = [oh for _, _, _, resident, oh in trace.grants if not resident]
    client_gap = []
    for job, asked, got, resident, _ in trace.grants:
        freed = [y for j, y in trace.yields if j != job and asked <= y <= got]
        if freed and not resident:
            client_gap.append(got - max(freed))
    return {
        "duty_cycle": held / (end - start),
        "grants": len(trace.grants),
        "switches": len(server_oh),
        "server_grant_overhead_s": {"p50": _pct(server_oh, 50), "p95": _pct(server_oh, 95)},
        "client_yield_to_grant_s": {"p50": _pct(client_gap, 50), "p95": _pct(client_gap, 95), "n": len(client_gap)},
    }


def _serve(port: int, kubeconfig: str, namespace: str) -> subprocess.Popen[bytes]:
    store = (
        ["--store", "kubernetes", "--kubeconfig", kubeconfig, "--namespace", namespace]
        if kubeconfig
        else ["--store", "memory"]
    )
    cmd = [sys.executable, "-m", "timeslice", "serve", "--listen", f"127.0.0.1:{port}", "--metrics-listen",
           "127.0.0.1:0", "--leader-elect", "false", "--log-level", "warning", *store,
           # the orchestrator's own grant path, measured bare: plaintext, no TokenReview, no job lookup
           "--authenticate", "none", "--job-check", "none", "--insecure"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=sys.stderr)  # stdout carries only the JSON


def run(gpu: float, off: float, cycles: int, kubeconfig: str = "", namespace: str = "default") -> dict[str, Any]:
    port = _free_port()
    proc = _serve(port, kubeconfig, namespace)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            stub = pb_grpc.TimeSliceOrchestratorStub(channel)  # type: ignore[no-untyped-call]
            tag = f"{os.getpid()}-{int(time.time())}"
            solo = _summary(_run(stub, f"bench-solo-{tag}", 1, gpu, off, cycles))
            shared = _summary(_run(stub, f"bench-shared-{tag}", 2, gpu, off, cycles))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    ratio = shared["duty_cycle"] / solo["duty_cycle"]
    return {
        "config": {
            "gpu_phase_s": gpu,
            "off_phase_s": off,
            "cycles_per_job": cycles,
            "store": "kubernetes Lease" if kubeconfig else "memory",
            "handover": "noop",
            "phases": "sleeps (GPU phase and rollout wait)",
        },
        "solo": solo,
        "shared": shared,
        "duty_cycle_ratio": ratio,
        "goals": {
            "duty_cycle_ratio_ge_1_6": ratio >= 1.6,
            "grant_overhead_p95_le_50ms": shared["server_grant_overhead_s"]["p95"] <= 0.050,
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.timeslice", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--gpu-phase", type=float, default=0.2, help="seconds a job holds the group per cycle")
    p.add_argument("--off-phase", type=float, default=0.2, help="seconds a job spends off the group per cycle")
    p.add_argument("--cycles", type=int, default=50, help="cycles per job")
    p.add_argument("--kubeconfig", default="", help="keep the group Leases in this cluster (default: memory)")
    p.add_argument("--namespace", default="default", help="namespace of the Leases with --kubeconfig")
    p.add_argument("--json", type=Path, default=None, help="write the result here too")
    args = p.parse_args(argv)
    if not (0 < args.gpu_phase <= 60 and 0 <= args.off_phase <= 60):
        p.error(f"--gpu-phase must be in (0, 60] and --off-phase in [0, 60], got {args.gpu_phase}, {args.off_phase}")
    if not 2 <= args.cycles <= 10_000:
        p.error(f"--cycles must be in [2, 10000], got {args.cycles}")
    res = run(args.gpu_phase, args.off_phase, args.cycles, args.kubeconfig, args.namespace)
    text = json.dumps(res, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if all(res["goals"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Elastic rollout workers for example 02 (GRPO on the tiny LLM), as local processes — no cluster.

    python -m benchmarks.rollout_elastic --json rollout_elastic.json

Measures, on this machine's CPU:

* **throughput**: rollout samples/s with 1, 2 and 4 rollout-worker processes (example 02's
  ``--role rollout``, ``--batch`` prompts per lease) fed by a rollout service in this process
  (``rose_sdk.rollout_service``: the tiny model's weights published, rounds of ``--round`` prompts
  submitted back to back, ``--rounds`` of them timed after a warm-up round);
* **join**: the seconds from a worker process's start (``Popen``) to its first accepted sample,
  and, as the worker reports it, from its loop's start (imports done) to its weights pulled and to
  its first sample;
* **world changes**: ``--changes`` changes of the rollout world while rounds run (alternately a
  worker added, one SIGKILLed while it holds a lease, one added, one leaving on SIGTERM), then the
  prompts lost (submitted, never returned) and duplicated (returned twice to the trainer), and the
  service's counters (requeued by release / disconnect / expiry, duplicate answers refused);
* **trainer suspend / resume**: example 02's ``--role trainer`` (with one rollout worker) registered
  with the real node agent (``dra_driver.agent``, cooperative backend, in this process) through a
  claim socket; ``--cycles`` suspends and resumes through the agent's control API: the operation's
  own duration, the wall time from the request to its end (a suspend waits for the next safe
  point), and the bytes moved.

Every figure is from this run; the machine is shared, so the JSON records the load average.
"""

from __future__ import annotations

import argparse
import itertools
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import emit_json, log, write_json

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "02_grpo_tiny_llm"
TRAIN = EXAMPLE / "train.py"


def _env(token: str, **extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ROSE_")}
    return {**clean, "PYTHONPATH": str(REPO), "ROSE_ROLLOUT_TOKEN": token, "TRL_EXPERIMENTAL_SILENCE": "1", **extra}


class Pool:
    """Rollout-worker processes against one service."""

    def __init__(self, addr: str, token: str, batch: int) -> None:
        self.addr, self.token, self.batch = addr, token, batch
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.started: dict[str, float] = {}
        self.outputs: dict[str, str] = {}
        self._n = 0

    def add(self) -> str:
        name = f"w{self._n}"
        self._n += 1
        self.started[name] = time.monotonic()
        self.procs[name] = subprocess.Popen(
            [sys.executable, str(TRAIN), "--role", "rollout", "--batch", str(self.batch), "--trainer-wait-s", "120"],
            env=_env(self.token, ROSE_TRAINER_ADDR=self.addr, ROSE_POD_NAME=name),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        return name

    def reap(self, name: str, sig: int | None = None) -> str:
        p = self.procs.pop(name)
        if sig is not None and p.poll() is None:
            p.send_signal(sig)
        try:
            out = p.communicate(timeout=120)[0] or ""
        except subprocess.TimeoutExpired:
            p.kill()
            out = p.communicate()[0] or ""
        self.outputs[name] = out
        return out

    def close(self) -> None:
        for name in list(self.procs):
            self.reap(name, signal.SIGKILL)


def _worker_report(out: str) -> dict[str, float]:
    """The ``first_sample_s`` / pulls line a worker prints at exit."""
    for line in out.splitlines():
        if line.startswith("rollout ") and "samples=" in line:
            kv = dict(f.split("=", 1) for f in line.split()[2:])
            return {k: float(v) for k, v in kv.items() if v not in ("None", "")}
    return {}


def _service(token: str, lease_s: float = 30.0) -> Any:
    sys.path.insert(0, str(EXAMPLE))
    import tiny_grpo  # type: ignore[import-not-found]

    from rose_sdk.integrations.rollout_worker import weights_blob
    from rose_sdk.rollout_service import RolloutService

    svc = RolloutService(token=token, job_seed=7, lease_s=lease_s).start()
    svc.bench_blob = weights_blob(tiny_grpo.model(7).state_dict())  # type: ignore[attr-defined]
    svc.publish_weights(0, svc.bench_blob)  # type: ignore[attr-defined]
    return svc


_ROUNDS = itertools.count(1)  # round numbers, unique across the run


def _round(svc: Any, n: int, prompts: list[str]) -> dict[str, Any]:
    """One round of ``n`` prompts; the completions returned (by id)."""
    rno = next(_ROUNDS)
    v = svc.submit_round([(f"r{rno}-{i}", prompts[i % len(prompts)]) for i in range(n)])
    got: dict[str, Any] = svc.wait_round(v, timeout=600)
    svc.publish_weights(v + 1, svc.bench_blob)  # the next version (same weights)
    return got


def _join(svc: Any, pool: Pool, workers: int, timeout: float = 600.0) -> dict[str, float]:
    """Start ``workers`` workers while a round is waiting for them; keep rounds coming until each
    has returned a sample. Seconds from each worker's Popen to its first accepted sample."""
    end = time.monotonic() + timeout
    rno = next(_ROUNDS)
    v = svc.submit_round([(f"j{rno}-{i}", "1234") for i in range(16 * workers)])
    names = [pool.add() for _ in range(workers)]
    while True:
        svc.wait_round(v, timeout=600)
        svc.publish_weights(v + 1, svc.bench_blob)
        if all(n in svc.first_completion_at for n in names) or time.monotonic() > end:
            break
        rno = next(_ROUNDS)
        v = svc.submit_round([(f"j{rno}-{i}", "1234") for i in range(4 * workers)])
    return {n: svc.first_completion_at[n] - pool.started[n] for n in names if n in svc.first_completion_at}


def throughput(workers: int, *, batch: int, round_n: int, rounds: int) -> dict[str, Any]:
    token = secrets.token_hex(16)
    svc = _service(token)
    pool = Pool(svc.address, token, batch)
    sys.path.insert(0, str(EXAMPLE))
    import tiny_grpo

    prompts = list(tiny_grpo.dataset(64)["prompt"])
    try:
        first = _join(svc, pool, workers)  # also the warm-up
        t0 = time.monotonic()
        total = 0
        for _ in range(rounds):
            total += len(_round(svc, round_n, prompts))
        wall = time.monotonic() - t0
        svc.finish()
        reports = {n: _worker_report(pool.reap(n)) for n in list(pool.procs)}
    finally:
        pool.close()
        svc.close()
    return {
        "workers": workers,
        "samples": total,
        "seconds": round(wall, 3),
        "samples_per_s": round(total / wall, 2),
        # load-independent: the workers' CPU seconds in their loops per sample they returned
        "worker_cpu_s_per_sample": round(
            sum(r.get("loop_cpu_s", 0.0) for r in reports.values())
            / max(1.0, sum(r.get("samples", 0.0) for r in reports.values())),
            4,
        ),
        "start_to_first_sample_s": {k: round(v, 2) for k, v in sorted(first.items())},
        "worker_reported": reports,
    }


def _stop_holder(svc: Any, pool: Pool, timeout: float = 60.0) -> str | None:
    """SIGKILL a worker while it holds a lease (SIGSTOP the holders, kill one still holding, SIGCONT
    the rest). None if no worker held one within ``timeout``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        holders = [w for w, n in svc.status()["leased"].items() if n and w in pool.procs]
        if not holders:
            time.sleep(0.002)
            continue
        for w in holders:
            pool.procs[w].send_signal(signal.SIGSTOP)
        still = [w for w, n in svc.status()["leased"].items() if n and w in holders]
        victim = still[0] if still else None
        for w in holders:
            if w == victim:
                pool.procs[w].kill()
            pool.procs[w].send_signal(signal.SIGCONT)
        if victim is not None:
            pool.reap(victim)
            return str(victim)
    return None


def _change_world(kind: str, svc: Any, pool: Pool, t0: float) -> str:
    """One world change: add a worker (and wait until it registers), kill the one holding a lease
    ("-" when none did), or let the oldest leave; the worker it touched."""
    if kind == "add":
        name = pool.add()
        while name not in svc.status()["workers"] and time.monotonic() - t0 < 300:
            time.sleep(0.05)
        return name
    if kind == "kill":
        return _stop_holder(svc, pool) or "-"
    name = sorted(pool.procs)[0]
    pool.reap(name, signal.SIGTERM)
    return name


def world_changes(changes: int, *, batch: int, round_n: int) -> dict[str, Any]:
    """Rounds run in a thread while the world changes ``changes`` times; every round's completions
    are checked against what it submitted."""
    import threading

    token = secrets.token_hex(16)
    svc = _service(token, lease_s=20.0)
    pool = Pool(svc.address, token, batch)
    rounds: list[tuple[set[str], dict[str, Any]]] = []
    stop = threading.Event()
    errors: list[str] = []

    def driver() -> None:
        while not stop.is_set():
            rno = next(_ROUNDS)
            ids = [f"c{rno}-{i}" for i in range(round_n)]
            try:
                v = svc.submit_round([(pid, "1234") for pid in ids])
                got = svc.wait_round(v, timeout=600)
                svc.publish_weights(v + 1, svc.bench_blob)
            except Exception as e:
                errors.append(repr(e))
                return
            rounds.append((set(ids), got))

    log_changes: list[dict[str, Any]] = []
    try:
        for _ in range(2):
            pool.add()
        t = threading.Thread(target=driver, daemon=True)
        t.start()
        while len(svc.status()["workers"]) < 2:
            time.sleep(0.1)
        kinds = ["add", "kill", "add", "leave"]
        for i in range(changes):
            kind = kinds[i % len(kinds)]
            if kind in ("kill", "leave") and len(pool.procs) <= 1:
                kind = "add"
            t0 = time.monotonic()
            name = _change_world(kind, svc, pool, t0)
            log_changes.append(
                {
                    "change": i + 1,
                    "kind": kind,
                    "worker": name,
                    "workers_after": len(pool.procs),
                    "seconds": round(time.monotonic() - t0, 2),
                }
            )
            log(f"world change {i + 1}/{changes}: {kind} {name} → {len(pool.procs)} workers")
            time.sleep(0.5)
        stop.set()
        t.join(timeout=600)
        svc.finish()
    finally:
        pool.close()
        svc.close()
    submitted = sum(len(ids) for ids, _ in rounds)
    lost = sum(len(ids - set(got)) for ids, got in rounds)
    extra = sum(len(set(got) - ids) for ids, got in rounds)
    # duplicated: a prompt returned twice to the trainer (one completion per id per round is all a
    # dict can hold, so also check the service accepted exactly what it returned)
    c = svc.queue.counters.as_dict()
    return {
        "changes": len(log_changes),
        "kills_holding_a_lease": sum(1 for x in log_changes if x["kind"] == "kill" and x["worker"] != "-"),
        "rounds": len(rounds),
        "prompts_submitted": submitted,
        "prompts_lost": lost,
        "prompts_duplicated": extra + (c["accepted"] - submitted if c["accepted"] > submitted else 0),
        "errors": errors,
        "counters": c,
        "log": log_changes,
    }


def trainer_suspend(cycles: int, steps: int) -> dict[str, Any]:
    """Example 02's trainer role (one rollout worker) under the real node agent: ``cycles``
    suspends and resumes."""
    import grpc
    from prometheus_client import CollectorRegistry

    from dra_driver.agent.server import AgentServer
    from dra_driver.claims import PodRef
    from dra_driver.suspend.engine import EngineConfig
    from dra_driver.suspend.events import RecordingEventSink
    from dra_driver.suspend.factory import build_engine
    from dra_driver.suspend.verify import CheckpointVerifier, StaticCheckpointPaths, VerifyLimits
    from rose_common.proto import rose_agent_v1_pb2_grpc as pb_grpc

    class NoEvict:
        def evict(self, pod: object, reason: str) -> None:
            raise RuntimeError(f"the benchmark evicts nothing ({reason})")

    tmp = Path(tempfile.mkdtemp(prefix="rose-rollout-bench-"))
    engine = build_engine(
        EngineConfig(host_memory_budget_bytes=1 << 30, backends=("cooperative",), node_name="bench"),
        events=RecordingEventSink(),
        evictor=NoEvict(),
        metrics_registry=CollectorRegistry(),
        verifier=CheckpointVerifier(
            VerifyLimits(), paths=StaticCheckpointPaths(default=str(tmp)), resolve_pid=lambda uid, pid: pid
        ),
    )
    server = AgentServer(engine, tmp / "w.sock", tmp / "c.sock", claim_socket_root=tmp / "claims", max_workers=8)
    server.start()
    channel = grpc.insecure_channel(f"unix:{tmp / 'c.sock'}")
    control = pb_grpc.NodeControlStub(channel)  # type: ignore[no-untyped-call]
    sock = (
        Path(server.claims.open_claim("claim-bench", [PodRef("rl", "trainer", "uid-trainer")], 1 << 40))
        / "workload.sock"
    )
    token = secrets.token_hex(16)
    port = _free_port()
    trainer = subprocess.Popen(
        [sys.executable, str(TRAIN), "--role", "trainer", "--out", str(tmp / "out"), "--max-steps", str(steps),
         "--port", str(port)],
        env=_env(token, ROSE_AGENT_SOCKET=str(sock), ROSE_POD_UID="uid-trainer", ROSE_POD_NAME="trainer",
                 ROSE_POD_NAMESPACE="rl"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    pool = Pool(f"127.0.0.1:{port}", token, 4)
    results: list[dict[str, Any]] = []
    try:
        pool.add()
        _wait_registered(control, trainer)
        time.sleep(2.0)  # a few steps in: Adam's moments exist
        results.extend(_suspend_cycles(control, cycles))
        out = trainer.communicate(timeout=900)[0] or ""
        if trainer.returncode != 0:
            raise RuntimeError(f"the trainer failed rc={trainer.returncode}: {out[-2000:]}")
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.communicate()
        pool.close()
        channel.close()
        server.stop(0)
    summary = [ln for ln in out.splitlines() if ln.startswith(("steps=", "rollout: "))]
    return {"cycles": results, "trainer": summary}


def _wait_registered(control: Any, trainer: subprocess.Popen[str]) -> None:
    """Until the trainer's workload is connected to the node agent (at most 300 s)."""
    import grpc

    from rose_common.proto import rose_agent_v1_pb2 as pb

    end = time.monotonic() + 300
    while True:
        try:
            st = control.Status(pb.StatusRequest(pod_uid="uid-trainer"))
            if st.workloads and st.workloads[0].connected:
                return
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:  # not registered yet
                raise
        if trainer.poll() is not None or time.monotonic() > end:
            out = trainer.communicate()[0] or ""
            raise RuntimeError(f"the trainer did not register (rc={trainer.returncode}): {out[-3000:]}")
        time.sleep(0.1)


def _suspend_cycles(control: Any, cycles: int) -> list[dict[str, Any]]:
    """``cycles`` suspends (no_wait, polled) and resumes of the trainer through the node agent."""
    from rose_common.proto import rose_agent_v1_pb2 as pb

    results: list[dict[str, Any]] = []
    for _ in range(cycles):
        t0 = time.monotonic()
        op = control.Suspend(pb.SuspendRequest(pod_uid="uid-trainer", grace_seconds=120, no_wait=True))
        while op.state in (pb.OPERATION_STATE_PENDING, pb.OPERATION_STATE_RUNNING):
            time.sleep(0.005)
            op = control.GetOperation(pb.GetOperationRequest(operation_id=op.id))
        wall_s = time.monotonic() - t0
        if op.state != pb.OPERATION_STATE_SUCCEEDED:
            raise RuntimeError(f"suspend failed: {op.message}")
        time.sleep(0.2)
        t1 = time.monotonic()
        res = control.Resume(pb.ResumeRequest(pod_uid="uid-trainer"))
        results.append(
            {
                "suspend_op_s": round(op.duration_seconds, 4),
                "suspend_wall_s": round(wall_s, 4),
                "suspend_bytes": op.bytes_moved,
                "resume_op_s": round(res.duration_seconds, 4),
                "resume_wall_s": round(time.monotonic() - t1, 4),
                "resume_bytes": res.bytes_moved,
            }
        )
        time.sleep(0.5)
    return results


def _free_port() -> int:
    from rose_sdk.rollout_service import free_port

    return free_port()


def _q(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    if not xs:
        return {}
    return {"min": xs[0], "p50": xs[len(xs) // 2], "max": xs[-1]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--json", type=Path, default=None, help="write the report here too")
    p.add_argument("--workers", default="1,2,4", help="worker counts for the throughput runs")
    p.add_argument("--batch", type=int, default=4, help="prompts per lease")
    p.add_argument("--round", type=int, default=32, help="prompts per round")
    p.add_argument("--rounds", type=int, default=4, help="timed rounds per worker count")
    p.add_argument("--changes", type=int, default=20, help="world changes")
    p.add_argument("--cycles", type=int, default=5, help="trainer suspend / resume cycles")
    p.add_argument("--steps", type=int, default=20, help="trainer steps for the suspend runs")
    p.add_argument("--skip", default="", help="comma-separated parts to skip: throughput,changes,suspend")
    a = p.parse_args(argv)
    skip = {s for s in a.skip.split(",") if s}
    report: dict[str, Any] = {
        "load_average_start": os.getloadavg(),
        "cpus": os.cpu_count(),
        "batch": a.batch,
        "round": a.round,
    }
    failed = False

    def part(name: str, fn: Any) -> None:
        """Run one part; a failure is recorded in the report (the other parts still run), and the
        report so far is written after each part."""
        nonlocal failed
        try:
            report[name] = fn()
        except Exception as e:  # recorded in the report; the run exits 1
            failed = True
            report[name] = {"error": repr(e)[-2000:]}
            log(f"{name} failed: {e!r}"[:500])
        write_json(a.json, report)

    if "throughput" not in skip:

        def tp() -> list[dict[str, Any]]:
            out = []
            for k in (int(x) for x in a.workers.split(",")):
                log(f"throughput with {k} workers")
                out.append(throughput(k, batch=a.batch, round_n=a.round, rounds=a.rounds))
            return out

        part("throughput", tp)
        if isinstance(report["throughput"], list):
            joins = [v for r in report["throughput"] for v in r["start_to_first_sample_s"].values()]
            report["start_to_first_sample_s"] = _q(joins)
    if "changes" not in skip:
        log(f"{a.changes} world changes")
        part("world_changes", lambda: world_changes(a.changes, batch=a.batch, round_n=a.round))
    if "suspend" not in skip:
        log(f"trainer suspend / resume x{a.cycles}")

        def sus() -> dict[str, Any]:
            r = trainer_suspend(a.cycles, a.steps)
            keys = ("suspend_op_s", "suspend_wall_s", "resume_op_s", "resume_wall_s", "suspend_bytes")
            r["summary"] = {k: _q([c[k] for c in r["cycles"]]) for k in keys}
            return r

        part("trainer_suspend", sus)
    report["load_average_end"] = os.getloadavg()
    emit_json(report, a.json)
    wc = report.get("world_changes")
    lost_or_dup = isinstance(wc, dict) and bool(
        wc.get("prompts_lost") or wc.get("prompts_duplicated") or wc.get("errors")
    )
    return 1 if failed or lost_or_dup else 0


if __name__ == "__main__":
    sys.exit(main())

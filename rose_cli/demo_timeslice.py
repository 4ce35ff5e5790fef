"""Demo act 5: two real small CPU RL jobs share one time-slice group; the duty cycle with and without.

Each job is REINFORCE on CartPole (the example trainer's environment, examples/01) in its own
process: a *sampler* phase (episodes with the current policy, off the accelerators) then a
*trainer* phase (several gradient passes over the batch) inside
``TimeSliceOrchestratorClient.on_accelerators``, which offloads the policy and Adam state to host
buffers at each yield and restores them at each acquire. Solo, each job holds a group of its own;
shared, both use one group, so one job trains while the other samples. The act prints each job's
updates per second and the group duty cycle (the share of wall time some job held the group).

I/O: the orchestrator (``timeslice``, in this process: gRPC on loopback, memory store, and the
explicit ``NoopHandover`` — CPU jobs, no node moves anything), the worker processes (``python -m
rose_cli.demo_timeslice --worker``), their JSON timings in a temporary directory. The cluster is
not used: the jobs' "accelerators" are CPU. :func:`union_s`, :func:`duty_cycle` and
:func:`summary` are pure.

    python -m rose_cli.demo_timeslice [--updates 12]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "01_cartpole_reinforce.py"


# ------------------------------------------------------------------ pure
def union_s(intervals: Sequence[tuple[float, float]]) -> float:
    """Total length covered by the intervals (overlaps counted once)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def duty_cycle(runs: Sequence[dict[str, Any]]) -> float:
    """Share of the runs' wall time (first start to last end) in which some run held the group."""
    start = min(r["start"] for r in runs)
    end = max(r["end"] for r in runs)
    held = union_s([(a, b) for r in runs for a, b in r["phases"]])
    return held / (end - start) if end > start else 0.0


def summary(solo: Sequence[dict[str, Any]], shared: Sequence[dict[str, Any]]) -> tuple[list[str], float, float]:
    """Table lines, the mean solo duty cycle and the shared group's duty cycle."""
    solo_dc = sum(duty_cycle([r]) for r in solo) / len(solo)
    shared_dc = duty_cycle(shared)
    lines = [f"{'job':<8}{'solo upd/s':>12}{'shared upd/s':>14}{'held solo':>11}{'held shared':>13}"]
    for a, b in zip(solo, shared, strict=True):
        rate = [len(r["phases"]) / (r["end"] - r["start"]) for r in (a, b)]
        held = [duty_cycle([r]) for r in (a, b)]
        lines.append(f"{a['job']:<8}{rate[0]:>12.2f}{rate[1]:>14.2f}{held[0]:>11.0%}{held[1]:>13.0%}")
    return lines, solo_dc, shared_dc


# ------------------------------------------------------------------ the worker process
def _episodes(env: Any, policy: Any, n: int) -> tuple[Any, Any, Any]:
    import numpy as np
    import torch

    obs_l, act_l, ret_l = [], [], []
    with torch.no_grad():
        for _ in range(n):
            obs, done, rewards = env.reset(), False, []
            while not done:
                a = torch.distributions.Categorical(logits=policy(torch.from_numpy(obs))).sample()  # type: ignore[no-untyped-call]
                obs_l.append(obs)
                act_l.append(int(a.item()))
                obs, r, done = env.step(int(a.item()))
                rewards.append(r)
            g, rets = 0.0, []
            for r in reversed(rewards):
                g = r + 0.99 * g
                rets.append(g)
            ret_l.extend(reversed(rets))
    ret = torch.tensor(ret_l)
    return torch.tensor(np.stack(obs_l)), torch.tensor(act_l), (ret - ret.mean()) / (ret.std() + 1e-8)


def worker(argv: list[str]) -> int:
    import importlib.util

    import numpy as np
    import torch

    from rose_sdk import CooperativeOffloader
    from rose_sdk.timeslice import TimeSliceOrchestratorClient

    p = argparse.ArgumentParser(prog="rose_cli.demo_timeslice --worker")
    for flag in ("--target", "--job", "--group", "--out"):
        p.add_argument(flag, required=True)
    p.add_argument("--updates", type=int, default=12)
    p.add_argument("--episodes", type=int, default=4)
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    spec = importlib.util.spec_from_file_location("cartpole_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    env = ex.CartPole(np.random.default_rng(a.seed))
    policy = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    client = TimeSliceOrchestratorClient(
        a.target, a.job, role="trainer", offloader=CooperativeOffloader(policy, opt), min_phase_ratio=0
    )
    phases: list[tuple[float, float]] = []
    start = time.monotonic()
    for _ in range(a.updates):
        obs, acts, ret = _episodes(env, policy, a.episodes)  # the sampler phase: off the group
        with client.on_accelerators(group_id=a.group, timeout_s=300):
            t0 = time.monotonic()
            for _ in range(a.epochs):  # the trainer phase: holds the group
                logp = torch.distributions.Categorical(logits=policy(obs)).log_prob(acts)  # type: ignore[no-untyped-call]
                loss = -(logp * ret).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            phases.append((t0, time.monotonic()))
    Path(a.out).write_text(json.dumps({"job": a.job, "start": start, "end": time.monotonic(), "phases": phases}))
    client.close()
    return 0


# ------------------------------------------------------------------ the act
def _run(target: str, jobs: list[tuple[str, str]], tmp: Path, updates: int) -> list[dict[str, Any]]:
    """Run the (job, group) workers at once; their timings."""
    procs = []
    for i, (job, group) in enumerate(jobs):
        out = tmp / f"{job}-{group}.json"
        cmd = [sys.executable, "-m", "rose_cli.demo_timeslice", "--worker", "--target", target, "--job", job,
               "--group", group, "--out", str(out), "--updates", str(updates), "--seed", str(i)]  # fmt: skip
        procs.append((subprocess.Popen(cmd, cwd=REPO), out))
    for proc, _ in procs:
        if proc.wait(600) != 0:
            raise RuntimeError(f"demo worker {proc.args!r} exited {proc.returncode}")
    return [json.loads(out.read_text()) for _, out in procs]


def act_timeslice(h: Any, api: Any, say: Callable[[str], None], updates: int = 12) -> bool:
    """Returns True when the shared group's duty cycle is above the solo jobs' (``h``/``api`` unused:
    the jobs run on CPU)."""
    from timeslice.orchestrator import Orchestrator
    from timeslice.server import grpc_server
    from timeslice.store import MemoryStore

    server, port = grpc_server(Orchestrator(MemoryStore()), "127.0.0.1:0", 32)
    target = f"127.0.0.1:{port}"
    try:
        with tempfile.TemporaryDirectory(prefix="rose-demo-ts-") as d:
            say("   · two CPU REINFORCE jobs, each alone on a group of its own (one after the other)")
            solo = [_run(target, [(job, f"solo-{job}")], Path(d), updates)[0] for job in ("job-a", "job-b")]
            say("   · the same two jobs sharing one group: one trains while the other samples")
            shared = _run(target, [("job-a", "shared"), ("job-b", "shared")], Path(d), updates)
    finally:
        server.stop(grace=None)
    lines, solo_dc, shared_dc = summary(solo, shared)
    for ln in lines:
        say(f"   {ln}")
    say(f"   group duty cycle: solo {solo_dc:.0%}, shared {shared_dc:.0%} ({shared_dc / solo_dc:.2f}x)")
    ok = shared_dc > solo_dc
    say(f"   {'✓' if ok else '✗'} sharing raises the group's duty cycle")
    return ok


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker(argv[1:])
    p = argparse.ArgumentParser(prog="python -m rose_cli.demo_timeslice", description=__doc__)
    p.add_argument("--updates", type=int, default=12)
    a = p.parse_args(argv)
    print("Act 5: two RL jobs share one time-slice group (acquire / yield), duty cycle with and without")
    return 0 if act_timeslice(None, None, lambda m: print(m, flush=True), a.updates) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Demo act 5: two real small CPU RL jobs share one time-slice group on the local cluster; the
duty cycle with and without sharing, and the switch latency split.

Each job is REINFORCE on CartPole (the example trainer's environment, examples/01) in its own
process: a *sampler* phase (episodes with the current policy, off the accelerators) then a
*trainer* phase (several gradient passes over the batch) inside
``TimeSliceOrchestratorClient.on_accelerators``. Each job has one worker pod on a KWOK node
(labels ``rose.io/elastic-rl-job`` and ``rose.io/timeslice-group``) with a lendable claim that a
real ``rose driver`` process prepared (simulated GPUs, the node suspend engine with its explicit
``simulated`` backend: the pod's device state is a modelled 1 GiB occupant). The orchestrator is
a real ``rose timeslice serve`` process as it runs in a cluster: TLS (a CA and certificate the act
generates, ``rose timeslice certs``), callers authenticated by TokenReview (the jobs send a
ServiceAccount token of their namespace), a job admitted only with worker pods of the group;
group records and the fencing token in Leases of the real API server, leader election, and
``--handover kube``: each switch suspends the yielder's pod
and restores the next job's through the driver (``rose.io/suspend-request`` with the fencing
token, all or nothing). The training processes run outside the pods (KWOK runs no containers),
so their own tensors move with the SDK's ``offloader=``: the policy and Adam state go to host
buffers at each yield and come back at each acquire.

Solo, each job's pod is labelled with a group of its own (the two jobs run at the same time, so
both runs see the same CPU load); shared, both pods are relabelled into one group, so one job
trains while the other samples. The act prints each job's updates per second, the group duty
cycle (the share of wall time some job held the group) with and without sharing, and the switch
latency split (suspend, restore, grant overhead) as the orchestrator answered it.

I/O: the cluster's API (the Python client), the processes it starts (a driver, the
orchestrator, the workers: ``python -m rose_cli.demo_timeslice --worker``), their logs and JSON
timings in a temporary directory. :func:`union_s`, :func:`duty_cycle`, :func:`summary`,
:func:`percentile`, :func:`switch_split` and :func:`pick_node` are pure.

    python -m rose_cli.demo_timeslice [--dir DIR] [--updates 6]   # on a cluster from `rose cluster up`
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

from rose_common import names

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "01_cartpole_reinforce.py"
GROUP = "demo-shared"
JOB_NAMES = ("job-a", "job-b")
WORKER_TIMEOUT_S = 120  # the longest a worker waits for a grant
DRIVER_ARGS = [
    "--suspend-engine", "node", "--suspend-backends", "simulated", "--simulated-occupant-bytes", "1Gi",
    "--host-memory-budget", "8Gi", "--default-grace-seconds", "10", "--node-facts-seconds", "1",
    "--serving-wait", "prepare",  # the prepare-time serving wait (prebind has its own e2e test)
]  # fmt: skip
SPLIT_PARTS = ("suspend", "restore", "grant_overhead")


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


def duty_cycle(runs: Sequence[dict[str, Any]], overlap: bool = False) -> float:
    """Share of the runs' wall time (first start to last end; with ``overlap``, only while every
    run is running) in which some run held the group."""
    if overlap:
        start, end = max(r["start"] for r in runs), min(r["end"] for r in runs)
    else:
        start, end = min(r["start"] for r in runs), max(r["end"] for r in runs)
    held = union_s([(max(a, start), min(b, end)) for r in runs for a, b in r["phases"] if b > start and a < end])
    return held / (end - start) if end > start else 0.0


def summary(solo: Sequence[dict[str, Any]], shared: Sequence[dict[str, Any]]) -> tuple[list[str], float, float]:
    """Table lines, the mean solo duty cycle and the shared group's duty cycle while both jobs run
    (the one that finishes first leaves the other alone on the group: that tail is a solo run)."""
    solo_dc = sum(duty_cycle([r]) for r in solo) / len(solo)
    shared_dc = duty_cycle(shared, overlap=True)
    lines = [f"{'job':<8}{'solo upd/s':>12}{'shared upd/s':>14}{'held solo':>11}{'held shared':>13}"]
    for a, b in zip(solo, shared, strict=True):
        rate = [len(r["phases"]) / (r["end"] - r["start"]) for r in (a, b)]
        held = [duty_cycle([r]) for r in (a, b)]
        lines.append(
            f"{a['job'].rsplit('/', 1)[-1]:<8}{rate[0]:>12.2f}{rate[1]:>14.2f}{held[0]:>11.0%}{held[1]:>13.0%}"
        )
    return lines, solo_dc, shared_dc


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0..1) of ``values``; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.999999) - 1))]


def switch_split(runs: Sequence[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """p50 and p95 of each part of the grants that moved state (not ``was_resident``)."""
    moved = [g for r in runs for g in r["grants"] if not g["was_resident"]]
    return {
        p: (percentile([g[f"{p}_s"] for g in moved], 0.5), percentile([g[f"{p}_s"] for g in moved], 0.95))
        for p in SPLIT_PARTS
    }


def pick_node(node_names: Sequence[str], pools: Mapping[str, str]) -> str:
    """The node for act 5: in the first pool but not its first node (act 3 used that one, act 4
    the last pool); the last node when the first pool has only one."""
    first = sorted(set(pools.values()))[0] if pools else ""
    rest = [n for n in sorted(node_names) if pools.get(n) == first][1:]
    return rest[0] if rest else sorted(node_names)[-1]


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
    """One job: for each group of ``--groups`` in turn, wait for a ``go`` line on stdin, run
    ``--updates`` sampler + trainer phases on that group, print ``RESULT <json timings>``."""
    import importlib.util

    import numpy as np
    import torch

    from rose_sdk import CooperativeOffloader
    from rose_sdk.timeslice import TimeSliceOrchestratorClient

    p = argparse.ArgumentParser(prog="rose_cli.demo_timeslice --worker")
    for flag in ("--target", "--job", "--groups"):
        p.add_argument(flag, required=True)
    p.add_argument("--updates", type=int, default=6)
    p.add_argument("--episodes", type=int, default=12)
    p.add_argument("--epochs", type=int, default=90)
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
    try:
        for group in a.groups.split(","):
            if sys.stdin.readline().strip() != "go":
                return 1
            phases: list[tuple[float, float]] = []
            grants: list[dict[str, Any]] = []
            start = time.monotonic()
            for _ in range(a.updates):
                obs, acts, ret = _episodes(env, policy, a.episodes)  # the sampler phase: off the group
                with client.on_accelerators(group_id=group, timeout_s=WORKER_TIMEOUT_S) as g:
                    t0 = time.monotonic()
                    grants.append(
                        {
                            "was_resident": g.was_resident,
                            "wait_s": g.wait_s,
                            "suspend_s": g.suspend_s,
                            "restore_s": g.restore_s,
                            "grant_overhead_s": g.grant_overhead_s,
                        }
                    )
                    for _ in range(a.epochs):  # the trainer phase: holds the group
                        logp = torch.distributions.Categorical(logits=policy(obs)).log_prob(acts)  # type: ignore[no-untyped-call]
                        loss = -(logp * ret).mean()
                        opt.zero_grad()
                        loss.backward()
                        opt.step()
                    phases.append((t0, time.monotonic()))
            run = {
                "job": a.job,
                "group": group,
                "start": start,
                "end": time.monotonic(),
                "phases": phases,
                "grants": grants,
            }
            print(f"RESULT {json.dumps(run)}", flush=True)
    finally:
        client.close()
    return 0


# ------------------------------------------------------------------ the act
class _Workers:
    """The jobs' worker processes, started early (importing torch overlaps the act's setup) and
    driven run by run: ``go`` on their stdin, one ``RESULT`` line back from each."""

    def __init__(
        self, target: str, jobs: list[str], updates: int, stack: ExitStack, env: Mapping[str, str] | None = None
    ) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        for i, job in enumerate(jobs):
            cmd = [
                sys.executable,
                "-m",
                "rose_cli.demo_timeslice",
                "--worker",
                "--target",
                target,
                "--job",
                job,
                "--groups",
                f"{solo_group(job)},{GROUP}",
                "--updates",
                str(updates),
                "--seed",
                str(i),
            ]
            proc = subprocess.Popen(
                cmd,
                cwd=REPO,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, **(env or {})},
            )
            self.procs.append(proc)
            stack.callback(_stop, proc)

    def run(self) -> list[dict[str, Any]]:
        """Start one run in every worker at once; their timings."""
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        return [self._result(proc) for proc in self.procs]

    @staticmethod
    def _result(proc: subprocess.Popen[str]) -> dict[str, Any]:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("RESULT "):
                out: dict[str, Any] = json.loads(line[len("RESULT ") :])
                return out
        raise RuntimeError(f"demo worker {proc.args!r} exited {proc.wait(30)} before its result")


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def solo_group(job: str) -> str:
    return f"solo-{job.rsplit('/', 1)[-1]}"


def _driver(h: Any, api: Any, node: str, root: Path, stack: ExitStack) -> Any:
    from dra_driver.publisher import HASH_ANNOTATION
    from local_cluster import free_port
    from local_cluster.kubelet import DriverProcess
    from local_cluster.objects import driver_slices, wait_for

    drv = DriverProcess(h.kubeconfig, node, root, h.gpus_per_node, free_port(), extra_args=DRIVER_ARGS)
    stack.callback(drv.stop)

    def published() -> bool:
        items = driver_slices(api, node)
        return len(items) == 1 and HASH_ANNOTATION in (items[0]["metadata"].get("annotations") or {})

    wait_for(f"the driver's ResourceSlice on {node}", published, timeout=60)
    return drv


def _pods(api: Any, ns: str, node: str, drv: Any, jobs: list[str]) -> None:
    """One worker pod per job on ``node``, its lendable claim prepared by the driver."""
    from kubernetes import client

    from local_cluster.objects import allocated_claim, claim_template, create_claim_template, gpu_pod, wait_for

    core = client.CoreV1Api(api)
    create_claim_template(api, ns, claim_template("lent", names.DEVICE_CLASS_LENDABLE))
    for job in jobs:
        name = job.split("/")[1]
        labels = {names.LABEL_JOB: name, names.LABEL_TIMESLICE_GROUP: solo_group(job)}
        core.create_namespaced_pod(ns, gpu_pod(f"{name}-0", "lent", labels=labels, node_name=node))
    for job in jobs:  # KWOK has no kubelet: the act plays its DRA prepare
        pod = f"{job.split('/')[1]}-0"
        claim = wait_for(f"{pod} claim allocated", partial(allocated_claim, api, ns, pod), timeout=90)
        err = drv.prepare(claim).error
        if err:
            raise RuntimeError(f"the driver did not prepare {ns}/{pod}'s claim: {err}")


def _relabel(api: Any, ns: str, jobs: list[str], group: str) -> None:
    from kubernetes import client

    for job in jobs:
        body = {"metadata": {"labels": {names.LABEL_TIMESLICE_GROUP: group}}}
        client.CoreV1Api(api).patch_namespaced_pod(f"{job.split('/')[1]}-0", ns, body)


def _credentials(api: Any, ns: str, tmp: Path) -> dict[str, str]:
    """What the jobs' clients need against the secure orchestrator: a CA and server certificate
    (``tls.crt``/``tls.key`` for the server, ``ca.crt`` for the clients) and a ServiceAccount token of
    the jobs' namespace with the orchestrator's audience; the clients' environment."""
    from kubernetes import client

    from timeslice import certs

    files = certs.generate(tmp / "tls", ("localhost", "127.0.0.1"))
    core = client.CoreV1Api(api)
    core.create_namespaced_service_account(ns, {"metadata": {"name": "demo-jobs"}})
    req = {"spec": {"audiences": [names.TIMESLICE_TOKEN_AUDIENCE], "expirationSeconds": 3600}}
    token = core.create_namespaced_service_account_token("demo-jobs", ns, req).status.token
    token_file = tmp / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    return {names.ENV_TIMESLICE_TOKEN_FILE: str(token_file), "ROSE_TIMESLICE_CA_FILE": str(files.ca)}


def _orchestrator(h: Any, ns: str, port: int, tmp: Path, stack: ExitStack) -> str:
    """``rose timeslice serve`` over the cluster's Leases, hand-over through the drivers, leader
    election on, TLS, TokenReview and the job check (the defaults); its gRPC target once it leads
    (``/readyz`` 200)."""
    from local_cluster import free_port, module_process
    from local_cluster.objects import wait_for

    mport = free_port()
    args = ["timeslice", "serve", "--store", "kubernetes", "--kubeconfig", str(h.kubeconfig), "--namespace", ns,
            "--handover", "kube", "--switch-timeout", "30s", "--identity", "demo-orchestrator",
            "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{mport}",
            "--tls-cert", str(tmp / "tls" / "tls.crt"), "--tls-key", str(tmp / "tls" / "tls.key"),
            "--token-audience", names.TIMESLICE_TOKEN_AUDIENCE]  # fmt: skip
    proc = stack.enter_context(module_process(args, tmp / "orchestrator.log"))

    def leads() -> bool:
        if proc.poll() is not None:
            tail = (tmp / "orchestrator.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"rose timeslice serve exited {proc.returncode}; its log ends:\n{tail}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{mport}/readyz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    wait_for("the orchestrator elected leader (/readyz 200)", leads, timeout=60)
    return f"127.0.0.1:{port}"


def _pod_events(api: Any, ns: str) -> dict[str, int]:
    from kubernetes import client

    out: dict[str, int] = {}
    for e in client.CoreV1Api(api).list_namespaced_event(ns).items:
        if e.reason in ("Suspended", "Resumed"):
            out[e.reason] = out.get(e.reason, 0) + (e.count or 1)
    return out


def act_timeslice(h: Any, api: Any, say: Callable[[str], None], updates: int = 6) -> bool:
    """Returns True when both jobs ran shared with switches between them and every switch went
    through the driver (a Suspended Event per switch). The duty cycles are printed, not judged:
    they are timings of CPU jobs on whatever machine runs the demo (two CPU "accelerator" phases
    compete for the same cores); ``python -m benchmarks.timeslice`` measures the gain."""
    from local_cluster import free_port
    from local_cluster.objects import delete_namespace, new_namespace

    node = pick_node(h.node_names, h.pools)
    with ExitStack() as stack:
        ns = new_namespace(api, "demo-ts")
        stack.callback(delete_namespace, api, ns)
        jobs = [f"{ns}/{name}" for name in JOB_NAMES]
        port = free_port()
        root = Path(tempfile.mkdtemp(prefix="rose-ts-", dir="/tmp"))  # unix socket paths stay short
        stack.callback(shutil.rmtree, root, True)
        workers = _Workers(f"127.0.0.1:{port}", jobs, updates, stack, _credentials(api, ns, root))
        drv = _driver(h, api, node, root, stack)
        _pods(api, ns, node, drv, jobs)
        say(
            f"   · `rose driver` on {node} (simulated GPUs, node suspend engine); a worker pod per job "
            f"({', '.join(jobs)}) with a lendable claim it prepared"
        )
        target = _orchestrator(h, ns, port, root, stack)
        say(
            f"   · `rose timeslice serve` at {target}: TLS, callers' ServiceAccount tokens reviewed, group Leases "
            f"in {ns}, leader elected, hand-over through the driver (suspend-request + fencing token)"
        )
        say("   · two CPU REINFORCE jobs (separate processes), each alone on a group of its own")
        solo = workers.run()
        _relabel(api, ns, jobs, GROUP)
        say(f"   · the same two jobs sharing group {GROUP!r}: one trains while the other samples")
        before = _pod_events(api, ns)
        shared = workers.run()
        events = _pod_events(api, ns)
    lines, solo_dc, shared_dc = summary(solo, shared)
    for ln in lines:
        say(f"   {ln}")
    say(f"   group duty cycle: solo {solo_dc:.0%}, shared {shared_dc:.0%} while both ran ({shared_dc / solo_dc:.2f}x)")
    switches = sum(1 for r in shared for g in r["grants"] if not g["was_resident"])
    split = switch_split(shared)
    parts = ", ".join(f"{part} {p50 * 1000:.0f} / {p95 * 1000:.0f} ms" for part, (p50, p95) in split.items())
    say(f"   {switches} switches through the driver, p50 / p95: {parts}")
    suspended = events.get("Suspended", 0) - before.get("Suspended", 0)
    say(
        f"   driver Events on the pods while sharing: {suspended} Suspended, "
        f"{events.get('Resumed', 0) - before.get('Resumed', 0)} Resumed"
    )
    ok = all(r["grants"] for r in shared) and switches > 0 and suspended >= switches - 1
    say(f"   {'✓' if ok else '✗'} both jobs took turns on the shared group; every switch moved through the driver")
    say("   (duty cycles above are this machine's timings; `python -m benchmarks.timeslice` measures the gain)")
    return ok


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker(argv[1:])
    from local_cluster import ClusterHandle, default_workdir

    p = argparse.ArgumentParser(
        prog="python -m rose_cli.demo_timeslice",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--updates", type=int, default=6)
    p.add_argument("--dir", type=Path, default=default_workdir(), help="work directory of `rose cluster up`")
    a = p.parse_args(argv)
    state = a.dir / "cluster.json"
    if not state.is_file():
        print(
            f"demo_timeslice: error: no cluster at {a.dir}: run `rose cluster up` first (or pass --dir)",
            file=sys.stderr,
        )
        return 2
    h = ClusterHandle.from_json(state.read_text())
    print("Act 5: two RL jobs share one time-slice group (acquire / yield), duty cycle with and without")
    api = h.api_client()
    try:
        return 0 if act_timeslice(h, api, lambda m: print(m, flush=True), a.updates) else 1
    finally:
        api.close()


if __name__ == "__main__":
    sys.exit(main())

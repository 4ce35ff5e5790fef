"""Demo act 6: example 02 (GRPO on a tiny LLM, ``examples/02_grpo_tiny_llm``) as an ElasticRLJob
with roles — one trainer, rollout workers min 1 max 3 — on the local cluster, lent and taken back.

The real controller and extender read a static-file forecast that the act moves: room for the
trainer and one rollout worker, then (after step 1) for all three, then (after step 3) for one
again — two world changes, the leaving workers SIGTERMed. ``rose_cli.example02_pods.ProcessKubelet``
plays the kubelet on the KWOK nodes (each Running pod's command as a local process); before the
trainer's container starts it prepares the trainer's claim on a real ``rose driver``
(``driver_prepare``), so the trainer registers on its claim's node-agent socket. At step 3 a serving
pod arrives on the trainer's GPU: its prepare returns once the trainer is suspended into host memory
at its safe point; the serving pod leaves (unprepare) and the trainer resumes. The trainer's rollout
service counts every prompt (none may be lost or taken twice) and the trained weights are compared,
bit for bit, with a run of the same job with one rollout worker throughout and no suspend.
``tests/e2e/elastic_controller/test_example02_cluster_e2e.py`` runs the same scenario (``run_job``).
"""

from __future__ import annotations

import contextlib
import copy
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from local_cluster import ClusterHandle, free_port
from local_cluster.objects import (
    allocated_claim,
    claim_template,
    create_claim_template,
    delete_namespace,
    gpu_pod,
    new_namespace,
    wait_for,
)
from rose_cli import demo_elastic as erj
from rose_cli.example02_pods import REPO, ProcessKubelet, Trainer, constant_world_run, counters
from rose_common import names, slices

EXAMPLE = REPO / "examples" / "02_grpo_tiny_llm" / "elasticrljob.yaml"
STEPS = 6
COMPLETIONS_PER_STEP = 8  # tiny_grpo: per_device_train_batch_size 8
ROLLOUTS_MAX = 3


def job_manifest(ns: str, steps: int = STEPS) -> dict[str, Any]:
    """The example, sized small (pure): ``steps`` steps, rollouts 1-3 taking one prompt per lease,
    no checkpoint path (nothing to restore from), and the requests and priority KWOK nodes take."""
    body: dict[str, Any] = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    body["metadata"]["namespace"] = ns
    spec = body["spec"]
    spec.pop("checkpointPath")
    spec["gracefulShutdownPeriod"], spec["minUsefulRunSeconds"] = 5, 60
    trainer, rollout = spec["roles"]["trainer"], spec["roles"]["rollout"]
    rollout["minWorkers"], rollout["maxWorkers"] = 1, ROLLOUTS_MAX
    for role in (trainer, rollout):
        pod = role["template"]["spec"]
        pod["priorityClassName"] = "rose-rl"
        pod["containers"][0].pop("resources")
    cmd = trainer["template"]["spec"]["containers"][0]["command"]
    cmd[cmd.index("--max-steps") + 1] = str(steps)
    rollout["template"]["spec"]["containers"][0]["command"] += ["--batch", "1"]
    return body


def driver_prepare(s: erj.Stage) -> Callable[[Any], dict[str, str]]:
    """The kubelet's DRA step for the trainer's pod (played): NodePrepareResources of its claim on
    its node's ``rose driver``; the env its container gets: the claim's node-agent socket and the pod.
    Rollout pods (reclaim: Remove, no state to suspend) are not prepared."""

    def prepare(pod: Any) -> dict[str, str]:
        if (pod.metadata.labels or {}).get(f"{names.LABEL_PREFIX}/rl-role") != "trainer":
            return {}
        drv = s.drivers[pod.spec.node_name]
        claim = wait_for(f"{pod.metadata.name}'s claim allocated", partial(erj._gpus_claim, s.api, s.ns, pod), 30)
        out = drv.kubelet.prepare(claim)
        if out.error:
            raise RuntimeError(f"prepare of {pod.metadata.name}'s claim on {pod.spec.node_name}: {out.error}")
        sock = erj._claim_socket(drv, claim["metadata"]["uid"])
        return {k: v for k, v in erj.trainer_env({}, sock, pod, REPO).items() if k.startswith("ROSE_")}

    return prepare


@dataclass
class Outcome:
    """What the run did, for the act's report and the test's asserts."""

    worlds: list[int] = field(default_factory=list)  # rollout processes at steps 1, 1-3 and 3-6
    terms: list[str] = field(default_factory=list)  # pods whose process got SIGTERM
    counters: dict[str, int] = field(default_factory=dict)  # the trainer's prompts and suspends
    states: list[str] = field(default_factory=list)  # the trainer pod's suspend state: serving prepared, left
    serving_prepare_s: float = 0.0
    weights: Path = Path()
    rollout_logs: list[Path] = field(default_factory=list)
    samples: list[tuple[float, int, str]] = field(default_factory=list)  # the played kubelet's
    timeline: list[tuple[float, str]] = field(default_factory=list)


def _trainer_state(s: erj.Stage, pod: str) -> str:
    from kubernetes import client

    p = client.CoreV1Api(s.api).read_namespaced_pod(pod, s.ns)
    return str((p.metadata.annotations or {}).get(names.ANNOTATION_SUSPEND_STATE, "Running"))


def _serving_round(s: erj.Stage, pod_name: str, release: Callable[[], None], o: Outcome) -> None:
    """A serving pod on the trainer's GPU: its prepare (the kubelet's, played) waits for the
    trainer's suspend, which lands at its next safe point once ``release`` lets it go on; then the
    serving pod leaves (unprepare) and the trainer resumes."""
    from kubernetes import client

    core = client.CoreV1Api(s.api)
    pod = core.read_namespaced_pod(pod_name, s.ns)
    node, lent = pod.spec.node_name, erj._gpus_claim(s.api, s.ns, pod)
    if lent is None:
        raise RuntimeError(f"{pod_name} lost its claim")
    index, _ = slices.parse_device_name(lent["status"]["allocation"]["devices"]["results"][0]["device"])
    sel = [f'device.attributes["{names.DRIVER_NAME}"].{names.ATTR_INDEX} == {index}']
    create_claim_template(s.api, s.ns, claim_template("serve-gpu", names.DEVICE_CLASS_SERVING, selectors=sel))
    core.create_namespaced_pod(
        s.ns, gpu_pod("llm-serving-0", "serve-gpu", labels={names.LABEL_ROLE: "serving"}, node_name=node)
    )
    srv = wait_for("serving claim allocated", partial(allocated_claim, s.api, s.ns, "llm-serving-0"), timeout=60)
    drv = s.drivers[node]
    got: list[Any] = []
    t0 = time.monotonic()
    th = threading.Thread(target=lambda: got.append(drv.kubelet.prepare(srv)), daemon=True)
    th.start()
    time.sleep(0.5)  # the suspend command reaches the trainer while it waits at the step's gate
    release()
    th.join(timeout=60)
    o.serving_prepare_s = time.monotonic() - t0
    if not got or got[0].error:
        raise RuntimeError(f"the serving prepare on {node} GPU {index}: {got[0].error if got else 'no answer'}")
    o.states.append(_trainer_state(s, pod_name))
    s.mark(
        f"serving pod llm-serving-0 arrives on {node} GPU {index}, the trainer's: prepare returned in "
        f"{o.serving_prepare_s:.2f}s with the trainer {o.states[-1]} (its state in host memory)"
    )
    time.sleep(1.0)
    if drv.kubelet.unprepare(srv).error:
        raise RuntimeError(f"the serving unprepare on {node}")
    core.delete_namespaced_pod("llm-serving-0", s.ns, grace_period_seconds=0)
    o.states.append(_trainer_state(s, pod_name))
    s.mark(f"serving leaves (unprepare): the trainer is {o.states[-1]} again")


def _until(kubelet: ProcessKubelet, what: str, done: Callable[[], bool], timeout: float) -> None:
    """Wait for ``done``; on a timeout, say which of the job's pods are where (the played kubelet's view)."""
    try:
        wait_for(what, lambda: kubelet.check() or done(), timeout)
    except AssertionError as e:
        raise TimeoutError(f"{e}; the job's pods: {kubelet.phases}") from None


def run_job(s: erj.Stage, kubelet_tmp: Path, token: str, steps: int = STEPS) -> Outcome:
    """The scenario on ``s`` (its namespace, forecast file, drivers on ``s.quiet``'s nodes, a
    controller and an extender reading the forecast): see the module docstring."""
    o = Outcome(weights=kubelet_tmp / "elastic.pt")
    job = job_manifest(s.ns, steps)
    name = job["metadata"]["name"]
    gates = kubelet_tmp / "gates"
    gates.mkdir(exist_ok=True)
    trainer_env = {
        "ROSE_EXAMPLE_GATE_DIR": str(gates),
        "ROSE_EXAMPLE_GATES": "1,3",
        "ROSE_EXAMPLE_WEIGHTS": str(o.weights),
    }
    three = [f"{name}-rollout-{i}" for i in range(ROLLOUTS_MAX)]
    cap = s.capacity[s.quiet]
    s.forecast(float(cap - 2))  # room: the trainer and 1 rollout worker
    time.sleep(2.5)  # the controller and the extender re-read the file every second
    s.t0 = time.monotonic()
    with ProcessKubelet(s.api, s.ns, name, kubelet_tmp, trainer_env, token, driver_prepare(s)) as kubelet:
        erj.kubectl(s.h, "apply", "-f", "-", stdin=yaml.safe_dump(job))
        s.mark(
            f"kubectl apply: ElasticRLJob {name} (trainer 1, rollouts 1-{ROLLOUTS_MAX}); forecast: serving "
            f"needs {cap - 2} of {cap} GPUs in {s.quiet}"
        )
        wait_for("the trainer process", lambda: kubelet.check() or kubelet.trainer is not None, 90)
        tr: Trainer | None = kubelet.trainer
        if tr is None:
            raise RuntimeError("the trainer process went away")
        tr.await_line("GATE 1", 180)
        o.worlds.append(len(kubelet.running("rollout")))
        s.mark(f"trainer registered on its claim's node-agent socket; step 1 done with {o.worlds[-1]} rollout worker")

        s.forecast(0.0)
        s.mark(f"forecast falls: serving needs 0 of {cap} GPUs in {s.quiet}")
        _until(kubelet, "3 rollout processes", lambda: kubelet.running("rollout") == three, 120)
        o.worlds.append(len(kubelet.running("rollout")))
        from rose_sdk.rollout_service import RolloutClient

        with RolloutClient(kubelet.trainer_addr, worker="demo", token=token) as c:
            wait_for("the new workers connect", lambda: set(three) <= set(c.status()["workers"]), 120)
        s.mark(f"world change 1: {o.worlds[-1]} rollout workers, all pulled the weights and lease prompts")
        (gates / "go-1").touch()
        tr.await_line("GATE 3", 180)

        s.forecast(float(cap - 2))
        s.mark(f"forecast rises: serving needs {cap - 2} of {cap} GPUs in {s.quiet}")
        _until(kubelet, "2 rollouts removed", lambda: kubelet.running("rollout") == three[:1], 90)
        o.worlds.append(len(kubelet.running("rollout")))
        s.mark(f"world change 2: {o.worlds[-1]} rollout worker (2 removed, SIGTERMed; their prompts back in the queue)")
        _serving_round(s, f"{name}-trainer-0", (gates / "go-3").touch, o)
        if tr.proc.wait(timeout=180) != 0:
            raise RuntimeError(f"the trainer failed: {''.join(tr.lines)[-3000:]}")
        o.counters = counters(tr.lines)
        s.mark(f"trainer finished {steps} steps")
        wait_for("the rollout workers see 'done' and exit", lambda: not kubelet.running("rollout"), 60)
        o.terms = sorted(n for _, what, n in kubelet.events if what == "sigterm")
        o.rollout_logs = [
            kubelet_tmp / f"{n}.log" for _, what, n in kubelet.events if what == "start" and "-rollout-" in n
        ]
        erj.kubectl(s.h, "delete", "elasticrljob", name, "-n", s.ns, "--wait=true")
        kubelet.check()
        o.samples = list(kubelet.samples)
    return o


def weights_identical(a: Path, b: Path) -> bool:
    """Whether two ``ROSE_EXAMPLE_WEIGHTS`` files hold the same parameters, bit for bit."""
    import torch

    x, y = torch.load(a)["model"], torch.load(b)["model"]
    return sorted(x) == sorted(y) and all(torch.equal(x[k], y[k]) for k in x)


def rewards(path: Path) -> list[float]:
    import torch

    return [float(r) for r in torch.load(path)["rewards"]]


def draw(o: Outcome, rw: list[float], out: Path) -> None:
    """The README picture: the reward per step, and the lending timeline (rollout workers running,
    the trainer's state) over the run's wall time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [1, 1.4]})
    ax1.plot(range(1, len(rw) + 1), rw, marker="o", color="tab:green")
    ax1.set(xlabel="optimizer step", ylabel="mean reward", title="GRPO reward per step (tiny Qwen2, TRL)")
    ax1.grid(alpha=0.3)
    ts = [t - o.samples[0][0] for t, _, _ in o.samples]
    ax2.step(ts, [n for _, n, _ in o.samples], where="post", color="tab:blue", label="rollout workers running")
    running = [1 if st == names.SuspendState.RUNNING else 0 for _, _, st in o.samples]
    ax2.step(
        ts,
        running,
        where="post",
        color="tab:orange",
        linestyle="--",
        label="trainer running on its lent GPU (1) / suspended or not started (0)",
    )
    sus = [1 if st == names.SuspendState.SUSPENDED else 0 for _, _, st in o.samples]
    ax2.fill_between(
        ts,
        0,
        [x * (ROLLOUTS_MAX + 1.7) for x in sus],
        step="post",
        color="tab:red",
        alpha=0.3,
        label="trainer suspended into host memory (serving holds its GPU)",
    )
    ax2.set(
        xlabel="seconds since kubectl apply",
        ylabel="workers",
        title="lending timeline",
        ylim=(0, ROLLOUTS_MAX + 1.7),
        yticks=range(ROLLOUTS_MAX + 1),
    )
    ax2.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def run_act(h: ClusterHandle, api: Any, say: Callable[[str], None], figure: Path | None = None) -> bool:
    """The act on a cluster with an extender; True when nothing was lost or duplicated, the trainer
    was suspended and resumed once and its weights equal the constant-world run's."""
    token = f"demo-{free_port()}-{time.monotonic_ns()}"
    pools = sorted(set(h.pools.values()))
    s = erj.Stage(h, api, say, Path(tempfile.mkdtemp(prefix="rose-demo-ex02-", dir="/tmp")))
    s.quiet, s.busy = pools[-1], pools[0]
    s.capacity = {p: h.gpus_per_node * sum(1 for q in h.pools.values() if q == p) for p in pools}
    # the reference runs alongside (its own processes, loopback port): the act waits for it at the end
    refs: list[tuple[Path, dict[str, int]] | BaseException] = []
    reference = threading.Thread(
        target=_into,
        args=(refs, partial(constant_world_run, s.tmp / "ref", STEPS, token)),
        name="constant-world-run",
        daemon=True,
    )
    (s.tmp / "ref").mkdir()
    with contextlib.ExitStack() as stack:
        erj._start_drivers(s, stack)
        s.forecast(float(s.capacity[s.quiet] - 2))
        erj._start_services(s, stack)
        s.ns = new_namespace(api, "demo-rollouts")
        stack.callback(delete_namespace, api, s.ns)
        erj._start_controller(s, stack, "on")
        reference.start()
        o = run_job(s, s.tmp, token)
    reference.join(timeout=300)
    if not refs or isinstance(refs[0], BaseException):
        raise RuntimeError(f"the constant-world reference run did not finish: {refs[0] if refs else 'timeout'}")
    ref, ref_counters = refs[0]
    say(
        f"   · reference (run alongside): the same job with 1 rollout worker throughout, never suspended "
        f"({ref_counters['accepted']} completions accepted)"
    )
    total = STEPS * COMPLETIONS_PER_STEP
    c = o.counters
    lost, dup = total - c["accepted"], c["duplicate"] + c["stale"]
    same = weights_identical(ref, o.weights)
    rw = rewards(o.weights)
    say(
        f"   · rollout workers per phase: {o.worlds}; prompts lost {lost}, duplicated {dup} "
        f"({c['accepted']}/{total} completions accepted, {c['requeued']} requeued from removed workers)"
    )
    say(
        f"   · reward first step {rw[0]:.3f}, last step {rw[-1]:.3f}; trainer suspended {c['suspends']}x, resumed "
        f"{c['resumes']}x"
    )
    say(f"   · weights bit-identical to a constant-world run: {'YES' if same else 'NO'}")
    out = figure or s.tmp / "example02.png"
    draw(o, rw, out)
    say(f"   · figure: {out}")
    return lost == 0 and dup == 0 and same and c["suspends"] == c["resumes"] == 1 and len(set(o.worlds)) > 1


def _into(out: list[Any], fn: Callable[[], Any]) -> None:
    try:
        out.append(fn())
    except BaseException as e:  # handed to the joining thread
        out.append(e)


def act_rollouts(h: ClusterHandle, api: Any, say: Callable[[str], None], figure: Path | None = None) -> bool:
    if not h.extender_url:
        say("   · (skipped: this cluster's rose-scheduler profile has no extender)")
        return True
    try:
        return run_act(h, api, say, figure)
    except (RuntimeError, TimeoutError, AssertionError) as e:
        say(f"   · FAILED: {e}")
        return False

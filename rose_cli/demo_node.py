"""Demo act: serving wins, the RL job is suspended into host memory and resumes bit-exact.

A real ``rose driver`` runs for one KWOK node (simulated GPUs, cooperative suspend backend,
its node agent socket). The RL pod's process is example 02's GRPO job (TRL's real GRPOTrainer on
a tiny LLM, ``rose_cli/demo_grpo.py``) on ROSE through ``rose_sdk.integrations.transformers``,
started by the demo with the pod's UID and its claim's env as the container would be; it resumes
bit-identical to an uninterrupted run. Then a hostile occupant (``rose_cli/demo_hostile.py``)
registers as SUSPENDED while it keeps its device memory, and the serving prepare on its GPU
returns only after the driver enforced the reclaim. KWOK has no kubelet, so the demo plays the
kubelet's DRA manager: it calls NodePrepareResources / NodeUnprepareResources over the driver's real gRPC sockets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from local_cluster import ClusterHandle, free_port
from local_cluster.binaries import REPO_ROOT
from local_cluster.kubelet import DriverProcess
from local_cluster.objects import (
    allocated_claim,
    claim_template,
    create_claim_template,
    gpu_pod,
    new_namespace,
    report_container_resources,
    wait_for,
)
from rose_common import names
from rose_common.proto import rose_agent_v1_pb2 as pb
from rose_common.proto import rose_agent_v1_pb2_grpc as pb_grpc

GRPO_STEPS, GRPO_SEED, GRPO_WAIT_STEP = 30, 7, 10


def _start_training(out: Path, env_extra: dict[str, str]) -> subprocess.Popen[str]:
    """Example 02's GRPO trainer (``rose_cli/demo_grpo.py``): it stays at step 10's safe point
    until suspended and resumed once when it has a node agent, else runs straight through."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROSE_")}
    env.update(env_extra)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rose_cli.demo_grpo",
            "--out",
            str(out),
            "--max-steps",
            str(GRPO_STEPS),
            "--seed",
            str(GRPO_SEED),
            "--wait-step",
            str(GRPO_WAIT_STEP),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("READY "):
            return
    raise RuntimeError(f"the training process exited before it was ready (rc={proc.wait()})")


def _cpu_request(core: Any, ns: str, pod: str) -> str:
    p = core.read_namespaced_pod(pod, ns)
    return str((p.spec.containers[0].resources.requests or {}).get("cpu", ""))


def _wait_cpu(core: Any, ns: str, pod: str, want: str, timeout: float = 15.0) -> str:
    """The RL pod's cpu request once the driver's pods/resize (done in the background) shows
    ``want``, or whatever it is after ``timeout``."""
    deadline = time.monotonic() + timeout
    cpu = _cpu_request(core, ns, pod)
    while cpu != want and time.monotonic() < deadline:
        time.sleep(0.25)
        cpu = _cpu_request(core, ns, pod)
    return cpu


def act_serving_wins(h: ClusterHandle, api: Any, say: Callable[[str], None]) -> bool:
    """Returns True when the resumed training is bit-identical to an uninterrupted run."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    node = h.node_names[0]
    root = Path(tempfile.mkdtemp(prefix="rose-demo-", dir="/tmp"))  # unix socket paths stay short
    agent_sock, control_sock = root / "a" / "workload.sock", root / "a" / "control.sock"
    drv = _start_driver(h, node, root, agent_sock, control_sock)
    procs: list[subprocess.Popen[str]] = []
    try:
        say(f"   · `rose driver` started for {node}: simulated GPUs, cooperative suspend, agent socket")
        ns = new_namespace(api, "demo-node")
        gpu0 = ['device.attributes["gpu.rose.io"].index == 0']
        create_claim_template(api, ns, claim_template("lent-gpu0", names.DEVICE_CLASS_LENDABLE, selectors=gpu0))
        create_claim_template(api, ns, claim_template("serve-gpu0", names.DEVICE_CLASS_SERVING, selectors=gpu0))
        rl = gpu_pod("rl-worker-0", "lent-gpu0", labels={names.LABEL_JOB: "grpo"}, cpu="4", node_name=node)
        rl["metadata"]["annotations"] = {names.ANNOTATION_GRACE: "60"}
        core.create_namespaced_pod(ns, rl)
        rl_claim = wait_for("RL claim allocated", lambda: allocated_claim(api, ns, "rl-worker-0"), timeout=90)
        rl_uid = core.read_namespaced_pod("rl-worker-0", ns).metadata.uid
        out = drv.kubelet.prepare(rl_claim)
        report_container_resources(api, ns, "rl-worker-0")  # the kubelet (played) reports its 4 CPUs
        say(
            f"   · RL pod rl-worker-0 got {out.devices[0].device_name} on {node}; kubelet (played) prepared it: "
            f"CDI {next(iter(out.devices[0].cdi_device_ids))}"
        )

        run_out, base_out = root / "run.pt", root / "baseline.pt"
        claim_dir = drv.plugin_dir / "claims" / rl_claim["metadata"]["uid"]  # its CDI spec mounts it
        pod_env = {
            "ROSE_AGENT_SOCKET": str(claim_dir / "workload.sock"),
            "ROSE_SIMULATED_DEVICE_MEMORY": str(claim_dir / "device-memory"),  # what the driver observes
            "ROSE_POD_UID": rl_uid,
            "ROSE_POD_NAMESPACE": ns,
            "ROSE_POD_NAME": "rl-worker-0",
            "PYTHONPATH": str(REPO_ROOT),
        }
        procs.append(_start_training(run_out, pod_env))
        procs.append(_start_training(base_out, {"PYTHONPATH": str(REPO_ROOT)}))  # the same seed, never suspended
        _wait_ready(procs[0])
        with grpc.insecure_channel(f"unix://{control_sock}") as ch:
            control = pb_grpc.NodeControlStub(ch)  # type: ignore[no-untyped-call]
            wait_for(
                "training registered with the node agent",
                lambda: (
                    any(w.pod_uid == rl_uid and w.connected for w in control.Status(pb.StatusRequest()).workloads)
                    or None
                ),
                timeout=60,
            )
            say(
                "   · examples/02_grpo_tiny_llm (TRL's GRPOTrainer on a tiny Qwen2 LLM, on ROSE through "
                "rose_sdk.integrations.transformers.attach) is training as that pod, registered with "
                "the node agent"
            )
            _serving_wins_gpu0(drv, api, ns, node, rl_uid, control, say)
        for p in procs:
            p.communicate(timeout=180)
        same = _training_unharmed(core, ns, rl_uid, run_out, base_out, say)
        enforced = _hostile_occupant(drv, api, ns, node, control_sock, say)
        return same and enforced
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        drv.stop()


def _start_driver(h: ClusterHandle, node: str, root: Path, agent_sock: Path, control_sock: Path) -> DriverProcess:
    """`rose driver` for ``node``: simulated GPUs, the node agent's sockets, cooperative suspend."""
    return DriverProcess(
        h.kubeconfig, node, root, gpus=h.gpus_per_node, metrics_port=free_port(),
        extra_args=[
            "--suspend-engine", "node", "--suspend-backends", "cooperative", "--host-memory-budget", "1Gi",
            "--agent-socket", str(agent_sock), "--agent-control-socket", str(control_sock),
            "--enforce-timeout-seconds", f"{ENFORCE_TIMEOUT_S:g}",
            "--serving-wait", "prebind",  # the default on v1.37.2 (auto): serving waits in the scheduler's PreBind
        ],
    )  # fmt: skip


def _serving_wins_gpu0(
    drv: DriverProcess, api: Any, ns: str, node: str, rl_uid: str, control: Any, say: Callable[[str], None]
) -> None:
    """A serving pod arrives on the training's GPU: prepared once the occupant is suspended, its CPU
    given back while suspended; the serving pod leaves and the occupant resumes."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    t0 = time.monotonic()
    core.create_namespaced_pod(
        ns, gpu_pod("llm-serving-0", "serve-gpu0", labels={names.LABEL_ROLE: "serving"}, node_name=node)
    )
    srv = wait_for("serving claim allocated", lambda: allocated_claim(api, ns, "llm-serving-0"), timeout=90)
    dev = srv["status"]["allocation"]["devices"]["results"][0]["device"]
    say(
        f"   · a serving pod arrives; the real scheduler gives it {dev}: the same physical GPU, whose "
        f"binding condition {names.BINDING_CONDITION_FREED} holds the pod in PreBind"
    )
    held, prep, err = _bound_then_prepared(drv, api, ns, "llm-serving-0", t0, timeout=120)
    assert err == "", err
    st = control.Status(pb.StatusRequest(pod_uid=rl_uid))
    op = [o for o in st.recent_operations if o.kind == pb.COMMAND_KIND_SUSPEND][-1]
    ann = core.read_namespaced_pod("rl-worker-0", ns).metadata.annotations or {}
    say(
        f"   · serving wins in the scheduler, not the kubelet: the pod waited {held:.2f}s in PreBind while "
        f"the driver suspended the RL occupant ({ann.get(names.ANNOTATION_SUSPEND_STATE)} at its safe point, "
        f"{op.bytes_moved} bytes of model, Adam state and TRL's buffers now in host memory) and reported the "
        f"GPU freed in the claim's status; then the kubelet's prepare took {prep:.2f}s"
    )
    say("   · Events on llm-serving-0: " + json.dumps(_reasons(core, ns, "llm-serving-0")))
    say(
        f"   · its CPU goes back to the scheduler through pods/resize: cpu request 4 -> "
        f"{_wait_cpu(core, ns, 'rl-worker-0', '100m')} while suspended (same pod)"
    )
    assert drv.kubelet.unprepare(srv).error == ""
    ann = core.read_namespaced_pod("rl-worker-0", ns).metadata.annotations or {}
    say(
        f"   · serving leaves (unprepare): the occupant is {ann.get(names.ANNOTATION_SUSPEND_STATE)} again, "
        f"cpu request {_wait_cpu(core, ns, 'rl-worker-0', '4')} restored"
    )


def _bound_then_prepared(
    drv: DriverProcess, api: Any, ns: str, pod: str, t0: float, timeout: float
) -> tuple[float, float, str]:
    """The kubelet's part, played: wait until the scheduler binds ``pod`` (after its PreBind wait),
    then prepare its claim. Returns seconds from ``t0`` to the binding, the prepare's own seconds,
    and the prepare's error ("" when prepared)."""

    from kubernetes import client

    core = client.CoreV1Api(api)

    def bound() -> str | None:
        return core.read_namespaced_pod(pod, ns).spec.node_name or None

    wait_for(f"{pod} bound by the scheduler", bound, timeout=timeout, interval=0.05)
    held = time.monotonic() - t0
    claim = allocated_claim(api, ns, pod)
    assert claim is not None
    t1 = time.monotonic()
    err = drv.kubelet.prepare(claim).error
    return held, time.monotonic() - t1, err


def _reasons(core: Any, ns: str, pod: str) -> list[str]:
    """The reasons of the Events on ``pod``, in the order they were first seen."""
    events = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={pod}").items
    return list(dict.fromkeys(e.reason for e in sorted(events, key=lambda e: e.metadata.creation_timestamp)))


def _training_unharmed(
    core: Any, ns: str, rl_uid: str, run_out: Path, base_out: Path, say: Callable[[str], None]
) -> bool:
    """Whether the suspended-and-resumed training ended bit-identical to the uninterrupted run."""
    import torch

    from rose_sdk import tensors_equal

    a = torch.load(run_out, weights_only=True)
    b = torch.load(base_out, weights_only=True)
    same = tensors_equal(a["model"], b["model"]) and tensors_equal(a["optimizer"], b["optimizer"])
    k = max(1, len(a["rewards"]) // 5)
    say(
        f"   · GRPO finished {a['steps']} steps (the reference run {b['steps']}): mean reward "
        f"{sum(a['rewards'][:k]) / k:.2f} over the first {k} steps -> {sum(a['rewards'][-k:]) / k:.2f} "
        f"over the last {k}"
    )
    same = same and a["suspends"] == a["resumes"] == 1 and a["steps"] == b["steps"] == GRPO_STEPS
    pod = core.read_namespaced_pod("rl-worker-0", ns)
    say(
        f"   · training finished: suspended {a['suspends']}x, resumed {a['resumes']}x; parameters and Adam "
        f"state bit-identical to an uninterrupted run: {'yes' if same else 'NO'}"
    )
    say(f"   · the RL pod was never deleted: same UID {pod.metadata.uid == rl_uid}, no restart")
    events = core.list_namespaced_event(ns, field_selector="involvedObject.name=rl-worker-0").items
    say("   · Events on the RL pod: " + json.dumps(sorted({e.reason for e in events})))
    return bool(same)


HOSTILE_GRACE_S = 3  # the hostile pod's rose.io/graceful-shutdown-seconds
ENFORCE_TIMEOUT_S = 5.0  # the driver's --enforce-timeout-seconds (default 10)
COOPERATIVE_SLACK_S = 5.0  # the driver waits for the cooperative phase at most grace + 5 s
# the scheduler re-checks a pod waiting in PreBind about every 5 s (docs/dra-lending.md): the time
# from the driver's "freed" to the binding
PREBIND_RECHECK_S = 5.0


def _hostile_occupant(
    drv: DriverProcess, api: Any, ns: str, node: str, control_sock: Path, say: Callable[[str], None]
) -> bool:
    """Serving wins whatever the RL job does: a lent occupant that registers as SUSPENDED while it
    keeps holding its device memory (``rose_cli/demo_hostile.py``); the serving prepare on its GPU
    returns only once the driver has freed the device itself. True when the device was observed
    free (the claim's device-memory file at 0 allocated bytes) when the prepare returned, within
    the driver's documented bound (``dra_driver/README.md``): grace + 5 s + the enforcement timeout,
    plus another enforcement timeout while the durable checkpoint the engine's fallback asked for is
    unanswered (a hostile occupant never answers it), phase ``enforced``."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    gpu1 = ['device.attributes["gpu.rose.io"].index == 1']
    create_claim_template(api, ns, claim_template("lent-gpu1", names.DEVICE_CLASS_LENDABLE, selectors=gpu1))
    create_claim_template(api, ns, claim_template("serve-gpu1", names.DEVICE_CLASS_SERVING, selectors=gpu1))
    rl = gpu_pod("rl-hostile-1", "lent-gpu1", labels={names.LABEL_JOB: "hostile"}, node_name=node)
    rl["metadata"]["annotations"] = {names.ANNOTATION_GRACE: str(HOSTILE_GRACE_S)}
    core.create_namespaced_pod(ns, rl)
    claim = wait_for("hostile RL claim allocated", lambda: allocated_claim(api, ns, "rl-hostile-1"), timeout=90)
    uid = core.read_namespaced_pod("rl-hostile-1", ns).metadata.uid
    assert drv.kubelet.prepare(claim).error == ""
    claim_dir = drv.plugin_dir / "claims" / claim["metadata"]["uid"]
    memfile = claim_dir / "device-memory"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROSE_")}
    env.update(
        ROSE_AGENT_SOCKET=str(claim_dir / "workload.sock"),
        ROSE_SIMULATED_DEVICE_MEMORY=str(memfile),
        ROSE_POD_UID=uid,
        PYTHONPATH=str(REPO_ROOT),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "rose_cli.demo_hostile", "--bytes", str(64 << 20)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_ready(proc)
        with grpc.insecure_channel(f"unix://{control_sock}") as ch:
            control = pb_grpc.NodeControlStub(ch)  # type: ignore[no-untyped-call]
            wait_for(
                "hostile occupant registered with the node agent",
                lambda: (
                    any(w.pod_uid == uid and w.connected for w in control.Status(pb.StatusRequest()).workloads) or None
                ),
                timeout=60,
            )
        held = os.stat(memfile).st_blocks * 512
        say(
            f"   · a hostile RL pod rl-hostile-1 on {node}'s GPU 1 (grace {HOSTILE_GRACE_S}s): registers with the "
            f"node agent as SUSPENDED while it keeps {held >> 20} MiB of device memory and computes"
        )
        t0 = time.monotonic()
        core.create_namespaced_pod(
            ns, gpu_pod("llm-serving-1", "serve-gpu1", labels={names.LABEL_ROLE: "serving"}, node_name=node)
        )
        bound = HOSTILE_GRACE_S + COOPERATIVE_SLACK_S + 2 * ENFORCE_TIMEOUT_S + PREBIND_RECHECK_S
        _, _, err = _bound_then_prepared(drv, api, ns, "llm-serving-1", t0, timeout=bound + 60)
        wait = time.monotonic() - t0
        resident = os.stat(memfile).st_blocks * 512 if memfile.exists() else 0
        try:
            rc = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            rc = None
        ok = _enforcement_observed(drv, core, ns, err, wait, resident, rc, say)
        srv = allocated_claim(api, ns, "llm-serving-1")
        if srv is not None:
            drv.kubelet.unprepare(srv)
        return ok
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _enforcement_observed(
    drv: DriverProcess,
    core: Any,
    ns: str,
    err: str,
    wait: float,
    resident: int,
    rc: int | None,
    say: Callable[[str], None],
) -> bool:
    """Whether the serving prepare returned without error, with the device observed free, within the
    driver's bound, counted as phase ``enforced`` and reported by a ReclaimEnforced Event."""
    from rose_common import promtext

    text = "\n".join(drv.metrics())
    phases = {
        ph: promtext.value(text, "rose_driver_gpu_returned_seconds_count", {"phase": ph}, default=0.0)
        for ph in ("cooperative", "enforced", "fallback")
    }
    returned = promtext.value(text, "rose_driver_gpu_returned_seconds_sum", {"phase": "enforced"}, default=0.0)
    bound = HOSTILE_GRACE_S + COOPERATIVE_SLACK_S + 2 * ENFORCE_TIMEOUT_S + PREBIND_RECHECK_S
    killed = "killed (SIGKILL)" if rc == -9 else f"rc={rc}"
    say(
        f"   · a serving pod gets GPU 1: bound after its PreBind wait and prepared {wait:.2f}s after it was "
        f"created (error {err!r}); the hostile process was {killed}"
    )
    say(
        f"   · the driver's rose_driver_gpu_returned_seconds{{phase}} counts: cooperative "
        f"{phases['cooperative']:.0f} (the honest trainer above), enforced {phases['enforced']:.0f} "
        f"(this one: {returned:.2f}s from the serving claim's allocation to the device observed free), "
        f"fallback {phases['fallback']:.0f}"
    )

    def reclaim_enforced() -> list[Any] | None:
        evs = core.list_namespaced_event(ns, field_selector="involvedObject.name=rl-hostile-1").items
        return [e for e in evs if e.reason == "ReclaimEnforced"] or None

    try:
        events = wait_for("the ReclaimEnforced Event", reclaim_enforced, timeout=15)
    except Exception:
        events = []
    say(f"   · Event ReclaimEnforced on rl-hostile-1: {events[0].message if events else '(none)'}")
    ok = err == "" and resident == 0 and wait <= bound and phases["enforced"] == 1 and bool(events)
    say(
        f"   · serving bound and prepared only once the device was observed free (device-memory file {resident} bytes "
        f"allocated at return; {wait:.1f}s <= grace {HOSTILE_GRACE_S}s + {COOPERATIVE_SLACK_S:.0f}s + "
        f"{ENFORCE_TIMEOUT_S:.0f}s for the fallback checkpoint the engine asked for + enforcement "
        f"{ENFORCE_TIMEOUT_S:.0f}s + the scheduler's PreBind re-check {PREBIND_RECHECK_S:.0f}s = {bound:.0f}s): "
        f"{'YES' if ok else 'NO'}"
    )
    return ok

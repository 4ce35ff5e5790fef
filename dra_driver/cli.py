"""``rose driver``: the DRA node driver (kubelet plugin, slice publisher, serving-wins suspend).

Every flag has an environment twin ``ROSE_DRIVER_<FLAG>`` (upper case, dashes → underscores).
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rose_common import names, runner
from rose_common.cli import EnvArgumentParser, boolean, byte_size, port_type

ENV_PREFIX = "ROSE_DRIVER_"
log = logging.getLogger("rose.driver")


def absolute_dir(text: str) -> str:
    """A directory flag: an absolute path (or empty where the flag has a default); the kubelet and
    the CDI runtime resolve these paths from another working directory, so a relative one is refused."""
    if text and not Path(text).is_absolute():
        raise argparse.ArgumentTypeError(
            f"{text!r} is a relative path: give an absolute one (e.g. /{text.lstrip('./')})"
        )
    return text


def build_parser() -> argparse.ArgumentParser:
    p = EnvArgumentParser(
        env_prefix=ENV_PREFIX,
        prog="rose driver",
        description="ROSE DRA node driver (gpu.rose.io). Every flag can also be set by the environment "
        f"variable shown in its help ({ENV_PREFIX}<FLAG>).",
    )

    def add(flag: str, help: str, **kw: Any) -> None:
        p.flag(f"--{flag}", help=help, **kw)

    add("node-name", "this node's name (the pool name of its ResourceSlice)", required=True)
    add("kubeconfig", "kubeconfig file; empty: in-cluster service account", default="")
    add(
        "gpu-backend",
        "GPU discovery backend, chosen explicitly (no fallback)",
        choices=["nvml", "simulated"],
        required=True,
    )
    add("simulated-gpus", "simulated backend: GPUs on this node", type=int, default=8)
    add(
        "simulated-gpu-memory",
        "simulated backend: memory per GPU",
        type=byte_size,
        default="141Gi",
    )
    add("simulated-gpu-model", "simulated backend: model name", default="NVIDIA H200 (simulated)")
    add(
        "simulated-host-link-gbps",
        "simulated backend: host<->device GB/s per direction",
        type=float,
        default=55.0,
    )
    add(
        "plugin-dir",
        "where the DRA socket (dra.sock) lives",
        type=absolute_dir,
        default=f"/var/lib/kubelet/plugins/{names.DRIVER_NAME}",
    )
    add(
        "kubelet-plugin-dir",
        "plugin-dir as the kubelet sees it (endpoint in GetInfo); default: plugin-dir",
        type=absolute_dir,
        default="",
    )
    add(
        "registry-dir",
        "kubelet plugin registry dir (registration socket)",
        type=absolute_dir,
        default="/var/lib/kubelet/plugins_registry",
    )
    add("cdi-dir", "dynamic CDI spec directory", type=absolute_dir, default="/var/run/cdi")
    add("state-dir", "checkpoint directory; default: plugin-dir", type=absolute_dir, default="")
    add("boot-id-file", "file holding the node boot ID", default="/proc/sys/kernel/random/boot_id")
    add(
        "metrics-port",
        "Prometheus /metrics port on 0.0.0.0 (-1: off, 0: ephemeral)",
        type=port_type(-1, "-1: off, 0: ephemeral"),
        default=9400,
    )
    add("metrics-address", "address the metrics server binds", default="0.0.0.0")
    add(
        "host-memory-budget",
        "host memory the suspend engine may fill with suspended state",
        type=byte_size,
        default="64Gi",
    )
    add(
        "spill-dir",
        "local directory (NVMe) for the disk tier of suspended state: when the host-memory budget "
        "is full, the least recently suspended state spills there before any checkpoint-and-evict; "
        "'' = no disk tier",
        type=absolute_dir,
        default="",
    )
    add(
        "spill-budget-bytes",
        "bytes the disk tier (--spill-dir) may hold",
        type=byte_size,
        default="0",
    )
    add(
        "suspend-engine",
        "suspend engine: 'node' (dra_driver.suspend) or 'none' (lent occupants are not "
        "suspended; serving-wins suspends are recorded as failed)",
        choices=["node", "none"],
        default="node",
    )
    add(
        "suspend-backends",
        "comma-separated suspend backends in preference order (cuda-checkpoint, cooperative, simulated)",
        default="cooperative",
    )
    add(
        "simulated-occupant-bytes",
        "simulated suspend backend: state size of a claim with no registered "
        "workload (KWOK end-to-end runs); 0: such claims are unknown",
        type=byte_size,
        default=0,
    )
    add(
        "simulated-host-dir",
        "simulated suspend backend with a disk tier: directory of its real bytes (device memory and "
        "DRAM copy per workload); '' = a /dev/shm folder per node",
        type=absolute_dir,
        default="",
    )
    add(
        "simulated-host-copy-bytes",
        "simulated suspend backend with a disk tier: real bytes kept per workload (its device memory, "
        "DRAM copy and spill file), while the budgets are charged its full state size; 0 = the state size",
        type=byte_size,
        default=0,
    )
    add(
        "agent-socket",
        "run the node agent, its control socket in this path's directory; workload pods get one socket"
        " per lent claim under <plugin-dir>/claims through the claim's CDI spec; empty: no agent",
        default="",
    )
    add(
        "agent-control-socket",
        "node agent control socket (controller / orchestrator), in a directory no pod mounts;"
        " default: <agent-socket dir>/control.sock",
        default="",
    )
    add(
        "checkpoint-max-bytes",
        "the fallback verifies a workload's durable checkpoint only up to this size (larger: refused, not evicted)",
        type=byte_size,
        default="64Gi",
    )
    add(
        "checkpoint-verify-seconds",
        "the fallback waits at most this long for a checkpoint's verification (then: not evicted)",
        type=float,
        default=120.0,
    )
    add(
        "default-grace-seconds",
        "grace period when the RL pod has no rose.io/graceful-shutdown-seconds",
        type=float,
        default=30.0,
    )
    add(
        "publish-slices",
        "publish this node's ResourceSlices (true/false)",
        type=boolean,
        default=True,
    )
    add(
        "watch-pods",
        "act on rose.io/suspend-request annotations of this node's pods (true/false)",
        type=boolean,
        default=True,
    )
    add(
        "reconcile-seconds",
        "period of the repair loop (retry resumes, re-suspend occupants the engine reports running)",
        type=float,
        default=10.0,
    )
    add(
        "node-facts-seconds",
        "how often to publish rose.io/host-memory-free-bytes, rose.io/lent-gpus, rose.io/lent-gpu-shares "
        "on the Node when they changed (<= 0: never)",
        type=float,
        default=5.0,
    )
    add(
        "suspended-cpu",
        "cpu request a suspended RL worker keeps: the rest is given back through pods/resize and "
        "restored on resume (rose.io/suspended-cpu holds the originals); empty: off",
        default="100m",
    )
    add(
        "enforce-timeout-seconds",
        "serving wins, enforced: after the occupant's grace period (+5 s), how long the driver may take to"
        " free a lent GPU it does not observe free (cuda-checkpoint of the holder PIDs when that backend is"
        " enabled, else SIGSTOP + SIGKILL of the holders and eviction of the pod); a durable checkpoint the"
        " engine requested and is still waiting for gets as long again first",
        type=float,
        default=10.0,
    )
    add(
        "gpu-shares",
        "also publish every GPU as a shareable device gpu-N-share (allowMultipleAllocations, consumable"
        " capacities memory and compute percent; DeviceClass share.gpu.rose.io) for RL shares of one GPU;"
        " docs/dra-lending.md, 'GPU shares' (true/false)",
        type=boolean,
        default=False,
    )
    add(
        "mps-control",
        "--gpu-shares on real GPUs (nvml): the CUDA MPS control binary the driver runs, one daemon per"
        " shared GPU (-d to start, quit to stop; pipe and log directories under <state-dir>/mps); a name"
        " is looked up on PATH. Never used on simulated GPUs",
        default="nvidia-cuda-mps-control",
    )
    add(
        "allow-serving-on-occupied-device",
        "prepare a serving claim even while a lent occupant's state is still observed on the device"
        " (counted in rose_driver_serving_on_occupied_device_total, an Event on the occupant); default:"
        " refuse, the kubelet retries (true/false)",
        type=boolean,
        default=False,
    )
    add(
        "device-context-allowance",
        "nvml: device memory a lent occupant's process may keep on a reclaimed GPU (its CUDA context);"
        " more is an occupied device",
        type=byte_size,
        default="512Mi",
    )
    add(
        "serving-wait",
        "where a serving pod waits while its GPU's lent occupant is suspended: prebind (the scheduler"
        " holds it in PreBind on the devices' binding conditions; the kubelet's prepare is then"
        " immediate), prepare (NodePrepareResources waits, as on clusters without the"
        " DRADeviceBindingConditions gate), or auto (prebind where the API server keeps device"
        " bindingConditions, else prepare; reported at start)",
        choices=["auto", "prebind", "prepare"],
        default="auto",
    )
    add("log-level", "debug, info, warning, error", default="info")
    return p


def build_engine(
    args: argparse.Namespace,
    gpus: list[Any],
    notifier: Any,
    evictor: Any,
    registry: Any,
    checkpoint_paths: Any = None,
    claim_pods: Any = None,
) -> Any:
    """The suspend engine (``dra_driver.suspend``) with the chosen backends, imported only when used.

    Its Events go to the API through the driver's notifier, to the pods ``claim_pods`` (the
    driver's claim records) names; its evictions through ``evictor``, its metrics to the driver's
    registry; a fallback checkpoint is verified only under the ``checkpointPath`` that
    ``checkpoint_paths`` (``verify.CheckpointPaths``) knows for the pod.
    """
    from dra_driver.suspend.engine import EngineConfig
    from dra_driver.suspend.events import NotifierEventSink
    from dra_driver.suspend.factory import build_engine as factory
    from dra_driver.suspend.verify import CheckpointVerifier, VerifyLimits

    backends = tuple(b.strip() for b in str(args.suspend_backends).split(",") if b.strip())
    cfg = EngineConfig(
        host_memory_budget_bytes=int(args.host_memory_budget),
        backends=backends,
        simulated_occupant_bytes=int(args.simulated_occupant_bytes),
        node_name=args.node_name,
        spill_dir=str(args.spill_dir),
        spill_budget_bytes=int(args.spill_budget_bytes),
    )
    gbps = min((g.host_link_gbps for g in gpus), default=float(args.simulated_host_link_gbps))
    return factory(
        cfg,
        simulated_host_link_bytes_per_second=gbps * 1e9,
        simulated_host_dir=str(args.simulated_host_dir),
        simulated_host_copy_bytes=int(args.simulated_host_copy_bytes),
        events=NotifierEventSink(notifier, claim_pods=claim_pods),
        evictor=evictor,
        metrics_registry=registry,
        verifier=CheckpointVerifier(
            VerifyLimits(int(args.checkpoint_max_bytes), float(args.checkpoint_verify_seconds)),
            paths=checkpoint_paths,
        ),
    )


class StartupError(Exception):
    """The driver cannot start; the message says what to fix, ``code`` is the exit status."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class DriverHealth:
    """What the driver's ``/healthz`` and ``/readyz`` mean. Alive: the repair loop went round
    within three of its periods (plus a minute's grace for a slow reconcile); ready: the kubelet
    registered the plugin (until then no claim can be prepared on this node)."""

    registered: bool = False
    loop_every_s: float = 0.0
    last_beat: float = field(default_factory=time.monotonic)

    def beat(self) -> None:
        self.last_beat = time.monotonic()

    def alive(self) -> tuple[bool, str]:
        late = time.monotonic() - self.last_beat
        if self.loop_every_s and late > 3 * self.loop_every_s + 60:
            return False, f"repair loop stuck: last round {late:.0f}s ago"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        return (True, "ok") if self.registered else (False, "not registered with the kubelet yet")


@dataclass
class Wiring:
    """What :func:`build` made and :func:`start` / :func:`run` use; nothing is started yet."""

    gpus: list[Any]
    metrics: Any
    notifier: Any
    engine: Any
    driver: Any
    publisher: Any
    facts: Any
    watcher: Any
    servers: Any = None
    agent_server: Any = None
    health: DriverHealth = field(default_factory=DriverHealth)
    binder: Any = None  # the binding watch (--serving-wait=prebind)
    claim_watch: Any = None  # serving claims allocated here (servingalloc.py); feeds the binder too
    reclaim_watch: Any = None  # the planner's reclaim DeviceTaintRules, onto share devices (--gpu-shares)
    serving_wait: str = "prepare"


def _discover(args: argparse.Namespace) -> list[Any]:
    from dra_driver import discovery

    simulated = discovery.SimulatedConfig(
        count=int(args.simulated_gpus),
        memory_bytes=int(args.simulated_gpu_memory),
        model=args.simulated_gpu_model,
        host_link_gbps=float(args.simulated_host_link_gbps),
    )
    try:
        return discovery.discover(args.gpu_backend, args.node_name, simulated)
    except discovery.DiscoveryError as e:
        raise StartupError(str(e)) from None


def _api_client(args: argparse.Namespace) -> Any:
    from dra_driver import kube

    try:
        return kube.api_client(args.kubeconfig or None)
    except Exception as e:
        where = args.kubeconfig or "the in-cluster service account"
        raise StartupError(f"cannot build an API client from {where}: {e}; set --kubeconfig") from None


def _check_suspended_cpu(value: str) -> None:
    from dra_driver.resize import cpu_millis
    from rose_common.quantity import QuantityError

    try:
        if value:
            cpu_millis(value)
    except QuantityError as e:
        raise StartupError(f"--suspended-cpu: {e} (examples: 100m, 0.5, 1)") from None


def _node_pool(node: Any) -> str:
    """The node's ``rose.io/gpu-pool`` label (the ``pool`` of the lent-GPU metrics); "" if unreadable."""
    try:
        return str(node.labels().get(names.LABEL_POOL, ""))
    except Exception as e:
        log.warning("cannot read the node's pool label; lent-GPU metrics carry pool=''", extra={"err": repr(e)})
        return ""


def _serving_wait(args: argparse.Namespace, api: Any) -> str:
    """``--serving-wait`` resolved against the API server (a dry-run probe), reported in the log."""
    from dra_driver import binding, kube

    probe = None if args.serving_wait == binding.MODE_PREPARE else kube.probe_binding_conditions(api, args.node_name)
    try:
        mode, why = binding.resolve_mode(args.serving_wait, probe)
    except ValueError as e:
        raise StartupError(str(e)) from None
    log.info("serving wait mode", extra={"mode": mode, "requested": args.serving_wait, "why": why})
    return mode


def build(args: argparse.Namespace) -> Wiring:
    """Discover the GPUs, build every part and recover the node state; starts no thread or server."""
    from dra_driver import kube
    from dra_driver.checkpoint import read_boot_id
    from dra_driver.evictions import ReportingEvictor
    from dra_driver.metrics import DriverMetrics
    from dra_driver.node import NodeDriver
    from dra_driver.nodefacts import NodeFactsPublisher, node_facts
    from dra_driver.podwatch import PodWatcher
    from dra_driver.publisher import LentHolds, SlicePublisher
    from dra_driver.state import StateCorruptError
    from rose_common.slices import resource_slice

    gpus = _discover(args)
    api = _api_client(args)
    metrics = DriverMetrics([g.info.index for g in gpus], pool=_node_pool(kube.KubeNode(api, args.node_name)))
    _check_suspended_cpu(args.suspended_cpu)
    notifier = kube.KubeNotifier(api, args.node_name, suspended_cpu=args.suspended_cpu, metrics=metrics)
    built: list[NodeDriver] = []  # the engine's Events find their pods in the driver's claim records

    def claim_pods() -> dict[str, tuple[Any, ...]]:
        return built[0].lent_claim_pods() if built else {}

    evictor = ReportingEvictor(kube.KubeEvictor(api), notifier, metrics.count_lent_eviction)
    try:
        engine = (
            build_engine(
                args, gpus, notifier, evictor, metrics.registry, kube.KubeCheckpointPaths(api), claim_pods=claim_pods
            )
            if args.suspend_engine == "node"
            else None
        )
    except Exception as e:
        raise StartupError(f"cannot start the suspend engine: {e}") from None
    state_dir = Path(args.state_dir or args.plugin_dir)
    agent_server = _agent_server(args, engine)
    enforcer = build_enforcer(args, gpus, engine, kube.KubeEvictor(api))
    mps_daemons = build_mps(args, gpus, state_dir, metrics)
    driver = NodeDriver(
        node_name=args.node_name,
        gpus=gpus,
        cdi_dir=Path(args.cdi_dir),
        state_dir=state_dir,
        claims=kube.KubeClaimSource(api),
        engine=engine,
        notifier=notifier,
        boot_id=read_boot_id(Path(args.boot_id_file)),
        metrics=metrics,
        default_grace_seconds=float(args.default_grace_seconds),
        workload_sockets=agent_server.claims if agent_server is not None else None,
        spill_dirs=_spill_dirs(engine, agent_server),
        enforcer=enforcer,
        allow_serving_on_occupied_device=bool(args.allow_serving_on_occupied_device),
        mps_daemons=mps_daemons,
    )
    built.append(driver)
    try:
        driver.recover()
    except StateCorruptError as e:
        raise StartupError(
            f"node state {state_dir / 'checkpoint.json'} is corrupt: {e}; "
            "inspect it, then move it away to start from an empty state",
            code=3,
        ) from None
    serving_wait = _serving_wait(args, api)
    metrics.set_serving_wait_mode(serving_wait)
    publisher = SlicePublisher(
        kube.KubeSlices(api, args.node_name),
        resource_slice(
            args.node_name,
            [g.info for g in gpus],
            1,
            binding_conditions=serving_wait == "prebind",
            shares=bool(args.gpu_shares),
        ),
        metrics,
    )
    if args.publish_slices:  # serving's GPUs: their lendable devices published tainted (publisher.py)
        driver.on_serving_holds = publisher.set_serving_holds
        if args.gpu_shares:  # a GPU lent in shares or whole: tainted against the other kind
            driver.on_lent_holds = lambda *holds: publisher.set_lent_holds(LentHolds(*holds))
        driver.snapshot()  # the holds the recovered state has, before the first publish
    gpu_memory = {g.info.index: g.info.memory_bytes for g in gpus}
    facts = NodeFactsPublisher(
        kube.KubeNode(api, args.node_name),
        lambda: node_facts(driver.snapshot(), int(args.host_memory_budget), _disk_tier(engine), gpu_memory),
        float(args.node_facts_seconds),
    )
    observers = [notifier.resizer.observe] if notifier.resizer is not None else []
    if agent_server is not None:  # workload reports: rose_rl_* metrics, pod annotations, the job's world
        agent_server.reports.metrics, agent_server.reports.publish = metrics, notifier.annotate
        observers.append(agent_server.reports.observe_pod)
    watcher = PodWatcher(kube.KubePods(api, args.node_name), driver, observers=observers)
    wiring = Wiring(gpus, metrics, notifier, engine, driver, publisher, facts, watcher)
    wiring.agent_server = agent_server
    wiring.serving_wait = serving_wait
    if args.publish_slices and args.gpu_shares:  # the planner's reclaim taint onto share devices too
        wiring.reclaim_watch = _reclaim_watch(api, args.node_name, publisher, metrics)
    claims_api = kube.KubeClaims(api)
    if serving_wait == "prebind":
        from dra_driver.bindwatch import BindingWatcher

        wiring.binder = BindingWatcher(claims_api, driver, args.node_name, metrics, notifier.event)
    if args.publish_slices or wiring.binder is not None:  # one watch of every claim for both
        wiring.claim_watch = _claim_watch(claims_api, args.node_name, publisher, wiring.binder, metrics, args)
    if agent_server is not None:  # one fencing book for both paths, kept in the node checkpoint
        agent_server.control.fence = lambda raw: driver.admit_fence(raw, [], "agent")
    return wiring


def _reclaim_watch(api: Any, node: str, publisher: Any, metrics: Any) -> Any:
    """The watch of the planner's reclaim DeviceTaintRules, feeding ``publisher`` (rulewatch.py)."""
    from dra_driver import kube
    from dra_driver.rulewatch import ReclaimTaintWatch

    restarts = metrics.watch_restarts_total
    return ReclaimTaintWatch(
        kube.Raw(api), node, publisher.set_reclaim_planned, on_restart=lambda kind: restarts.labels(kind).inc()
    )


def _claim_watch(claims_api: Any, node: str, publisher: Any, binder: Any, metrics: Any, args: Any) -> Any:
    """The watch of every ResourceClaim: serving claims allocated on this node taint their GPUs'
    lent devices (with --publish-slices), and the binding watch hears every claim through it."""
    from dra_driver.servingalloc import ServingAllocWatch

    restarts = metrics.watch_restarts_total
    publish = publisher.set_serving_allocated if args.publish_slices else lambda _: None
    return ServingAllocWatch(
        claims_api,
        claims_api.settings,
        node,
        publish,
        also=[binder] if binder is not None else [],
        on_restart=lambda kind: restarts.labels(kind).inc(),
    )


def _disk_tier(engine: Any) -> tuple[int, int] | None:
    """The engine's disk tier of suspended state as (budget, held) bytes; None without one."""
    usage = getattr(engine, "tier_usage", None)
    if usage is None or getattr(engine, "spill", None) is None:
        return None
    budget, held = usage()["disk"]
    return int(budget), int(held)


def build_mps(args: argparse.Namespace, gpus: list[Any], state_dir: Path, metrics: Any) -> Any:
    """GPU shares on real GPUs: the MPS control daemons (``dra_driver.mps``); None on simulated GPUs
    or without ``--gpu-shares`` (no share is prepared there). The binary must be there at start."""
    import shutil

    from dra_driver.mps import MPS_DIR, MpsCounters, MpsDaemons

    if not args.gpu_shares or all(g.simulated for g in gpus):
        return None
    if shutil.which(args.mps_control) is None:
        raise StartupError(
            f"--mps-control {args.mps_control!r}: no such executable (on PATH or at that path); GPU shares on"
            " real GPUs need the CUDA MPS control binary"
        )
    counters = MpsCounters(
        daemons=metrics.mps_daemons.set,
        start_failed=metrics.mps_start_failures_total.inc,
        stop_failed=metrics.mps_stop_failures_total.inc,
    )
    uuids = {g.info.index: g.info.uuid for g in gpus}
    return MpsDaemons(args.mps_control, state_dir / MPS_DIR, uuids, counters=counters)


def build_enforcer(args: argparse.Namespace, gpus: list[Any], engine: Any, evictor: Any) -> Any:
    """The driver's eyes and hands on lent GPUs (``dra_driver.enforce``): the simulated device
    accounting on simulated GPUs, NVML on real ones; cuda-checkpoint only where enabled."""
    from dra_driver.enforce import Enforcer
    from dra_driver.suspend.devicewatch import NvmlDeviceWatch, SimulatedDeviceMemory

    if float(args.enforce_timeout_seconds) <= 0:
        raise StartupError(f"--enforce-timeout-seconds must be > 0, got {args.enforce_timeout_seconds}")
    watch: Any
    if all(g.simulated for g in gpus):
        watch = SimulatedDeviceMemory(
            Path(args.plugin_dir) / "claims",
            ledger=getattr(engine, "simulated_resident_bytes", None),
            ledger_free=getattr(engine, "free_simulated", None),
        )
    else:
        from dra_driver.suspend.nvml import NvmlMemoryProbe, NvmlUnavailable

        try:
            watch = NvmlDeviceWatch(NvmlMemoryProbe.load(), int(args.device_context_allowance))
        except NvmlUnavailable as e:
            raise StartupError(f"cannot observe lent GPUs: {e}") from None
    backend = getattr(engine, "backend", None)
    checkpointer = backend("cuda-checkpoint") if backend is not None else None
    return Enforcer(
        watch, timeout_seconds=float(args.enforce_timeout_seconds), evictor=evictor, checkpointer=checkpointer
    )


def _spill_dirs(engine: Any, agent_server: Any) -> Any:
    """The disk tier, which gives each lent claim a spill directory its CDI spec mounts: only
    where a cooperative workload (the one writer of its own spill file) can reach the agent."""
    spill = getattr(engine, "spill", None)
    if spill is None or agent_server is None or "cooperative" not in engine.config.backends:
        return None
    return spill


def _agent_server(args: argparse.Namespace, engine: Any) -> Any:
    """The node agent: control socket, and per-claim workload sockets under <plugin-dir>/claims."""
    if not (args.agent_socket or args.agent_control_socket) or engine is None:
        return None
    from dra_driver.agent.server import AgentServer

    control = Path(args.agent_control_socket or Path(args.agent_socket).parent / "control.sock")
    return AgentServer(engine, None, control, claim_socket_root=Path(args.plugin_dir) / "claims")


def start(args: argparse.Namespace, w: Wiring) -> None:
    """Serve metrics, the agent and the kubelet plugin; start publishing and watching."""
    from dra_driver.plugin import SocketPathError, start_plugin
    from rose_common import httpserver

    if args.metrics_port >= 0:
        try:
            server = httpserver.serve_probes(
                (args.metrics_address, args.metrics_port),
                registry=w.metrics.registry,
                name="driver",
                healthy=w.health.alive,
                ready=w.health.ready,
            )
        except OSError as err:
            raise StartupError(f"--metrics-port {args.metrics_port}: {err.strerror or err}") from None
        log.info("metrics serving", extra={"port": server.port})
    if w.agent_server is not None:
        w.agent_server.start()

    def on_registered() -> None:
        w.metrics.registration_total.labels("ok").inc()
        w.health.registered = True
        if args.publish_slices:  # every (re)registration re-publishes the slices
            threading.Thread(target=w.publisher.reconcile, name="republish", daemon=True).start()

    try:
        w.servers = start_plugin(
            w.driver,
            Path(args.plugin_dir),
            Path(args.registry_dir),
            kubelet_endpoint=str(Path(args.kubelet_plugin_dir) / "dra.sock") if args.kubelet_plugin_dir else None,
            on_registered=on_registered,
            on_failed=lambda err: w.metrics.registration_total.labels("error").inc(),
        )
    except SocketPathError as e:
        raise StartupError(str(e)) from None
    if args.publish_slices:
        w.publisher.start()
    if float(args.node_facts_seconds) > 0:
        w.facts.start()
    if args.watch_pods:
        w.watcher.start()
    if w.binder is not None:
        w.binder.start(own_watch=w.claim_watch is None)
    if w.claim_watch is not None:
        w.claim_watch.start()
    if w.reclaim_watch is not None:
        w.reclaim_watch.start()


def run(args: argparse.Namespace, w: Wiring, stop: threading.Event) -> int:
    """The repair loop until ``stop`` is set (the runner sets it on SIGTERM / SIGINT), then stop every part."""
    log.info("driver started", extra={"node": args.node_name, "gpus": len(w.gpus), "backend": args.gpu_backend})
    w.health.loop_every_s = float(args.reconcile_seconds)
    while not stop.wait(float(args.reconcile_seconds)):
        try:
            w.driver.reconcile()
        except Exception as e:
            log.warning("reconcile failed", extra={"err": repr(e)})
        w.health.beat()
    log.info("driver stopping", extra={"node": args.node_name})
    w.watcher.stop()
    if w.claim_watch is not None:
        w.claim_watch.stop()
    if w.binder is not None:
        w.binder.stop()
    if w.reclaim_watch is not None:
        w.reclaim_watch.stop()
    w.notifier.close()
    w.facts.stop()
    w.servers.stop()
    if w.agent_server is not None:
        w.agent_server.stop()
    if args.publish_slices:
        try:
            w.publisher.remove()
        except Exception as e:
            log.warning("removing resourceslices failed", extra={"err": repr(e)})
    w.driver.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    return runner.run("rose driver", lambda: build_parser().parse_args(argv), _serve)


def _serve(args: argparse.Namespace, r: runner.Runner) -> int:
    try:
        wiring = build(args)
        start(args, wiring)
    except StartupError as e:
        print(runner.start_failure_line("rose driver", str(e)), file=sys.stderr)
        return e.code
    return run(args, wiring, r.stop)

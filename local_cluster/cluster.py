"""A real Kubernetes control plane as local processes on loopback.

etcd → kube-apiserver (TLS, RBAC, Node authorizer) → kube-controller-manager (with the
resourceclaim controller) → kube-scheduler (default profile) → a second kube-scheduler
(profile ``rose-scheduler``, carrying the ROSE extender) → kwok (keeps fake nodes Ready and
moves pods to Running). Each process has its own log file and pid file under the cluster's
work directory; ``down`` leaves no process and no listening port behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from local_cluster import binaries, pki
from rose_common import names, slices

COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "rose-scheduler",
    "kwok",
)
DEFAULT_EXTENDER_PORT = 18787
MANIFESTS = binaries.REPO_ROOT / "manifests"
# Cluster-wide objects every ROSE install has; applied by `rose cluster up`.
BOOTSTRAP_MANIFESTS = ("cluster/deviceclasses.yaml", "crd/elasticrljob.yaml", "cluster/priorityclasses.yaml")


class ClusterError(RuntimeError):
    """The cluster could not be started or is unhealthy; the message says what to fix."""


def default_workdir(name: str = "rose") -> Path:
    env = os.environ.get("ROSE_CLUSTER_DIR")
    if env:
        return Path(env)
    state = os.environ.get("XDG_STATE_HOME")
    return (Path(state) if state else Path.home() / ".local" / "state") / "rose" / "clusters" / name


@dataclass
class ClusterConfig:
    """What to start. Ports of 0 are picked free at start-up; explicit ports are checked."""

    nodes: int = 4
    gpus_per_node: int = 8
    pools: int = 1
    workdir: Path = field(default_factory=default_workdir)
    kubernetes_version: str | None = None
    apiserver_port: int = 0
    etcd_port: int = 0
    extender_url: str | None = f"http://127.0.0.1:{DEFAULT_EXTENDER_PORT}"
    seed_slices: bool = True
    node_cpu: str = "64"
    node_memory: str = "512Gi"
    node_pods: str = "110"
    build: bool = True
    # For in-process users (the pytest fixture, benchmarks): the components get SIGKILL when the
    # process that started them dies, so a killed test run never leaves a cluster behind.
    # `rose cluster up` leaves it off: its cluster outlives the command by design.
    die_with_parent: bool = False


@dataclass
class ClusterHandle:
    """A running cluster: what tests, the CLI and the demo need to talk to it."""

    kubeconfig: Path
    server: str
    node_names: list[str]
    gpus_per_node: int
    extender_url: str | None
    workdir: Path
    pools: dict[str, str] = field(default_factory=dict)  # node → pool
    ports: dict[str, int] = field(default_factory=dict)
    kubernetes_version: str = ""

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` authenticated as the cluster admin."""
        from rose_common.kube.client import api_client

        return api_client(self.kubeconfig)

    def to_json(self) -> str:
        d = asdict(self)
        d["kubeconfig"] = str(self.kubeconfig)
        d["workdir"] = str(self.workdir)
        return json.dumps(d, indent=2)

    @classmethod
    def from_json(cls, text: str) -> ClusterHandle:
        d = json.loads(text)
        d["kubeconfig"] = Path(d["kubeconfig"])
        d["workdir"] = Path(d["workdir"])
        return cls(**d)


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> int:
    """SIGTERM, up to ``timeout`` seconds for it to exit, then SIGKILL; the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)


@contextlib.contextmanager
def module_process(args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m ARGS`` from the repository root with its output in ``log``, stopped (see
    :func:`stop_process`) when the block ends."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", *args], cwd=binaries.REPO_ROOT, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            yield proc
        finally:
            stop_process(proc)


def kwok_node(name: str, pool: str, cpu: str = "64", memory: str = "512Gi", pods: str = "110") -> dict[str, Any]:
    """A KWOK-managed GPU node of ``pool``, labelled as ROSE's nodes are (allocatable = capacity)."""
    cap = {"cpu": cpu, "memory": memory, "pods": pods}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                names.LABEL_GPU_NODE: "true",
                names.LABEL_POOL: pool,
            },
        },
        "spec": {},
        "status": {"allocatable": cap, "capacity": cap},
    }


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


RESERVED_PORTS_DIR = Path("/tmp/rose-reserved-ports")  # one file per port drawn: the drawing process's PID
RESERVATION_MAX_AGE_S = 6 * 3600.0


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's too; a zombie too: see LocalCluster._alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _claim_port(port: int, registry: Path) -> bool:
    """Record ``port`` as drawn by this process (``O_EXCL``), unless a live process drew it; a
    claim whose process is gone, or older than :data:`RESERVATION_MAX_AGE_S`, is taken over."""
    registry.mkdir(mode=0o1777, exist_ok=True)
    path = registry / str(port)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except FileExistsError:
            try:
                owner = int(path.read_text() or "0")
                stale = not _alive(owner) or time.time() - path.stat().st_mtime > RESERVATION_MAX_AGE_S
            except (OSError, ValueError):
                stale = True
            if not stale:
                return False
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def reserved_port(low: int = 20000, registry: Path = RESERVED_PORTS_DIR) -> int:
    """A free loopback port for a server that binds it only later (the extender behind a cluster's
    rose-scheduler profile, a soak's driver metrics): drawn below the kernel's ephemeral range,
    where no ``bind(("", 0))`` and no outgoing connection's source port lands meanwhile, as one from
    :func:`free_port` may when other test runs share the machine; and claimed in ``registry`` for
    as long as the drawing process lives, so no other draw (this process's or another run's)
    returns it before the server binds: two CI lanes and a soak beside them drew the same port,
    and a driver died with "Address already in use". :func:`free_port` where that range is too
    small."""
    try:
        ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return free_port()
    draw = random.SystemRandom()
    for _ in range(200 if ephemeral_low - low >= 1000 else 0):
        port = draw.randrange(low, ephemeral_low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        try:
            if not _claim_port(port, registry):
                continue
        except OSError:  # no registry here (read-only /tmp): the draw alone, as before
            pass
        return port
    return free_port()


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        data = path.read_bytes()[-20000:].decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    return "\n".join(data.splitlines()[-lines:])


def _kubeconfig(path: Path, server: str, p: pki.Pki, user: str) -> None:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "rose-local", "cluster": {"server": server, "certificate-authority": str(p.ca_crt)}}],
        "users": [
            {
                "name": user,
                "user": {"client-certificate": str(p.crt(user)), "client-key": str(p.key(user))},
            }
        ],
        "contexts": [{"name": "rose-local", "context": {"cluster": "rose-local", "user": user}}],
        "current-context": "rose-local",
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(doc, f)


class LocalCluster:
    """Start, inspect and stop one local cluster living in ``config.workdir``."""

    def __init__(self, config: ClusterConfig, progress: Callable[[str], None] | None = None) -> None:
        self.cfg = config
        self.dir = config.workdir
        self.logs = self.dir / "logs"
        self.pids = self.dir / "pids"
        self._progress = progress or (lambda _msg: None)

    # ---------------------------------------------------------------- state on disk
    @property
    def state_file(self) -> Path:
        return self.dir / "cluster.json"

    def handle(self) -> ClusterHandle:
        if not self.state_file.exists():
            raise ClusterError(f"no cluster in {self.dir}: run `rose cluster up` first")
        return ClusterHandle.from_json(self.state_file.read_text())

    def _pid(self, component: str) -> int | None:
        f = self.pids / f"{component}.pid"
        try:
            return int(f.read_text().strip())
        except (OSError, ValueError):
            return None

    @staticmethod
    def _alive(pid: int) -> bool:
        if not _alive(pid):
            return False
        # A zombie child of ours counts as dead, once it is a zombie as a whole: a process whose
        # main thread has exited shows "Z" while its other threads are still exiting, and those
        # still hold the process's files (a Go server's listening socket stays open meanwhile).
        try:
            if len(os.listdir(f"/proc/{pid}/task")) > 1:
                return True
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(") ", 1)[1][0] != "Z"
        except OSError:
            return False

    # ---------------------------------------------------------------- up
    def up(self) -> ClusterHandle:
        t0 = time.monotonic()
        if self.state_file.exists() and any((pid := self._pid(c)) is not None and self._alive(pid) for c in COMPONENTS):
            raise ClusterError(
                f"a cluster is already running from {self.dir}; `rose cluster down` first "
                "(or set ROSE_CLUSTER_DIR for a second one)"
            )
        if self.cfg.nodes < 0 or self.cfg.gpus_per_node < 0 or self.cfg.gpus_per_node > 64:
            raise ClusterError("--nodes must be ≥ 0 and --gpus-per-node between 0 and 64")
        self._progress("checking binaries (building them on first use; cached by version)")
        try:
            bins = binaries.ensure(self.cfg.kubernetes_version, build=self.cfg.build)
        except binaries.BinariesError as e:
            raise ClusterError(str(e)) from e

        ports = self._ports()
        for d in (self.dir, self.logs, self.pids):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        etcd_data = self.dir / "etcd-data"
        if etcd_data.exists():
            import shutil

            shutil.rmtree(etcd_data)
        p = pki.generate(self.dir / "pki")
        server = f"https://127.0.0.1:{ports['kube-apiserver']}"
        kc = {u: self.dir / f"{u}.kubeconfig" for u in ("admin", "controller-manager", "scheduler")}
        for user, path in kc.items():
            _kubeconfig(path, server, p, user)

        try:
            self._start_all(bins, p, ports, kc)
            node_names, pools = self._nodes()
            handle = ClusterHandle(
                kubeconfig=kc["admin"],
                server=server,
                node_names=node_names,
                gpus_per_node=self.cfg.gpus_per_node,
                extender_url=self.cfg.extender_url,
                workdir=self.dir,
                pools=pools,
                ports=ports,
                kubernetes_version=bins.versions.kubernetes,
            )
            self.state_file.write_text(handle.to_json())
            self._progress("installing DeviceClasses and the ElasticRLJob CRD")
            self._bootstrap(handle)
            self._progress(f"registering {len(node_names)} KWOK nodes")
            self._create_nodes(handle)
            self._wait_nodes_ready(handle)
        except BaseException:
            self.down()
            raise
        self._progress(f"cluster up in {time.monotonic() - t0:.1f}s")
        return handle

    def _ports(self) -> dict[str, int]:
        wanted = {
            "etcd": self.cfg.etcd_port,
            "etcd-peer": 0,
            "kube-apiserver": self.cfg.apiserver_port,
            "kube-controller-manager": 0,
            "kube-scheduler": 0,
            "rose-scheduler": 0,
            "kwok": 0,
        }
        flags = {"etcd": "--etcd-port", "kube-apiserver": "--apiserver-port"}
        out: dict[str, int] = {}
        for comp, port in wanted.items():
            if port:
                if port_in_use(port):
                    raise ClusterError(
                        f"port {port} for {comp} is already in use on 127.0.0.1: stop what listens there "
                        f"(`ss -ltnp 'sport = :{port}'`) or choose another with {flags.get(comp, 'its flag')}"
                    )
                out[comp] = port
            else:  # bound only once the component starts: below the ephemeral range, claimed
                out[comp] = reserved_port()
        return out

    def _spawn(self, component: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.logs / f"{component}.log", "ab")  # noqa: SIM115 - handed to the child
        preexec = None
        if self.cfg.die_with_parent:
            argv, preexec = dying_with_parent(argv)
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=self.dir,
            preexec_fn=preexec,  # noqa: PLW1509 - only without setpriv
        )
        log.close()
        (self.pids / f"{component}.pid").write_text(str(proc.pid))
        self._procs[component] = proc
        return proc

    def _wait(self, component: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self._procs.get(component)
            if proc is not None and proc.poll() is not None:
                raise ClusterError(
                    f"{component} exited with code {proc.returncode} during start-up. Last lines of "
                    f"{self.logs / (component + '.log')}:\n{log_tail(self.logs / (component + '.log'))}"
                )
            with contextlib.suppress(Exception):
                if check():
                    return
            time.sleep(0.2)
        raise ClusterError(
            f"{component} was not ready within {timeout:.0f}s. Last lines of its log:\n"
            f"{log_tail(self.logs / (component + '.log'))}"
        )

    @staticmethod
    def _https_ok(url: str, ctx: ssl.SSLContext) -> bool:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as r:
            return bool(r.status == 200)

    def _start_all(self, bins: binaries.Binaries, p: pki.Pki, ports: dict[str, int], kc: dict[str, Path]) -> None:
        """Start the components in dependency order, each waited for before what needs it."""
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        argv = control_plane_commands(bins, p, ports, kc, self.dir)
        self._argv = argv
        etcd_url = f"http://127.0.0.1:{ports['etcd']}"

        def etcd_ok() -> bool:
            with urllib.request.urlopen(f"{etcd_url}/health", timeout=2) as r:
                return bool(json.loads(r.read()).get("health") == "true")

        self._progress("starting etcd")
        self._spawn("etcd", argv["etcd"])
        self._wait("etcd", etcd_ok, 30)
        self._progress("starting kube-apiserver")
        self._spawn("kube-apiserver", argv["kube-apiserver"])
        ctx = ssl.create_default_context(cafile=str(p.ca_crt))
        ctx.load_cert_chain(str(p.crt("admin")), str(p.key("admin")))
        apiserver_ready = f"https://127.0.0.1:{ports['kube-apiserver']}/readyz"
        self._wait("kube-apiserver", lambda: self._https_ok(apiserver_ready, ctx), 90)
        self._start_controllers(argv, ports, kc)
        self._progress("starting kwok")
        (self.dir / "kwok.yaml").write_text(bins.kwok_stages.read_text())
        self._spawn("kwok", argv["kwok"])
        self._wait("kwok", lambda: self._http_ok(f"http://127.0.0.1:{ports['kwok']}/healthz"), 30)

    def _start_controllers(self, argv: dict[str, list[str]], ports: dict[str, int], kc: dict[str, Path]) -> None:
        """kube-controller-manager and both schedulers, started together, then each waited for."""
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # self-signed serving certs of kcm/scheduler, health only
        self._progress("starting kube-controller-manager")
        self._spawn("kube-controller-manager", argv["kube-controller-manager"])
        (self.dir / "scheduler").mkdir(exist_ok=True)
        for comp, profile, ext in (
            ("kube-scheduler", "default-scheduler", None),
            ("rose-scheduler", names.SCHEDULER_NAME, self.cfg.extender_url),
        ):
            conf = self.dir / "scheduler" / f"{comp}.yaml"
            conf.write_text(yaml.safe_dump(scheduler_config(kc["scheduler"], profile, ext)))
            self._progress(f"starting {comp} (profile {profile}{', extender ' + ext if ext else ''})")
            self._spawn(comp, argv[comp])
        for comp in ("kube-controller-manager", "kube-scheduler", "rose-scheduler"):
            healthz = f"https://127.0.0.1:{ports[comp]}/healthz"
            self._wait(comp, lambda url=healthz: self._https_ok(url, insecure), 60)  # type: ignore[misc]

    def restart(self, component: str, timeout: float = 90.0) -> float:
        """SIGKILL one control-plane component this object started (``etcd``, ``kube-apiserver``,
        ...) and start it again with the same command line and data; returns the seconds until it
        answered its health check again. For soak tests: a crash of the control plane."""
        argv = getattr(self, "_argv", {}).get(component)
        proc = getattr(self, "_procs", {}).get(component)
        if argv is None or proc is None:
            raise ClusterError(f"{component}: not a component this LocalCluster started")
        t0 = time.monotonic()
        proc.kill()
        proc.wait(timeout=30)
        self._spawn(component, argv)
        ports = self.handle().ports
        if component == "etcd":
            url = f"http://127.0.0.1:{ports['etcd']}/health"
            self._wait(component, lambda: self._http_ok(url), timeout)
        elif component == "kube-apiserver":
            p = pki.Pki(self.dir / "pki")
            ctx = ssl.create_default_context(cafile=str(p.ca_crt))
            ctx.load_cert_chain(str(p.crt("admin")), str(p.key("admin")))
            url = f"https://127.0.0.1:{ports['kube-apiserver']}/readyz"
            self._wait(component, lambda: self._https_ok(url, ctx), timeout)
        return time.monotonic() - t0

    @staticmethod
    def _http_ok(url: str) -> bool:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)

    def _bootstrap(self, h: ClusterHandle) -> None:
        api = h.api_client()
        try:
            for path in BOOTSTRAP_MANIFESTS:
                apply_file(api, MANIFESTS / path)
        finally:
            api.close()

    def _nodes(self) -> tuple[list[str], dict[str, str]]:
        node_names = [f"rose-node-{i}" for i in range(self.cfg.nodes)]
        pools = {n: f"pool-{chr(ord('a') + i % max(1, self.cfg.pools))}" for i, n in enumerate(node_names)}
        return node_names, pools

    def _create_nodes(self, h: ClusterHandle) -> None:
        from kubernetes import client

        api = h.api_client()
        core = client.CoreV1Api(api)
        custom = client.CustomObjectsApi(api)

        def one(name: str) -> None:
            core.create_node(
                kwok_node(name, h.pools[name], self.cfg.node_cpu, self.cfg.node_memory, self.cfg.node_pods)
            )
            if self.cfg.seed_slices and self.cfg.gpus_per_node > 0:
                body = slices.resource_slice(name, slices.simulated_gpus(name, self.cfg.gpus_per_node), 1)
                custom.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", body)

        try:
            with ThreadPoolExecutor(max_workers=8) as ex:
                list(ex.map(one, h.node_names))
        finally:
            api.close()

    def _wait_nodes_ready(self, h: ClusterHandle, timeout: float | None = None) -> None:
        # KWOK initialises nodes at a bounded rate: allow more time for large fake clusters
        timeout = timeout if timeout is not None else max(60.0, 0.5 * len(h.node_names))
        from kubernetes import client

        api = h.api_client()
        core = client.CoreV1Api(api)
        want = set(h.node_names)

        def ready() -> bool:
            got = set()
            for n in core.list_node(label_selector=f"{names.LABEL_GPU_NODE}=true").items:
                if any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or [])):
                    got.add(n.metadata.name)
            return want <= got

        try:
            self._wait("kwok", ready, timeout)
        finally:
            api.close()

    # ---------------------------------------------------------------- status / down
    def status(self) -> list[dict[str, Any]]:
        """One row per component: pid, alive, port, and the log tail of a dead one."""
        ports: dict[str, int] = {}
        if self.state_file.exists():
            ports = self.handle().ports
        rows = []
        for comp in COMPONENTS:
            pid = self._pid(comp)
            alive = pid is not None and self._alive(pid)
            row: dict[str, Any] = {
                "component": comp,
                "pid": pid,
                "alive": alive,
                "port": ports.get(comp),
                "log": str(self.logs / f"{comp}.log"),
            }
            if pid is not None and not alive:
                row["log_tail"] = log_tail(self.logs / f"{comp}.log")
            rows.append(row)
        return rows

    def down(self, timeout: float = 15.0) -> list[str]:
        """Stop every component (SIGTERM to its process group, then SIGKILL after ``timeout``);
        return what was stopped. etcd goes last, once its clients have exited: a kube-apiserver
        whose etcd is gone spends 20 s in its graceful shutdown retrying an etcd write
        (``peer_endpoint_controller's RemoveEndpoints() timed out``), which cost every cluster
        teardown the whole ``timeout``."""
        pids = {c: self._pid(c) for c in reversed(COMPONENTS)}
        stopped = self._stop({c: p for c, p in pids.items() if c != "etcd"}, timeout)
        stopped += self._stop({c: p for c, p in pids.items() if c == "etcd"}, timeout)
        self._reap_all()
        return stopped

    def _stop(self, pids: dict[str, int | None], timeout: float) -> list[str]:
        """SIGTERM these components' process groups at once, wait up to ``timeout`` s, SIGKILL."""
        stopped = []
        for comp, pid in pids.items():
            if pid is not None and self._alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGTERM)
                stopped.append(comp)
        deadline = time.monotonic() + timeout
        for comp, pid in pids.items():
            if pid is None:
                continue
            while self._alive(pid) and time.monotonic() < deadline:
                self._reap(comp)
                time.sleep(0.05)
            if self._alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                while self._alive(pid):
                    self._reap(comp)
                    time.sleep(0.05)
            self._reap(comp)
            with contextlib.suppress(FileNotFoundError):
                (self.pids / f"{comp}.pid").unlink()
        return stopped

    def _reap_all(self) -> None:
        """Reap every child this object spawned (all dead by now) and forget the cluster."""
        for proc in getattr(self, "_procs", {}).values():
            with contextlib.suppress(Exception):
                proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(timeout=10)
        with contextlib.suppress(FileNotFoundError):
            self.state_file.unlink()

    def _reap(self, comp: str) -> None:
        proc = getattr(self, "_procs", {}).get(comp)
        if proc is not None:
            with contextlib.suppress(Exception):
                proc.poll()


def _die_with_parent() -> None:
    """In the child between fork and exec: ask Linux for SIGKILL when the parent dies.

    Only where util-linux's ``setpriv`` is missing (:func:`dying_with_parent`): Python code run
    between fork and exec forces a real ``fork()``, whose atfork handlers (gRPC's among them, in a
    process that has gRPC threads) run in the child; a restarted kube-apiserver once aborted there
    (exit -6, gRPC's "epoll_wait error: Bad file descriptor" its only line)."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def dying_with_parent(argv: Sequence[str]) -> tuple[list[str], Callable[[], None] | None]:
    """``(argv, preexec_fn)`` for a child that gets SIGKILL when the thread that started it exits.

    With ``setpriv`` (util-linux, in every Debian base) the death signal is set by ``setpriv
    --pdeathsig KILL`` just before it execs ``argv``: no Python runs in the forked child, so
    ``subprocess`` can use ``vfork`` and no atfork handler runs there. Without it, the ctypes
    ``prctl`` in a ``preexec_fn`` (the old way)."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return list(argv), _die_with_parent
    return [setpriv, "--pdeathsig", "KILL", "--", *argv], None


def control_plane_commands(
    bins: binaries.Binaries, p: pki.Pki, ports: dict[str, int], kc: dict[str, Path], workdir: Path
) -> dict[str, list[str]]:
    """The command line of every component, by component name. Pure: reads and starts nothing.

    The scheduler configurations and ``kwok.yaml`` it names are written by the caller under
    ``workdir`` (``scheduler/<component>.yaml``, ``kwok.yaml``).
    """
    return {
        "etcd": _etcd_command(bins, ports, workdir),
        "kube-apiserver": _apiserver_command(bins, p, ports),
        "kube-controller-manager": [
            str(bins.kube_controller_manager),
            f"--kubeconfig={kc['controller-manager']}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports['kube-controller-manager']}",
            f"--root-ca-file={p.ca_crt}",
            f"--service-account-private-key-file={p.sa_key}",
            "--use-service-account-credentials=true",
            "--leader-elect=false",
            "--controllers=*",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
            "--kube-api-qps=500",
            "--kube-api-burst=1000",
            "--v=1",
        ],
        **{
            comp: [
                str(bins.kube_scheduler),
                f"--config={workdir / 'scheduler' / f'{comp}.yaml'}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports[comp]}",
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
                "--v=1",
            ]
            for comp in ("kube-scheduler", "rose-scheduler")
        },
        "kwok": [
            str(bins.kwok),
            f"--kubeconfig={kc['admin']}",
            f"--config={workdir / 'kwok.yaml'}",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--server-address=127.0.0.1:{ports['kwok']}",
            "--node-ip=127.0.0.1",
            "--node-lease-duration-seconds=40",
            "--tls-cert-file=",
            "--tls-private-key-file=",
        ],
    }


def _etcd_command(bins: binaries.Binaries, ports: dict[str, int], workdir: Path) -> list[str]:
    etcd_url = f"http://127.0.0.1:{ports['etcd']}"
    peer_url = f"http://127.0.0.1:{ports['etcd-peer']}"
    return [
        str(bins.etcd),
        "--name=rose",
        f"--data-dir={workdir / 'etcd-data'}",
        f"--listen-client-urls={etcd_url}",
        f"--advertise-client-urls={etcd_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=rose={peer_url}",
        "--listen-metrics-urls=",
        "--auto-compaction-retention=1",
        "--quota-backend-bytes=4294967296",
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def _apiserver_command(bins: binaries.Binaries, p: pki.Pki, ports: dict[str, int]) -> list[str]:
    etcd_url = f"http://127.0.0.1:{ports['etcd']}"
    return [
        str(bins.kube_apiserver),
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports['kube-apiserver']}",
        f"--tls-cert-file={p.crt('apiserver')}",
        f"--tls-private-key-file={p.key('apiserver')}",
        f"--client-ca-file={p.ca_crt}",
        f"--service-account-key-file={p.sa_pub}",
        f"--service-account-signing-key-file={p.sa_key}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        "--authorization-mode=Node,RBAC",
        "--allow-privileged=true",
        "--endpoint-reconciler-type=none",
        "--service-cluster-ip-range=10.96.0.0/16",
        # a test cluster on loopback: no request throttling in the way of benchmarks
        "--max-requests-inflight=0",
        "--max-mutating-requests-inflight=0",
        "--enable-priority-and-fairness=false",
        "--watch-cache=true",
        "--v=1",
    ]


# How long the DynamicResources plugin holds a pod in PreBind for its devices' binding conditions
# (kube-scheduler v1.37.2's default: 10m, read from `kube-scheduler --write-config-to`). ROSE's
# driver reports its serving devices freed within the lent occupant's grace + 5 s + twice
# --enforce-timeout-seconds (dra_driver/README.md); a pod held past this is deallocated and
# rescheduled, and the driver releases what it held for it. Long enough for the local cluster's
# graces (the driver's default 30 s + 25 s), short enough that a lost driver costs two minutes.
BINDING_TIMEOUT_SECONDS = 120


def scheduler_config(kubeconfig: Path, profile: str, extender_url: str | None) -> dict[str, Any]:
    """KubeSchedulerConfiguration for one scheduler process (leader election off: one replica)."""
    conf: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig), "qps": 500, "burst": 1000},
        "leaderElection": {"leaderElect": False},
        "profiles": [
            {
                "schedulerName": profile,
                "pluginConfig": [
                    {"name": "DynamicResources", "args": {"bindingTimeout": f"{BINDING_TIMEOUT_SECONDS}s"}}
                ],
            }
        ],
    }
    if extender_url:
        conf["extenders"] = [extender_entry(extender_url)]
    return conf


def extender_entry(url: str) -> dict[str, Any]:
    """The extender stanza: the same values as manifests/extender (see scheduler_extender/README)."""
    return {
        "urlPrefix": url,
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "preemptVerb": "preempt",
        "weight": 5,
        "enableHTTPS": False,
        "nodeCacheCapable": True,
        "ignorable": True,
        "httpTimeout": "2s",
    }


_PLURALS = {
    "DeviceClass": ("resource.k8s.io", "v1", "deviceclasses", False),
    "CustomResourceDefinition": ("apiextensions.k8s.io", "v1", "customresourcedefinitions", False),
    "ResourceClaimTemplate": ("resource.k8s.io", "v1", "resourceclaimtemplates", True),
    "PriorityClass": ("scheduling.k8s.io", "v1", "priorityclasses", False),
    "ValidatingAdmissionPolicy": ("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", False),
    "ValidatingAdmissionPolicyBinding": (
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicybindings",
        False,
    ),
}


def apply_file(api: Any, path: Path, namespace: str = "default") -> None:
    """Create (or replace) every object of a YAML file whose kind is listed in _PLURALS."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from rose_common.kube.errors import Conflict, from_api_exception

    custom = client.CustomObjectsApi(api)
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        kind = doc.get("kind")
        if kind not in _PLURALS:
            raise ClusterError(f"{path}: cannot apply kind {kind!r} (supported: {', '.join(_PLURALS)})")
        group, version, plural, namespaced = _PLURALS[kind]
        name = doc["metadata"]["name"]
        try:
            if namespaced:
                custom.create_namespaced_custom_object(group, version, namespace, plural, doc)
            else:
                custom.create_cluster_custom_object(group, version, plural, doc)
        except ApiException as e:
            if not isinstance(from_api_exception(e), Conflict):
                raise
            if namespaced:
                cur = custom.get_namespaced_custom_object(group, version, namespace, plural, name)
                doc["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
                custom.replace_namespaced_custom_object(group, version, namespace, plural, name, doc)
            else:
                cur = custom.get_cluster_custom_object(group, version, plural, name)
                doc["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
                custom.replace_cluster_custom_object(group, version, plural, name, doc)

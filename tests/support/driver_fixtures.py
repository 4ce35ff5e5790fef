"""Test helpers for the DRA driver (prefix ``driver``).

Explicit stand-ins, each named for what it replaces:

* :class:`StaticClaims` / :class:`FileClaims` stand in for the API server's ResourceClaims in
  the unit, contract and crash tiers (the e2e tier uses the real API server);
* :class:`RecordingEngine` stands in for the suspend engine (``dra_driver.suspend``) and records
  the order of calls; :class:`FileOccupantEngine` stands in for a GPU workload whose device
  state lives in a file, so a test can check it survives kill -9 at any point.

Run as a script (``python tests/support/driver_fixtures.py crash-child ...``) it is the crash-test child.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from local_cluster.kubelet import DriverProcess

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from dra_driver.claims import ClaimRef, PodRef  # noqa: E402
from dra_driver.discovery import SimulatedConfig, discover_simulated  # noqa: E402
from dra_driver.engine_api import SuspendResult  # noqa: E402
from dra_driver.node import ClaimNotFoundError, NodeDriver, NullNotifier  # noqa: E402
from rose_common import names  # noqa: E402
from rose_common.atomic import atomic_write  # noqa: E402

NODE = "node-a"
NS = "ml"


def make_claim(
    uid: str,
    name: str,
    devices: list[tuple[str, str]],
    *,
    namespace: str = NS,
    driver: str = names.DRIVER_NAME,
    pool: str = NODE,
    pod: tuple[str, str] | None = None,
    allocated: bool = True,
) -> dict[str, Any]:
    """A ResourceClaim as the API returns it; ``devices`` are ``(request, device)`` pairs."""
    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = {
            "devices": {"results": [{"request": r, "driver": driver, "pool": pool, "device": d} for r, d in devices]}
        }
    if pod:
        status["reservedFor"] = [{"resource": "pods", "name": pod[0], "uid": pod[1]}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"devices": {"requests": [{"name": r} for r, _ in devices]}},
        "status": status,
    }


class StaticClaims:
    """In-memory ResourceClaims and Pods (stands in for the API server)."""

    def __init__(self, claims: list[dict[str, Any]] | None = None, pods: list[dict[str, Any]] | None = None) -> None:
        self.claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims or []}
        self.pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods or []}

    def add(self, claim: dict[str, Any]) -> None:
        self.claims[(claim["metadata"]["namespace"], claim["metadata"]["name"])] = claim

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return self.claims[(namespace, name)]
        except KeyError:
            raise ClaimNotFoundError(f"{namespace}/{name}") from None

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.pods.get((namespace, name))


class FileClaims(StaticClaims):
    """ResourceClaims from a JSON file (a list of claims) — for driver subprocesses."""

    def __init__(self, path: Path) -> None:
        super().__init__(json.loads(path.read_text()))


@dataclass
class RecordingEngine:
    """Records suspend/resume calls in order; occupants are running until suspended."""

    suspend_seconds: float = 0.0
    fallback: str | None = None
    fallback_fails: bool = False
    fail: bool = False
    fail_resume: bool = False
    calls: list[tuple[str, str, float]] = field(default_factory=list)
    states: dict[str, str] = field(default_factory=dict)
    _mu: threading.Lock = field(default_factory=threading.Lock)

    def suspend(self, claim_uid: str, grace_seconds: float) -> SuspendResult:
        time.sleep(self.suspend_seconds)
        with self._mu:
            self.calls.append(("suspend", claim_uid, grace_seconds))
            if self.fail:
                return SuspendResult(False, "recording", 0, 0.0, None, "test engine told to fail")
            if self.fallback:
                # as dra_driver.suspend.engine: ok once the durable checkpoint is confirmed (the pod
                # is then evicted); a fallback that could not be taken leaves the workload running
                if self.fallback_fails:
                    return SuspendResult(False, "recording", 0, 0.0, self.fallback, "fallback impossible")
                self.states[claim_uid] = "checkpointed-evicted"
                return SuspendResult(True, "recording", 0, 0.0, self.fallback, "over budget; checkpointed")
            moved = 0 if self.states.get(claim_uid) == "suspended" else 1 << 20
            self.states[claim_uid] = "suspended"
            return SuspendResult(True, "recording", moved, self.suspend_seconds, None, "ok")

    def resume(self, claim_uid: str) -> SuspendResult:
        with self._mu:
            self.calls.append(("resume", claim_uid, 0.0))
            if self.fail_resume:
                return SuspendResult(False, "recording", 0, 0.0, None, "no workload registered for claim")
            self.states[claim_uid] = "running"
            return SuspendResult(True, "recording", 1 << 20, 0.0, None, "ok")

    def occupant_state(self, claim_uid: str) -> str:
        return self.states.get(claim_uid, "running")


@dataclass
class RecordingNotifier:
    states: list[tuple[str, str]] = field(default_factory=list)
    events: list[tuple[str, str, bool]] = field(default_factory=list)

    def suspend_state(self, pod: PodRef, state: str, message: str) -> None:
        self.states.append((pod.name, state))

    def event(self, pod: PodRef, reason: str, message: str, warning: bool) -> None:
        self.events.append((pod.name, reason, warning))


def payload_of(uid: str) -> bytes:
    return hashlib.sha256(uid.encode()).digest() * 256  # 8 KiB of "device state"


class FileOccupantEngine:
    """A workload whose device state is a file ``<uid>.dev``; suspend moves it to ``<uid>.host``.

    Idempotent and crash-safe in itself (atomic writes; the marker ``<uid>.state`` is switched
    only after the copy is durable), so a test can check that state survives kill -9 anywhere.
    """

    def __init__(self, root: Path, step_seconds: float = 0.0) -> None:
        self.root = root
        self.step = step_seconds
        root.mkdir(parents=True, exist_ok=True)

    def _p(self, uid: str, ext: str) -> Path:
        return self.root / f"{uid}.{ext}"

    def occupant_state(self, uid: str) -> str:
        p = self._p(uid, "state")
        return p.read_text() if p.exists() else "running"

    def _ensure_started(self, uid: str) -> None:
        if not self._p(uid, "state").exists():
            atomic_write(self._p(uid, "dev"), payload_of(uid))
            atomic_write(self._p(uid, "state"), b"running")

    def _move(self, uid: str, src: str, dst: str, new_state: str) -> int:
        self._ensure_started(uid)
        if self.occupant_state(uid) == new_state:
            return 0
        time.sleep(self.step)
        if self._p(uid, src).exists():
            atomic_write(self._p(uid, dst), self._p(uid, src).read_bytes())
        time.sleep(self.step)
        atomic_write(self._p(uid, "state"), new_state.encode())
        self._p(uid, src).unlink(missing_ok=True)
        return len(payload_of(uid))

    def suspend(self, claim_uid: str, grace_seconds: float) -> SuspendResult:
        n = self._move(claim_uid, "dev", "host", "suspended")
        return SuspendResult(True, "file-occupant", n, 0.0, None, "ok")

    def resume(self, claim_uid: str) -> SuspendResult:
        n = self._move(claim_uid, "host", "dev", "running")
        return SuspendResult(True, "file-occupant", n, 0.0, None, "ok")

    def check(self, uid: str) -> str:
        """Where the occupant's state is, after verifying it is intact: "running" or "suspended"."""
        state = self.occupant_state(uid)
        where = "dev" if state == "running" else "host"
        data = self._p(uid, where).read_bytes()
        assert data == payload_of(uid), f"occupant {uid}: {where} copy corrupt"
        return state


def make_driver(tmp: Path, claims: Any, engine: Any, notifier: Any = None, gpus: int = 2, **kw: Any) -> NodeDriver:
    return NodeDriver(
        node_name=NODE,
        gpus=discover_simulated(NODE, SimulatedConfig(count=gpus)),
        cdi_dir=tmp / "cdi",
        state_dir=tmp / "state",
        claims=claims,
        engine=engine,
        notifier=notifier or NullNotifier(),
        boot_id="boot-1",
        **kw,
    )


# --------------------------------------------------------------------------- crash-test scripts
# Claims: L0 lent on GPU 0 (pod rl-0), S0 serving on GPU 0, L1 lent on GPU 1 (pod rl-1).
CRASH_CLAIMS = [
    make_claim("uid-l0", "l0", [("gpu", "gpu-0-lendable")], pod=("rl-0", "pod-rl-0")),
    make_claim("uid-s0", "s0", [("gpu", "gpu-0-serving")], pod=("serve-0", "pod-serve-0")),
    make_claim("uid-l1", "l1", [("gpu", "gpu-1-lendable")], pod=("rl-1", "pod-rl-1")),
]
REFS = {c["metadata"]["uid"]: ClaimRef(NS, c["metadata"]["uid"], c["metadata"]["name"]) for c in CRASH_CLAIMS}
SCRIPTS: dict[str, list[tuple[str, str]]] = {
    # serving arrives on a lent GPU, then leaves
    "reclaim": [("prepare", "uid-l0"), ("prepare", "uid-s0"), ("unprepare", "uid-s0")],
    # serving stays: the occupant must end suspended
    "hold": [("prepare", "uid-l0"), ("prepare", "uid-l1"), ("prepare", "uid-s0")],
    # suspend request through the API path plus serving wins on the other GPU, then everything leaves
    "mixed": [
        ("prepare", "uid-l0"),
        ("prepare", "uid-l1"),
        ("request", "pod-rl-1"),
        ("prepare", "uid-s0"),
        ("unprepare", "uid-s0"),
        ("cancel", "pod-rl-1"),
        ("unprepare", "uid-l0"),
    ],
}


def run_script_step(driver: NodeDriver, op: str, arg: str) -> None:
    if op == "prepare":
        out = driver.prepare([REFS[arg]])
        assert not out[arg].error, out[arg].error
    elif op == "unprepare":
        out2 = driver.unprepare([REFS[arg]])
        assert not out2[arg], out2[arg]
    elif op == "request":
        driver.request_suspend(PodRef(NS, arg.removeprefix("pod-"), arg), 5.0)
    elif op == "cancel":
        driver.cancel_suspend(PodRef(NS, arg.removeprefix("pod-"), arg))
    else:
        raise ValueError(op)


def observe(tmp: Path) -> dict[str, Any]:
    """The externally visible outcome: claims, suspensions, CDI specs, occupants (verified intact)."""
    from dra_driver import cdi
    from dra_driver.state import decode

    data = decode((tmp / "state" / "checkpoint.json").read_bytes())
    eng = FileOccupantEngine(tmp / "engine")
    return {
        "claims": sorted((u, r.state) for u, r in data.claims.items()),
        "suspensions": sorted((u, s.state, tuple(sorted(s.held_by))) for u, s in data.suspensions.items()),
        "cdi": cdi.list_specs(tmp / "cdi"),
        "occupants": {u: eng.check(u) for u in ("uid-l0", "uid-l1") if (tmp / "engine" / f"{u}.state").exists()},
    }


def crash_child(tmp: Path, script: str, start: int) -> int:
    claims_file = tmp / "claims.json"
    driver = make_driver(tmp, FileClaims(claims_file), FileOccupantEngine(tmp / "engine", step_seconds=0.002))
    driver.recover()
    steps = SCRIPTS[script]
    for i in range(start, len(steps)):
        print(f"begin {i}", flush=True)
        run_script_step(driver, *steps[i])
        print(f"end {i}", flush=True)
    return 0


def grpc_child(tmp: Path) -> int:
    """A full driver process: recovery + kubelet plugin sockets, claims from a file."""
    import signal

    from dra_driver.plugin import start_plugin

    driver = make_driver(tmp, FileClaims(tmp / "claims.json"), FileOccupantEngine(tmp / "engine", 0.002))
    driver.recover()
    servers = start_plugin(driver, tmp / "plug", tmp / "reg")
    print("ready", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    servers.stop()
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "crash-child":
        sys.exit(crash_child(Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
    if sys.argv[1] == "grpc-child":
        sys.exit(grpc_child(Path(sys.argv[2])))
    raise SystemExit(f"unknown mode {sys.argv[1]}")


# ----------------------------------------------------------------------------- e2e: real drivers

# A `rose driver` for a KWOK node in the e2e tier: simulated GPUs, the node agent's suspend engine
# with its explicit `simulated` backend (each prepared lent claim is an occupant holding 1 GiB).
E2E_DRIVER_ARGS = [
    "--suspend-engine", "node", "--suspend-backends", "simulated",
    "--simulated-occupant-bytes", "1Gi", "--host-memory-budget", "8Gi",
    "--default-grace-seconds", "10", "--node-facts-seconds", "0.5",
    # these tests play the kubelet's prepare-time wait; the scheduler-side wait (prebind) has its
    # own (tests/e2e/dra_driver/test_driver_binding_e2e.py)
    "--serving-wait", "prepare",
]  # fmt: skip


def driver_published(api: Any, node: str) -> dict[str, Any] | None:
    """The node's one ResourceSlice once its ``rose driver`` (not the seed) has published it."""
    from dra_driver.publisher import HASH_ANNOTATION
    from local_cluster.objects import driver_slices

    items = driver_slices(api, node)
    if len(items) == 1 and HASH_ANNOTATION in (items[0]["metadata"].get("annotations") or {}):
        return items[0]
    return None


def restore_seed_slices(cluster: Any, api: Any, nodes: list[str]) -> None:
    """Once a test's drivers are stopped, check they removed their slices on shutdown, and give
    their nodes back the session cluster's seed slices (the other tests schedule on them), even
    when that check fails."""
    from kubernetes import client

    from local_cluster.objects import driver_slices, wait_for
    from rose_common.slices import resource_slice, simulated_gpus

    try:
        for n in nodes:
            wait_for(f"slices of {n} removed on driver shutdown", lambda n=n: not driver_slices(api, n), timeout=30)
    finally:
        for n in nodes:
            if not driver_slices(api, n):
                client.CustomObjectsApi(api).create_cluster_custom_object(
                    "resource.k8s.io",
                    "v1",
                    "resourceslices",
                    resource_slice(n, simulated_gpus(n, cluster.gpus_per_node), 1),
                )


@contextlib.contextmanager
def node_driver(
    cluster: Any, node: str, prefix: str, args: Callable[[Path], list[str]], show_log: bool = False
) -> Iterator[DriverProcess]:
    """A real ``rose driver`` for ``node`` of the session cluster, with ``args(root)``, its state
    under a short temp root (unix socket paths; ``prefix`` names it). On exit: stopped (exit code 0
    asserted), its slices checked removed and the node's seed slices given back, the root removed;
    ``show_log`` prints the log's tail (pytest shows it when the test failed)."""
    from local_cluster import free_port
    from local_cluster.kubelet import DriverProcess

    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    drv = DriverProcess(cluster.kubeconfig, node, root, cluster.gpus_per_node, free_port(), extra_args=args(root))
    api = cluster.api_client()
    try:
        yield drv
    finally:
        code = drv.stop()
        try:
            restore_seed_slices(cluster, api, [node])
            assert code == 0, code
        finally:
            api.close()
            if show_log:
                print((root / f"{node}.log").read_text()[-4000:])
            shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def simulated_host_driver(
    cluster: Any, node: str, prefix: str, args: Callable[[Path], list[str]]
) -> Iterator[DriverProcess]:
    """:func:`node_driver` whose simulated backend starts and ends with an empty host folder
    (``/dev/shm/rose-simulated-host-<node>``: its device memory and DRAM copies)."""
    shm = Path("/dev/shm") / f"rose-simulated-host-{node}"
    shutil.rmtree(shm, ignore_errors=True)
    try:
        with node_driver(cluster, node, prefix, args) as drv:
            yield drv
    finally:
        shutil.rmtree(shm, ignore_errors=True)

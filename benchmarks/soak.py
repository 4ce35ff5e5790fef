"""A day of real serving demand through the whole system, with faults (issue 25 §2).

    python -m benchmarks.soak --series ../shared/data/traces/derived/servegen_m-large_10min.csv \\
        --hours 24 --speed 96 --json OUT.json [--faults 3] [--seed 1] [--workdir DIR]

On a real local cluster (``local_cluster``: etcd, kube-apiserver, kube-controller-manager, the
two kube-schedulers, KWOK; 4 nodes of 3 simulated GPUs (``Params.gpus_per_node``) in 2 pools),
time-compressed ``--speed`` times (one 10-minute row of the trace lasts ``600 / speed`` wall seconds):

* Serving as it arrives. The trace (requests per 10 min) is turned into busy serving GPUs per
  pool (``busy_gpus``: the week before the played slice sizes one GPU, its peak using 90 % of
  the pool, as ``rose simulate`` does; pool-b plays the same trace 12 h later). A small exporter
  serves ``rose_serving_busy_gpus{pool}`` at the trace's pace; the real Prometheus scrapes it
  every second, with the week before backfilled (``promtool tsdb create-blocks-from``); the real
  ``rose predictor serve`` forecasts from it on the compressed clock (its step, seasons and
  horizons divided by ``speed``); a serving Deployment per pool (pods with a serving claim each)
  is scaled to the busy GPUs as they arrive.
* RL as a user runs it. ElasticRLJobs (``jobs``) under the real ``rose controller`` (planner on,
  http forecasts from the predictor), ``rose extender`` behind the rose-scheduler profile and one
  ``rose driver`` per node (simulated GPUs, node suspend engine with the ``simulated`` and
  ``cooperative`` backends). The first job's worker runs the real example trainer
  (examples/01_cartpole_reinforce.py) on its claim's node-agent socket; the other workers are the
  driver's simulated occupants. KWOK has no kubelet, so the harness plays the kubelet's DRA
  manager (NodePrepareResources / NodeUnprepareResources over the real gRPC sockets) for every
  pod bound to a node, as ``rose demo`` does.
* A time-slice group (``TS_GROUP``): two more ElasticRLJobs (``TS_JOBS``, one shared claim) under
  the real ``rose timeslice serve`` (TLS, TokenReview, group Leases, leader election, the hand-over
  through the drivers, as demo act 5 runs it); each member's workload is an SDK client in the
  harness that takes turns (Acquire, hold, Yield).
* Faults, seeded and logged (``fault_plan``): SIGKILL of the controller, the extender, the
  predictor and a driver; a restart (SIGKILL, start) of the kube-apiserver and of etcd; a driver
  SIGKILLed in the middle of a suspend (while a serving prepare waits for it); the predictor
  down for longer than the consumers' ``--forecast-max-age``; a node's host-memory budget full
  (its driver restarted with a budget of what it holds, for ``host_full_s``; ``--host-full-force``
  also pins a serving burst onto a lent occupant there); SIGKILL of the orchestrator; the trainer
  job's checkpoint directory full (a small tmpfs filled, with its node's host-memory budget full
  and a serving burst on its GPU, so the driver's fallback checkpoint is refused).
* ``--serving-wait prepare|prebind``: the drivers' mode; with prebind a check runs before each
  serving prepare (its GPU's lent claims already suspended in the driver's node state).
* Invariants, each a hard failure (the run stops, exit 1): a serving prepare never returns while
  a lent occupant's state is on its GPU (the driver's own node state has every lent claim on that
  GPU suspended, and the trainer's device-memory file holds 0 bytes); no device is allocated to
  two claims; no job's suspend count goes back, no driver evicts a lent worker without a verified
  durable checkpoint (its log), and the real trainer ends bit-identical to an uninterrupted run of
  the same seed; no two members of the time-slice group are un-suspended by their drivers at once
  (after a hand-over); after every fault every job is at its planned target (``converged``; the
  group: its Lease settled with a grant since the fault) within ``--converge-bound`` wall seconds.

Figures (JSON and a printed summary): faults injected and survived, time to converge per kind
(p50 / p99), serving prepares and their waits, RL useful GPU-hours (active GPUs x sim time) and
the trainer's steps, suspends, and the same slice through ``rose_sim.report.simulate``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import log
from local_cluster.cluster import dying_with_parent

REPO = Path(__file__).resolve().parent.parent
TRAINER = REPO / "examples" / "01_cartpole_reinforce.py"
ROW_S = 600  # the traces' step
HISTORY_ROWS = 7 * 144  # the week before the played slice: sizes the pool, backfilled for the predictor
POOL_SHIFT_ROWS = 72  # pool-b plays the trace 12 h later
NS = "soak"
PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
FAULT_KINDS = (
    "kill-controller",
    "kill-extender",
    "kill-predictor",
    "kill-driver",
    "kill-driver-mid-suspend",
    "restart-apiserver",
    "restart-etcd",
    "predictor-down",
    "host-memory-full",
    "kill-orchestrator",
    "checkpoint-dir-full",
)
SERVING_WAITS = ("prepare", "prebind")
PREBIND_KILL_AFTER_S = 1.0  # prebind: the mid-suspend kill this long after the burst pod is created
HOST_BUDGET = "512Gi"  # a node's host-memory budget for suspended state (eight 64 GiB occupants)
OCCUPANT_GIB = 64  # a simulated occupant: 64 GiB over 55 GB/s is a 1.25 s suspend (a driver can die inside it)
# The disk tier of suspended state (issue 27 §4), as a node with local NVMe runs: eight 64 GiB occupants
# charged, while the simulated backend keeps only HOST_COPY real bytes per occupant (device file, DRAM
# copy, spill file; ``--simulated-host-copy-bytes``): the budgets see 64 GiB, the disk sees 1 MiB.
SPILL_BUDGET = "512Gi"
HOST_COPY = "1Mi"
DRAM_FULL = "1"  # --host-memory-budget of a DRAM tier checkpoint-dir-full makes full (what it holds stays)
DISK_FULL = "1"  # --spill-budget-bytes of a disk tier the fault makes full (> 0; what it holds stays)


# ----------------------------------------------------------------------------- pure parts
def busy_gpus(values: np.ndarray, history_rows: int, pool_gpus: int, peak_util: float = 0.9) -> np.ndarray:
    """Busy serving GPUs per row: one GPU serves the history's peak / (pool x peak_util) (pure;
    ``rose_sim.inputs.demand_from_values``'s sizing). Gaps carry the last value."""
    x = np.asarray(values, dtype=float).copy()
    for i in range(len(x)):
        if math.isnan(x[i]):
            x[i] = x[i - 1] if i else 0.0
    peak = float(np.max(x[:history_rows]))
    if peak <= 0:
        raise ValueError("the history before the played slice never exceeds 0: cannot size the pool")
    per_gpu = peak / (pool_gpus * peak_util)
    out: np.ndarray = np.ceil(np.clip(x, 0, None) / per_gpu - 1e-9)
    return out


@dataclass(frozen=True)
class Fault:
    at_s: float  # wall seconds after the start of the played slice
    kind: str
    target: str = ""


def fault_plan(
    seed: int,
    duration_s: float,
    count: int,
    nodes: Sequence[str],
    kinds: Sequence[str] = FAULT_KINDS,
    first_s: float = 30.0,
    spacing_s: float = 40.0,
) -> list[Fault]:
    """``count`` faults at seeded random times, at least ``spacing_s`` apart (time to converge in
    between), every kind before any repeats, in a seeded order (pure)."""
    rng = random.Random(seed)
    room = duration_s - first_s - 30.0
    n = max(0, min(count, int(room // spacing_s) + 1)) if room > 0 else 0
    if n == 0:
        return []
    slack = room - (n - 1) * spacing_s
    offsets = sorted(rng.uniform(0, slack) for _ in range(n))
    order: list[str] = []
    while len(order) < n:
        batch = list(kinds)
        rng.shuffle(batch)
        order += batch
    out = []
    for i in range(n):
        kind = order[i]
        target = rng.choice(list(nodes)) if kind.startswith("kill-driver") else ""
        out.append(Fault(round(first_s + offsets[i] + i * spacing_s, 1), kind, target))
    return out


def busiest_node(counts: dict[str, int], nodes: Sequence[str]) -> str:
    """The node with most of ``counts`` (ties: the first by name; none counted: the first node; pure)."""
    if not nodes:
        raise ValueError("no nodes to choose from")
    return min(sorted(nodes), key=lambda n: -counts.get(n, 0))


def evictions_losing_state(log_lines: Sequence[str]) -> list[str]:
    """The driver's evictions of lent workloads without a verified durable checkpoint, from its JSON
    log lines (``"evicting lent workload"``): each lost what it had on the GPU ("pod: reason"; pure).
    Only the checkpoint-and-evict fallback evicts after the checkpoint is confirmed and verified;
    an enforcement (the workload did not free the GPU in time, or its suspend failed with no
    checkpoint channel) evicts without one."""
    out = []
    for line in log_lines:
        if '"evicting lent workload"' not in line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        reason = str(rec.get("reason", ""))
        if rec.get("msg") == "evicting lent workload" and "fallback: durable checkpoint" not in reason:
            out.append(f"{rec.get('pod')}: {reason[:300]}")
    return out


def _log_ts(rec: dict[str, Any]) -> float | None:
    """A driver log record's ``ts`` ("2026-12-02T05:27:33.068Z") as a Unix time; None if absent."""
    import datetime as dt

    try:
        return dt.datetime.strptime(str(rec["ts"]), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC).timestamp()
    except (KeyError, ValueError):
        return None


def tiers_full_eviction(rec: dict[str, Any], node: str, windows: Sequence[tuple[str, float, float]]) -> bool:
    """Pure: an eviction the fault made inevitable — on a node while the fault held every tier of
    its suspended state full (``windows``: (node, start, end) Unix times), refused for room (the
    host-memory budget) and with nothing to checkpoint to (no SDK checkpoint channel). Never the
    real trainer's worker (``soak/trainer-w*``): it has a checkpoint channel, and an eviction that
    found none (a reclaim before it registered again with a restarted driver, T4) lost its state."""
    reason = str(rec.get("reason", ""))
    ts = _log_ts(rec)
    return (
        ts is not None
        and not str(rec.get("pod", "")).startswith(f"{NS}/trainer-w")
        and "does not fit the host-memory budget" in reason
        and "fallback impossible" in reason
        and any(n == node and a <= ts <= b for n, a, b in windows)
    )


@dataclass
class DriverLogTally:
    """What a driver's log says about suspended state: evictions that lost it (the invariant),
    evictions the fault made inevitable (every tier full, no checkpoint channel: reported apart),
    and spills to the disk tier (``SuspendedStateSpilled``)."""

    lost: list[str] = field(default_factory=list)
    by_fault: list[str] = field(default_factory=list)
    spills: int = 0


def tally_driver_log(
    log_lines: Sequence[str], node: str = "", windows: Sequence[tuple[str, float, float]] = ()
) -> DriverLogTally:
    """Pure: :class:`DriverLogTally` of one node's driver log lines (JSON; others skipped)."""
    out = DriverLogTally()
    for line in log_lines:
        if '"SuspendedStateSpilled"' in line:
            with contextlib.suppress(ValueError):
                out.spills += json.loads(line).get("reason") == "SuspendedStateSpilled"
            continue
        lost = evictions_losing_state([line])
        if lost:
            (out.by_fault if tiers_full_eviction(json.loads(line), node, windows) else out.lost).extend(lost)
    return out


def fill_until_enospc(path: Path) -> None:
    """Write zeros to ``path`` until its file system is full (ENOSPC; other errors raise)."""
    import errno

    with path.open("wb") as fh:
        try:
            while True:
                fh.write(b"\0" * (64 << 10))
                fh.flush()
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    return float(np.quantile(np.asarray(values, dtype=float), q))


def devices_allocated_twice(claims: Sequence[dict[str, Any]]) -> dict[str, list[str]]:
    """``pool/device`` → the claims it is allocated to, where more than one (pure)."""
    seen: dict[str, list[str]] = {}
    for c in claims:
        alloc = (c.get("status") or {}).get("allocation") or {}
        for r in (alloc.get("devices") or {}).get("results") or []:
            key = f"{r.get('pool')}/{r.get('device')}"
            seen.setdefault(key, []).append(f"{c['metadata']['namespace']}/{c['metadata']['name']}")
    return {k: v for k, v in seen.items() if len(v) > 1}


def job_converged(job: dict[str, Any], workers: Sequence[dict[str, Any]]) -> str:
    """Why the job is not at its planned target ("" when it is; pure). At target: the controller
    has seen the last spec, ``activeGPUs == targetGPUs``, and the workers agree (as many running
    and un-suspended as the active GPUs need; every worker bound to a node)."""
    st = job.get("status") or {}
    spec = job["spec"]
    gen = job["metadata"].get("generation")
    if st.get("observedGeneration") != gen:
        return f"status at generation {st.get('observedGeneration')}, spec at {gen}"
    target, active = st.get("targetGPUs"), st.get("activeGPUs", 0)
    if target is None or active != target:
        return f"{active} active GPUs, target {target}"
    gpw = int(spec.get("gpusPerWorker", 1))
    running = [w for w in workers if w["state"] == "Running"]
    if len(running) * gpw != active:
        return f"{len(running)} workers running un-suspended, {active} active GPUs"
    unbound = [w["name"] for w in workers if not w["node"]]
    if unbound:
        return f"workers not bound: {', '.join(unbound)}"
    return ""


def job_manifest(name: str, min_gpus: int, max_gpus: int, priority: int = 0, group: str = "") -> dict[str, Any]:
    from rose_common import names

    body: dict[str, Any] = {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "minGPUs": min_gpus,
            "maxGPUs": max_gpus,
            "gpusPerWorker": 1,
            "gracefulShutdownPeriod": 5,
            "minUsefulRunSeconds": 10,
            "stateBytesPerWorker": OCCUPANT_GIB << 30,
            "priority": priority,
            "template": {
                "spec": {
                    "priorityClassName": "rose-rl",
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "trainer", "image": "rose/soak"}],
                }
            },
        },
    }
    if group:
        body["spec"]["timesliceGroup"] = group
    return body


def prepare_error_summary(errors: Sequence[str]) -> dict[str, Any]:
    """The played kubelet's failed (and retried) prepares: how many, per pod and per distinct
    message (pure; messages cut at the claim name so repeats group)."""
    by_pod: dict[str, int] = {}
    by_msg: dict[str, int] = {}
    for e in errors:
        pod, _, msg = e.partition(": ")
        by_pod[pod] = by_pod.get(pod, 0) + 1
        key = msg.split(";")[0][:140]
        by_msg[key] = by_msg.get(key, 0) + 1
    top = sorted(by_msg.items(), key=lambda kv: -kv[1])[:8]
    return {"count": len(errors), "by_pod": by_pod, "top_messages": dict(top), "last": list(errors[-5:])}


JOBS = (("trainer", 1, 1, 30), ("elastic-a", 1, 4, 0), ("elastic-b", 2, 4, 0))
TS_GROUP = "tsg"  # the time-slice group: its members share one claim per worker index and take turns
TS_JOBS = ("ts-a", "ts-b")  # its members (1 GPU each; the orchestrator's clients run in the harness)
TS_PRIORITY = 20  # above the elastic jobs, below the trainer (30, the bit-exact witness: it runs
# first); the planner counts each member's worker as a GPU of its own (elastic_controller README)
TS_LEASE_NS = "default"  # the controller's --lease-namespace: the orchestrator writes its group Leases there
TS_HOLD_S, TS_OFF_S = 2.0, 1.0  # each member's phase on the group, and off it, per turn
HOLDING_STATES = ("Running", "Requested")  # a bound worker in one of these holds its device state


def freed_for_serving(state: str | None, resident: int, trainer: bool) -> bool:
    """Whether the driver's own node state says a lent claim has left its GPU to serving (pure): it
    is suspended or checkpointed, or enforced on (a kill: whether that lost state is judged apart,
    by "serving never on a lent occupant's state" and the eviction log), or it is the real trainer,
    whose suspend was refused with its device observed free (0 B resident). That last case is T3's
    corner: host memory and checkpoint storage both full, where the driver serves by its rule while
    the trainer keeps its state in its own process. "Not suspended" (``None``) and a suspend in
    flight are not freed."""
    from dra_driver.state import CHECKPOINTED_EVICTED, ENFORCED_EVICTED, SUSPEND_FAILED, SUSPENDED

    if state in (SUSPENDED, CHECKPOINTED_EVICTED, ENFORCED_EVICTED):
        return True
    return state == SUSPEND_FAILED and trainer and resident == 0


def group_holders(workers: dict[str, Sequence[dict[str, Any]]]) -> list[str]:
    """The group members that hold the group's devices by the driver's own word (pure): a member
    holds when one of its workers has its claim prepared by its node's driver (``prepared``), took
    part in a hand-over (the orchestrator wrote its ``rose.io/fencing-token``) and runs by the
    driver's ``rose.io/suspend-state`` (a ``rose.io/suspend-request`` the driver has not yet acted
    on still holds: ``Requested``). Workers never handed over are left out: before its first grant
    a member has no fencing token and the driver has never been asked to move it; a worker not
    bound, or whose claim no driver prepared (e.g. refused: serving holds that GPU), holds nothing."""
    return sorted(
        job
        for job, ws in workers.items()
        if any(w.get("fenced") and w.get("prepared") and w["node"] and w["state"] in HOLDING_STATES for w in ws)
    )


def serving_waiting(job: dict[str, Any], workers: Sequence[dict[str, Any]]) -> list[str]:
    """The job's workers the controller shows waiting for serving (pure): named in its
    ``ServingHoldsGPU`` condition while True (their lent claim is on a GPU serving holds)."""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") == "ServingHoldsGPU" and c.get("status") == "True":
            return [w["name"] for w in workers if f"{w['name']}: " in str(c.get("message") or "")]
    return []


def group_member_ready(job: dict[str, Any], workers: Sequence[dict[str, Any]]) -> str:
    """Why a time-slice group member is not settled ("" when it is; pure): the controller has seen
    the last spec, and as many workers as its planned target (``targetGPUs / gpusPerWorker``)
    exist, every one bound. Which member's state is on the devices is the orchestrator's
    (:func:`group_converged`): a member waiting for the group is suspended at its target, and so is
    one suspended by a hand-over in flight (the controller plans it on the shared claim the group
    still holds: ``Worker.handed``), so a hand-over instant is a converged snapshot. A worker
    the controller plans as waiting for serving (its shared claim allocated on a GPU serving holds,
    never prepared there: named in the job's ``ServingHoldsGPU`` condition, True) is outside the
    target: it holds nothing until serving leaves (soak T2's remainder)."""
    st = job.get("status") or {}
    gen = job["metadata"].get("generation")
    if st.get("observedGeneration") != gen:
        return f"status at generation {st.get('observedGeneration')}, spec at {gen}"
    target = st.get("targetGPUs")
    if target is None:
        return "no target yet"
    want = int(target) // max(1, int(job["spec"].get("gpusPerWorker", 1)))
    waiting = serving_waiting(job, workers)
    if len(workers) != want + len(waiting):
        extra = f" ({len(waiting)} waiting for serving)" if waiting else ""
        return f"{len(workers)} workers, target {want}{extra}"
    unbound = [w["name"] for w in workers if not w["node"]]
    if unbound:
        return f"workers not bound: {', '.join(unbound)}"
    return ""


def shared_claim_complete(claim: dict[str, Any], bound_pods: set[str]) -> bool:
    """Whether every bound pod that references ``claim`` by name is in its ``reservedFor`` (pure).
    The driver learns a claim's pods at its first prepare only (a later prepare is idempotent), so
    the played kubelet prepares a time-slice group's shared claim once all its bound members are
    reserved: a member's worker missing from the driver's record would have its hand-over refused
    (``fencing token refused``, reason ``no-claim``)."""
    reserved = {r.get("uid") for r in (claim.get("status") or {}).get("reservedFor") or []}
    return bound_pods <= reserved


def registered_since(log_path: Path, offset: int, pod_uid: str) -> bool:
    """Whether the driver's log (JSON lines) past ``offset`` says the workload of ``pod_uid``
    registered with the cooperative backend (its SDK checkpoint channel)."""
    try:
        with log_path.open("rb") as f:
            f.seek(offset)
            chunk = f.read().decode(errors="replace")
    except OSError:
        return False
    for line in chunk.splitlines():
        if '"workload registered"' in line and pod_uid in line:
            with contextlib.suppress(ValueError):
                if "cooperative" in json.loads(line).get("backends", []):
                    return True
    return False


def group_converged(lease: dict[str, Any] | None, token_before: int, members_placed: int) -> str:
    """Why the time-slice group has not converged ("" when it has; pure): its Lease (the
    orchestrator's record, a ``coordination.k8s.io/v1`` Lease as a dict) settled, no hand-over in
    flight, and a grant since the fault (the fencing token, +1 on every grant, past
    ``token_before``). With no member placed (``members_placed`` 0: the planner gave the group no
    GPU, or no driver prepared its claim) nobody can be granted, and the group is idle: converged."""
    from rose_common import timeslice_lease

    if members_placed == 0:
        return ""
    if lease is None:
        return "no Lease of the group yet"
    g = timeslice_lease.read(lease)
    if g is None:
        return "the group's Lease carries no group"
    if g.switching:
        return f"hand-over to {g.holder} in flight (token {g.token})"
    if g.token <= token_before:
        return f"no grant since the fault (fencing token {g.token})"
    return ""


# ----------------------------------------------------------------------------- I/O: processes
class Proc:
    """A component as a process of its own that the harness can SIGKILL and start again."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.name, self.argv, self.log_path, self.env = name, argv, log_path, env
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        """Started from the main thread only: the child dies with it (PDEATHSIG follows the thread)."""
        argv, preexec = dying_with_parent(self.argv)
        with self.log_path.open("ab") as f:
            self.proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         cwd=REPO, env=self.env or {**os.environ, "PYTHONPATH": str(REPO)},
                                         preexec_fn=preexec)  # fmt: skip  # noqa: PLW1509

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        from local_cluster import stop_process

        if self.proc is not None:
            stop_process(self.proc, timeout=20)


def _get(url: str, timeout: float = 3.0) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), ""
    except OSError:
        return 0, ""


def wait_until(what: str, fn: Callable[[], Any], timeout: float, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except Exception as e:
            last = e
        time.sleep(interval)
    raise SoakFailure(f"timed out ({timeout:.0f}s) waiting for {what}; last: {last!r}")


class SoakFailure(AssertionError):
    """An invariant broke or the harness could not go on; the message says which and why."""


# ----------------------------------------------------------------------------- the soak
@dataclass
class Params:
    series: Path
    hours: float
    speed: float
    faults: int
    seed: int
    workdir: Path
    converge_bound_s: float = 90.0
    forecast_max_age_s: float = 20.0
    start_row: int = HISTORY_ROWS
    trainer_updates: int = 400
    kinds: tuple[str, ...] = FAULT_KINDS
    fault_spacing_s: float = 40.0  # at least this far apart (time to converge in between)
    drain_s: float = 300.0
    simulate: bool = True
    plan_interval_s: float = 1.0  # the controller's --plan-interval (wall seconds)
    cluster: Any = None  # a running local cluster of the same shape (a ClusterHandle) instead of a new one
    serving_wait: str = "prepare"  # the drivers' --serving-wait: prepare (the played kubelet's prepare
    # suspends the lent occupant) or prebind (the scheduler holds the serving pod in PreBind until the
    # driver has suspended it; the prepare is then immediate)
    host_full_s: float = 60.0  # how long the host-memory-full fault holds a node's budget full
    host_full_force: bool = False  # and a serving burst pinned onto a running lent occupant there
    timeslice: bool = True  # the time-slice group and its orchestrator (benchmarks.sim_to_real: off)
    gpus_per_node: int = 3  # 4 nodes in 2 pools; 3 GPUs a node leaves the group room for both members
    ckpt_full_s: float = 30.0  # how long the checkpoint-dir-full fault holds the trainer's checkpoint directory full

    def __post_init__(self) -> None:
        if self.serving_wait not in SERVING_WAITS:
            raise ValueError(f"serving_wait {self.serving_wait!r}: one of {', '.join(SERVING_WAITS)}")
        if self.faults and "kill-orchestrator" in self.kinds and not self.timeslice:
            raise ValueError("fault kill-orchestrator needs the time-slice group and its orchestrator (timeslice on)")


@dataclass
class Figures:
    faults: list[dict[str, Any]] = field(default_factory=list)
    serving_prepares: list[float] = field(default_factory=list)  # seconds each serving prepare took
    serving_waits: list[float] = field(default_factory=list)  # those that waited for an occupant's suspend
    serving_pending_s: list[float] = field(default_factory=list)  # pod created -> prepared
    prepare_errors: list[str] = field(default_factory=list)  # kubelet prepares that failed (retried)
    useful_gpu_s: float = 0.0  # sim seconds x active GPUs
    checks: dict[str, int] = field(default_factory=dict)
    suspends: int = 0
    serving_on_lent_gpu: int = 0  # serving prepares on a GPU lent to a prepared RL claim
    serving_over_failed_suspend: int = 0  # of them over the real trainer's refused suspend (device free)
    samples: list[dict[str, Any]] = field(default_factory=list)


class Soak:
    def __init__(self, p: Params, say: Callable[[str], None] = log) -> None:
        self.p, self.say = p, say
        self.row_s = ROW_S / p.speed
        self.rows = max(1, round(p.hours * 3600 / ROW_S))
        self.duration_s = self.rows * self.row_s
        self.fig = Figures()
        self.stack = contextlib.ExitStack()
        self.stop = threading.Event()
        self.failure: str | None = None
        self.mu = threading.Lock()
        self.prepared: dict[str, dict[str, Any]] = {}  # claim uid -> {claim, node, role, pod}
        self.inflight: set[str] = set()
        self.drivers: dict[str, Any] = {}
        self.procs: dict[str, Proc] = {}
        self.predictor_held_down = False
        self.ended = False  # the played slice is over: serving gone
        self.kill_mid_suspend: str | None = None  # node whose driver dies inside the next serving wait
        self.suspend_counts: dict[str, int] = {}
        self.trainer: subprocess.Popen[bytes] | None = None
        self.trainer_claim = ""  # the UID of the claim the real trainer runs on
        self.t_start = 0.0
        self.events: list[str] = []
        self.bursts: list[str] = []
        self.round_claims: list[dict[str, Any]] = []
        self.replicas: dict[str, int] = {}
        self.api_errors = 0
        self.host_full: list[dict[str, Any]] = []  # what each host-memory-full fault saw
        self.ckpt_full: list[dict[str, Any]] = []  # what each checkpoint-dir-full fault saw
        self.ckpt_dir: Path | None = None  # the trainer job's checkpointPath lives here (a small tmpfs)
        self.log_offsets: dict[str, int] = {}  # node -> bytes of its driver log already read
        self.tiers_full: list[tuple[str, float, float]] = []  # (node, start, end): every tier full by a fault
        self.tiers_full_open: dict[str, float] = {}  # node -> start of such a window still open
        self.evicted_by_fault: list[str] = []  # evictions while every tier was full by the fault
        self.spills_to_disk = 0  # SuspendedStateSpilled in the drivers' logs
        self.ts_token_before = -1  # the group's fencing token when the fault under judgement began
        self.ts_turns: dict[str, int] = dict.fromkeys(TS_JOBS, 0)  # grants each member's client got
        self.ts_errors: list[str] = []  # its clients' last failed calls (retried)
        self.ts_error_count = 0
        self.ts_max_holders = 0
        # observe rounds, and those in which a member was not at its planned target (group_member_ready):
        # how often a snapshot of the group could not count as converged (soak g2/g3/g5's symptom)
        self.ts_rounds = 0
        self.ts_not_at_target: dict[str, int] = dict.fromkeys(TS_JOBS, 0)

    # -------------------------------------------------------------- helpers
    def note(self, what: str) -> None:
        t = time.monotonic() - self.t_start if self.t_start else 0.0
        line = f"t+{t:7.1f}s (sim {t * self.p.speed / 3600:5.2f} h) {what}"
        self.events.append(line)
        self.say(line)

    def fail(self, what: str) -> None:
        with self.mu:
            if self.failure is None:
                self.failure = what
        self.note(f"INVARIANT BROKEN: {what}")
        self.stop.set()

    def check(self, name: str, ok: bool, why: str) -> None:
        self.fig.checks[name] = self.fig.checks.get(name, 0) + 1
        if not ok:
            self.fail(f"{name}: {why}")

    def row_now(self) -> int:
        return min(self.rows - 1, int((time.monotonic() - self.t_start) / self.row_s))

    # -------------------------------------------------------------- set-up
    def setup(self) -> None:
        from local_cluster import ClusterConfig, LocalCluster, reserved_port

        p = self.p
        p.workdir.mkdir(parents=True, exist_ok=True)
        self.tmp = p.workdir
        from predictor.series import read_series_csv

        s = read_series_csv(p.series)
        need = p.start_row + POOL_SHIFT_ROWS + self.rows
        if len(s.values) < need:
            raise SoakFailure(
                f"{p.series}: {len(s.values)} rows; --hours {p.hours} after a week of history needs {need}"
            )
        if s.step != ROW_S:
            raise SoakFailure(f"{p.series}: step {s.step}s; the soak plays 10-minute series")
        self.series_values = s.values
        self.say(f"cluster: 4 KWOK nodes x {p.gpus_per_node} simulated GPUs, 2 pools (workdir {p.workdir})")
        if p.cluster is not None:  # a running cluster of the same shape (no faults: it is not restarted)
            from urllib.parse import urlparse

            if p.faults or not p.cluster.extender_url:
                raise SoakFailure("a given cluster takes no faults and needs its extender URL")
            self.h = p.cluster
            self.extender_port = int(urlparse(p.cluster.extender_url).port or 0)
            self.api = self.h.api_client()
            self.stack.callback(self._delete_namespace)  # leave the cluster as it was found
        else:
            self.extender_port = reserved_port()
            cfg = ClusterConfig(
                nodes=4,
                gpus_per_node=p.gpus_per_node,
                pools=2,
                workdir=p.workdir / "cluster",
                seed_slices=False,
                extender_url=f"http://127.0.0.1:{self.extender_port}",
                die_with_parent=True,
            )
            self.lc = LocalCluster(cfg)
            self.h = self.lc.up()
            self.stack.callback(self.lc.down)
            self.api = self.h.api_client()
        self.pools = sorted(set(self.h.pools.values()))
        self.cap = {pl: sum(1 for q in self.h.pools.values() if q == pl) * self.h.gpus_per_node for pl in self.pools}
        self.busy: dict[str, np.ndarray] = {}
        for i, pl in enumerate(self.pools):
            shift = i * POOL_SHIFT_ROWS
            vals = self.series_values[shift + p.start_row - HISTORY_ROWS : shift + p.start_row + self.rows]
            self.busy[pl] = busy_gpus(vals, HISTORY_ROWS, self.cap[pl])
        if "checkpoint-dir-full" in p.kinds and p.faults:
            self._checkpoint_dir()
        self._serving_metrics()
        self._predictor()
        self._drivers()
        self._services()
        self._namespace()
        if p.timeslice:
            self._orchestrator()

    def _checkpoint_dir(self) -> None:
        """The trainer job's checkpoint directory on a filesystem of its own that can be filled: a
        4 MiB tmpfs mounted here (needs root, as this harness runs; the real trainer's checkpoint
        is ~20 KiB)."""
        d = self.tmp / "ckpt"
        d.mkdir(exist_ok=True)
        out = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "rose-soak-ckpt", str(d)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if out.returncode != 0:
            raise SoakFailure(f"checkpoint-dir-full needs a small tmpfs (mount as root): {out.stderr.strip()}")
        self.stack.callback(lambda: subprocess.run(["umount", "-l", str(d)], capture_output=True, check=False))
        self.ckpt_dir = d
        self.say(f"checkpoint directory of the trainer job: {d} (a 4 MiB tmpfs, filled by checkpoint-dir-full)")

    def _delete_namespace(self) -> None:
        """Delete the soak's namespace and wait (at most 60 s) until it is gone."""
        from kubernetes import client

        core = client.CoreV1Api(self.api)
        with contextlib.suppress(Exception):
            core.delete_namespace(NS, grace_period_seconds=0)

        def gone() -> bool:
            try:
                core.read_namespace(NS, _request_timeout=5)
            except client.ApiException as e:
                return bool(e.status == 404)
            return False

        with contextlib.suppress(SoakFailure):
            wait_until(f"namespace {NS} deleted", gone, timeout=60)

    def _serving_metrics(self) -> None:
        from tests.support.prometheus_fixtures import MetricsStandIn

        def render() -> str:
            k = HISTORY_ROWS + (self.row_now() if self.t_start else 0)
            lines = [
                "# HELP rose_serving_busy_gpus Busy serving GPUs (the trace, replayed).",
                "# TYPE rose_serving_busy_gpus gauge",
            ]
            lines += [
                f'rose_serving_busy_gpus{{pool="{pl}"}} {0.0 if self.ended else self.busy[pl][k]:.1f}'
                for pl in self.pools
            ]
            return "\n".join(lines) + "\n"

        self.exporter = MetricsStandIn(render)
        self.stack.callback(self.exporter.close)
        # the week before, backfilled at the compressed pace, ending where the replay begins
        t0 = time.time()
        self.t_backfill_end = t0
        labels = f'job="replay",instance="127.0.0.1:{self.exporter.port}"'
        om = [
            "# HELP rose_serving_busy_gpus Busy serving GPUs (the trace, replayed).",
            "# TYPE rose_serving_busy_gpus gauge",
        ]
        for k in range(HISTORY_ROWS):
            ts = t0 - (HISTORY_ROWS - k) * self.row_s
            # a sample per wall second within the row, as the scrape would have taken
            for j in range(max(1, int(self.row_s))):
                for pl in self.pools:
                    om.append(f'rose_serving_busy_gpus{{pool="{pl}",{labels}}} {self.busy[pl][k]:.1f} {ts + j:.3f}')
        # openmetrics wants one series' samples together and in order
        head, body = om[:2], om[2:]
        body.sort(key=lambda ln: (ln.split("}")[0], float(ln.rsplit(" ", 1)[1])))
        (self.tmp / "history.om").write_text("\n".join([*head, *body, "# EOF"]) + "\n")
        subprocess.run(
            [
                PROMTOOL,
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                str(self.tmp / "history.om"),
                str(self.tmp / "tsdb"),
            ],
            check=True,
            capture_output=True,
            timeout=300,
        )

    def _prom_start(self) -> None:
        from local_cluster import reserved_port

        cfg = (
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: replay\n"
            f"    static_configs:\n      - targets: ['127.0.0.1:{self.exporter.port}']\n"
        )
        (self.tmp / "prometheus.yml").write_text(cfg)
        self.prom_port = getattr(self, "prom_port", 0) or reserved_port()
        self.procs["prometheus"] = Proc("prometheus", [PROMETHEUS, f"--config.file={self.tmp / 'prometheus.yml'}",
                                        f"--storage.tsdb.path={self.tmp / 'tsdb'}", "--storage.tsdb.retention.time=30d",
                                        f"--web.listen-address=127.0.0.1:{self.prom_port}"],
                                        self.tmp / "prometheus.log")  # fmt: skip
        self.stack.callback(self.procs["prometheus"].stop)

    def _predictor(self) -> None:
        from local_cluster import reserved_port

        self._prom_start()
        sp = self.p.speed
        pools = "pools:\n" + "".join(
            f'  - name: {pl}\n    query: sum(rose_serving_busy_gpus{{pool="{pl}"}})\n    unit: gpus\n'
            f"    capacity: {self.cap[pl]}\n    capacity_per_gpu: 1\n"
            for pl in self.pools
        )
        (self.tmp / "pools.yaml").write_text(pools)
        self.pred_port = reserved_port()

        def secs(sim_s: float) -> str:  # the compressed clock
            return f"{max(1, round(sim_s / sp))}s"

        self.horizons = [max(1, round(h / sp)) for h in (600, 1800, 3600)]
        argv = [sys.executable, "-m", "predictor", "serve", "--pools", str(self.tmp / "pools.yaml"),
                "--prometheus-url", f"http://127.0.0.1:{self.prom_port}", "--listen", f"127.0.0.1:{self.pred_port}",
                "--step", "1s", "--history", secs(8 * 86400), "--horizons", ",".join(f"{h}s" for h in self.horizons),
                "--quantiles", "0.9", "--risks", "0.05", "--refresh-interval", "1s", "--max-data-age", "10s",
                "--retrain-interval", secs(6 * 3600), "--season-day", secs(86400), "--season-week", secs(7 * 86400),
                "--model-dir", str(self.tmp / "models")]  # fmt: skip
        self.procs["predictor"] = Proc("predictor", argv, self.tmp / "predictor.log")
        self.stack.callback(self.procs["predictor"].stop)
        self.say(f"predictor: step 1s, horizons {self.horizons} s (10/30/60 min / {sp:g}); waiting for a fit")

        def fresh() -> bool:
            ok = True
            for pl in self.pools:
                code, body = _get(f"http://127.0.0.1:{self.pred_port}/v1/forecast?pool={pl}")
                ok = ok and code == 200 and not json.loads(body).get("stale", True)
            return ok

        wait_until("fresh forecasts from the predictor", fresh, timeout=300, interval=1.0)

    def _drivers(self) -> None:
        from local_cluster import reserved_port
        from local_cluster.kubelet import DriverProcess
        from local_cluster.objects import driver_slices

        root = Path(tempfile.mkdtemp(prefix="rose-soak-", dir="/tmp"))  # short: unix socket paths
        self.stack.callback(lambda: __import__("shutil").rmtree(root, True))
        self.driver_root = root
        for node in self.h.node_names:
            args = ["--suspend-engine", "node", "--suspend-backends", "simulated,cooperative",
                    "--simulated-occupant-bytes", f"{OCCUPANT_GIB}Gi", "--host-memory-budget", HOST_BUDGET,
                    "--spill-dir", str(self.tmp / "spill" / node), "--spill-budget-bytes", SPILL_BUDGET,
                    "--simulated-host-dir", str(self.tmp / "simulated-host" / node),
                    "--simulated-host-copy-bytes", HOST_COPY,
                    "--default-grace-seconds", "5", "--node-facts-seconds", "1", "--suspended-cpu=",
                    "--reconcile-seconds", "2",
                    # prepare: the played kubelet's prepare reclaims; prebind: the scheduler holds
                    # the serving pod in PreBind until the driver freed the GPU (--serving-wait)
                    "--serving-wait", self.p.serving_wait,
                    "--agent-control-socket", str(root / node / "a" / "control.sock")]  # fmt: skip
            drv = DriverProcess(
                self.h.kubeconfig,
                node,
                root,
                gpus=self.h.gpus_per_node,
                metrics_port=reserved_port(),
                extra_args=args,
                die_with_parent=True,
            )
            self.drivers[node] = drv
            self.stack.callback(drv.stop)
        for node in self.h.node_names:
            wait_until(f"driver of {node} publishing", partial(driver_slices, self.api, node), timeout=90)
        self.say(
            f"drivers: {len(self.drivers)} `rose driver` processes (simulated GPUs, {OCCUPANT_GIB} GiB occupants; "
            f"host memory {HOST_BUDGET}, disk tier {SPILL_BUDGET} under {self.tmp / 'spill'}, "
            f"{HOST_COPY} real bytes each)"
        )

    def _common(self) -> list[str]:
        return ["--forecast-backend=http", f"--predictor-url=http://127.0.0.1:{self.pred_port}", "--risk=0.05",
                "--forecast-refresh=1", "--forecast-timeout=3", f"--forecast-max-age={self.p.forecast_max_age_s:g}",
                "--forecast-horizons=" + ",".join(f"{h}s" for h in self.horizons),
                f"--kubeconfig={self.h.kubeconfig}"]  # fmt: skip

    def _services(self) -> None:
        from local_cluster import reserved_port

        self.ctl_port = reserved_port()
        dwell = max(1, round(300 / self.p.speed))
        self.procs["controller"] = Proc("controller", [sys.executable, "-m", "elastic_controller", *self._common(),
                                        f"--plan-interval={self.p.plan_interval_s:g}", f"--dwell={dwell}",
                                        "--lease-namespace=default",
                                        "--lease-name=rose-soak", "--lease-duration=6", "--lease-renew=2",
                                        # a worker the scheduler keeps refusing for serving's forecast goes
                                        # well within the 90 s convergence bound; its pool cools down for
                                        # a simulated ~1.6 h at 96x (group soak g7)
                                        "--refused-after=20", "--refused-cooldown=60",
                                        f"--metrics-listen=127.0.0.1:{self.ctl_port}"],
                                        self.tmp / "controller.log")  # fmt: skip
        self.stack.callback(self.procs["controller"].stop)
        self.procs["extender"] = Proc("extender", [sys.executable, "-m", "scheduler_extender",
                                      f"--listen=127.0.0.1:{self.extender_port}", *self._common()],
                                      self.tmp / "extender.log")  # fmt: skip
        self.stack.callback(self.procs["extender"].stop)
        wait_until("controller /metrics", lambda: _get(f"http://127.0.0.1:{self.ctl_port}/metrics")[0] == 200, 60)
        wait_until("extender /readyz", lambda: _get(f"http://127.0.0.1:{self.extender_port}/readyz")[0] == 200, 60)
        self.say(
            f"controller (plan every {self.p.plan_interval_s:g} s, dwell {dwell} s, "
            f"forecast max age {self.p.forecast_max_age_s:g} s) "
            "and extender on the predictor's forecasts"
        )

    def _namespace(self) -> None:
        from kubernetes import client

        from local_cluster.objects import claim_template, create_claim_template
        from rose_common import names

        core = client.CoreV1Api(self.api)
        core.create_namespace({"metadata": {"name": NS}})
        create_claim_template(self.api, NS, claim_template("serving-gpu", names.DEVICE_CLASS_SERVING))
        apps = client.AppsV1Api(self.api)
        for pl in self.pools:
            labels = {"app": f"serve-{pl}", names.LABEL_ROLE: "serving"}
            apps.create_namespaced_deployment(
                NS,
                {
                    "metadata": {"name": f"serve-{pl}"},
                    "spec": {
                        "replicas": 0,
                        "selector": {"matchLabels": {"app": f"serve-{pl}"}},
                        "strategy": {"type": "Recreate"},
                        "template": {
                            "metadata": {"labels": labels},
                            "spec": {
                                "nodeSelector": {names.LABEL_POOL: pl},
                                "terminationGracePeriodSeconds": 0,
                                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "serving-gpu"}],
                                "containers": [
                                    {
                                        "name": "llm",
                                        "image": "rose/serving",
                                        "resources": {"requests": {"cpu": "100m"}, "claims": [{"name": "gpu"}]},
                                    }
                                ],
                            },
                        },
                    },
                },
            )

    def _orchestrator(self) -> None:
        """``rose timeslice serve`` as in a cluster (as demo act 5 runs it): TLS, callers' ServiceAccount
        tokens reviewed, a job admitted only with worker pods of the group, group Leases in the
        controller's lease namespace, leader election, the hand-over through the nodes' drivers."""
        from kubernetes import client

        from local_cluster import reserved_port
        from rose_common import names
        from timeslice import certs

        files = certs.generate(self.tmp / "tls", ("localhost", "127.0.0.1"))
        core = client.CoreV1Api(self.api)
        core.create_namespaced_service_account(NS, {"metadata": {"name": "soak-jobs"}})
        req = {"spec": {"audiences": [names.TIMESLICE_TOKEN_AUDIENCE], "expirationSeconds": 86400}}
        token = core.create_namespaced_service_account_token("soak-jobs", NS, req).status.token
        self.ts_token_file = self.tmp / "ts-token"
        self.ts_token_file.write_text(token)
        self.ts_token_file.chmod(0o600)
        self.ts_ca = files.ca
        self.ts_port, self.ts_mport = reserved_port(), reserved_port()
        self.procs["orchestrator"] = Proc("orchestrator", [
            sys.executable, "-m", "timeslice", "serve", "--store", "kubernetes", "--kubeconfig", str(self.h.kubeconfig),
            "--namespace", TS_LEASE_NS, "--lease-name", "rose-soak-timeslice", "--handover", "kube",
            "--switch-timeout", "30s", "--identity", "soak-orchestrator", "--listen", f"127.0.0.1:{self.ts_port}",
            "--metrics-listen", f"127.0.0.1:{self.ts_mport}", "--tls-cert", str(files.cert), "--tls-key",
            str(files.key), "--token-audience", names.TIMESLICE_TOKEN_AUDIENCE],
            self.tmp / "orchestrator.log")  # fmt: skip
        self.stack.callback(self.procs["orchestrator"].stop)
        wait_until("the orchestrator elected leader (/readyz 200)", self._orchestrator_leads, 90)
        self.say(
            f"orchestrator: `rose timeslice serve` (TLS, TokenReview, Leases in {TS_LEASE_NS}, hand-over "
            f"through the drivers) for group {TS_GROUP} of {', '.join(TS_JOBS)}"
        )

    def _orchestrator_leads(self) -> bool:
        return _get(f"http://127.0.0.1:{self.ts_mport}/readyz")[0] == 200

    def _ts_client(self, job: str) -> None:
        """A member's workload: Acquire the group, hold it ``TS_HOLD_S``, Yield, ``TS_OFF_S`` off;
        failed calls (the orchestrator down, the job not admitted yet) are counted and retried."""
        from rose_sdk.timeslice import TimeSliceOrchestratorClient

        cl = TimeSliceOrchestratorClient(
            f"127.0.0.1:{self.ts_port}",
            f"{NS}/{job}",
            role="trainer",
            min_phase_ratio=0,
            token_file=str(self.ts_token_file),
            ca_file=str(self.ts_ca),
            retry_timeout_s=30,
        )
        try:
            while not self.stop.is_set() and not self.ended:
                try:
                    cl.acquire(TS_GROUP, timeout_s=60)
                    self.ts_turns[job] += 1
                    self.stop.wait(TS_HOLD_S)
                    cl.release(TS_GROUP)
                except Exception as e:
                    self.ts_errors.append(f"{job}: {type(e).__name__}: {str(e)[:160]}")
                    del self.ts_errors[:-50]  # the last 50 (counted in ts_error_count)
                    self.ts_error_count += 1
                    self.stop.wait(1.0)
                    continue
                self.stop.wait(TS_OFF_S)
        finally:
            with contextlib.suppress(Exception):
                cl.close()

    def group_lease(self) -> dict[str, Any] | None:
        from kubernetes import client

        from rose_common import names

        items = client.CustomObjectsApi(self.api).list_namespaced_custom_object(
            "coordination.k8s.io",
            "v1",
            TS_LEASE_NS,
            "leases",
            label_selector=f"{names.LABEL_TIMESLICE_GROUP}={TS_GROUP}",
            _request_timeout=10,
        )["items"]
        mine = [i for i in items if (i["metadata"].get("annotations") or {}).get("rose.io/timeslice-namespace") == NS]
        return mine[0] if mine else None

    def group_token(self) -> int:
        lease = self.group_lease()
        return int((lease or {}).get("spec", {}).get("leaseTransitions") or 0)

    # -------------------------------------------------------------- the played kubelet
    def _claims_of(self, pod: Any, claims: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
        """The pod's claims once allocated and reserved for it (``claims``: this round's list, by name)."""
        out = []
        # a claim made from a template is named in the pod's status; a shared claim (a time-slice
        # group's) is referenced by name in its spec
        named = [st.resource_claim_name for st in pod.status.resource_claim_statuses or []]
        named += [rc.resource_claim_name for rc in pod.spec.resource_claims or [] if rc.resource_claim_name]
        for name in dict.fromkeys(named):
            c = claims.get(name or "")
            status = (c or {}).get("status") or {}
            if (
                c
                and status.get("allocation")
                and any(r.get("uid") == pod.metadata.uid for r in status.get("reservedFor") or [])
            ):
                out.append(c)
        return out

    def kubelet_round(self, pool: ThreadPoolExecutor) -> None:
        from kubernetes import client

        from rose_common import names

        pods = client.CoreV1Api(self.api).list_namespaced_pod(NS, _request_timeout=10).items
        claims = {
            c["metadata"]["name"]: c
            for c in client.CustomObjectsApi(self.api).list_namespaced_custom_object(
                "resource.k8s.io", "v1", NS, "resourceclaims", _request_timeout=10
            )["items"]
        }
        self.round_claims = list(claims.values())
        bound = [p for p in pods if p.spec.node_name and not p.metadata.deletion_timestamp]
        sharers: dict[str, set[str]] = {}  # a claim referenced by name (shared) -> the bound pods using it
        for pod in bound:
            for rc in pod.spec.resource_claims or []:
                if rc.resource_claim_name:
                    sharers.setdefault(rc.resource_claim_name, set()).add(pod.metadata.uid)
        live: set[str] = set()
        for pod in bound:
            role = (pod.metadata.labels or {}).get(names.LABEL_ROLE, "")
            for c in self._claims_of(pod, claims):
                uid = c["metadata"]["uid"]
                live.add(uid)
                if not shared_claim_complete(c, sharers.get(c["metadata"]["name"], set())):
                    continue  # prepared once every pod bound to it is reserved (see shared_claim_complete)
                with self.mu:
                    if uid in self.prepared or uid in self.inflight:
                        continue
                    self.inflight.add(uid)
                pool.submit(self._prepare, c, pod, role)
        with self.mu:
            gone = [u for u in self.prepared if u not in live and u not in self.inflight]
            for u in gone:
                self.inflight.add(u)
        for u in gone:
            pool.submit(self._unprepare, u)

    def _prepare(self, claim: dict[str, Any], pod: Any, role: str) -> None:
        uid = claim["metadata"]["uid"]
        node = pod.spec.node_name
        try:
            drv = self.drivers[node]
            killer: threading.Timer | None = None
            if role == "serving" and self.kill_mid_suspend == node and self._occupied(node, claim):
                self.kill_mid_suspend = None
                killer = threading.Timer(0.4, self._kill_driver, (node, "mid-suspend"))
                killer.start()
            if role == "serving" and self.p.serving_wait == "prebind":
                self._check_freed_before_prepare(node, claim)
            t0 = time.monotonic()
            out = drv.kubelet.prepare(claim)
            took = time.monotonic() - t0
            if killer is not None:
                killer.join()
            if out.error:
                self.fig.prepare_errors.append(f"{pod.metadata.name}: {out.error[:160]}")
                return
            if role == "serving":
                self.fig.serving_prepares.append(took)
                if took > 0.5:
                    self.fig.serving_waits.append(took)
                created = pod.metadata.creation_timestamp.timestamp()
                self.fig.serving_pending_s.append(time.time() - created)
                self._check_serving_free(node, claim)
            with self.mu:
                self.prepared[uid] = {"claim": claim, "node": node, "role": role, "pod": pod.metadata.name}
            if pod.metadata.labels.get("rose.io/elastic-rl-job") == "trainer" and self.trainer is None:
                self._start_trainer(node, uid, pod)
        except Exception as e:
            self.fig.prepare_errors.append(f"{pod.metadata.name}: {type(e).__name__}: {str(e)[:160]}")
        finally:
            with self.mu:
                self.inflight.discard(uid)

    def _unprepare(self, uid: str) -> None:
        try:
            rec = self.prepared[uid]
            out = self.drivers[rec["node"]].kubelet.unprepare(rec["claim"])
            if not out.error:
                with self.mu:
                    self.prepared.pop(uid, None)
            else:
                self.fig.prepare_errors.append(f"unprepare {rec['pod']}: {out.error[:160]}")
        except Exception as e:
            self.fig.prepare_errors.append(f"unprepare {uid}: {type(e).__name__}: {str(e)[:160]}")
        finally:
            with self.mu:
                self.inflight.discard(uid)

    @staticmethod
    def _gpu_index(claim: dict[str, Any]) -> int:
        from rose_common import slices

        dev = claim["status"]["allocation"]["devices"]["results"][0]["device"]
        return int(slices.parse_device_name(dev)[0])

    def _lent_on(self, node: str, index: int) -> list[str]:
        with self.mu:
            return [
                u
                for u, r in self.prepared.items()
                if r["node"] == node and r["role"] != "serving" and self._gpu_index(r["claim"]) == index
            ]

    def _occupied(self, node: str, claim: dict[str, Any]) -> bool:
        return bool(self._lent_on(node, self._gpu_index(claim)))

    def _check_freed_before_prepare(self, node: str, serving: dict[str, Any]) -> None:
        """prebind: the scheduler bound the serving pod only after the driver freed its GPU, so its
        prepare has nothing to suspend: every lent claim on that GPU is already suspended (or
        checkpointed) in the driver's own node state before the played kubelet calls prepare."""
        from dra_driver.state import decode

        index = self._gpu_index(serving)
        lent = self._lent_on(node, index)
        if not lent:  # nothing lent on that GPU (and a driver that prepared nothing yet has no node state)
            return
        drv = self.drivers[node]
        data = decode((drv.plugin_dir / "checkpoint.json").read_bytes())
        for uid in lent:
            sus = data.suspensions.get(uid)
            mem = drv.plugin_dir / "claims" / uid / "device-memory"
            resident = mem.stat().st_blocks * 512 if mem.exists() else 0
            state = sus.state if sus else None
            self.check(
                "prebind: a serving pod reaches its prepare with its GPU freed",
                freed_for_serving(state, resident, uid == self.trainer_claim),
                f"serving claim {serving['metadata']['name']} bound to {node} GPU {index} while lent claim "
                f"{uid} is {state or 'not suspended'} ({resident} B resident)",
            )

    def _enforced_by_fault(self, node: str, uid: str) -> bool:
        """A simulated occupant enforced on while checkpoint-dir-full holds every tier of ``node``
        full: its suspend found no room and it has no checkpoint channel, so serving wins by design
        (T3's corner), as for the evictions ``tiers_full_eviction`` counts apart; counted the same
        way, never ignored. Never the real trainer's claim (it has a checkpoint channel)."""
        if node not in self.tiers_full_open or uid == self.trainer_claim:
            return False
        with self.mu:
            pod = next((r["pod"] for u, r in self.prepared.items() if u == uid), uid)
        self.evicted_by_fault.append(
            f"{node}: {NS}/{pod}: enforced on (killed): every tier full, no checkpoint channel"
        )
        self.note(f"enforced on while every tier of {node} was full by the fault: {NS}/{pod}")
        return True

    def _check_serving_free(self, node: str, serving: dict[str, Any]) -> None:
        """Invariant: the serving prepare returned → every lent claim on its GPU is suspended in
        the driver's own crash-safe node state, and the trainer's device-memory file is empty."""
        from dra_driver.state import CHECKPOINTED_EVICTED, ENFORCED_EVICTED, SUSPEND_FAILED, SUSPENDED, decode

        index = self._gpu_index(serving)
        drv = self.drivers[node]
        data = decode((drv.plugin_dir / "checkpoint.json").read_bytes())
        lent = self._lent_on(node, index)
        self.fig.serving_on_lent_gpu += bool(lent)
        self.check("serving never on a lent occupant's state", True, "")  # one per serving prepare
        for uid in lent:
            sus = data.suspensions.get(uid)
            ok = sus is not None and sus.state in (SUSPENDED, CHECKPOINTED_EVICTED, ENFORCED_EVICTED)
            if sus is not None and sus.state == ENFORCED_EVICTED and self._enforced_by_fault(node, uid):
                continue
            if sus is not None and sus.state == ENFORCED_EVICTED:
                self.fail(f"lent claim {uid} on {node} was enforced on (killed): its RL state is lost")
            mem = drv.plugin_dir / "claims" / uid / "device-memory"
            resident = mem.stat().st_blocks * 512 if mem.exists() else 0
            if sus is not None and sus.state == SUSPEND_FAILED and resident == 0 and uid == self.trainer_claim:
                # the real trainer's suspend refused (its fallback checkpoint could not be written) and
                # its device observed free: the driver serves (its contract); the trainer keeps its state
                # in its own process on the host (it holds no simulated device memory: on a GPU this
                # would be an enforcement). Counted, not a loss: its pod and bit-exactness are judged.
                self.fig.serving_over_failed_suspend += 1
                self.note(
                    f"serving claim {serving['metadata']['name']} prepared over the trainer's failed suspend "
                    f"({node} GPU {index}, 0 B resident)"
                )
                ok = True
            self.check(
                "serving never on a lent occupant's state",
                ok and resident == 0,
                f"serving claim {serving['metadata']['name']} prepared on {node} GPU {index} while lent claim "
                f"{uid} is {sus.state if sus else 'not suspended'} ({resident} B resident)",
            )

    # -------------------------------------------------------------- the trainer
    def _start_trainer(self, node: str, claim_uid: str, pod: Any) -> None:
        from dra_driver import cdi

        self.trainer_claim = claim_uid
        drv = self.drivers[node]
        edits = json.loads((drv.cdi_dir / cdi.spec_filename(claim_uid)).read_text())["containerEdits"]
        env_c = dict(e.split("=", 1) for e in edits.get("env", []))
        sock = Path(edits["mounts"][0]["hostPath"]) / Path(env_c[cdi.ENV_AGENT_SOCKET]).name
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROSE_")}
        env.update(
            PYTHONPATH=str(REPO),
            ROSE_AGENT_SOCKET=str(sock),
            ROSE_POD_UID=pod.metadata.uid,
            ROSE_POD_NAMESPACE=NS,
            ROSE_POD_NAME=pod.metadata.name,
        )
        if self.ckpt_dir is not None:  # the job's checkpointPath, as the controller sets it on the pod
            env["ROSE_CHECKPOINT_PATH"] = str(self.ckpt_dir / "trainer.ckpt")
        # it lingers (at safe points) until 80 % of the slice is played, then saves and exits; a wall
        # time, since its own linger starts when its updates end (a linger in seconds from its start
        # outlasted the drain once its updates ran unhindered)
        until = time.time() + max(2.0, 0.8 * self.duration_s - (time.monotonic() - self.t_start))
        self.trainer_args = ["--updates", str(self.p.trainer_updates), "--seed", "3"]
        argv, preexec = dying_with_parent([sys.executable, str(TRAINER), "--out", str(self.tmp / "trainer.pt"),
                                           *self.trainer_args, "--linger-until", f"{until:.0f}"])  # fmt: skip
        with (self.tmp / "trainer.log").open("ab") as f:
            self.trainer = subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            preexec_fn=preexec)  # fmt: skip  # noqa: PLW1509
        self.note(f"trainer: examples/{TRAINER.name} on {pod.metadata.name} ({node}), agent socket of its claim")

    def _reference(self) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROSE_")}
        env["PYTHONPATH"] = str(REPO)
        out = str(self.tmp / "reference.pt")
        argv, preexec = dying_with_parent(["nice", sys.executable, str(TRAINER), "--out", out,
                                           "--updates", str(self.p.trainer_updates), "--seed", "3"])  # fmt: skip
        return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                preexec_fn=preexec)  # fmt: skip  # noqa: PLW1509

    def _bit_exact(self) -> dict[str, Any]:
        import torch

        a = torch.load(self.tmp / "trainer.pt", weights_only=False)
        b = torch.load(self.tmp / "reference.pt", weights_only=False)

        def eq(x: Any, y: Any) -> bool:
            if isinstance(x, torch.Tensor):
                return isinstance(y, torch.Tensor) and bool(torch.equal(x, y))
            if isinstance(x, dict):
                return isinstance(y, dict) and x.keys() == y.keys() and all(eq(x[k], y[k]) for k in x)
            if isinstance(x, list | tuple):
                return (
                    isinstance(y, list | tuple)
                    and len(x) == len(y)
                    and all(eq(u, v) for u, v in zip(x, y, strict=True))
                )
            return bool(x == y)

        same = {k: eq(a[k], b[k]) for k in ("model", "optimizer", "replay", "lengths", "rng", "per_update")}
        return {
            "identical": all(same.values()),
            "fields": same,
            "suspends": a["suspends"],
            "resumes": a["resumes"],
            "steps": len(a["lengths"]),
        }

    # -------------------------------------------------------------- observing
    def jobs_view(self) -> dict[str, tuple[dict[str, Any], list[dict[str, Any]]]]:
        from kubernetes import client

        from rose_common import names

        # the claims a driver has prepared (the played kubelet's record of its answers), read BEFORE the
        # pods: a driver writes what it did at a prepare (a standing suspend request acted on) before
        # the prepare returns, so pods listed after the record show it; listed before, a pod could look
        # un-suspended on a claim recorded prepared a moment later (group_holders would count it)
        with self.mu:
            prepared = {(r["node"], r["claim"]["metadata"]["name"]) for r in self.prepared.values()}
        objs = client.CustomObjectsApi(self.api).list_namespaced_custom_object(
            names.GROUP, names.VERSION, NS, names.PLURAL, _request_timeout=10
        )["items"]
        pods = (
            client.CoreV1Api(self.api)
            .list_namespaced_pod(NS, label_selector=names.LABEL_JOB, _request_timeout=10)
            .items
        )
        out: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
        for j in objs:
            ws = []
            for p in pods:
                if (p.metadata.labels or {}).get(names.LABEL_JOB) != j["metadata"][
                    "name"
                ] or p.metadata.deletion_timestamp:
                    continue
                ann = p.metadata.annotations or {}
                state = ann.get(names.ANNOTATION_SUSPEND_STATE, "Running") if p.status.phase == "Running" else "Pending"
                if state == "Running" and names.ANNOTATION_SUSPEND_REQUEST in ann:
                    state = "Requested"
                used = [st.resource_claim_name for st in p.status.resource_claim_statuses or []]
                used += [rc.resource_claim_name for rc in p.spec.resource_claims or [] if rc.resource_claim_name]
                ws.append(
                    {
                        "name": p.metadata.name,
                        "node": p.spec.node_name or "",
                        "state": state,
                        "uid": p.metadata.uid,
                        "fenced": names.ANNOTATION_FENCING_TOKEN in ann,
                        "prepared": any((p.spec.node_name, c) in prepared for c in used),
                    }
                )
            out[j["metadata"]["name"]] = (j, ws)
        return out

    @staticmethod
    def _placed(job: dict[str, Any], workers: list[dict[str, Any]]) -> bool:
        waiting = serving_waiting(job, workers)
        return any(w["node"] and w["prepared"] and w["name"] not in waiting for w in workers)

    def not_converged(self) -> str:
        """ "" once every job is at its planned target, the controller alive, and the kubelet's work done."""
        for name in ("controller", "extender", "predictor", "orchestrator"):
            if name in self.procs and not self.procs[name].alive():
                return f"{name} not running"
        if self.p.timeslice and not self._orchestrator_leads():
            return "orchestrator not the leader (yet)"
        from rose_common import promtext

        for node, drv in self.drivers.items():
            if drv.proc.poll() is not None or _get(f"http://127.0.0.1:{drv.metrics_port}/metrics")[0] != 200:
                return f"rose driver of {node} not serving"
        code, text = _get(f"http://127.0.0.1:{self.ctl_port}/metrics")
        if code != 200:
            return "controller /metrics not answering"
        if promtext.value(text, "rose_controller_leader", {}, default=0.0) != 1.0:
            return "controller not the leader (yet)"
        if promtext.value(text, "rose_controller_reconciles_total", {}, default=0.0) < 1:
            return "controller has not reconciled since it started"
        if promtext.value(text, "rose_controller_forecast_stale", {}, default=0.0) > 0:
            return "controller without a fresh forecast"
        for pl in self.pools:
            code, body = _get(f"http://127.0.0.1:{self.pred_port}/v1/forecast?pool={pl}")
            if code != 200 or json.loads(body).get("stale", True):
                return f"no fresh forecast for {pl} (HTTP {code})"
        view = self.jobs_view()
        for name, (j, ws) in sorted(view.items()):
            # a group member's devices are the orchestrator's to give: it is judged as the group
            why = group_member_ready(j, ws) if name in TS_JOBS else job_converged(j, ws)
            if why:
                return f"{name}: {why}"
        # a member counts once a driver prepared its worker's claim: the shared claim refused on a GPU
        # serving holds leaves the group nothing to grant on (its hand-overs fail and roll back)
        # a member whose worker waits for serving (its GPU is serving's: ServingHoldsGPU) is not placed either
        placed = sum(1 for n in TS_JOBS if self._placed(*view.get(n, ({}, []))))
        why = group_converged(self.group_lease(), self.ts_token_before, placed) if self.p.timeslice else ""
        if why:
            return f"time-slice group {TS_GROUP}: {why}"
        with self.mu:
            if self.inflight:
                return f"{len(self.inflight)} kubelet prepares in flight"
        return ""

    def observe(self) -> None:
        """One round of the invariants that hold at every moment, and the RL accounting."""

        twice = devices_allocated_twice(self.round_claims)
        self.check("no device allocated twice", not twice, json.dumps(twice))
        view = self.jobs_view()
        active = 0
        for name, (j, _ws) in view.items():
            st = j.get("status") or {}
            n = int(st.get("suspendCount") or 0)
            prev = self.suspend_counts.get(name, 0)
            self.check("no job's suspend count goes back", n >= prev, f"{name}: suspendCount {prev} -> {n}")
            self.suspend_counts[name] = max(n, prev)
            active += int(st.get("activeGPUs") or 0)
        holders = group_holders({n: ws for n, (_j, ws) in view.items() if n in TS_JOBS})
        self.ts_max_holders = max(self.ts_max_holders, len(holders))
        if self.p.timeslice:
            self.ts_rounds += 1
            for member in TS_JOBS:
                if member in view and group_member_ready(*view[member]):
                    self.ts_not_at_target[member] += 1
        self.check(
            "no two members of the time-slice group hold its devices at once",
            len(holders) <= 1,
            f"group {TS_GROUP}: {holders} un-suspended by their drivers after a hand-over",
        )
        self._check_driver_evictions()
        if self.trainer is not None and self.trainer.poll() not in (None, 0):
            log = self.tmp / "trainer.log"
            tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
            self.fail(f"the trainer exited with {self.trainer.returncode}: {log}; its last lines:\n" + "\n".join(tail))
        return None if active is None else self._account(active)

    def _check_driver_evictions(self) -> None:
        """Invariant: no lent worker is evicted with its state (a simulated occupant has no step
        counter of its own: the driver's log of its evictions is where a loss shows). Exempt, and
        counted apart: an eviction while a fault held every tier of that node full and the workload
        had no checkpoint channel (``tiers_full_eviction``). Also counts the spills to disk."""
        now = time.time()
        windows = [*self.tiers_full, *((n, a, now + 60.0) for n, a in self.tiers_full_open.items())]
        for node in self.drivers:
            path = self.driver_root / f"{node}.log"
            off = self.log_offsets.get(node, 0)
            try:
                with path.open("rb") as f:
                    f.seek(off)
                    chunk = f.read()
            except OSError:
                continue
            done = chunk.rfind(b"\n") + 1  # whole lines only
            self.log_offsets[node] = off + done
            t = tally_driver_log(chunk[:done].decode(errors="replace").splitlines(), node, windows)
            self.spills_to_disk += t.spills
            if t.by_fault:
                self.evicted_by_fault.extend(f"{node}: {x}" for x in t.by_fault)
                self.note(f"evicted while every tier of {node} was full by the fault: " + "; ".join(t.by_fault))
            self.check("no lent worker evicted with its state", not t.lost, f"{node}: " + "; ".join(t.lost))

    def _account(self, active: int) -> None:
        now = time.monotonic()
        last = getattr(self, "_acc_t", now)
        self._acc_t = now
        if not self.ended:  # the played slice only
            self.fig.useful_gpu_s += active * (now - last) * self.p.speed

    # -------------------------------------------------------------- faults
    def _kill_driver(self, node: str, why: str) -> None:
        """SIGKILL (from any thread); the main loop's :meth:`restart_dead` starts it again."""
        self.drivers[node].kill9()
        self.note(f"fault: SIGKILL rose driver of {node} ({why})")

    def restart_dead(self) -> None:
        """As a DaemonSet / Deployment would: start again what died (main thread only)."""
        for node, drv in self.drivers.items():
            if drv.restart_if_dead():
                self.note(f"rose driver of {node} started again")
        for name in ("controller", "extender", "orchestrator"):
            if name in self.procs and not self.procs[name].alive():
                self.procs[name].start()
                self.note(f"{name} started again")
        if not self.procs["predictor"].alive() and not self.predictor_held_down:
            self.procs["predictor"].start()
            self.note("predictor started again")

    def inject(self, f: Fault) -> float | None:
        """Carry out one fault; returns the monotonic time from which convergence is measured
        (None: the fault could not be set up at this moment, e.g. nothing to kill a suspend of)."""
        kind = f.kind
        if kind in ("kill-controller", "kill-extender", "kill-predictor", "kill-orchestrator"):
            comp = kind.removeprefix("kill-")
            self.procs[comp].kill9()
            self.note(f"fault: SIGKILL {comp}")
        elif kind == "kill-driver":
            self._kill_driver(f.target, "at a random time")
            time.sleep(1.0)
        elif kind == "kill-driver-mid-suspend":
            give_up = time.monotonic() + 60.0  # wait (the system running on) for a running lent occupant
            while not self._force_serving_onto_lent(f.target, quiet=time.monotonic() < give_up):
                if time.monotonic() >= give_up or self.stop.is_set():
                    return None
                self.tick()
        elif kind in ("restart-apiserver", "restart-etcd"):
            comp = "kube-apiserver" if kind == "restart-apiserver" else "etcd"
            took = self.lc.restart(comp)
            self.note(f"fault: SIGKILL {comp}, started again (healthy after {took:.1f}s)")
        elif kind == "host-memory-full":
            self._host_memory_full(f)
        elif kind == "checkpoint-dir-full":
            if not self._checkpoint_dir_full():
                return None
        elif kind == "predictor-down":
            self.predictor_held_down = True
            self.procs["predictor"].kill9()
            down = self.p.forecast_max_age_s + 10
            self.note(f"fault: predictor down for {down:g}s (> --forecast-max-age {self.p.forecast_max_age_s:g}s)")
            end = time.monotonic() + down
            while time.monotonic() < end and not self.stop.is_set():
                self.tick()
            self.predictor_held_down = False
        else:
            raise ValueError(f"unknown fault {kind}")
        return time.monotonic()

    def _set_budget(self, node: str, budget: str, spill: str = SPILL_BUDGET) -> None:
        """SIGKILL ``node``'s driver and start it again (main thread) with ``--host-memory-budget
        budget`` and ``--spill-budget-bytes spill``."""
        drv = self.drivers[node]
        for flag, v in (("--host-memory-budget", budget), ("--spill-budget-bytes", spill)):
            drv.args[drv.args.index(flag) + 1] = v
        drv.kill9()
        drv.restart_if_dead()

    def _host_memory_full(self, f: Fault) -> None:
        """The host-memory budget full on one node for ``host_full_s``: its driver restarted with a
        budget of exactly what its suspended occupants hold now (no room for one more state; a
        DaemonSet rolled out with a smaller budget), then restarted with the normal one. The node
        with most running lent occupants is chosen (a reclaim there is what the fault is about).
        Expected: the extender places no new RL worker there (host memory published full); a
        reclaim there is refused by the suspend engine (checkpoint-and-evict fallback where the
        workload has a checkpoint channel; a simulated occupant has none: its loss would break
        the invariant "no RL state lost")."""
        from rose_common import promtext

        view = self.jobs_view()
        running = {w["uid"] for _j, ws in view.values() for w in ws if w["state"] == "Running"}
        with self.mu:
            lent = [r for r in self.prepared.values() if r["role"] != "serving"]
        pods = {w["name"]: w["uid"] for _j, ws in view.values() for w in ws}
        per: dict[str, int] = {}
        for r in lent:
            if pods.get(r["pod"]) in running:
                per[r["node"]] = per.get(r["node"], 0) + 1
        node = busiest_node(per, self.h.node_names)
        held = 0.0
        with contextlib.suppress(Exception):
            held = promtext.value(
                "\n".join(self.drivers[node].metrics()), "rose_suspend_host_memory_held_bytes", {}, default=0.0
            )
        # full: what it holds, but at least one occupant's state (a DRAM tier smaller than one state
        # cannot take it even after spilling every other one: no node runs so; the disk tier has room)
        budget = max(int(held), OCCUPANT_GIB << 30)
        self._set_budget(node, str(budget))
        rec: dict[str, Any] = {
            "node": node,
            "running_lent_there": per.get(node, 0),
            "held_bytes": int(held),
            "budget_bytes": budget,
        }
        self.note(
            f"fault: host-memory budget of {node} full ({budget} B, what it holds, at least one state) for "
            f"{self.p.host_full_s:g}s; {per.get(node, 0)} running lent occupants there"
        )
        self.host_full.append(rec)
        end = time.monotonic() + self.p.host_full_s
        forced = not self.p.host_full_force
        while time.monotonic() < end and not self.stop.is_set():
            self.tick()
            if not forced and time.monotonic() > end - self.p.host_full_s + 5:  # the driver back up
                forced = self._force_serving_onto_lent(node, quiet=True, kill=False, only=True)
                rec["forced_reclaim"] = forced
        self._end_bursts()
        text = ""
        with contextlib.suppress(Exception):
            text = "\n".join(self.drivers[node].metrics())
        rec["refused_fallbacks"] = {
            r: promtext.value(text, "rose_suspend_fallbacks_total", {"reason": r}, default=0.0)
            for r in ("host_memory_budget",)
        }
        rec["suspends"] = promtext.value(
            text, "rose_driver_occupant_suspend_total", {"outcome": "suspended"}, default=0.0
        )
        # the driver was restarted as the window began: its counters are the window's
        rec["spills_to_disk"] = promtext.value(
            text, "rose_suspend_spills_total", {"direction": "to_disk", "result": "ok"}, default=0.0
        )
        rec["disk_tier_bytes"] = promtext.value(text, "rose_driver_host_state_bytes", {"tier": "disk"}, default=0.0)
        self._set_budget(node, HOST_BUDGET)
        self.note(f"host-memory budget of {node} back to {HOST_BUDGET} ({rec})")
        self.check(
            "host memory full: no reclaim refused for the budget (the disk tier takes the state)",
            rec["refused_fallbacks"]["host_memory_budget"] == 0,
            json.dumps(rec),
        )

    def _trainer_running(self) -> tuple[str, str] | None:
        """(node, pod UID) of the trainer's worker when it runs un-suspended on a prepared claim."""
        view = self.jobs_view()
        ws = [w for w in view.get("trainer", ({}, []))[1] if w["state"] == "Running" and w["node"]]
        with self.mu:
            prepared = {r["pod"] for r in self.prepared.values()}
        return next(((w["node"], w["uid"]) for w in ws if w["name"] in prepared), None)

    def _fallback_refusals(self, node: str, pod_uid: str) -> tuple[float, int]:
        """What the driver exposes of refused fallbacks: its ``rose_suspend_fallbacks_total`` (all
        reasons, since it started) and the ``SuspendFallbackCheckpointFailed`` Events on the pod."""
        from kubernetes import client

        from rose_common import promtext

        text = ""
        with contextlib.suppress(Exception):
            text = "\n".join(self.drivers[node].metrics())
        fallbacks = promtext.value(text, "rose_suspend_fallbacks_total", {}, default=0.0)
        events = client.CoreV1Api(self.api).list_namespaced_event(NS, _request_timeout=10).items
        failed = sum(
            (e.count or 1)
            for e in events
            if e.reason == "SuspendFallbackCheckpointFailed" and e.involved_object.uid == pod_uid
        )
        return fallbacks, failed

    def _checkpoint_dir_full(self) -> bool:
        """The trainer job's checkpoint directory full for ``ckpt_full_s``; False: not set up (the
        trainer's worker not running within 60 s). To make the driver ask for a checkpoint, the
        trainer's node's host-memory budget is made full as well (as ``host-memory-full`` does) and
        a serving burst is pinned onto its GPU: the reclaim's suspend is refused by the budget, the
        checkpoint-and-evict fallback asks the trainer for a durable checkpoint, which cannot be
        written. Expected: the driver does not evict (a ``SuspendFallbackCheckpointFailed`` Event
        and ``rose_suspend_fallbacks_total``: the refusal visible), the trainer keeps its pod and
        its state; once the directory has room and the budget is back, the system converges."""

        from rose_common import promtext

        if self.ckpt_dir is None:
            raise SoakFailure("checkpoint-dir-full without a checkpoint directory")
        give_up = time.monotonic() + 60.0
        where = self._trainer_running()
        while where is None:
            if time.monotonic() >= give_up or self.stop.is_set():
                self.note("fault skipped: the trainer's worker not running within 60 s (checkpoint-dir-full)")
                return False
            self.tick()
            where = self._trainer_running()
        node, uid = where
        filler = self.ckpt_dir / "filler"
        fill_until_enospc(filler)
        st = os.statvfs(self.ckpt_dir)
        rec: dict[str, Any] = {"node": node, "pod_uid": uid, "free_bytes": st.f_bavail * st.f_frsize}
        held = 0.0
        with contextlib.suppress(Exception):
            held = promtext.value(
                "\n".join(self.drivers[node].metrics()), "rose_suspend_host_memory_held_bytes", {}, default=0.0
            )
        log_path = self.driver_root / f"{node}.log"
        since = log_path.stat().st_size if log_path.exists() else 0
        # every tier of the node full (DRAM and disk: budgets of 1 B, what they hold stays), so the
        # trainer's suspend finds no room and asks for the checkpoint that cannot be written. An
        # occupant of that node with no checkpoint channel reclaimed now is evicted by design
        # (counted apart). A DRAM budget of "what it holds" (``held``, read from the driver's metric
        # just before its restart) was not full: a 64 GiB suspend finishing around the read, or the
        # restarted driver's ledger not yet charged again, left room (T7 run g5; groupwait run g2).
        rec["held_bytes"] = int(held)
        self.tiers_full_open[node] = time.time()
        self._set_budget(node, DRAM_FULL, DISK_FULL)
        self.note(
            f"fault: checkpoint directory of trainer full ({rec['free_bytes']} B free) for "
            f"{self.p.ckpt_full_s:g}s; host-memory budget and disk tier of {node} full; reclaim of its GPU forced"
        )
        self.ckpt_full.append(rec)
        end = time.monotonic() + self.p.ckpt_full_s
        forced = False
        while time.monotonic() < end and not self.stop.is_set():
            self.tick()
            # once the trainer registered again with its restarted driver (its checkpoint channel: a
            # reclaim before that finds none and is enforced, the loss the eviction check catches)
            if not forced and registered_since(log_path, since, uid):
                forced = self._force_serving_onto_lent(node, quiet=True, kill=False, only=True, pod="trainer-w0")
                rec["forced_reclaim"] = forced
        rec["fallbacks"], rec["fallback_failed_events"] = self._fallback_refusals(node, uid)
        view = self.jobs_view()
        uids = [w["uid"] for w in view.get("trainer", ({}, []))[1]]
        rec["trainer_pod_kept"] = uid in uids
        filler.unlink()
        self._end_bursts()
        self._set_budget(node, HOST_BUDGET)
        self.tiers_full.append((node, self.tiers_full_open.pop(node), time.time()))
        self.note(
            f"checkpoint directory has room again, budgets of {node} back to {HOST_BUDGET} / {SPILL_BUDGET} ({rec})"
        )
        self.check(
            "checkpoint dir full: the trainer keeps its worker (no eviction without a checkpoint)",
            rec["trainer_pod_kept"],
            f"trainer's worker {uid} gone: {uids}",
        )
        if forced:
            self.check(
                "checkpoint dir full: the refused checkpoint is visible (Event or metric)",
                rec["fallbacks"] > 0 or rec["fallback_failed_events"] > 0,
                json.dumps(rec),
            )
        return True

    def _force_serving_onto_lent(
        self, prefer: str, quiet: bool = False, kill: bool = True, only: bool = False, pod: str = ""
    ) -> bool:
        """For the mid-suspend kill: a serving pod pinned to a GPU of ``node`` that holds a running
        lent occupant, so its prepare must suspend it (and the driver dies 0.4 s into that)."""
        from kubernetes import client

        from rose_common import names

        view = self.jobs_view()
        running = {w["uid"] for _j, ws in view.values() for w in ws if w["state"] == "Running"}
        with self.mu:
            lent = [r for r in self.prepared.values() if r["role"] != "serving"]
        lent.sort(key=lambda r: (r["node"] != prefer, r["pod"] == "trainer-w0"))  # the planned node first
        pods = client.CoreV1Api(self.api).list_namespaced_pod(NS, label_selector=names.LABEL_JOB).items
        uid_of = {p.metadata.name: p.metadata.uid for p in pods}
        target = next(
            (
                r
                for r in lent
                if uid_of.get(r["pod"]) in running
                and (not only or r["node"] == prefer)
                and (not pod or r["pod"] == pod)
            ),
            None,
        )
        if target is None:
            if not quiet:
                self.note("fault skipped: no running lent occupant anywhere for a mid-suspend kill within 60 s")
            return False
        node = target["node"]
        if kill and self.p.serving_wait == "prepare":
            self.kill_mid_suspend = node  # the played kubelet's prepare suspends: killed 0.4 s into it
        index = self._gpu_index(target["claim"])
        from local_cluster.objects import claim_template, create_claim_template

        name = f"burst-{int(time.monotonic() * 1000) % 10**8}"
        sel = [f'device.attributes["{names.DRIVER_NAME}"].{names.ATTR_INDEX} == {index}']
        create_claim_template(self.api, NS, claim_template(name, names.DEVICE_CLASS_SERVING, selectors=sel))
        from local_cluster.objects import gpu_pod

        body = gpu_pod(name, name, labels={names.LABEL_ROLE: "serving", "soak": "burst"}, node_name=node)
        client.CoreV1Api(self.api).create_namespaced_pod(NS, body)
        if kill and self.p.serving_wait == "prebind":  # the driver suspends once the scheduler allocated the claim
            threading.Timer(PREBIND_KILL_AFTER_S, self._kill_driver, (node, "mid-suspend (prebind)")).start()
        self.bursts.append(name)
        self.note(
            f"fault: serving burst {name} onto {node} GPU {index} (lent to {target['pod']})"
            + ("; its driver dies inside the suspend" if kill else "")
        )
        return True

    def _end_bursts(self) -> None:
        from kubernetes import client

        for name in self.bursts:
            with contextlib.suppress(Exception):
                client.CoreV1Api(self.api).delete_namespaced_pod(name, NS, grace_period_seconds=0)
            with contextlib.suppress(Exception):
                client.ResourceV1Api(self.api).delete_namespaced_resource_claim_template(name, NS)
        self.bursts = []

    # -------------------------------------------------------------- the loop
    def scale_serving(self) -> None:
        from kubernetes import client

        k = HISTORY_ROWS + self.row_now()
        for pl in self.pools:
            want = 0 if self.ended else int(min(self.busy[pl][k], self.cap[pl]))
            if self.replicas.get(pl) != want:
                client.AppsV1Api(self.api).patch_namespaced_deployment_scale(
                    f"serve-{pl}", NS, {"spec": {"replicas": want}}, _request_timeout=10
                )
                self.replicas[pl] = want

    def tick(self) -> None:
        """One round: serving scaled to the trace, the kubelet's work, the invariants. API errors
        while the control plane is down are expected and retried."""
        self.restart_dead()
        try:
            self.scale_serving()
            self.kubelet_round(self.pool)
            self.observe()
        except SoakFailure:
            raise
        except Exception as e:
            self.api_errors += 1
            if self.api_errors % 20 == 1:
                self.note(f"(API error, retried: {type(e).__name__}: {str(e)[:120]})")
        time.sleep(0.5)

    def run(self) -> dict[str, Any]:
        p = self.p
        self.bursts = []
        self.ended = False
        self.round_claims = []
        self.replicas = {}
        self.api_errors = 0
        plan = fault_plan(p.seed, self.duration_s, p.faults, self.h.node_names, p.kinds, spacing_s=p.fault_spacing_s)
        self.say(
            f"played: rows {p.start_row}..{p.start_row + self.rows} of {p.series.name} ({p.hours:g} h at "
            f"{p.speed:g}x = {self.duration_s:.0f} s); faults (seed {p.seed}): "
            + ", ".join(f"{f.kind}{'@' + f.target if f.target else ''} at {f.at_s:.0f}s" for f in plan)
        )
        ref = self._reference()
        from kubernetes import client

        from rose_common import names

        with ThreadPoolExecutor(max_workers=8) as self.pool:
            self.t_start = time.monotonic()
            for name, lo, hi, prio in JOBS:
                body = job_manifest(name, lo, hi, prio)
                if name == "trainer" and self.ckpt_dir is not None:
                    body["spec"]["checkpointPath"] = str(self.ckpt_dir / "trainer.ckpt")
                client.CustomObjectsApi(self.api).create_namespaced_custom_object(
                    names.GROUP, names.VERSION, NS, names.PLURAL, body
                )
            for name in TS_JOBS if p.timeslice else ():
                body = job_manifest(name, 1, 1, TS_PRIORITY, TS_GROUP)
                client.CustomObjectsApi(self.api).create_namespaced_custom_object(
                    names.GROUP, names.VERSION, NS, names.PLURAL, body
                )
            self.note(
                f"applied {len(JOBS) + len(TS_JOBS)} ElasticRLJobs: "
                + ", ".join(f"{n} ({lo}-{hi} GPUs)" for n, lo, hi, _ in JOBS)
                + f", time-slice group {TS_GROUP}: "
                + ", ".join(f"{n} (1 GPU, shared)" for n in TS_JOBS)
            )
            ts_threads = [
                threading.Thread(target=self._ts_client, args=(n,), daemon=True, name=f"ts-{n}")
                for n in (TS_JOBS if p.timeslice else ())
            ]
            for t in ts_threads:
                t.start()
            pending = list(plan)
            while time.monotonic() - self.t_start < self.duration_s and not self.stop.is_set():
                if pending and time.monotonic() - self.t_start >= pending[0].at_s:
                    f = pending.pop(0)
                    self._fault(f)
                    continue
                self.tick()
            self._drain()
            self.stop.set()
        self._end_bursts()
        ref.wait(timeout=600)
        return self._finish()

    def _drain(self) -> None:
        """After the played slice: serving leaves (scaled to 0) and the system runs on until the
        real trainer has finished its updates and saved its state (at most ``drain_s``)."""
        if self.stop.is_set():
            return
        self.ended = True
        self.note("played slice over: serving scaled to 0, running on until the trainer finishes")
        end = time.monotonic() + self.p.drain_s
        while time.monotonic() < end and not self.stop.is_set():
            if self.trainer is not None and self.trainer.poll() is not None:
                return
            self.tick()
        self.fail(f"the trainer did not finish within {self.p.drain_s:g}s after the played slice")

    def _fault(self, f: Fault) -> None:
        t_fault = time.monotonic()
        sim_h = (t_fault - self.t_start) * self.p.speed / 3600
        try:  # convergence asks for a grant of the group after the fault
            self.ts_token_before = self.group_token()
        except Exception:
            self.ts_token_before = -1
        try:
            t_from = self.inject(f)
        except Exception as e:
            self.fail(f"fault {f.kind} could not be injected: {type(e).__name__}: {e}")
            return
        if t_from is None:
            self.fig.faults.append(
                {
                    "kind": f.kind,
                    "target": f.target,
                    "at_sim_h": round(sim_h, 2),
                    "converged_s": None,
                    "survived": None,
                    "skipped": True,
                }
            )
            return
        why = "?"
        seen: Counter[str] = Counter()  # every reason judged while waiting: which job kept it from converging
        settle = time.monotonic() + 2.0  # let the fault's effect be seen before judging convergence
        while not self.stop.is_set():
            self.tick()
            if f.kind == "kill-driver-mid-suspend" and self.bursts and time.monotonic() - t_from > 5:
                self._end_bursts()  # the burst leaves once its prepare went through (or not)
            if time.monotonic() < settle:
                continue
            try:
                why = self.not_converged()
            except Exception as e:
                why = f"API: {type(e).__name__}"
            seen[why or "bursts"] += 1
            if not why and not self.bursts:
                took = time.monotonic() - t_from
                self.fig.faults.append(
                    {
                        "kind": f.kind,
                        "target": f.target,
                        "at_sim_h": round(sim_h, 2),
                        "converged_s": round(took, 2),
                        "survived": True,
                    }
                )
                self.note(f"converged after {f.kind}: {took:.1f}s")
                return
            if time.monotonic() - t_from > self.p.converge_bound_s:
                self.fig.faults.append(
                    {
                        "kind": f.kind,
                        "target": f.target,
                        "at_sim_h": round(sim_h, 2),
                        "converged_s": None,
                        "survived": False,
                        "last": why,
                        "reasons": dict(seen.most_common(8)),
                    }
                )
                top = "; ".join(f"{n}x {r}" for r, n in seen.most_common(4))
                self.fail(f"not converged within {self.p.converge_bound_s:g}s after {f.kind}: {why} (judged: {top})")
                return

    def _timeslice_figures(self) -> dict[str, Any]:
        token = None
        with contextlib.suppress(Exception):
            token = self.group_token()
        return {
            "group": TS_GROUP,
            "members": list(TS_JOBS),
            "fencing_token_end": token,
            "turns_by_member": dict(self.ts_turns),
            "most_holders_seen": self.ts_max_holders,
            "rounds": self.ts_rounds,
            "rounds_member_not_at_target": dict(self.ts_not_at_target),
            "fencing_rejections": self._metric_sum("rose_driver_fencing_rejections_total"),
            "client_errors": self.ts_error_count,
            "client_errors_last": self.ts_errors[-5:],
        }

    def _metric_sum(self, name: str, labels: dict[str, str] | None = None) -> float:
        from rose_common import promtext

        total = 0.0
        for drv in self.drivers.values():
            with contextlib.suppress(Exception):
                total += promtext.value("\n".join(drv.metrics()), name, labels or {}, default=0.0)
        return total

    def _disk_tier_figures(self) -> dict[str, Any]:
        """Spills to disk (the drivers' logs), state per tier now, evictions the faults made inevitable."""
        return {
            "spills_to_disk": self.spills_to_disk,
            "state_bytes_by_tier": {
                t: self._metric_sum("rose_driver_host_state_bytes", {"tier": t}) for t in ("dram", "disk")
            },
            "evicted_while_every_tier_full_by_the_fault": len(self.evicted_by_fault),
            "evicted_while_every_tier_full": self.evicted_by_fault,
        }

    def _finish(self) -> dict[str, Any]:
        exact: dict[str, Any] = {}
        if self.trainer is not None:
            try:
                self.trainer.wait(timeout=180)
                exact = self._bit_exact()
                self.check("the real trainer's resumes are bit-exact", bool(exact["identical"]), json.dumps(exact))
            except Exception as e:
                self.fail(f"trainer did not finish or compare: {type(e).__name__}: {e}")
        else:
            self.fail("the trainer job's worker never got a prepared claim")
        suspends = self._metric_sum("rose_driver_occupant_suspend_total", {"outcome": "suspended"})
        kinds: dict[str, list[float]] = {}
        for f in self.fig.faults:
            if f["converged_s"] is not None:
                kinds.setdefault(f["kind"], []).append(f["converged_s"])
        conv = {
            k: {"n": len(v), "p50_s": round(percentile(v, 0.5) or 0, 2), "p99_s": round(percentile(v, 0.99) or 0, 2)}
            for k, v in sorted(kinds.items())
        }
        w = self.fig.serving_prepares
        return {
            "ok": self.failure is None,
            "failure": self.failure,
            "params": {
                "series": str(self.p.series),
                "hours": self.p.hours,
                "speed": self.p.speed,
                "faults": self.p.faults,
                "seed": self.p.seed,
                "start_row": self.p.start_row,
                "converge_bound_s": self.p.converge_bound_s,
                "forecast_max_age_s": self.p.forecast_max_age_s,
                "serving_wait": self.p.serving_wait,
                "host_full_force": self.p.host_full_force,
                "kinds": list(self.p.kinds),
            },
            "pools": {
                pl: {
                    "gpus": self.cap[pl],
                    "busy_min": int(self.busy[pl][HISTORY_ROWS:].min()),
                    "busy_max": int(self.busy[pl][HISTORY_ROWS:].max()),
                }
                for pl in self.pools
            },
            "jobs": [{"name": n, "minGPUs": lo, "maxGPUs": hi, "priority": pr} for n, lo, hi, pr in JOBS],
            "faults": {
                "injected": sum(1 for f in self.fig.faults if not f.get("skipped")),
                "skipped": sum(1 for f in self.fig.faults if f.get("skipped")),
                "survived": sum(1 for f in self.fig.faults if f["survived"]),
                "each": self.fig.faults,
                "converge_by_kind": conv,
            },
            "serving": {
                "prepares": len(w),
                "prepare_p50_s": percentile(w, 0.5),
                "prepare_p99_s": percentile(w, 0.99),
                "waits_over_0_5s": len(self.fig.serving_waits),
                "prepares_on_a_lent_gpu": self.fig.serving_on_lent_gpu,
                "prepares_over_the_trainers_failed_suspend": self.fig.serving_over_failed_suspend,
                "wait_p99_s": percentile(self.fig.serving_waits, 0.99),
                "pod_created_to_prepared_p99_s": percentile(self.fig.serving_pending_s, 0.99),
                "driver_serving_wait_seconds_sum": self._metric_sum("rose_driver_serving_wait_seconds_sum"),
            },
            "rl": {
                "useful_gpu_hours": round(self.fig.useful_gpu_s / 3600, 2),
                "trainer": exact,
                "suspends_since_last_driver_restart": suspends,
                "suspend_count_by_job": self.suspend_counts,
            },
            "checks": self.fig.checks,
            "prepare_errors": prepare_error_summary(self.fig.prepare_errors),
            "host_memory_full": self.host_full,
            "disk_tier": self._disk_tier_figures(),
            "checkpoint_dir_full": self.ckpt_full,
            "timeslice": self._timeslice_figures() if self.p.timeslice else None,
            "api_errors": self.api_errors,
            "timeline": self.events,
        }

    def diagnose(self) -> None:
        """On a failure, before the teardown: the cluster's view (pods, jobs, claims, Events) and
        the drivers' logs into the workdir (``diagnose.json``, ``drivers/``), as evidence."""
        import shutil

        from kubernetes import client

        from rose_common import names

        out: dict[str, Any] = {"failure": self.failure}
        with contextlib.suppress(Exception):
            core = client.CoreV1Api(self.api)
            out["pods"] = [
                {
                    "name": p.metadata.name,
                    "uid": p.metadata.uid,
                    "phase": p.status.phase,
                    "node": p.spec.node_name,
                    "annotations": p.metadata.annotations,
                    "conditions": [(c.type, c.status, c.reason, c.message) for c in p.status.conditions or []],
                    "claims": [(c.name, c.resource_claim_name) for c in p.status.resource_claim_statuses or []],
                }
                for p in core.list_namespaced_pod(NS).items
            ]
            out["jobs"] = client.CustomObjectsApi(self.api).list_namespaced_custom_object(
                names.GROUP, names.VERSION, NS, names.PLURAL
            )["items"]
            out["claims"] = [
                {"name": c["metadata"]["name"], "status": c.get("status")}
                for c in client.CustomObjectsApi(self.api).list_namespaced_custom_object(
                    "resource.k8s.io", "v1", NS, "resourceclaims"
                )["items"]
            ]
            evs = core.list_namespaced_event(NS).items
            evs.sort(key=lambda e: str(e.last_timestamp or e.event_time))
            out["events"] = [
                f"{e.last_timestamp or e.event_time} {e.involved_object.name} {e.reason}: {e.message}" for e in evs
            ][-300:]
        with self.mu:
            out["prepared"] = {u: {k: v for k, v in r.items() if k != "claim"} for u, r in self.prepared.items()}
        (self.tmp / "diagnose.json").write_text(json.dumps(out, indent=1, default=str))
        (self.tmp / "drivers").mkdir(exist_ok=True)
        for node in self.drivers:
            with contextlib.suppress(OSError):
                shutil.copy(self.driver_root / f"{node}.log", self.tmp / "drivers" / f"{node}.log")
        self.say(f"diagnosis: {self.tmp / 'diagnose.json'}, driver logs in {self.tmp / 'drivers'}")

    def close(self) -> None:
        if self.trainer is not None and self.trainer.poll() is None:
            self.trainer.kill()
        if self.failure is not None and hasattr(self, "api"):
            with contextlib.suppress(Exception):
                self.diagnose()
        self.stack.close()


def simulate_slice(p: Params, pool_gpus: int, pools: Sequence[str] = ("pool-a", "pool-b")) -> dict[str, Any]:
    """The same slice through ``rose simulate`` (rose_sim as a library): both pools in one
    simulation (pool-b the trace ``POOL_SHIFT_ROWS`` later, as played), the week before as their
    history, the played hours evaluated, the soak's jobs across the pools, 1-minute ticks."""
    from predictor.series import read_series_csv
    from rose_sim.engine import SimConfig, default_policies
    from rose_sim.inputs import CostModel, demand_from_values, parse_jobs
    from rose_sim.report import simulate

    s = read_series_csv(p.series)
    rows = max(1, round(p.hours * 3600 / ROW_S))
    demands = []
    for i, _pl in enumerate(pools):
        first = i * POOL_SHIFT_ROWS + p.start_row - HISTORY_ROWS
        vals = s.values[first : first + HISTORY_ROWS + rows]
        # every pool on the first pool's clock (the simulation's pools share one time axis)
        demands.append(
            demand_from_values(
                s.start + (p.start_row - HISTORY_ROWS) * ROW_S,
                vals,
                ROW_S,
                tick_s=60,
                history_s=HISTORY_ROWS * ROW_S,
                pool_gpus=pool_gpus,
                min_evaluated_s=rows * ROW_S,
            )
        )
    jobs = parse_jobs([(f"soak job {n}", job_manifest(n, lo, hi, pr)) for n, lo, hi, pr in JOBS])
    wanted = ("oracle", "baseline", "model")
    cfg = SimConfig(pool_gpus=pool_gpus, risk="0.05", dwell_s=300.0, pool_name=pools[0])
    more = tuple((pl, pool_gpus, d) for pl, d in zip(pools[1:], demands[1:], strict=True))
    rep = simulate(demands[0], jobs, CostModel(), cfg, wanted, default_policies(wanted), more_pools=more)
    return {"pool_gpus": rep["pool_gpus"], "evaluated_days": rep["evaluated_days"], "results": rep["results"]}


def run_soak(p: Params, say: Callable[[str], None] = log) -> dict[str, Any]:
    s = Soak(p, say)
    try:
        s.setup()
        report = s.run()
    except SoakFailure as e:
        report = {"ok": False, "failure": str(e), "timeline": s.events}
    finally:
        s.close()
    if p.simulate:
        keep = (
            "rl_useful_gpu_hours",
            "rl_lent_gpu_hours",
            "rl_steps",
            "serving_waits",
            "serving_wait_p99_s",
            "suspends",
            "suspends_per_day",
            "evictions_per_day",
            "planned_reclaims",
            "unplanned_reclaims",
            "rl_lent_gpu_hours_by_pool",
        )
        try:
            r = simulate_slice(p, 2 * p.gpus_per_node)
            sim: dict[str, Any] = {k: {f: v.get(f) for f in keep} for k, v in r["results"].items()}
        except Exception as e:  # reported, the soak's own verdict stands
            sim = {"error": f"{type(e).__name__}: {e}"}
        report["simulate"] = {
            "note": "rose_sim.report.simulate on the same slice: both pools "
            f"({2 * p.gpus_per_node} GPUs each) in "
            "one simulation, the soak's three jobs; its own cost model and forecasters, "
            "not the soak's faults (benchmarks.sim_to_real compares like for like)",
            "policies": sim,
        }
    return report


def summary(r: dict[str, Any]) -> str:
    lines = [f"soak: {'PASS' if r.get('ok') else 'FAIL: ' + str(r.get('failure'))}"]
    if "faults" in r:
        f = r["faults"]
        lines.append(f"faults injected {f['injected']}, survived {f['survived']}")
        for k, v in f["converge_by_kind"].items():
            lines.append(f"  {k}: converged n={v['n']} p50 {v['p50_s']}s p99 {v['p99_s']}s")
        sv = r["serving"]
        lines.append(
            f"serving prepares {sv['prepares']} (p50 {sv['prepare_p50_s']}, p99 {sv['prepare_p99_s']} s); "
            f"waits > 0.5 s: {sv['waits_over_0_5s']} (p99 {sv['wait_p99_s']} s)"
        )
        rl = r["rl"]
        lines.append(
            f"RL useful GPU-hours {rl['useful_gpu_hours']}; trainer {rl['trainer']}; "
            f"suspendCount by job {rl['suspend_count_by_job']}"
        )
        if "disk_tier" in r:
            d = r["disk_tier"]
            lines.append(
                f"disk tier: {d['spills_to_disk']} spills to disk; evicted while every tier was full by the fault: "
                f"{d['evicted_while_every_tier_full_by_the_fault']}"
            )
        lines.append(f"checks: {r['checks']}")
    return "\n".join(lines)


def _n(x: Any, nd: int = 2) -> str:
    return "-" if x is None else f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def markdown(r: dict[str, Any]) -> str:
    """The report's figures as markdown tables (pure)."""
    out = [f"**Verdict: {'PASS' if r.get('ok') else 'FAIL: ' + str(r.get('failure'))}**", ""]
    if "faults" not in r:
        return "\n".join(out)
    f = r["faults"]
    out += [
        f"Faults: {f['injected']} injected, {f['survived']} survived, {f.get('skipped', 0)} skipped "
        f"(bound {r['params']['converge_bound_s']:g} s wall).",
        "",
        "| fault | n | converged p50 s | p99 s |",
        "| --- | --- | --- | --- |",
    ]
    out += [f"| {k} | {v['n']} | {v['p50_s']:.1f} | {v['p99_s']:.1f} |" for k, v in f["converge_by_kind"].items()]
    sv, rl = r["serving"], r["rl"]
    tr = rl.get("trainer") or {}
    out += [
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| serving prepares (pods that got a GPU) | {sv['prepares']} |",
        f"| of them on a GPU lent to a prepared RL claim | {sv.get('prepares_on_a_lent_gpu', '-')} |",
        f"| serving prepare p50 / p99 s | {_n(sv['prepare_p50_s'])} / {_n(sv['prepare_p99_s'])} |",
        f"| serving waits (prepare > 0.5 s), count / p99 s | {sv['waits_over_0_5s']} / {_n(sv['wait_p99_s'])} |",
        f"| serving pod created → prepared p99 s | {_n(sv['pod_created_to_prepared_p99_s'])} |",
        f"| RL useful GPU-hours (active GPUs x simulated time) | {rl['useful_gpu_hours']} |",
        f"| trainer steps / suspends / resumes / bit-identical | {tr.get('steps')} / {tr.get('suspends')} / "
        f"{tr.get('resumes')} / {tr.get('identical')} |",
        f"| suspendCount by job (end) | {rl['suspend_count_by_job']} |",
        f"| invariant checks made | {r['checks']} |",
        f"| played kubelet's failed prepares (retried) | {r['prepare_errors']['count']} |",
    ]
    sim = (r.get("simulate") or {}).get("policies") or {}
    if sim:
        out += [
            "",
            "The same slice through `rose simulate` (both pools, the three jobs; faults "
            "not modelled), beside the soak's own figures:",
            "",
            "| run | RL GPU-hours | serving waits | serving wait p99 s | suspends |",
            "| --- | --- | --- | --- | --- |",
            f"| soak (real system; active GPUs x time) | {rl['useful_gpu_hours']} | {sv['waits_over_0_5s']} | "
            f"{_n(sv['wait_p99_s'])} | {sum((rl.get('suspend_count_by_job') or {}).values())} |",
        ]
        if "error" in sim:
            out.append(f"| simulate | error: {sim['error']} | | | |")
        else:
            out += [
                f"| simulate `{pol}` (lent / useful) | {_n(v.get('rl_lent_gpu_hours'), 1)} / "
                f"{_n(v.get('rl_useful_gpu_hours'), 1)} | {v.get('serving_waits')} | "
                f"{_n(v.get('serving_wait_p99_s'))} | {v.get('suspends')} |"
                for pol, v in sim.items()
            ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n")[0])
    ap.add_argument("--series", type=Path, required=True, help="a 10-minute series CSV (t_seconds,value)")
    ap.add_argument("--hours", type=float, default=24.0, help="simulated hours to play (24)")
    ap.add_argument("--speed", type=float, default=96.0, help="time compression (96: a day in 15 minutes)")
    ap.add_argument("--faults", type=int, default=len(FAULT_KINDS), help="faults to inject (one of each kind)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--converge-bound", type=float, default=90.0, help="wall seconds to converge after a fault (90)")
    ap.add_argument("--trainer-updates", type=int, default=400, help="updates of the real trainer (400)")
    ap.add_argument("--fault-kinds", default=",".join(FAULT_KINDS), help="the kinds to draw from (all)")
    ap.add_argument(
        "--serving-wait",
        choices=SERVING_WAITS,
        default="prepare",
        help="the drivers' --serving-wait: prepare (the played kubelet's prepare suspends "
        "the occupant) or prebind (the scheduler holds the pod until its GPU is freed)",
    )
    ap.add_argument(
        "--host-full-force",
        action="store_true",
        help="host-memory-full: also pin a serving burst onto a lent occupant of that node",
    )
    ap.add_argument(
        "--no-timeslice",
        action="store_true",
        help="the soak's shape before the time-slice group: 4 nodes x 2 GPUs, no group, no orchestrator "
        "(and no kill-orchestrator among the default kinds)",
    )
    ap.add_argument("--json", type=Path, help="write the report here")
    ap.add_argument("--markdown", type=Path, help="write the figures as markdown tables here")
    ap.add_argument("--workdir", type=Path, help="where the cluster and logs live (default: a new temp dir)")
    a = ap.parse_args(argv)
    if not a.series.is_file():
        ap.error(f"--series {a.series}: no such file")
    if a.hours <= 0 or a.speed <= 0 or a.faults < 0:
        ap.error("--hours and --speed must be > 0, --faults >= 0")
    kinds = tuple(k.strip() for k in a.fault_kinds.split(",") if k.strip())
    if a.no_timeslice and a.fault_kinds == ",".join(FAULT_KINDS):
        kinds = tuple(k for k in kinds if k != "kill-orchestrator")
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if unknown or not kinds:
        ap.error(f"--fault-kinds: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(FAULT_KINDS)}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a clean stop: the cluster and processes go too
    workdir = a.workdir or Path(tempfile.mkdtemp(prefix="rose-soak-"))
    p = Params(
        a.series,
        a.hours,
        a.speed,
        a.faults,
        a.seed,
        workdir,
        converge_bound_s=a.converge_bound,
        kinds=kinds,
        trainer_updates=a.trainer_updates,
        serving_wait=a.serving_wait,
        host_full_force=a.host_full_force,
        timeslice=not a.no_timeslice,
        gpus_per_node=2 if a.no_timeslice else 3,
    )
    r = run_soak(p)
    print(summary(r))
    if a.json:
        a.json.write_text(json.dumps(r, indent=1, default=str) + "\n")
    if a.markdown:
        a.markdown.write_text(markdown(r) + "\n")
    return 0 if r.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())

"""The ElasticRLJob controller under live spec edits and SIGKILLs, on the local cluster (real API
server and garbage collector, the rose-scheduler profile with the extender as a process, KWOK
running the bound pods); ``python -m elastic_controller`` is a process this test starts, kills
with SIGKILL and restarts. Forecasts come from the explicit ``static-file`` backend.

The test plays the DRA driver, and says so: a watch on the job's worker pods writes
``rose.io/suspend-state: Suspended`` on a pod as soon as it carries a ``rose.io/suspend-request``,
and ``Running`` once the request is withdrawn (KWOK nodes have no driver). Like the real driver
(``dra_driver.podwatch``: every listed pod is handled), it acts on every pod a (re)list shows,
not only on watch events: a change made after one watch stream ends and before the next list is
seen only in that list. The same watch checks the invariants on every event it sees (not only at
the end):

- never two live pods for one worker index, never more live workers than ``maxGPUs``;
- never a job running (phase Running, no suspend request, not suspended) with more than
  ``maxGPUs`` workers; never with fewer than ``minGPUs`` (and more than 0) beyond one write
  batch: the controller writes a gang's pods or requests one API call at a time, so the watch
  sees a batch in flight; an episode below the minimum that no SIGKILL cut and that lasts longer
  than ``BATCH_BOUND_S`` is a violation (the bound is a generous ceiling for 2 to 4 API calls on a
  shared machine, not a speed goal). An episode a kill cut must be ended by the restarted
  controller: each trial waits for convergence, which excludes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from elastic_controller.workers import LABEL_WORKER_INDEX
from local_cluster import ClusterHandle, free_port, module_process, stop_process
from rose_common import names
from tests.support.elastic_fixtures import write_forecasts
from tests.support.erj_manifests import elastic_rl_job
from tests.support.k8s_helpers import delete_namespace, new_namespace, wait_for

REPO = Path(__file__).resolve().parents[3]
CONTROLLER = "rose-elastic-controller"
TRIALS = int(os.environ.get("ROSE_E2E_KILL_TRIALS", "50"))
SEED = int(os.environ.get("ROSE_E2E_KILL_SEED", "20261130"))
BATCH_BOUND_S = 5.0


# ----------------------------------------------------------------------------- forecasts


# ----------------------------------------------------------------------------- the controller process
@dataclass
class ControllerProc:
    """``python -m elastic_controller`` as a process that the test can SIGKILL and restart; one
    identity across restarts (a restarted container of the same pod), so it renews its own Lease."""

    args: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "elastic_controller", *self.args], cwd=REPO, stdout=out, stderr=subprocess.STDOUT
            )
        self.starts += 1

    def kill(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, self.tail()
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:]) if self.log.exists() else ""


@dataclass
class World:
    api: Any
    ns: str
    forecasts: Path
    quiet: str
    busy: str
    capacity: int
    ctl: ControllerProc
    watch: Watch | None = None

    def forecast(self, quiet_need: float) -> None:
        write_forecasts(self.forecasts, {self.quiet: quiet_need, self.busy: float(self.capacity)})


@pytest.fixture
def world(cluster: ClusterHandle, api: Any, tmp_path: Path) -> Iterator[World]:
    assert cluster.extender_url, "the cluster must run the rose-scheduler profile with an extender URL"
    pools = sorted(set(cluster.pools.values()))
    assert len(pools) >= 2, f"the e2e cluster needs two pools, got {cluster.pools}"
    quiet, busy = pools[0], pools[1]
    capacity = sum(1 for p in cluster.pools.values() if p == quiet) * cluster.gpus_per_node
    forecasts = tmp_path / "forecasts.json"
    write_forecasts(forecasts, {quiet: 0.0, busy: float(capacity)})
    host, _, port = cluster.extender_url.removeprefix("http://").partition(":")
    common = ["--forecast-backend=static-file", f"--forecast-file={forecasts}", "--forecast-refresh=0.5",
              f"--kubeconfig={cluster.kubeconfig}"]  # fmt: skip
    lease = f"ctl-robust-{free_port()}"
    ctl = ControllerProc([*common, "--plan-interval=0.5", "--dwell=0", "--lease-namespace=default",
                          f"--lease-name={lease}", "--identity=robust-e2e", "--metrics-listen=127.0.0.1:0"],
                         tmp_path / "controller.log")  # fmt: skip
    ns = new_namespace(api, "robust")
    try:
        with module_process(["scheduler_extender", f"--listen={host}:{port}", *common], tmp_path / "extender.log"):
            ctl.start()
            w = World(api, ns, forecasts, quiet, busy, capacity, ctl)
            w.watch = Watch(w, {})
            w.watch.start()
            yield w
            w.watch.halt()
    finally:
        ctl.stop()
        delete_namespace(api, ns)
        with contextlib.suppress(Exception):
            client.CoordinationV1Api(api).delete_namespaced_lease(lease, "default")


# ----------------------------------------------------------------------------- the job
def job_body(ns: str, name: str, min_gpus: int, max_gpus: int, priority: int = 0) -> dict[str, Any]:
    return elastic_rl_job(
        name,
        ns,
        minGPUs=min_gpus,
        maxGPUs=max_gpus,
        gpusPerWorker=1,
        gracefulShutdownPeriod=5,
        minUsefulRunSeconds=60,
        stateBytesPerWorker=1 << 30,
        priority=priority,
        template={"spec": {"containers": [{"name": "trainer", "image": "rose/grpo"}]}},
    )


def _crd(api: Any) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def create_job(w: World, name: str, min_gpus: int, max_gpus: int, priority: int = 0) -> None:
    _crd(w.api).create_namespaced_custom_object(
        names.GROUP, names.VERSION, w.ns, names.PLURAL, job_body(w.ns, name, min_gpus, max_gpus, priority)
    )


def patch_spec(w: World, name: str, **spec: int) -> None:
    _crd(w.api).patch_namespaced_custom_object(names.GROUP, names.VERSION, w.ns, names.PLURAL, name, {"spec": spec})


def get_job(w: World, name: str) -> dict[str, Any]:
    out: dict[str, Any] = _crd(w.api).get_namespaced_custom_object(names.GROUP, names.VERSION, w.ns, names.PLURAL, name)
    return out


def pods_of(w: World, name: str) -> list[Any]:
    pods = client.CoreV1Api(w.api).list_namespaced_pod(w.ns, label_selector=f"{names.LABEL_JOB}={name}").items
    return sorted((p for p in pods if p.metadata.deletion_timestamp is None), key=lambda p: p.metadata.name)


def _ann(p: Any) -> dict[str, str]:
    return dict(p.metadata.annotations or {})


def _job_of(p: Any) -> str | None:
    job: str | None = (p.metadata.labels or {}).get(names.LABEL_JOB)
    return job


def requested(p: Any) -> bool:
    return names.ANNOTATION_SUSPEND_REQUEST in _ann(p)


def active(p: Any) -> bool:
    """A worker running: phase Running, no suspend request, not suspended."""
    return (
        p.status.phase == "Running"
        and not requested(p)
        and _ann(p).get(names.ANNOTATION_SUSPEND_STATE) in (None, "Running")
    )


# ----------------------------------------------------------------------------- the played driver + invariants
@dataclass
class Watch:
    """One watch on the namespace's worker pods: plays the driver and checks the invariants on
    every event (module docstring). An episode of a job running below ``minGPUs`` is recorded
    with the kill count when it began: one no kill cut is a violation past ``BATCH_BOUND_S``; one
    a kill cut must be ended by the restarted controller (the trial's convergence)."""

    w: World
    bounds: dict[str, tuple[int, int]]  # job -> (min, max), the widest the trial allows
    pods: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    episodes: list[tuple[str, float, bool]] = field(default_factory=list)  # (job, seconds, a kill cut it)
    kills: int = 0  # SIGKILLs so far (the trial loop counts them here)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    events: int = 0
    uids: set[str] = field(default_factory=set)  # every worker pod ever seen
    _open: dict[str, tuple[float, int]] = field(default_factory=dict)  # job -> (start, kills at start)

    def start(self) -> None:
        """Run the watch (it lists first) on a thread of its own."""
        self.stop.clear()
        self.thread = threading.Thread(target=self.run, name="played-driver", daemon=True)
        self.thread.start()

    def halt(self) -> None:
        """Stop the watch (within one watch stream's 5 s) and wait for it."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=10)
            assert not self.thread.is_alive(), "the played driver's watch did not stop"

    def run(self) -> None:
        core = client.CoreV1Api(self.w.api)
        while not self.stop.is_set():
            try:
                listed = core.list_namespaced_pod(self.w.ns, label_selector=names.LABEL_JOB)
                self.pods = {p.metadata.name: p for p in listed.items}
                self._check()
                for pod in listed.items:  # changed while no watch was open: seen only here (issue 25 §1)
                    self._play_driver(core, pod, "LISTED")
                for ev in watch.Watch().stream(
                    core.list_namespaced_pod,
                    self.w.ns,
                    label_selector=names.LABEL_JOB,
                    resource_version=listed.metadata.resource_version,
                    timeout_seconds=5,
                ):
                    pod = ev["object"]
                    self.events += 1
                    if ev["type"] == "DELETED":
                        self.pods.pop(pod.metadata.name, None)
                    else:
                        self.pods[pod.metadata.name] = pod
                    self._check()
                    self._play_driver(core, pod, ev["type"])
                    if self.stop.is_set():
                        return
            except Exception:  # a dropped watch: list again
                time.sleep(0.2)

    def _play_driver(self, core: Any, pod: Any, kind: str) -> None:
        if kind == "DELETED" or pod.metadata.deletion_timestamp is not None:
            return
        state = _ann(pod).get(names.ANNOTATION_SUSPEND_STATE)
        want = "Suspended" if requested(pod) else ("Running" if state == "Suspended" else None)
        if want is None or want == state:
            return
        with contextlib.suppress(Exception):
            core.patch_namespaced_pod(
                pod.metadata.name,
                self.w.ns,
                {"metadata": {"uid": pod.metadata.uid, "annotations": {names.ANNOTATION_SUSPEND_STATE: want}}},
            )

    def _check(self) -> None:
        for job, (lo, hi) in self.bounds.items():
            live = [p for p in self.pods.values() if _job_of(p) == job and p.metadata.deletion_timestamp is None]
            idx = [(p.metadata.labels or {}).get(LABEL_WORKER_INDEX) for p in live]
            if len(set(idx)) != len(idx):
                self.violations.append(f"{job}: two live pods for one worker index: {sorted(map(str, idx))}")
            if len(live) > hi:
                self.violations.append(f"{job}: {len(live)} live workers > maxGPUs {hi}")
            running = sum(1 for p in live if active(p))
            if running > hi:
                self.violations.append(f"{job}: {running} running > maxGPUs {hi}")
            self._episode(job, 0 < running < lo)
            self.uids.update(p.metadata.uid for p in live)

    def _episode(self, job: str, below: bool) -> None:
        now = time.monotonic()
        if below and job not in self._open:
            self._open[job] = (now, self.kills)
        elif not below and job in self._open:
            start, kills = self._open.pop(job)
            self._close(job, now - start, self.kills != kills)

    def _close(self, job: str, seconds: float, cut: bool) -> None:
        self.episodes.append((job, seconds, cut))
        if not cut and seconds > BATCH_BOUND_S:
            self.violations.append(f"{job}: running below minGPUs for {seconds:.1f}s with no kill in between")

    def finish(self) -> None:
        """Close the episodes still open (the job left below its minimum at the end)."""
        now = time.monotonic()
        for job, (start, kills) in list(self._open.items()):
            self._close(job, now - start, self.kills != kills)
            self.violations.append(f"{job}: still running below minGPUs at the end")
        self._open.clear()


# ----------------------------------------------------------------------------- live spec edits
def _wait_pods(w: World, name: str, what: str, pred: Any, timeout: float = 30) -> list[Any]:
    return wait_for(f"{name}: {what}", lambda: (pods := pods_of(w, name)) and pred(pods) and pods, timeout)


def test_live_edits_of_max_and_min_take_effect_on_a_running_job(world: World) -> None:
    w = world
    create_job(w, "edit", 2, 4)
    _wait_pods(w, "edit", "4 running", lambda ps: len(ps) == 4 and all(active(p) for p in ps))
    uids = {p.metadata.name: p.metadata.uid for p in pods_of(w, "edit")}

    patch_spec(w, "edit", maxGPUs=2)  # max down: workers above it go
    ps = _wait_pods(w, "edit", "2 workers after maxGPUs=2", lambda ps: len(ps) == 2 and all(active(p) for p in ps))
    assert {p.metadata.name: p.metadata.uid for p in ps}.items() <= uids.items()  # kept workers are the same pods
    st = wait_for(
        "status observes generation 2",
        lambda: (
            (s := get_job(w, "edit").get("status") or {}).get("observedGeneration") == 2
            and s.get("activeGPUs") == 2
            and s
        ),
        20,
    )
    assert st["phase"] == "Running"

    patch_spec(w, "edit", maxGPUs=4)  # max up: regrows
    _wait_pods(w, "edit", "4 running after maxGPUs=4", lambda ps: len(ps) == 4 and all(active(p) for p in ps))

    # min up to 4, then serving is forecast to need 2 of the pool's GPUs: at min 2 the job would
    # shrink to 2; at min 4 it cannot, so the whole gang is suspended
    patch_spec(w, "edit", minGPUs=4)
    wait_for(
        "status observes generation 4",
        lambda: (get_job(w, "edit").get("status") or {}).get("observedGeneration") == 4,
        20,
    )
    w.forecast(float(w.capacity - 2))
    ps = _wait_pods(w, "edit", "gang suspend at minGPUs 4", lambda ps: len(ps) == 4 and all(requested(p) for p in ps))
    assert all(json.loads(_ann(p)[names.ANNOTATION_SUSPEND_REQUEST])["by"] == CONTROLLER for p in ps)

    patch_spec(w, "edit", minGPUs=2)  # min back down: room for 2 → two resume, two stay suspended
    _wait_pods(w, "edit", "2 resumed at minGPUs 2", lambda ps: sum(1 for p in ps if not requested(p)) == 2, 30)
    assert w.ctl.proc is not None and w.ctl.proc.poll() is None, w.ctl.tail()


def test_a_live_priority_edit_changes_which_gang_is_suspended(world: World) -> None:
    """Two gangs of 2 fill the pool; serving is forecast to need 2: the cheaper gang (lower
    priority, same state size) is suspended. Raising the first job's priority above the second's
    before the forecast rises makes the second the one suspended."""
    w = world
    create_job(w, "low", 2, 2, priority=0)
    create_job(w, "high", 2, 2, priority=5)
    for name in ("low", "high"):
        _wait_pods(w, name, "2 running", lambda ps: len(ps) == 2 and all(active(p) for p in ps))
    patch_spec(w, "low", priority=10)  # "low" is now the more expensive to suspend
    wait_for(
        "status observes the edit", lambda: (get_job(w, "low").get("status") or {}).get("observedGeneration") == 2, 20
    )
    w.forecast(float(w.capacity - 2))
    _wait_pods(w, "high", "gang suspended", lambda ps: len(ps) == 2 and all(requested(p) for p in ps))
    assert not any(requested(p) for p in pods_of(w, "low")), "the edited (now more expensive) job was suspended"


# ----------------------------------------------------------------------------- SIGKILL trials
LEVELS = ("idle", "room-for-min", "full")  # the serving forecast in the job's pool


def _need(w: World, level: str) -> float:
    return {"idle": 0.0, "room-for-min": float(w.capacity - 2), "full": float(w.capacity)}[level]


def _state(p: Any) -> str | None:
    return _ann(p).get(names.ANNOTATION_SUSPEND_STATE)


def converged(w: World, name: str, level: str, max_gpus: int = 4) -> str | None:
    """None once the job (min 2, in a pool of 4) sits where ``level`` and ``max_gpus`` put it,
    else why not."""
    want = min({"idle": 4, "room-for-min": 2, "full": 0}[level], max_gpus)
    pods = pods_of(w, name)
    job = get_job(w, name)
    st = job.get("status") or {}
    running = [p for p in pods if active(p)]
    parked = [p for p in pods if requested(p) and _state(p) == "Suspended"]
    if len(running) != want or len(running) + len(parked) != len(pods) or len(pods) > max_gpus:
        return f"{len(running)} running, {len(parked)} suspended of {len(pods)} pods (want {want} running)"
    if level == "idle" and any(requested(p) for p in pods):
        return "a suspend request left behind"
    if st.get("activeGPUs") != want or st.get("observedGeneration") != job["metadata"]["generation"]:
        return f"status {st.get('phase')} activeGPUs {st.get('activeGPUs')}"
    return None


def _pod_states(w: World, name: str) -> str:
    """One line per live worker: phase, suspend request and suspend state (a failed trial's evidence)."""
    return "\n".join(
        f"  {p.metadata.name}: phase {p.status.phase}, request "
        f"{_ann(p).get(names.ANNOTATION_SUSPEND_REQUEST)}, state {_state(p)}"
        for p in pods_of(w, name)
    )


def _converge(w: World, name: str, level: str, what: str, max_gpus: int = 4) -> None:
    why: list[str | None] = []
    try:
        wait_for(what, lambda: not why.append(converged(w, name, level, max_gpus)) and why[-1] is None, 90)
    except AssertionError as e:
        raise AssertionError(f"{e}: {why[-1]}\n{_pod_states(w, name)}\ncontroller log:\n{w.ctl.tail()}") from None
    assert w.ctl.proc is not None and w.ctl.proc.poll() is None, f"the controller exited:\n{w.ctl.tail()}"


def test_controller_sigkilled_at_random_points_of_transitions_converges(world: World) -> None:
    """``TRIALS`` trials (seeded: ``ROSE_E2E_KILL_SEED``): the forecast moves the job to another
    level (grow to 4, shrink to 2, gang suspend, resume), or a live edit toggles ``maxGPUs``
    between 4 and 2 (workers removed, later recreated); after a random delay inside the
    transition the controller is SIGKILLed and restarted; the job must converge, with the watch's
    invariants holding throughout."""
    w, rng, name = world, random.Random(SEED), "chaos"
    assert w.watch is not None
    w.watch.bounds = {name: (2, 4)}
    create_job(w, name, 2, 4)
    _converge(w, name, "idle", "4 running")
    level, max_gpus, t0, log, mid = "idle", 4, time.monotonic(), [], 0
    for trial in range(TRIALS):
        if rng.random() < 0.25:
            max_gpus = 6 - max_gpus
            patch_spec(w, name, maxGPUs=max_gpus)
        else:
            level = rng.choice([lv for lv in LEVELS if lv != level])
            w.forecast(_need(w, level))
        delay, pause = rng.uniform(0.0, 1.5), rng.uniform(0.0, 0.3)
        time.sleep(delay)
        mid += converged(w, name, level, max_gpus) is not None  # the transition not yet done
        w.ctl.kill()
        w.watch.kills += 1
        time.sleep(pause)
        w.ctl.start()
        _converge(w, name, level, f"trial {trial}: {level}, max {max_gpus} after a kill at +{delay:.2f}s", max_gpus)
        log.append(f"{trial}:{level}/{max_gpus}@{delay:.2f}")
        assert not w.watch.violations, (w.watch.violations, log)
    wall = time.monotonic() - t0
    w.forecast(0.0)
    patch_spec(w, name, maxGPUs=4)
    _converge(w, name, "idle", "back to 4 running, no request left")
    w.watch.finish()
    cut = [s for _, s, c in w.watch.episodes if c]
    batch = [s for _, s, c in w.watch.episodes if not c]
    print(
        f"SIGKILL trials: {TRIALS} (seed {SEED}) in {wall:.0f} s, {w.ctl.starts} controller starts, "
        f"{mid} kills before the transition was done, {w.watch.events} pod events watched, "
        f"{len(w.watch.uids)} worker pods ever; below-min episodes: "
        f"{len(batch)} inside a batch (longest {max(batch, default=0):.2f} s), {len(cut)} cut by a kill "
        f"(longest {max(cut, default=0):.2f} s)"
    )
    assert not w.watch.violations, w.watch.violations
    _crd(w.api).delete_namespaced_custom_object(names.GROUP, names.VERSION, w.ns, names.PLURAL, name)
    wait_for("no worker left after delete", lambda: not pods_of(w, name) or None, 60)


def test_the_played_driver_acts_on_what_a_relist_shows(world: World) -> None:
    """Issue 25 §1 (CI, trial 38 of the SIGKILL test: room-for-min, maxGPUs 2; "0 running, 0
    suspended of 2 pods" for 90 s): the controller withdrew its suspend requests while the played
    driver's watch was between two streams (it lists again every 5 s); the list showed both pods
    with no request and still ``Suspended``, the driver played only watch events, and nothing
    changed the pods again. The kill was not involved. Here the watch is held at exactly that
    step: stopped while the requests are withdrawn, then started again (list first)."""
    w, name = world, "relist"
    assert w.watch is not None
    w.watch.bounds = {name: (2, 2)}
    create_job(w, name, 2, 2)
    _converge(w, name, "idle", "2 running", max_gpus=2)
    w.forecast(_need(w, "full"))
    _converge(w, name, "full", "gang suspended", max_gpus=2)
    w.watch.halt()  # between two watch streams
    w.forecast(_need(w, "room-for-min"))
    withdrawn = lambda ps: len(ps) == 2 and all(not requested(p) and _state(p) == "Suspended" for p in ps)  # noqa: E731
    _wait_pods(w, name, "requests withdrawn, pods still suspended", withdrawn)
    w.watch.start()
    _converge(w, name, "room-for-min", "resumed by the driver after a relist", max_gpus=2)
    assert not w.watch.violations, w.watch.violations

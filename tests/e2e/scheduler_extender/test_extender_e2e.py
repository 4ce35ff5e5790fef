"""The extender end to end: the real kube-scheduler (profile ``rose-scheduler`` of the local
cluster) calls our extender process over HTTP at ``cluster.extender_url``; the extender watches
the real API server (nodes, pods, ResourceClaims, ResourceSlices) and reads forecasts from the
explicit ``static-file`` backend (the predictor server is another component; the forecast file
holds ForecastResponse objects exactly as the predictor's /v1/forecast returns them).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from kubernetes import client

from local_cluster import ClusterHandle, free_port, stop_process
from local_cluster.kubelet import DriverProcess
from local_cluster.objects import allocated_claim
from rose_common import extender_names, names, promtext
from scheduler_extender import wire
from tests.support.cluster_fixtures import session_shaped_cluster
from tests.support.driver_fixtures import E2E_DRIVER_ARGS, driver_published, restore_seed_slices
from tests.support.extender_fixtures import forecast
from tests.support.k8s_helpers import (
    claim_template,
    create_claim_template,
    delete_namespace,
    gpu_pod,
    new_namespace,
    report_container_resources,
    wait_for,
)

REPO = Path(__file__).resolve().parents[3]


def _pools(cluster: ClusterHandle) -> tuple[str, str]:
    pools = sorted(set(cluster.pools.values()))
    assert len(pools) >= 2, f"the e2e cluster needs two pools, got {cluster.pools}"
    return pools[0], pools[1]  # (quiet, busy)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    """A cluster of its own: these tests read every node's slices and the scheduler's Events, which
    the session cluster's earlier scenarios (drivers, extenders, controllers of other modules) change."""
    with session_shaped_cluster(tmp_path_factory.mktemp("extender-cluster")) as c:
        yield c


@pytest.fixture(scope="module")
def extender(cluster: ClusterHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Our extender as a real process, listening exactly where the rose-scheduler profile calls."""
    assert cluster.extender_url, "the cluster must run the rose-scheduler profile with an extender URL"
    tmp = tmp_path_factory.mktemp("extender")
    quiet, busy = _pools(cluster)
    capacity = {p: sum(cluster.gpus_per_node for n in cluster.pools if cluster.pools[n] == p) for p in (quiet, busy)}
    now = datetime.now(UTC)  # the extender counts the horizons from the reply's time
    items = [
        json.loads(forecast(quiet, {600: 0, 1800: 0, 3600: 0}, generated_at=now).model_dump_json()),
        # busy: serving needs the whole pool from 30 minutes on → idle window 15 minutes from the reply's time
        # (the extender counts horizons from generated_at: the window shrinks as this file ages)
        json.loads(
            forecast(busy, {900: 0, 1800: capacity[busy], 3600: capacity[busy]}, generated_at=now).model_dump_json()
        ),
    ]
    (tmp / "forecasts.json").write_text(json.dumps({"forecasts": items}))
    url = urlparse(cluster.extender_url)
    # what the real kube-scheduler sends is kept here (ROSE_EXTENDER_CAPTURE_DIR to keep it)
    capture = Path(os.environ.get("ROSE_EXTENDER_CAPTURE_DIR") or tmp / "capture")
    log = (tmp / "extender.log").open("wb")
    metrics_port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scheduler_extender",
            f"--listen={url.hostname}:{url.port}",
            f"--metrics-listen=127.0.0.1:{metrics_port}",
            f"--kubeconfig={cluster.kubeconfig}",
            "--forecast-backend=static-file",
            f"--forecast-file={tmp / 'forecasts.json'}",
            "--forecast-refresh=1",
            f"--capture-dir={capture}",
        ],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def ready() -> bool:
        try:
            conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=1)
            conn.request("GET", "/readyz")
            ok = conn.getresponse().status == 200
            conn.close()
            return ok
        except OSError:
            return False

    try:
        wait_for("extender ready (cache synced)", lambda: proc.poll() is None and ready(), timeout=30)
        time.sleep(1.5)  # one forecast refresh
        yield {
            "proc": proc,
            "capture": capture,
            "quiet": quiet,
            "busy": busy,
            "host": url.hostname,
            "port": url.port,
            "metrics_port": metrics_port,
        }
    finally:
        stop_process(proc)
        log.close()


@pytest.fixture
def ns(api: Any) -> Iterator[str]:
    name = new_namespace(api, "ext")
    create_claim_template(api, name, claim_template("lendable-1", names.DEVICE_CLASS_LENDABLE))
    create_claim_template(api, name, claim_template("serving-1", names.DEVICE_CLASS_SERVING))
    yield name
    delete_namespace(api, name)


def _metric(extender: dict[str, Any], name: str, **labels: str) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", extender["metrics_port"], timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return promtext.value(text, name, labels)


def _node_of(api: Any, ns: str, pod: str) -> str | None:
    p = client.CoreV1Api(api).read_namespaced_pod(pod, ns)
    return p.spec.node_name or None


def _rl_pod(
    name: str, job: str, *, cpu: str = "100m", node: str | None = None, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    body = gpu_pod(
        name,
        "lendable-1",
        scheduler=names.SCHEDULER_NAME,
        labels={names.LABEL_JOB: job},
        priority_class="rose-rl",
        cpu=cpu,
        node_name=node,
    )
    body["metadata"]["annotations"] = annotations or {}
    return body


def test_rl_workers_land_on_the_pool_forecast_idle_longest(
    cluster: ClusterHandle, extender: dict[str, Any], api: Any, ns: str
) -> None:
    """Pool ``quiet`` is forecast idle for the full hour; pool ``busy`` only for 15 minutes.
    Four 1-GPU workers (as many as the quiet pool has lendable GPUs) all land in the quiet pool;
    a fifth that needs 20 minutes of uninterrupted run finds no node: the quiet pool has no
    lendable GPU left and the busy pool's window is too short (FailedAndUnresolvableNodes)."""
    core = client.CoreV1Api(api)
    quiet, _busy = extender["quiet"], extender["busy"]
    quiet_nodes = {n for n, p in cluster.pools.items() if p == quiet}
    lendable_in_quiet = len(quiet_nodes) * cluster.gpus_per_node
    placed: dict[str, str] = {}
    for i in range(lendable_in_quiet):
        core.create_namespaced_pod(ns, _rl_pod(f"worker-{i}", "grpo"))
        placed[f"worker-{i}"] = wait_for(f"worker-{i} bound", lambda i=i: _node_of(api, ns, f"worker-{i}"), 60)
    assert set(placed.values()) <= quiet_nodes, (placed, cluster.pools)
    assert _metric(extender, "rose_extender_prioritize_calls_total", pod_kind="rl-worker") >= 1

    core.create_namespaced_pod(ns, _rl_pod("picky", "grpo", annotations={extender_names.ANNOTATION_MIN_RUN: "1200"}))

    def refused() -> str | None:
        events = core.list_namespaced_event(ns, field_selector="involvedObject.name=picky").items
        msgs = [e.message or "" for e in events if e.reason == "FailedScheduling"]
        return next((m for m in msgs if "min useful run" in m or "lendable GPUs free" in m), None)

    message = wait_for("FailedScheduling event from the extender's filter", refused, 60)
    assert _node_of(api, ns, "picky") is None, message
    # the capture of what the real kube-scheduler sent parses with our wire models
    captured = sorted(extender["capture"].glob("filter-*-request.json"))
    assert captured
    args = wire.ExtenderArgs.model_validate_json(captured[0].read_bytes())
    assert args.Nodes is None and args.NodeNames  # nodeCacheCapable: names only


@contextlib.contextmanager
def _driver_on(cluster: ClusterHandle, api: Any, node: str) -> Iterator[DriverProcess]:
    """The real ROSE DRA driver (``rose driver``, simulated GPUs, the node agent's explicit
    ``simulated`` suspend backend) for one KWOK node, its slice published; the session's seed
    slice comes back afterwards."""
    root = Path(tempfile.mkdtemp(prefix="rose-extdrv-", dir="/tmp"))  # unix socket paths <= 107 bytes
    drv = DriverProcess(cluster.kubeconfig, node, root, cluster.gpus_per_node, free_port(), E2E_DRIVER_ARGS)
    passed = False
    try:
        wait_for(f"the driver's slice for {node}", lambda: driver_published(api, node), 60)
        yield drv
        passed = True
    finally:
        code = drv.stop()
        restore_seed_slices(cluster, api, [node])
        if passed and code == 0:  # else its log stays for the failure
            shutil.rmtree(root, ignore_errors=True)
        assert code == 0, f"driver exited {code}; log: {drv.log_path}"


def _cpu_request(api: Any, ns: str, pod: str) -> str:
    p = client.CoreV1Api(api).read_namespaced_pod(pod, ns)
    return str(p.spec.containers[0].resources.requests["cpu"])


def test_serving_pod_is_placed_with_the_rl_pod_suspended_not_deleted(
    cluster: ClusterHandle, extender: dict[str, Any], api: Any, ns: str
) -> None:
    """How preemption genuinely arises here: serving and lendable devices are distinct devices of
    the same physical GPU, so DRA alone never makes a serving pod preempt an RL pod. Priority plus
    node CPU does: an RL worker (priority rose-rl) takes 60 of the node's 64 CPUs; a serving pod
    (priority rose-serving) pinned to that node asks for 10 CPUs and a serving GPU. The real
    kube-scheduler's DefaultPreemption dry run proposes the RL worker as the victim and calls our
    preempt verb (nodeCacheCapable: UIDs only). The extender takes the RL pod out of the victim
    list, patches ``rose.io/suspend-request`` on it and records an Event, and drops the node (no
    other victims), so kube-scheduler deletes nothing. The real ROSE DRA driver on that node (it
    prepared the worker's lent claim, played kubelet calling it) sees the request, suspends the
    worker into host memory (its explicit ``simulated`` backend: KWOK runs no GPU process) and
    gives the worker's CPU back through ``pods/resize``; the scheduler retries and binds the
    serving pod to that node. The RL pod is never deleted: same UID, no deletionTimestamp, no
    DisruptionTarget condition. KWOK has no kubelet: the test plays its reports of the resources
    containers run with (``report_container_resources``) and its prepare call."""
    core = client.CoreV1Api(api)
    node = sorted(n for n, p in cluster.pools.items() if p == extender["busy"])[0]
    with _driver_on(cluster, api, node) as drv:
        grace = {names.ANNOTATION_GRACE: "10"}  # what the extender passes on as the suspend's grace
        core.create_namespaced_pod(ns, _rl_pod("rl-victim", "grpo-e2e", cpu="60", node=node, annotations=grace))
        assert wait_for("RL worker bound", lambda: _node_of(api, ns, "rl-victim"), 60) == node
        uid = core.read_namespaced_pod("rl-victim", ns).metadata.uid
        rl_claim = wait_for("RL claim allocated", lambda: allocated_claim(api, ns, "rl-victim"), 60)
        assert drv.prepare(rl_claim).error == ""  # the kubelet (played) prepares the lent GPU
        wait_for("RL worker Running", lambda: core.read_namespaced_pod("rl-victim", ns).status.phase == "Running", 30)
        report_container_resources(api, ns, "rl-victim")  # the kubelet's report of what runs
        suspended_before = _metric(extender, "rose_extender_preempt_victims_total", action="suspended")

        serving = gpu_pod(
            "llm-0",
            "serving-1",
            scheduler=names.SCHEDULER_NAME,
            labels={names.LABEL_ROLE: names.ROLE_SERVING},
            priority_class="rose-serving",
            cpu="10",
            node_name=node,
        )
        core.create_namespaced_pod(ns, serving)

        def annotations() -> dict[str, str]:
            return dict(core.read_namespaced_pod("rl-victim", ns).metadata.annotations or {})

        def state() -> str | None:
            return annotations().get(names.ANNOTATION_SUSPEND_STATE)

        raw = wait_for(
            "suspend request from the extender", lambda: annotations().get(names.ANNOTATION_SUSPEND_REQUEST), 60
        )
        request = json.loads(raw)
        assert request["by"] == extender_names.EXTENDER_COMPONENT and request["graceSeconds"] == 10
        # the preemptor the API server has (pending, outranking the worker), not the body's word
        preemptor = core.read_namespaced_pod("llm-0", ns).metadata
        assert request["preemptor"] == {"namespace": ns, "name": "llm-0", "uid": preemptor.uid}
        wait_for("worker Suspended by the driver", lambda: state() == "Suspended", 60)
        wait_for("its CPU given back through pods/resize", lambda: _cpu_request(api, ns, "rl-victim") == "100m", 60)
        report_container_resources(api, ns, "rl-victim")  # the kubelet (played) actuated the resize

        assert wait_for("serving pod bound", lambda: _node_of(api, ns, "llm-0"), 120) == node
        rl = core.read_namespaced_pod("rl-victim", ns)
        assert rl.metadata.uid == uid and rl.metadata.deletion_timestamp is None
        assert not any(c.type == "DisruptionTarget" for c in rl.status.conditions or [])
        assert _metric(extender, "rose_extender_preempt_victims_total", action="suspended") >= suspended_before + 1
        events = core.list_namespaced_event(ns, field_selector="involvedObject.name=rl-victim").items
        reasons = {e.reason for e in events if e.involved_object.uid == uid}
        assert {extender_names.EVENT_REASON_SUSPEND_REQUESTED, "Suspended", names.EVENT_CPU_RELEASED} <= reasons, (
            reasons
        )
        # its owner withdraws the request once the preemptor is bound (an Event and a metric)
        wait_for("request withdrawn", lambda: names.ANNOTATION_SUSPEND_REQUEST not in annotations(), 30)
        events = core.list_namespaced_event(ns, field_selector="involvedObject.name=rl-victim").items
        assert "SuspendWithdrawn" in {e.reason for e in events if e.involved_object.uid == uid}
        assert _metric(extender, "rose_extender_suspend_withdrawn_total", reason="preemptor-bound") >= 1
        assert drv.unprepare(rl_claim).error == ""
    captured = sorted(extender["capture"].glob("preempt-*-request.json"))
    assert captured, "kube-scheduler never called the preempt verb"
    args = wire.ExtenderPreemptionArgs.model_validate_json(captured[-1].read_bytes())
    assert args.NodeNameToMetaVictims and args.NodeNameToVictims is None


def test_the_cache_follows_every_kind_by_watch_not_by_relisting(
    cluster: ClusterHandle, extender: dict[str, Any], api: Any, ns: str
) -> None:
    """A worker's claim is allocated and its pod bound: the extender learns both through its
    watches. A watch that fails (as the official client's Watch did for ResourceClaims, whose
    model class it could not find) shows as a restart; there must be none for any kind."""
    core = client.CoreV1Api(api)
    claims_before = _metric(extender, "rose_extender_cache_objects", kind="ResourceClaim")
    core.create_namespaced_pod(ns, _rl_pod("watched", "watch-job"))
    wait_for("watched bound", lambda: _node_of(api, ns, "watched"), 60)
    wait_for(
        "the allocated claim in the extender's cache",
        lambda: _metric(extender, "rose_extender_cache_objects", kind="ResourceClaim") > claims_before,
        30,
    )
    for kind in ("Node", "Pod", "ResourceClaim", "ResourceSlice"):
        restarts = _metric(extender, "rose_extender_watch_restarts_total", kind=kind)
        assert restarts == 0, f"{kind} watch restarted {restarts:g} times; see the extender log"

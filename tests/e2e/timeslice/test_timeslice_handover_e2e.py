"""The collective time-slice hand-over end to end: a group spanning two KWOK nodes, one real
``rose driver`` process per node (simulated GPUs, the suspend engine's explicit ``simulated``
backend), switched all-or-nothing by ``timeslice.handover.KubeHandover`` through the API server.

KWOK has no kubelet, so the test plays the kubelet's DRA prepare (as tests/e2e/dra_driver/test_driver_e2e.py
does). Job ``a`` and job ``b`` each have one worker on each node. The switch a → b suspends a on
both nodes before b resumes; then back; then the driver of the second node is stopped (the
injected failure) and a switch rolls the first node back. A command with a stale fencing token
is refused by the driver.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from local_cluster import ClusterHandle, free_port
from local_cluster.kubelet import DriverProcess
from local_cluster.objects import allocated_claim
from rose_common import names
from rose_common.kube.client import Raw
from tests.support.driver_fixtures import E2E_DRIVER_ARGS, driver_published, restore_seed_slices
from tests.support.k8s_helpers import (
    claim_template,
    create_claim_template,
    delete_namespace,
    gpu_pod,
    new_namespace,
    wait_for,
)
from timeslice.handover import RUNNING, SUSPENDED, KubeHandover, RawPods

GROUP = "e2e-grp"


@pytest.fixture(scope="module")
def two_drivers(cluster: ClusterHandle) -> Iterator[dict[str, DriverProcess]]:
    root = Path(tempfile.mkdtemp(prefix="rose-ts-", dir="/tmp"))  # short: unix socket paths <= 107 bytes
    nodes = cluster.node_names[:2]
    procs = {
        n: DriverProcess(cluster.kubeconfig, n, root, cluster.gpus_per_node, free_port(), extra_args=E2E_DRIVER_ARGS)
        for n in nodes
    }
    api = cluster.api_client()
    try:
        yield procs
    finally:
        for p in procs.values():
            if p.proc.poll() is None:
                p.stop()
        try:
            restore_seed_slices(cluster, api, [n for n in nodes])
        finally:
            api.close()
            shutil.rmtree(root, ignore_errors=True)


def _state(core: Any, ns: str, pod: str) -> str:
    ann = core.read_namespaced_pod(pod, ns).metadata.annotations or {}
    return str(ann.get(names.ANNOTATION_SUSPEND_STATE, RUNNING))


def _states(core: Any, ns: str) -> dict[str, str]:
    return {p: _state(core, ns, p) for p in ("a-0", "a-1", "b-0", "b-1")}


def test_multi_node_group_switches_all_or_nothing_and_rolls_back(
    cluster: ClusterHandle, two_drivers: dict[str, DriverProcess], api: Any
) -> None:
    core = client.CoreV1Api(api)
    nodes = list(two_drivers)
    ns = new_namespace(api, "ts")
    try:
        for n in nodes:
            wait_for(f"driver slice on {n}", lambda n=n: driver_published(api, n), timeout=60)
        create_claim_template(api, ns, claim_template("lent", names.DEVICE_CLASS_LENDABLE))
        for job in ("a", "b"):
            for i, node in enumerate(nodes):
                labels = {names.LABEL_JOB: job, names.LABEL_TIMESLICE_GROUP: GROUP}
                core.create_namespaced_pod(ns, gpu_pod(f"{job}-{i}", "lent", labels=labels, node_name=node))
        for job in ("a", "b"):  # the kubelet prepares every worker's claim on its node
            for i, node in enumerate(nodes):
                claim = wait_for(f"{job}-{i} claim", lambda p=f"{job}-{i}": allocated_claim(api, ns, p), timeout=90)
                assert two_drivers[node].prepare(claim).error == ""

        handover = KubeHandover(RawPods(Raw(api)), rollback_timeout_s=60)
        res = handover.switch(GROUP, 1, f"{ns}/a", f"{ns}/b", deadline=time.time() + 60)
        assert res.ok, res.error
        assert _states(core, ns) == {"a-0": SUSPENDED, "a-1": SUSPENDED, "b-0": RUNNING, "b-1": RUNNING}
        res = handover.switch(GROUP, 2, f"{ns}/b", f"{ns}/a", deadline=time.time() + 60)
        assert res.ok, res.error
        assert _states(core, ns) == {"a-0": RUNNING, "a-1": RUNNING, "b-0": SUSPENDED, "b-1": SUSPENDED}
        assert res.suspend_s > 0 and res.restore_s > 0

        # a stale orchestrator (token 1 < 2) tries to suspend a on the first node: refused
        stale = {
            names.ANNOTATION_SUSPEND_REQUEST: json.dumps({"by": "stale"}),
            names.ANNOTATION_FENCING_TOKEN: f"{GROUP}:1",
        }
        core.patch_namespaced_pod("a-0", ns, {"metadata": {"annotations": stale}})

        def evs() -> list[str]:
            return [e.reason for e in core.list_namespaced_event(ns, field_selector="involvedObject.name=a-0").items]

        wait_for("fencing rejection Event", lambda: names.EVENT_FENCING_REJECTED in evs(), timeout=30)
        assert _state(core, ns, "a-0") == RUNNING
        fresh = {names.ANNOTATION_SUSPEND_REQUEST: None, names.ANNOTATION_FENCING_TOKEN: f"{GROUP}:2"}
        core.patch_namespaced_pod("a-0", ns, {"metadata": {"annotations": fresh}})

        # the injected failure: the second node's driver is down, so a cannot be suspended there
        assert two_drivers[nodes[1]].stop() == 0
        res = handover.switch(GROUP, 3, f"{ns}/a", f"{ns}/b", deadline=time.time() + 10)
        assert not res.ok and res.rolled_back, res.error
        assert res.failed_pods == (f"{ns}/a-1@{nodes[1]}",)
        # all or nothing: the first node suspended a, then resumed it; b stayed suspended everywhere
        assert _states(core, ns) == {"a-0": RUNNING, "a-1": RUNNING, "b-0": SUSPENDED, "b-1": SUSPENDED}
        a0 = core.read_namespaced_pod("a-0", ns).metadata.annotations or {}
        assert names.ANNOTATION_SUSPEND_REQUEST not in a0
        reasons = evs()
        assert reasons.count("Suspended") >= 2 and reasons.count("Resumed") >= 2  # switch 1 and 3's rollback
    finally:
        delete_namespace(api, ns)

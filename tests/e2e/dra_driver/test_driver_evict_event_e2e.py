"""A reclaim that cannot suspend evicts the lent workload, and the API says so on the real pod
(docs/bench/soak.md, finding 4). A real ``rose driver`` (simulated GPUs, the engine's explicit
``simulated`` backend) with a host-memory budget of 0 B and no disk tier; the real scheduler
allocates a lent GPU, then serving on it; this test plays the kubelet. The suspend is refused,
the simulated occupant has no SDK checkpoint channel, so the driver enforces at the deadline and
evicts the lent pod. The refusal's Warning and the eviction's Warning are Events on that pod (the
claim's ``reservedFor``), none on the occupant's ``simulated-claim-<uid>`` registration, and the
eviction is counted as one that lost its state."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from local_cluster import ClusterHandle
from local_cluster.kubelet import DriverProcess
from local_cluster.objects import allocated_claim
from rose_common import names
from tests.support.driver_fixtures import driver_published, simulated_host_driver
from tests.support.k8s_helpers import (
    claim_template,
    create_claim_template,
    gpu_pod,
    scratch_namespace,
    wait_for,
)

OCCUPANT = 16 << 20


@pytest.fixture(scope="module")
def full_driver(cluster: ClusterHandle) -> Iterator[tuple[DriverProcess, str]]:
    node = cluster.node_names[-1]

    def args(_: Path) -> list[str]:
        return [
            "--suspend-engine", "node", "--suspend-backends", "simulated",
            "--simulated-occupant-bytes", str(OCCUPANT), "--host-memory-budget", "0",
            "--default-grace-seconds", "2", "--enforce-timeout-seconds", "10",
            "--serving-wait", "prepare",  # the played kubelet's prepare reclaims
        ]  # fmt: skip

    with simulated_host_driver(cluster, node, "rose-evev-", args) as drv:
        yield drv, node


def _warnings_on(core: client.CoreV1Api, ns: str, pod: str) -> dict[str, str]:
    evs = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={pod},type=Warning").items
    return {e.reason: e.message for e in evs}


def test_unsuspendable_occupant_eviction_is_a_warning_on_its_real_pod(
    cluster: ClusterHandle, full_driver: tuple[DriverProcess, str], api: Any
) -> None:
    with scratch_namespace(api, "evev") as ns:
        _reclaim_by_eviction(full_driver, api, ns)


def _reclaim_by_eviction(full_driver: tuple[DriverProcess, str], api: Any, ns: str) -> None:
    drv, node = full_driver
    wait_for("driver slice", lambda: driver_published(api, node), timeout=60)
    core = client.CoreV1Api(api)
    sel = ['device.attributes["gpu.rose.io"].index == 0']
    create_claim_template(api, ns, claim_template("lent", names.DEVICE_CLASS_LENDABLE, selectors=sel))
    create_claim_template(api, ns, claim_template("serve", names.DEVICE_CLASS_SERVING, selectors=sel))
    core.create_namespaced_pod(ns, gpu_pod("rl-0", "lent", labels={names.LABEL_JOB: "job-ev"}, node_name=node))
    lent = wait_for("RL claim", lambda: allocated_claim(api, ns, "rl-0"), timeout=90)
    rl_uid = core.read_namespaced_pod("rl-0", ns).metadata.uid
    assert [r["uid"] for r in lent["status"]["reservedFor"]] == [rl_uid]
    assert drv.prepare(lent).error == ""
    core.create_namespaced_pod(ns, gpu_pod("srv-0", "serve", labels={names.LABEL_ROLE: "serving"}, node_name=node))
    serve = wait_for("serving claim", lambda: allocated_claim(api, ns, "srv-0"), timeout=90)

    out = drv.prepare(serve)  # no host memory to suspend into, no checkpoint: serving wins by eviction
    assert out.error == "", out.error

    got = wait_for("warnings on rl-0", lambda: (w := _warnings_on(core, ns, "rl-0")).get("LentWorkloadEvicted") and w)
    assert "host-memory budget" in got["SuspendFallbackCheckpointFailed"]
    assert "suspend refused" in got["LentWorkloadEvicted"]
    assert "state was lost" in got["LentWorkloadEvicted"]
    evicted = next(
        e
        for e in core.list_namespaced_event(ns, field_selector="involvedObject.name=rl-0").items
        if e.reason == "LentWorkloadEvicted"
    )
    assert evicted.involved_object.uid == rl_uid
    everywhere = core.list_event_for_all_namespaces().items
    assert [e.involved_object.name for e in everywhere if e.involved_object.name.startswith("simulated-claim-")] == []
    assert drv.metric("rose_driver_lent_evictions_total", {"state": "lost"}) == 1
    assert drv.metric("rose_driver_lent_evictions_total", {"state": "saved"}) == 0
    assert drv.unprepare(serve).error == ""
    assert drv.unprepare(lent).error == ""

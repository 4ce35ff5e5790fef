"""Layered memory end to end: a real ``rose driver`` (simulated GPUs, the suspend engine's explicit
``simulated`` backend holding real bytes) with a DRAM budget that holds one suspended occupant and
a disk tier (``--spill-dir``). The real scheduler allocates two lent GPUs, then serving on both;
this test plays the kubelet. The second serving prepare spills the first occupant to disk instead
of evicting anything; the driver's metrics and node facts show both tiers; giving the GPU back
resumes the spilled occupant from disk."""

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

MiB = 1 << 20
OCCUPANT = 48 * MiB
DRAM = 64 * MiB  # one occupant fits, two do not
DISK = 256 * MiB


@pytest.fixture(scope="module")
def spill_driver(cluster: ClusterHandle) -> Iterator[tuple[DriverProcess, str, Path]]:
    node = cluster.node_names[-1]

    def args(root: Path) -> list[str]:
        return [
            "--suspend-engine", "node", "--suspend-backends", "simulated",
            "--simulated-occupant-bytes", str(OCCUPANT), "--host-memory-budget", str(DRAM),
            "--spill-dir", str(root / "spill"), "--spill-budget-bytes", str(DISK),
            "--default-grace-seconds", "10", "--node-facts-seconds", "0.5",
            "--serving-wait", "prepare",  # the played kubelet's prepare reclaims (prebind has its own e2e test)
        ]  # fmt: skip

    with simulated_host_driver(cluster, node, "rose-spl-", args) as drv:
        yield drv, node, drv.root.parent / "spill"


@pytest.fixture
def ns(api: Any) -> Iterator[str]:
    with scratch_namespace(api, "spill") as name:
        yield name


def _sample(drv: DriverProcess, line_prefix: str) -> float | None:
    for ln in drv.metrics():
        if ln.startswith(line_prefix + " "):
            return float(ln.rsplit(" ", 1)[1])
    return None


def test_budget_full_spills_to_disk_not_evict_and_resumes_from_disk(
    cluster: ClusterHandle, spill_driver: tuple[DriverProcess, str, Path], api: Any, ns: str
) -> None:
    drv, node, spill_dir = spill_driver
    wait_for("driver slice", lambda: driver_published(api, node), timeout=60)
    core = client.CoreV1Api(api)
    lent, serve = {}, {}
    for gpu in (0, 1):
        sel = [f'device.attributes["gpu.rose.io"].index == {gpu}']
        create_claim_template(api, ns, claim_template(f"lent-{gpu}", names.DEVICE_CLASS_LENDABLE, selectors=sel))
        create_claim_template(api, ns, claim_template(f"serve-{gpu}", names.DEVICE_CLASS_SERVING, selectors=sel))
        core.create_namespaced_pod(
            ns, gpu_pod(f"rl-{gpu}", f"lent-{gpu}", labels={names.LABEL_JOB: "job-s"}, node_name=node)
        )
    for gpu in (0, 1):
        lent[gpu] = wait_for(f"RL claim {gpu}", lambda g=gpu: allocated_claim(api, ns, f"rl-{g}"), timeout=90)
        assert drv.prepare(lent[gpu]).error == ""
    for gpu in (0, 1):
        core.create_namespaced_pod(
            ns, gpu_pod(f"srv-{gpu}", f"serve-{gpu}", labels={names.LABEL_ROLE: "serving"}, node_name=node)
        )
        serve[gpu] = wait_for(f"serving claim {gpu}", lambda g=gpu: allocated_claim(api, ns, f"srv-{g}"), timeout=90)

    assert drv.prepare(serve[0]).error == ""  # occupant 0 suspended into DRAM
    assert _sample(drv, 'rose_driver_host_state_bytes{tier="dram"}') == OCCUPANT
    out = drv.prepare(serve[1])  # occupant 1 does not fit DRAM: occupant 0 spills to disk
    assert out.error == "", out.error
    assert _sample(drv, 'rose_driver_host_state_bytes{tier="dram"}') == OCCUPANT
    assert _sample(drv, 'rose_driver_host_state_bytes{tier="disk"}') == OCCUPANT
    assert _sample(drv, 'rose_suspend_spills_total{direction="to_disk",result="ok"}') == 1
    assert _sample(drv, 'rose_driver_occupant_suspend_total{outcome="suspended"}') == 2  # no fallback
    assert _sample(drv, 'rose_driver_occupant_suspend_total{outcome="checkpoint_evict"}') == 0
    assert [p.name for p in spill_dir.iterdir()] == [f"simulated-claim-{lent[0]['metadata']['uid']}.spill"]
    facts = {names.ANNOTATION_HOST_MEM_FREE: str(DRAM - OCCUPANT), names.ANNOTATION_SPILL_FREE: str(DISK - OCCUPANT)}

    def published() -> bool:
        ann = core.read_node(node).metadata.annotations or {}
        return all(ann.get(k) == v for k, v in facts.items())

    wait_for("node facts of both tiers", published, timeout=15)

    assert drv.unprepare(serve[0]).error == ""  # serving leaves GPU 0: occupant 0 resumes from disk
    assert _sample(drv, 'rose_suspend_spills_total{direction="to_dram",result="ok"}') == 1
    assert _sample(drv, 'rose_driver_host_state_bytes{tier="disk"}') == 0
    assert not list(spill_dir.iterdir())
    assert drv.unprepare(serve[1]).error == ""
    assert _sample(drv, 'rose_driver_host_state_bytes{tier="dram"}') == 0
    for gpu in (0, 1):
        assert drv.unprepare(lent[gpu]).error == ""

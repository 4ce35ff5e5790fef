"""GPU shares end to end (issue 27 §3): the real kube-apiserver and kube-scheduler, one real
``rose driver --gpu-shares`` process (simulated GPUs of 141 GiB, the node suspend engine with its
explicit ``simulated`` backend), and this harness playing the kubelet's prepare as
tests/e2e/dra_driver/test_driver_e2e.py does.

Three RL shares of 60 GiB + 25 % ask for GPU 0's shareable device: the scheduler sums their
``consumedCapacity`` and allocates two (120 GiB of 141), the third stays pending. The driver
prepares both on the one GPU with their MPS limits in the CDI spec; a serving pod then lands on the
same GPU and its prepare suspends both shares first (serving's growth reclaims the shares), and
its unprepare resumes them. While the shares are prepared, the GPU's lendable device is tainted
``rose.io/shares-hold`` and a whole-GPU lendable pod on it stays pending.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from dra_driver import cdi
from local_cluster import ClusterHandle
from local_cluster.kubelet import DriverProcess
from local_cluster.objects import allocated_claim, pod_claim
from rose_common import names, promtext
from rose_common.quantity import to_int
from tests.support.driver_fixtures import E2E_DRIVER_ARGS, driver_published, node_driver
from tests.support.k8s_helpers import (
    claim_template,
    create_claim_template,
    gpu_pod,
    scratch_namespace,
    wait_for,
)

REPO = Path(__file__).resolve().parents[3]
GPU0 = 'device.attributes["gpu.rose.io"].index == 0'


@pytest.fixture(scope="module")
def share_driver(cluster: ClusterHandle) -> Iterator[DriverProcess]:
    with node_driver(
        cluster, cluster.node_names[-1], "rose-shr-", lambda _: [*E2E_DRIVER_ARGS, "--gpu-shares", "true"]
    ) as d:
        yield d


@pytest.fixture
def ns(api: Any) -> Iterator[str]:
    with scratch_namespace(api, "shr") as name:
        yield name


def share_template(name: str, memory: str, compute: str) -> dict[str, Any]:
    """examples/share-claim-template.yaml, renamed, pinned to GPU 0, with these capacities."""
    t: dict[str, Any] = copy.deepcopy(yaml.safe_load((REPO / "examples/share-claim-template.yaml").read_text()))
    t["metadata"]["name"] = name
    exactly = t["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    exactly["capacity"]["requests"] = {"memory": memory, "compute": compute}
    exactly["selectors"] = [{"cel": {"expression": GPU0}}]
    return t


def _state(api: Any, ns: str, pod: str) -> str:
    ann: dict[str, str] = client.CoreV1Api(api).read_namespaced_pod(pod, ns).metadata.annotations or {}
    return ann.get(names.ANNOTATION_SUSPEND_STATE, "")


def _reasons(api: Any, ns: str, pod: str) -> set[str]:
    evs = client.CoreV1Api(api).list_namespaced_event(ns, field_selector=f"involvedObject.name={pod}").items
    return {e.reason for e in evs}


def test_shares_fit_by_capacity_and_serving_reclaims_them_first(
    cluster: ClusterHandle, share_driver: DriverProcess, api: Any, ns: str
) -> None:
    drv, node = share_driver, share_driver.node
    s = wait_for("the driver's slice with shares", lambda: driver_published(api, node), timeout=60)
    share = {d["name"]: d for d in s["spec"]["devices"]}["gpu-0-share"]  # the API server kept it as sent
    assert share["allowMultipleAllocations"] is True
    assert share["capacity"]["compute"]["requestPolicy"]["validRange"]["step"] == "5"

    core = client.CoreV1Api(api)
    create_claim_template(api, ns, share_template("rl-share", "60Gi", "23"))  # 23 % → 25 by the step
    create_claim_template(api, ns, claim_template("serve-gpu0", names.DEVICE_CLASS_SERVING, selectors=[GPU0]))
    for i in range(3):
        pod = gpu_pod(f"rl-{i}", "rl-share", labels={names.LABEL_JOB: "job-s"}, node_name=node)
        pod["metadata"]["annotations"] = {names.ANNOTATION_GRACE: "10"}
        core.create_namespaced_pod(ns, pod)

    # the scheduler accounts for consumed capacity across the share claims of one device
    def two_allocated() -> list[dict[str, Any]] | None:
        got = [c for i in range(3) if (c := allocated_claim(api, ns, f"rl-{i}")) is not None]
        return got if len(got) == 2 else None

    claims = wait_for("two of three shares allocated", two_allocated, timeout=60)
    pending = next(f"rl-{i}" for i in range(3) if allocated_claim(api, ns, f"rl-{i}") is None)
    results = [c["status"]["allocation"]["devices"]["results"][0] for c in claims]
    assert {r["device"] for r in results} == {"gpu-0-share"}
    consumed = [{k: to_int(v) for k, v in r["consumedCapacity"].items()} for r in results]
    assert consumed == [{"compute": 25, "memory": 60 * 2**30}] * 2
    assert len({r["shareID"] for r in results}) == 2
    wait_for(f"{pending} unschedulable", lambda: "FailedScheduling" in _reasons(api, ns, pending), timeout=30)
    assert not ((pod_claim(api, ns, pending) or {}).get("status") or {}).get("allocation")

    # the kubelet prepares both shares on the one GPU; the CDI spec carries their MPS limits
    for c in claims:
        out = drv.prepare(c)
        assert out.error == "" and out.devices[0].device_name == "gpu-0-share", out
        spec = json.loads((drv.cdi_dir / cdi.spec_filename(c["metadata"]["uid"])).read_text())
        env = spec["containerEdits"]["env"]
        assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=61440M" in env and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in env
    m = "\n".join(drv.metrics())
    assert promtext.value(m, "rose_driver_share_claims", {"gpu": "0"}) == 2
    assert promtext.value(m, "rose_driver_share_memory_bytes", {"gpu": "0"}) == 120 * 2**30
    assert promtext.value(m, "rose_driver_share_compute_percent", {"gpu": "0"}) == 50

    def lent() -> tuple[str | None, str | None]:
        ann: dict[str, str] = client.CoreV1Api(api).read_node(node).metadata.annotations or {}
        return ann.get(names.ANNOTATION_LENT), ann.get(names.ANNOTATION_LENT_SHARES)

    # node facts: GPU 0 is lent in shares (120 of 141 GiB: 0.86 of it), not lent whole
    wait_for("node facts: GPU 0 lent in shares", lambda: lent() == ("", "0=0.86"), timeout=15)

    # a GPU lent in shares is not lent whole: its lendable device is tainted, a whole claim waits
    def lendable_taints() -> list[str] | None:
        devs = {d["name"]: d for d in (driver_published(api, node) or {"spec": {"devices": []}})["spec"]["devices"]}
        keys = [t["key"] for t in (devs.get("gpu-0-lendable") or {}).get("taints") or []]
        return keys or None

    assert wait_for("gpu-0-lendable tainted", lendable_taints, timeout=30) == [names.TAINT_SHARES_HOLD]
    create_claim_template(api, ns, claim_template("whole-gpu0", names.DEVICE_CLASS_LENDABLE, selectors=[GPU0]))
    core.create_namespaced_pod(ns, gpu_pod("rl-whole", "whole-gpu0", node_name=node))
    wait_for("the whole-GPU pod unschedulable", lambda: "FailedScheduling" in _reasons(api, ns, "rl-whole"), 30)
    assert allocated_claim(api, ns, "rl-whole") is None

    # serving's growth onto GPU 0: both shares are suspended before serving is prepared
    core.create_namespaced_pod(
        ns, gpu_pod("serve-0", "serve-gpu0", labels={names.LABEL_ROLE: "serving"}, node_name=node)
    )
    srv = wait_for("serving claim allocated", lambda: allocated_claim(api, ns, "serve-0"), timeout=60)
    assert srv["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0-serving"
    rl = sorted(c["status"]["reservedFor"][0]["name"] for c in claims)
    assert drv.prepare(srv).error == ""
    assert [_state(api, ns, p) for p in rl] == ["Suspended", "Suspended"]
    assert all("Suspended" in _reasons(api, ns, p) for p in rl)
    assert 'rose_driver_gpu_residency{gpu="0",resident="serving"} 1.0' in drv.metrics()

    # serving leaves: both shares run again
    assert drv.unprepare(srv).error == ""
    assert [_state(api, ns, p) for p in rl] == ["Running", "Running"]
    for c in claims:
        assert drv.unprepare(c).error == ""

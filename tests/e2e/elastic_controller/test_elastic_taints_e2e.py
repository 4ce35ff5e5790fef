"""The planner's intent as device taints, on the real control plane (issue 27 §2).

``python -m elastic_controller`` as a process with forecasts from the explicit ``static-file``
backend (pool ``quiet`` idle, pool ``busy`` full): its plan loop writes one NoSchedule
DeviceTaintRule (resource.k8s.io/v1) per lendable device of ``busy``. The real kube-scheduler's
DynamicResources plugin then allocates no lendable claim there, while a serving claim on the same
node and a lendable claim in ``quiet`` are allocated; when the forecast falls the rules go and the
waiting claim is allocated.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from local_cluster import ClusterHandle, free_port, module_process
from local_cluster.objects import allocated_claim
from rose_common import names, promtext
from tests.support.elastic_fixtures import write_forecasts
from tests.support.erj_cluster import scrape_metrics, two_pools
from tests.support.k8s_helpers import (
    claim_template,
    create_claim_template,
    delete_namespace,
    gpu_pod,
    new_namespace,
    wait_for,
)

RULES = "devicetaintrules"


def _rules(api: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = client.CustomObjectsApi(api).list_cluster_custom_object(
        "resource.k8s.io", "v1", RULES, label_selector=names.LABEL_TAINT_POOL
    )["items"]
    return items


def _delete_rules(api: Any) -> None:
    for r in _rules(api):
        client.CustomObjectsApi(api).delete_cluster_custom_object("resource.k8s.io", "v1", RULES, r["metadata"]["name"])


def _controller(cluster: ClusterHandle, forecasts: Path, port: int) -> list[str]:
    """``python -m elastic_controller`` with the static forecast file and reclaim taints on."""
    return ["elastic_controller", "--forecast-backend=static-file", f"--forecast-file={forecasts}",
            "--forecast-refresh=1", f"--kubeconfig={cluster.kubeconfig}", "--plan-interval=1", "--dwell=0",
            "--taint-lead=60", "--lease-namespace=default", f"--lease-name=ctl-taints-{port}",
            f"--metrics-listen=127.0.0.1:{port}"]  # fmt: skip


@pytest.fixture
def world(cluster: ClusterHandle, api: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    quiet, busy, capacity = two_pools(cluster)
    forecasts = tmp_path / "forecasts.json"
    write_forecasts(forecasts, {quiet: 0.0, busy: float(capacity)})
    port = free_port()
    args = _controller(cluster, forecasts, port)
    ns = new_namespace(api, "taint")
    try:
        with module_process(args, tmp_path / "controller.log"):
            wait_for("controller metrics up", lambda: scrape_metrics(port) or None, 30)
            yield {"ns": ns, "quiet": quiet, "busy": busy, "forecasts": forecasts, "port": port}
    finally:
        delete_namespace(api, ns)
        _delete_rules(api)  # whatever the stopped controller left: other tests schedule on these devices


def _node_of(cluster: ClusterHandle, pool: str) -> str:
    return sorted(n for n, p in cluster.pools.items() if p == pool)[0]


def _failed_to_allocate(api: Any, ns: str, pod: str) -> bool:
    evs = client.CoreV1Api(api).list_namespaced_event(ns, field_selector=f"involvedObject.name={pod}").items
    return any(e.reason == "FailedScheduling" and "cannot allocate all claims" in (e.message or "") for e in evs)


def test_a_planned_reclaim_taints_the_pools_lendable_devices_until_the_forecast_falls(
    cluster: ClusterHandle, api: Any, world: dict[str, Any]
) -> None:
    ns, quiet, busy = world["ns"], world["quiet"], world["busy"]
    busy_nodes = sorted(n for n, p in cluster.pools.items() if p == busy)
    want = {(n, f"gpu-{i}-lendable") for n in busy_nodes for i in range(cluster.gpus_per_node)}

    def tainted() -> set[tuple[str, str]] | None:
        got = {(r["spec"]["deviceSelector"]["pool"], r["spec"]["deviceSelector"]["device"]) for r in _rules(api)}
        return got if got == want else None

    wait_for("the busy pool's lendable devices tainted", tainted, timeout=30)
    for r in _rules(api):
        assert r["spec"]["taint"] == {
            "key": names.TAINT_RECLAIM_PLANNED,
            "value": busy,
            "effect": "NoSchedule",
            "timeAdded": r["spec"]["taint"]["timeAdded"],
        }
        assert r["metadata"]["labels"] == {names.LABEL_TAINT_POOL: busy}
    text = scrape_metrics(world["port"])
    assert promtext.value(text, "rose_controller_pool_reclaim_tainted", {"pool": busy}) == 1
    assert promtext.value(text, "rose_controller_pool_reclaim_tainted", {"pool": quiet}) == 0

    create_claim_template(api, ns, claim_template("lent", names.DEVICE_CLASS_LENDABLE))
    create_claim_template(api, ns, claim_template("serve", names.DEVICE_CLASS_SERVING))
    core = client.CoreV1Api(api)
    busy_node, quiet_node = _node_of(cluster, busy), _node_of(cluster, quiet)
    core.create_namespaced_pod(ns, gpu_pod("rl-busy", "lent", labels={names.LABEL_JOB: "j"}, node_name=busy_node))
    core.create_namespaced_pod(ns, gpu_pod("rl-quiet", "lent", labels={names.LABEL_JOB: "j"}, node_name=quiet_node))
    core.create_namespaced_pod(ns, gpu_pod("serve-busy", "serve", node_name=busy_node))
    # serving still lands on the tainted node (its devices carry no taint), RL lands in the quiet pool
    wait_for("serving claim allocated on the busy node", lambda: allocated_claim(api, ns, "serve-busy"), timeout=60)
    wait_for("RL claim allocated in the quiet pool", lambda: allocated_claim(api, ns, "rl-quiet"), timeout=60)
    # no new RL claim lands where it would be reclaimed at once
    wait_for("RL claim refused on the tainted pool", lambda: _failed_to_allocate(api, ns, "rl-busy"), timeout=60)
    assert allocated_claim(api, ns, "rl-busy") is None

    write_forecasts(world["forecasts"], {quiet: 0.0, busy: 0.0})  # the forecast falls
    wait_for("rules removed", lambda: not _rules(api), timeout=30)
    claim = wait_for("RL claim allocated once untainted", lambda: allocated_claim(api, ns, "rl-busy"), timeout=60)
    (res,) = claim["status"]["allocation"]["devices"]["results"]
    assert res["pool"] == busy_node and res["device"].endswith("-lendable")
    assert promtext.value(scrape_metrics(world["port"]), "rose_controller_pool_reclaim_tainted", {"pool": busy}) == 0


def test_a_stopped_controller_withdraws_its_taints(cluster: ClusterHandle, api: Any, tmp_path: Path) -> None:
    """SIGTERM (an orderly stop): the leader deletes the rules it owns, so a stopped planner's intent
    does not keep new lent claims off those GPUs (rose demo's act 5 found it: act 4's controller had
    left the busy pool tainted)."""
    quiet, busy, capacity = two_pools(cluster)
    forecasts = tmp_path / "forecasts.json"
    write_forecasts(forecasts, {quiet: 0.0, busy: float(capacity)})
    args = _controller(cluster, forecasts, free_port())
    try:
        with module_process(args, tmp_path / "controller.log"):
            wait_for("the busy pool tainted", lambda: _rules(api), timeout=60)
        assert _rules(api) == [], "the stopped controller left its DeviceTaintRules"
        assert "reclaim taints withdrawn on stop" in (tmp_path / "controller.log").read_text()
    finally:
        _delete_rules(api)

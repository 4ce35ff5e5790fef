"""What one tenant's inputs may do to the others, against the real controller (issue 22 §4, §5, §6):
``python -m elastic_controller`` and the extender as processes on the local cluster, forecasts
from the explicit ``static-file`` backend (as in test_elastic_controller_e2e.py). The tenant's
writes are made as the tests' admin client: the admission policy that keeps tenants from writing
``rose.io/*`` is another layer; the planner must not depend on it alone.

- §4: a worker's own ``rose.io/reported-state-bytes`` of 10^18 bytes (a 40,000 s suspend) made
  the pool's lead pass the forecast horizon and every lent GPU of the pool was reclaimed, the
  other tenant's included; a live edit to ``gracefulShutdownPeriod: 3600`` did the same.
- §5: after ``--forecast-max-age`` without a fresh forecast every lent GPU was reclaimed.
- §6: a forged ``rose.io/suspend-state: Suspended`` made the planner skip a running worker's reclaim.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from local_cluster import ClusterHandle, free_port, module_process
from rose_common import names, promtext
from tests.support.elastic_fixtures import write_forecasts
from tests.support.erj_cluster import kubectl, scrape_metrics, two_pools
from tests.support.erj_manifests import elastic_rl_job
from tests.support.k8s_helpers import delete_namespace, new_namespace, wait_for


@pytest.fixture
def world(cluster: ClusterHandle, api: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The extender and the controller on one forecast file (pool ``quiet`` idle, ``busy`` full),
    a forecast older than 3 s counting as missing; two tenant namespaces."""
    assert cluster.extender_url, "the cluster must run the rose-scheduler profile with an extender URL"
    quiet, busy, capacity = two_pools(cluster)
    forecasts = tmp_path / "forecasts.json"
    write_forecasts(forecasts, {quiet: 0.0, busy: float(capacity)})
    ext_host, _, ext_port = cluster.extender_url.removeprefix("http://").partition(":")
    metrics_port = free_port()
    common = ["--forecast-backend=static-file", f"--forecast-file={forecasts}", "--forecast-refresh=1",
              f"--kubeconfig={cluster.kubeconfig}"]  # fmt: skip
    ext_args = ["scheduler_extender", f"--listen={ext_host}:{ext_port}", *common]
    ctl_args = ["elastic_controller", *common, "--forecast-max-age=3", "--plan-interval=1", "--dwell=0",
                "--lease-namespace=default", f"--lease-name=ctl-inputs-{metrics_port}",
                f"--metrics-listen=127.0.0.1:{metrics_port}"]  # fmt: skip
    a, b = new_namespace(api, "tenant-a"), new_namespace(api, "tenant-b")
    try:
        with (
            module_process(ext_args, tmp_path / "extender.log"),
            module_process(ctl_args, tmp_path / "controller.log") as ctl,
        ):
            wait_for("controller metrics up", lambda: scrape_metrics(metrics_port) or None, 30)
            # its probes (rose_common.httpserver): alive, and ready once its informers listed
            assert _status(metrics_port, "/healthz") == 200
            wait_for("controller ready", lambda: _status(metrics_port, "/readyz") == 200 or None, 30)
            yield {
                "a": a,
                "b": b,
                "forecasts": forecasts,
                "quiet": quiet,
                "busy": busy,
                "capacity": capacity,
                "metrics": metrics_port,
                "controller": ctl,
                "log": tmp_path / "controller.log",
            }
    finally:
        delete_namespace(api, a)
        delete_namespace(api, b)


def _status(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def _apply(cluster: ClusterHandle, ns: str, name: str, gpus: int, **spec: Any) -> None:
    template = {"spec": {"priorityClassName": "rose-rl", "containers": [{"name": "trainer", "image": "rose/grpo"}]}}
    fields = {
        "minGPUs": 1,
        "maxGPUs": gpus,
        "gpusPerWorker": 1,
        "gracefulShutdownPeriod": 5,
        "minUsefulRunSeconds": 60,
        "stateBytesPerWorker": 1 << 30,
        **spec,
        "template": template,
    }
    body = elastic_rl_job(name, ns, **fields)
    kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(body))


def _workers(api: Any, ns: str, job: str) -> list[Any]:
    pods = client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=f"{names.LABEL_JOB}={job}").items
    return sorted(pods, key=lambda p: p.metadata.name)


def _running(api: Any, ns: str, job: str, n: int) -> list[Any]:
    def ok() -> list[Any] | None:
        pods = _workers(api, ns, job)
        return pods if len(pods) == n and all(p.status.phase == "Running" for p in pods) else None

    pods: list[Any] = wait_for(f"{n} workers of {ns}/{job} running", ok, 60)
    return pods


def _requested(api: Any, ns: str, job: str) -> list[str]:
    return [
        p.metadata.name
        for p in _workers(api, ns, job)
        if names.ANNOTATION_SUSPEND_REQUEST in (p.metadata.annotations or {})
    ]


def _annotate(api: Any, ns: str, pod: str, ann: dict[str, str]) -> None:
    client.CoreV1Api(api).patch_namespaced_pod(pod, ns, {"metadata": {"annotations": ann}})


def _quiet_for(api: Any, seconds: float, *jobs: tuple[str, str]) -> None:
    """No suspend request on any of ``jobs``' workers for ``seconds`` (plan rounds every 1 s)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for ns, job in jobs:
            assert _requested(api, ns, job) == [], f"{ns}/{job} was reclaimed"
        time.sleep(0.5)


def test_one_tenants_reported_state_and_grace_never_reclaim_another_tenant(
    cluster: ClusterHandle, api: Any, world: dict[str, Any]
) -> None:
    a, b, half = world["a"], world["b"], world["capacity"] // 2
    _apply(cluster, a, "alpha", half)
    _running(api, a, "alpha", half)
    _apply(cluster, b, "beta", half)
    beta = _running(api, b, "beta", half)  # the quiet pool is lent whole: half each

    # the tenant reports 10^18 bytes of state on its own pod (bounded: a few seconds of suspend)
    _annotate(api, b, beta[0].metadata.name, {names.ANNOTATION_REPORTED_STATE_BYTES: str(10**18)})
    _quiet_for(api, 6.0, (a, "alpha"), (b, "beta"))

    # a CRD-valid grace period past the forecast's hour: beta alone is given back
    kubectl(cluster, "patch", "elasticrljob", "beta", "-n", b, "--type=merge", "-p",
             '{"spec": {"gracefulShutdownPeriod": 3600}}')  # fmt: skip
    wait_for("beta's workers reclaimed", lambda: len(_requested(api, b, "beta")) == half or None, 20)
    _quiet_for(api, 4.0, (a, "alpha"))
    assert world["controller"].poll() is None, world["log"].read_text()[-2000:]


def test_a_stale_forecast_freezes_lending_instead_of_reclaiming_everything(
    cluster: ClusterHandle, api: Any, world: dict[str, Any]
) -> None:
    a, quiet = world["a"], world["quiet"]
    _apply(cluster, a, "alpha", world["capacity"])
    _running(api, a, "alpha", world["capacity"])
    before = promtext.value(scrape_metrics(world["metrics"]), "rose_controller_forecast_missing_total", default=0)
    write_forecasts(world["forecasts"], {world["busy"]: float(world["capacity"])})  # quiet: no forecast any more

    def missing() -> bool | None:  # past --forecast-max-age: plans without a fresh forecast for quiet
        text = scrape_metrics(world["metrics"])
        return promtext.value(text, "rose_controller_forecast_missing_total", default=0) > before or None

    wait_for("plans without a fresh forecast", missing, 20)
    _quiet_for(api, 5.0, (a, "alpha"))  # before: every lent GPU of the pool reclaimed here
    text = scrape_metrics(world["metrics"])
    assert promtext.value(text, "rose_controller_forecast_stale", {"pool": quiet}) == 1
    events = client.CoreV1Api(api).list_namespaced_event(a, field_selector="involvedObject.name=alpha").items
    assert "ForecastStale" in {e.reason for e in events}
    assert promtext.value(scrape_metrics(world["metrics"]), "rose_controller_reclaims_total", {"kind": "planned"}) == 0


def test_a_forged_suspended_state_does_not_skip_the_reclaim(
    cluster: ClusterHandle, api: Any, world: dict[str, Any]
) -> None:
    a, n = world["a"], world["capacity"]
    _apply(cluster, a, "alpha", n)
    pods = _running(api, a, "alpha", n)
    for p in pods:  # the tenant claims its running workers are suspended
        _annotate(api, a, p.metadata.name, {names.ANNOTATION_SUSPEND_STATE: "Suspended"})
    time.sleep(2.0)  # a few plan rounds see the forged state
    write_forecasts(world["forecasts"], {world["quiet"]: float(n), world["busy"]: float(n)})
    wait_for("planned suspend requests on every worker", lambda: len(_requested(api, a, "alpha")) == n or None, 20)

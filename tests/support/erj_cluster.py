"""The elastic controller's e2e world on the session cluster: the extender (so the
rose-scheduler profile places the workers) and ``python -m elastic_controller`` as real
processes, both reading one ``static-file`` forecast file, in a namespace of the test's own;
and the small clients the controller's e2e tests share (``kubectl`` as a user runs it, the
controller's ``/metrics``, a job's workers).

``world`` is function-scoped, as it was in ``test_elastic_controller_e2e.py``: each test gets
its own processes, forecast file and namespace."""

from __future__ import annotations

import http.client
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from local_cluster import ClusterHandle, free_port, module_process
from rose_common import names
from tests.support.elastic_fixtures import write_forecasts
from tests.support.k8s_helpers import delete_namespace, new_namespace, wait_for

JOB = "grpo"


def two_pools(cluster: ClusterHandle) -> tuple[str, str, int]:
    """The first two pools (``quiet``, ``busy``) and the GPUs of the first."""
    pools = sorted(set(cluster.pools.values()))
    assert len(pools) >= 2, f"the e2e cluster needs two pools, got {cluster.pools}"
    per_pool = sum(1 for p in cluster.pools.values() if p == pools[0]) * cluster.gpus_per_node
    return pools[0], pools[1], per_pool


@pytest.fixture
def world(cluster: ClusterHandle, api: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The extender (so the rose-scheduler profile places the workers) and the controller, both
    reading one forecast file: pool ``quiet`` forecast idle, pool ``busy`` forecast full."""
    assert cluster.extender_url, "the cluster must run the rose-scheduler profile with an extender URL"
    quiet, busy, capacity = two_pools(cluster)
    forecasts = tmp_path / "forecasts.json"
    write_forecasts(forecasts, {quiet: 0.0, busy: float(capacity)})
    ext_host, _, ext_port = cluster.extender_url.removeprefix("http://").partition(":")
    metrics_port = free_port()
    common = ["--forecast-backend=static-file", f"--forecast-file={forecasts}", "--forecast-refresh=1",
              f"--kubeconfig={cluster.kubeconfig}"]  # fmt: skip
    ext_args = ["scheduler_extender", f"--listen={ext_host}:{ext_port}", *common]
    ctl_args = ["elastic_controller", *common, "--plan-interval=1", "--dwell=0", "--lease-namespace=default",
                f"--lease-name=ctl-e2e-{metrics_port}", f"--metrics-listen=127.0.0.1:{metrics_port}"]  # fmt: skip
    ns = new_namespace(api, "erj")
    try:
        with (
            module_process(ext_args, tmp_path / "extender.log"),
            module_process(ctl_args, tmp_path / "controller.log") as ctl,
        ):
            wait_for("controller metrics up", lambda: scrape_metrics(metrics_port) or None, 30)
            yield {
                "ns": ns,
                "forecasts": forecasts,
                "quiet": quiet,
                "busy": busy,
                "capacity": capacity,
                "metrics": metrics_port,
                "controller": ctl,
                "log": tmp_path / "controller.log",
            }
    finally:
        delete_namespace(api, ns)


def scrape_metrics(port: int) -> str:
    """The controller's ``/metrics`` text on loopback ``port`` (empty while it does not answer)."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        return text
    except OSError:
        return ""


def kubectl(cluster: ClusterHandle, *args: str, stdin: str | None = None) -> str:
    """``kubectl`` as a user runs it against ``cluster``; its stdout (a failure fails the test)."""
    binary = shutil.which("kubectl")
    if binary is None:
        pytest.fail("kubectl is not on PATH: the test applies and deletes the job as a user would")
    out = subprocess.run(
        [binary, f"--kubeconfig={cluster.kubeconfig}", *args],
        input=stdin,
        text=True,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, f"kubectl {' '.join(args)}: {out.stderr}"
    return out.stdout


def job_workers(api: Any, ns: str) -> list[Any]:
    """The pods of job :data:`JOB` in ``ns``, by name."""
    pods = client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=f"{names.LABEL_JOB}={JOB}").items
    return sorted(pods, key=lambda p: p.metadata.name)

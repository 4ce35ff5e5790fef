"""The extender judges an RL share in shares, end to end (issue 27 §3): the session cluster's real
kube-scheduler (profile ``rose-scheduler``) calls our extender process at ``cluster.extender_url``;
one real ``rose driver --gpu-shares`` publishes its node's share devices; the pod's claim comes from
``examples/share-claim-template.yaml`` (20 GiB + 25 %), found by the extender through the pod's
``status.resourceClaimStatuses`` and its own ResourceClaim watch. The forecast (``static-file``
backend) first says serving needs the node's whole pool: the pod stays Pending with the extender's
share verdict; then that serving goes quiet, the pod is nudged, and the scheduler allocates the
share on the node's ``gpu-N-share`` device.
"""

from __future__ import annotations

import copy
import http.client
import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml
from kubernetes import client

from local_cluster import ClusterHandle, free_port, stop_process
from local_cluster.kubelet import DriverProcess
from local_cluster.objects import allocated_claim
from rose_common import names, promtext
from tests.support.driver_fixtures import E2E_DRIVER_ARGS, driver_published, node_driver
from tests.support.extender_fixtures import forecast
from tests.support.k8s_helpers import create_claim_template, delete_namespace, gpu_pod, new_namespace, wait_for

REPO = Path(__file__).resolve().parents[3]


def _write_forecasts(path: Path, cluster: ClusterHandle, busy_pool: str | None) -> None:
    """Every pool quiet, but ``busy_pool``: serving needs all of it for the whole hour."""
    now = datetime.now(UTC)  # the extender counts the horizons from the reply's time
    items = []
    for pool in sorted(set(cluster.pools.values())):
        gpus = cluster.gpus_per_node * sum(1 for p in cluster.pools.values() if p == pool)
        level = gpus if pool == busy_pool else 0
        items.append(
            json.loads(forecast(pool, {600: level, 1800: level, 3600: level}, generated_at=now).model_dump_json())
        )
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"forecasts": items}))
    tmp.replace(path)


@pytest.fixture(scope="module")
def share_driver(cluster: ClusterHandle) -> Iterator[DriverProcess]:
    with node_driver(
        cluster, cluster.node_names[-1], "rose-exs-", lambda _: [*E2E_DRIVER_ARGS, "--gpu-shares", "true"]
    ) as d:
        yield d


@pytest.fixture(scope="module")
def extender(
    cluster: ClusterHandle, share_driver: DriverProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    assert cluster.extender_url, "the session cluster's rose-scheduler profile calls an extender"
    tmp = tmp_path_factory.mktemp("extender-shares")
    path = tmp / "forecasts.json"
    _write_forecasts(path, cluster, cluster.pools[share_driver.node])
    url = urlparse(cluster.extender_url)
    metrics_port = free_port()
    log = (tmp / "extender.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scheduler_extender",
            f"--listen={url.hostname}:{url.port}",
            f"--metrics-listen=127.0.0.1:{metrics_port}",
            f"--kubeconfig={cluster.kubeconfig}",
            "--forecast-backend=static-file",
            f"--forecast-file={path}",
            "--forecast-refresh=1",
        ],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def ready() -> bool:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", metrics_port, timeout=1)
            conn.request("GET", "/readyz")
            ok = conn.getresponse().status == 200
            conn.close()
            return ok
        except OSError:
            return False

    try:
        wait_for("extender ready", lambda: proc.poll() is None and ready(), timeout=30)
        yield {"forecasts": path, "metrics_port": metrics_port}
    finally:
        stop_process(proc)
        log.close()


@pytest.fixture
def ns(api: Any) -> Iterator[str]:
    name = new_namespace(api, "exs")
    yield name
    delete_namespace(api, name)


def _metric(extender: dict[str, Any], name: str) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", extender["metrics_port"], timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return promtext.value(text, name, {})


def test_share_pod_judged_in_shares_by_the_real_scheduler(
    cluster: ClusterHandle, share_driver: DriverProcess, extender: dict[str, Any], api: Any, ns: str
) -> None:
    node = share_driver.node
    wait_for("the driver's slice with shares", lambda: driver_published(api, node), timeout=60)
    template = copy.deepcopy(yaml.safe_load((REPO / "examples/share-claim-template.yaml").read_text()))
    create_claim_template(api, ns, template)
    core = client.CoreV1Api(api)
    pod = gpu_pod("rl-share", "rl-share", scheduler=names.SCHEDULER_NAME, labels={names.LABEL_JOB: "j"}, node_name=node)
    core.create_namespaced_pod(ns, pod)
    nudges = iter(range(10**6))

    def nudge() -> None:
        """A pod update puts an unschedulable pod back in kube-scheduler's queue (as the controller's
        rose.io/schedule-retry does): a first attempt that raced the extender's claim watch retries."""
        core.patch_namespaced_pod(
            "rl-share", ns, {"metadata": {"annotations": {"test.rose.io/nudge": str(next(nudges))}}}
        )

    def refused() -> str | None:
        events = core.list_namespaced_event(ns, field_selector="involvedObject.name=rl-share").items
        msg = next(
            (e.message for e in events if e.reason == "FailedScheduling" and "counted in shares" in (e.message or "")),
            None,
        )
        if msg is None:
            nudge()
        return msg

    message = wait_for("FailedScheduling with the extender's share verdict", refused, timeout=60, interval=2)
    assert f"serving forecast needs pool {cluster.pools[node]!r}" in message and "a share of 20 GiB + 25 %" in message
    assert allocated_claim(api, ns, "rl-share") is None

    _write_forecasts(extender["forecasts"], cluster, None)  # serving goes quiet everywhere

    def allocated() -> dict[str, Any] | None:
        got = allocated_claim(api, ns, "rl-share")
        if got is None:
            nudge()
        return got

    claim = wait_for("the share allocated once the forecast leaves room", allocated, timeout=60, interval=2)
    result = claim["status"]["allocation"]["devices"]["results"][0]
    assert result["pool"] == node and result["device"].endswith("-share"), result
    assert _metric(extender, "rose_extender_share_calls_total") >= 2

"""An ElasticRLJob with roles end to end (issue 23 §3): ``python -m elastic_controller`` and the
extender as processes on the session cluster (as in ``test_elastic_controller_e2e.py``: the
``world`` fixture of ``tests/support/erj_cluster.py``), forecasts from the ``static-file`` backend.

A trainer of 1 and rollouts of 1-3 in the quiet pool (4 GPUs): the trainer, its Service and three
rollout workers are created; a forecast rise that leaves room for 2 removes two rollout workers
while the trainer keeps running; one that leaves room for 1 suspends the last rollout (the test
plays the driver, as the other controller e2e test does) and still not the trainer. Status and
metrics per role along the way. The example ``examples/02_grpo_tiny_llm/elasticrljob.yaml`` is
sent to the API server (server dry run) and accepted with its defaults.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kubernetes import client

from local_cluster import ClusterHandle
from rose_common import names, promtext
from tests.support.elastic_fixtures import write_forecasts
from tests.support.erj_cluster import kubectl, scrape_metrics, world  # noqa: F401 (the fixture)
from tests.support.erj_manifests import elastic_rl_job
from tests.support.k8s_helpers import wait_for

JOB = "grpo-roles"
REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "02_grpo_tiny_llm" / "elasticrljob.yaml"
RL_ROLE = f"{names.LABEL_PREFIX}/rl-role"


def _manifest(ns: str) -> str:
    pod = {"spec": {"priorityClassName": "rose-rl", "containers": [{"name": "c", "image": "rose/grpo"}]}}
    roles = {
        "trainer": {"workers": 1, "stateBytesPerWorker": 1 << 30, "template": pod},
        "rollout": {"minWorkers": 1, "maxWorkers": 3, "template": pod},
    }
    body = elastic_rl_job(JOB, ns, gracefulShutdownPeriod=5, minUsefulRunSeconds=60, roles=roles)
    return json.dumps(body)


def _pods(api: Any, ns: str) -> dict[str, Any]:
    items = client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=f"{names.LABEL_JOB}={JOB}").items
    return {p.metadata.name: p for p in items if p.metadata.deletion_timestamp is None}


def _roles(api: Any, ns: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(names.GROUP, names.VERSION, ns, names.PLURAL, JOB)
    roles: dict[str, Any] = (obj.get("status") or {}).get("roles") or {}
    return roles


def test_rollouts_are_reclaimed_before_the_trainer(cluster: ClusterHandle, api: Any, world: dict[str, Any]) -> None:  # noqa: F811
    ns, quiet, busy, cap = world["ns"], world["quiet"], world["busy"], world["capacity"]
    assert cap == 4, f"the scenario is sized for 4 GPUs in a pool, got {cap}"
    kubectl(cluster, "apply", "-f", "-", stdin=_manifest(ns))

    # 1. idle forecast: the trainer and three rollout workers, all running, each with its role
    def all_running() -> dict[str, Any] | None:
        pods = _pods(api, ns)
        return pods if len(pods) == 4 and all(p.status.phase == "Running" for p in pods.values()) else None

    pods = wait_for("trainer + 3 rollouts running", all_running, 60)
    assert sorted(pods) == [f"{JOB}-rollout-0", f"{JOB}-rollout-1", f"{JOB}-rollout-2", f"{JOB}-trainer-0"]
    trainer = pods[f"{JOB}-trainer-0"]
    assert trainer.metadata.labels[RL_ROLE] == "trainer" and trainer.spec.subdomain == f"{JOB}-trainer"
    rollout_env = {e.name: e.value for e in pods[f"{JOB}-rollout-2"].spec.containers[0].env}
    assert rollout_env["ROSE_ROLE"] == "rollout" and rollout_env["ROSE_ROLE_INDEX"] == "2"
    assert rollout_env["ROSE_TRAINER_ADDR"] == f"{JOB}-trainer-0.{JOB}-trainer.{ns}.svc:50051"
    svc = client.CoreV1Api(api).read_namespaced_service(f"{JOB}-trainer", ns)
    assert svc.spec.cluster_ip == "None" and svc.spec.selector[RL_ROLE] == "trainer"
    assert {p.spec.node_selector[names.LABEL_POOL] for p in pods.values()} == {quiet}
    want = {
        "trainer": {"desiredWorkers": 1, "activeWorkers": 1, "suspendedWorkers": 0},
        "rollout": {"desiredWorkers": 3, "activeWorkers": 3, "suspendedWorkers": 0},
    }
    wait_for("status per role", lambda: _roles(api, ns) == want, 20)
    trainer_uid = trainer.metadata.uid

    # 2. serving is forecast to need 2 of the pool's 4: two rollout workers removed, the trainer stays
    write_forecasts(world["forecasts"], {quiet: float(cap - 2), busy: float(cap)})

    def two_left() -> dict[str, Any] | None:
        pods = _pods(api, ns)
        return pods if len(pods) == 2 else None

    left = wait_for("two rollouts removed", two_left, 30)
    assert sorted(left) == [f"{JOB}-rollout-0", f"{JOB}-trainer-0"]
    assert left[f"{JOB}-trainer-0"].metadata.uid == trainer_uid
    assert all(names.ANNOTATION_SUSPEND_REQUEST not in (p.metadata.annotations or {}) for p in left.values())
    roles = wait_for("rollout desired 1", lambda: (r := _roles(api, ns))["rollout"]["desiredWorkers"] == 1 and r, 20)
    assert roles["trainer"]["activeWorkers"] == 1

    # 3. room for 1: the last rollout (at its minimum) is suspended, the trainer still runs
    write_forecasts(world["forecasts"], {quiet: float(cap - 1), busy: float(cap)})

    def rollout_requested() -> Any:
        p = _pods(api, ns).get(f"{JOB}-rollout-0")
        return p if p is not None and names.ANNOTATION_SUSPEND_REQUEST in (p.metadata.annotations or {}) else None

    wait_for("suspend request on the last rollout", rollout_requested, 30)
    core = client.CoreV1Api(api)  # the test plays the driver: the rollout's state is in host memory now
    core.patch_namespaced_pod(
        f"{JOB}-rollout-0", ns, {"metadata": {"annotations": {names.ANNOTATION_SUSPEND_STATE: "Suspended"}}}
    )
    roles = wait_for("rollout suspended", lambda: (r := _roles(api, ns))["rollout"]["suspendedWorkers"] == 1 and r, 20)
    assert roles["trainer"] == {"desiredWorkers": 1, "activeWorkers": 1, "suspendedWorkers": 0}
    t = _pods(api, ns)[f"{JOB}-trainer-0"]
    assert t.metadata.uid == trainer_uid and names.ANNOTATION_SUSPEND_REQUEST not in (t.metadata.annotations or {})
    job_key = f"{ns}/{JOB}"

    def role_metric(role: str, state: str) -> float:
        labels = {"job": job_key, "role": role, "state": state}
        return promtext.value(scrape_metrics(world["metrics"]), "rose_controller_role_workers", labels)

    wait_for("the role metric shows the suspended rollout", lambda: role_metric("rollout", "suspended") == 1, 10)
    assert (role_metric("trainer", "active"), role_metric("rollout", "active"), role_metric("rollout", "desired")) == (
        1,
        0,
        0,
    )
    reasons = [e.reason for e in core.list_namespaced_event(ns, field_selector=f"involvedObject.name={JOB}").items]
    assert "PlannedShrink" in reasons and "PlannedGangSuspend" in reasons, reasons
    kubectl(cluster, "delete", "elasticrljob", JOB, "-n", ns, "--wait=true")
    assert world["controller"].poll() is None, world["log"].read_text()[-2000:]


def test_the_grpo_example_is_accepted(cluster: ClusterHandle) -> None:
    """The API server validates it (schema, CEL) and fills in its defaults; a server dry run stores nothing."""
    out = kubectl(cluster, "-n", "default", "apply", "--dry-run=server", "-o", "json", "-f", str(EXAMPLE))
    spec = json.loads(out)["spec"]
    assert spec["roles"]["trainer"]["placement"] == "Lent" and spec["roles"]["rollout"]["reclaim"] == "Remove"
    assert "minGPUs" not in spec and spec["suspendPolicy"] == "HostMemoryFirst"

"""The ElasticRLJob controller end to end: ``python -m elastic_controller`` as a real process
against the local cluster (real API server, garbage collector, the rose-scheduler profile with
our extender as a process, KWOK running the bound pods), forecasts from the explicit
``static-file`` backend (the file holds ForecastResponse objects exactly as the predictor's
/v1/forecast returns them; rewriting it is the forecast changing).

The test plays the DRA driver, and says so: once the controller has written its
``rose.io/suspend-request`` on the workers, the test writes ``rose.io/suspend-state: Suspended``
on them, as the driver does after moving the state to host memory, and ``Running`` once the
controller has withdrawn its requests, as the driver does after a resume (KWOK nodes have no
driver).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
from typing import Any

from kubernetes import client

from local_cluster import ClusterHandle, free_port
from rose_common import names, promtext
from tests.support.elastic_fixtures import write_forecasts
from tests.support.erj_cluster import JOB, job_workers, kubectl, scrape_metrics, world
from tests.support.erj_manifests import elastic_rl_job
from tests.support.k8s_helpers import wait_for

__all__ = ["world"]  # the fixture: the extender and the controller, one static forecast file


def _job_manifest(ns: str, lo: int = 2, hi: int = 4) -> str:
    template = {"spec": {"priorityClassName": "rose-rl", "containers": [{"name": "trainer", "image": "rose/grpo"}]}}
    body = elastic_rl_job(
        JOB,
        ns,
        minGPUs=lo,
        maxGPUs=hi,
        gpusPerWorker=1,
        gracefulShutdownPeriod=5,
        minUsefulRunSeconds=60,
        stateBytesPerWorker=1 << 30,
        template=template,
    )
    return json.dumps(body)


def _status(api: Any, ns: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(names.GROUP, names.VERSION, ns, names.PLURAL, JOB)
    out: dict[str, Any] = obj.get("status") or {}
    return out


def test_job_grows_on_idle_forecast_suspends_before_serving_and_delete_leaves_nothing(
    cluster: ClusterHandle, api: Any, world: dict[str, Any]
) -> None:
    ns, quiet = world["ns"], world["quiet"]
    t0 = time.monotonic()
    kubectl(cluster, "apply", "-f", "-", stdin=_job_manifest(ns))

    # 1. the forecast leaves the quiet pool idle: four workers, all pinned there, running
    def running() -> list[Any] | None:
        pods = job_workers(api, ns)
        return pods if len(pods) == 4 and all(p.status.phase == "Running" for p in pods) else None

    pods = wait_for("4 workers running", running, 45)
    uids = {p.metadata.name: p.metadata.uid for p in pods}
    for p in pods:
        owner = p.metadata.owner_references[0]
        assert (owner.kind, owner.name, owner.controller) == (names.KIND, JOB, True)
        assert p.spec.scheduler_name == names.SCHEDULER_NAME
        assert p.spec.node_selector == {names.LABEL_POOL: quiet}
        assert cluster.pools[p.spec.node_name] == quiet
        assert p.spec.resource_claims[0].resource_claim_template_name == f"{JOB}-gpus"
    rct = client.ResourceV1Api(api).read_namespaced_resource_claim_template(f"{JOB}-gpus", ns)
    assert rct.spec.spec.devices.requests[0].exactly.device_class_name == names.DEVICE_CLASS_LENDABLE
    status = wait_for(
        "status Running at 4 GPUs",
        lambda: (s := _status(api, ns)).get("phase") == "Running" and s.get("activeGPUs") == 4 and s,
        20,
    )
    assert status["targetGPUs"] == 4 and status["observedGeneration"] == 1
    printed = kubectl(cluster, "get", "elasticrljob", JOB, "-n", ns)
    assert "Running" in printed, printed

    # 2. serving is forecast to need the whole quiet pool: planned suspend requests on every worker
    write_forecasts(world["forecasts"], {quiet: float(world["capacity"]), world["busy"]: float(world["capacity"])})

    def requested() -> list[dict[str, Any]] | None:
        reqs = [(p.metadata.annotations or {}).get(names.ANNOTATION_SUSPEND_REQUEST) for p in job_workers(api, ns)]
        return [json.loads(r) for r in reqs] if len(reqs) == 4 and all(reqs) else None

    reqs = wait_for("suspend requests on all 4 workers", requested, 20)
    assert {r["by"] for r in reqs} == {"rose-elastic-controller"}
    assert {r["graceSeconds"] for r in reqs} == {5}
    text = scrape_metrics(world["metrics"])
    assert promtext.value(text, "rose_controller_reclaims_total", {"kind": "planned"}) >= 4

    # the test plays the driver: the state is in host memory now
    core = client.CoreV1Api(api)
    for name in uids:
        core.patch_namespaced_pod(
            name, ns, {"metadata": {"annotations": {names.ANNOTATION_SUSPEND_STATE: "Suspended"}}}
        )
    status = wait_for("status Suspended", lambda: (s := _status(api, ns)).get("phase") == "Suspended" and s, 20)
    assert status["suspendedGPUs"] == 4 and status["activeGPUs"] == 0 and status["suspendCount"] == 1
    assert {p.metadata.name: p.metadata.uid for p in job_workers(api, ns)} == uids  # suspended, not recreated
    reasons = {e.reason for e in core.list_namespaced_event(ns, field_selector=f"involvedObject.name={JOB}").items}
    assert {"Running", "Suspended"} <= reasons, reasons

    # 3. the forecast falls: the controller withdraws its requests; the test plays the driver resuming
    write_forecasts(world["forecasts"], {quiet: 0.0, world["busy"]: float(world["capacity"])})

    def withdrawn() -> bool | None:
        pods = job_workers(api, ns)
        return all(names.ANNOTATION_SUSPEND_REQUEST not in (p.metadata.annotations or {}) for p in pods) or None

    wait_for("suspend requests withdrawn", withdrawn, 20)
    for name in uids:
        core.patch_namespaced_pod(name, ns, {"metadata": {"annotations": {names.ANNOTATION_SUSPEND_STATE: "Running"}}})
    status = wait_for("status Running again", lambda: (s := _status(api, ns)).get("phase") == "Running" and s, 20)
    assert status["activeGPUs"] == 4 and status["totalSuspendedSeconds"] > 0
    assert {p.metadata.name: p.metadata.uid for p in job_workers(api, ns)} == uids  # resumed, same pods

    # 4. kubectl delete: the garbage collector removes the workers and the claim template
    kubectl(cluster, "delete", "elasticrljob", JOB, "-n", ns, "--wait=true")

    left: list[str] = []

    def gone() -> bool | None:
        rcts = client.ResourceV1Api(api).list_namespaced_resource_claim_template(ns).items
        claims = client.ResourceV1Api(api).list_namespaced_resource_claim(ns).items
        left[:] = [
            f"{type(o).__name__} {o.metadata.name} deleting={o.metadata.deletion_timestamp is not None}"
            for o in (*job_workers(api, ns), *rcts, *claims)
        ]
        return not left or None

    with contextlib.suppress(AssertionError):
        wait_for("no pods, claim templates or claims left", gone, 30)
    assert not left, f"left after kubectl delete: {left}"
    assert world["controller"].poll() is None, world["log"].read_text()[-2000:]
    text = scrape_metrics(world["metrics"])
    reconciles = promtext.value(text, "rose_controller_reconciles_total")
    errors = promtext.value(text, "rose_controller_reconciles_total", {"result": "error"})
    print(
        f"controller e2e: {time.monotonic() - t0:.1f} s from apply to nothing left; "
        f"{reconciles:.0f} reconciles ({errors:.0f} with a failed action)"
    )
    assert reconciles < 200, "the reconcile loops on its own writes"


def test_of_two_lease_writers_from_one_read_only_one_wins(api: Any) -> None:
    """The Lease I/O on the real API server: two replicas that read the same resourceVersion both
    decide to take an expired lease; the replace of the second conflicts, so only one leads."""
    from elastic_controller import leader
    from elastic_controller.kube import LeaseLock
    from rose_common.kube.client import Raw

    raw = Raw(api)
    name = f"lease-e2e-{free_port()}"
    a, b = LeaseLock(raw, "default", name), LeaseLock(raw, "default", name)
    now = dt.datetime.now(dt.UTC)
    first = leader.decide(None, "old", now - dt.timedelta(minutes=5), 15)
    assert first.write is not None and a.write(first.write, "")
    record, rv = a.get()
    assert record is not None and record.holder == "old" and rv
    wins = []
    for lock, me in ((a, "a"), (b, "b")):
        d = leader.decide(record, me, now, 15)
        assert d.leader and d.write is not None  # both see an expired lease
        wins.append(lock.write(d.write, rv))
    assert wins == [True, False]
    after, _ = b.get()
    assert after is not None and after.holder == "a" and after.transitions == 1
    client.CoordinationV1Api(api).delete_namespaced_lease(name, "default")


def test_a_suspended_worker_waits_for_its_pool_and_is_never_moved_to_another(
    cluster: ClusterHandle, api: Any, world: dict[str, Any]
) -> None:
    """Soak finding 1 (issue 25): a gang-suspended 1-GPU job whose pool stays full while the other
    pool frees up. Before, the planner removed the suspended worker (its pod deleted, its state in
    host memory lost) and grew a fresh one in the other pool. Now the same pod waits, suspended, and
    resumes in its own pool. The test plays the driver (module docstring)."""
    ns, quiet, busy, cap = world["ns"], world["quiet"], world["busy"], float(world["capacity"])
    core = client.CoreV1Api(api)
    kubectl(cluster, "apply", "-f", "-", stdin=_job_manifest(ns, 1, 1))
    pod = wait_for(
        "1 worker running", lambda: (p := job_workers(api, ns)) and p[0].status.phase == "Running" and p[0], 45
    )
    name, uid = pod.metadata.name, pod.metadata.uid
    assert pod.spec.node_selector == {names.LABEL_POOL: quiet}

    write_forecasts(world["forecasts"], {quiet: cap, busy: cap})

    def requested() -> bool:
        return names.ANNOTATION_SUSPEND_REQUEST in (core.read_namespaced_pod(name, ns).metadata.annotations or {})

    wait_for("planned suspend request", requested, 20)
    core.patch_namespaced_pod(name, ns, {"metadata": {"annotations": {names.ANNOTATION_SUSPEND_STATE: "Suspended"}}})
    wait_for("status Suspended", lambda: _status(api, ns).get("phase") == "Suspended", 20)

    # the other pool frees up; the worker's own pool stays full
    write_forecasts(world["forecasts"], {quiet: cap, busy: 0.0})

    def busy_untainted() -> bool:
        text = scrape_metrics(world["metrics"])
        return bool(text) and promtext.value(text, "rose_controller_pool_reclaim_tainted", {"pool": busy}, -1) == 0

    wait_for("the controller plans with the freed pool (its reclaim taint withdrawn)", busy_untainted, 20)
    plans = promtext.value(scrape_metrics(world["metrics"]), "rose_controller_plan_duration_seconds_count")
    wait_for(
        "3 more plans",
        lambda: (
            promtext.value(scrape_metrics(world["metrics"]), "rose_controller_plan_duration_seconds_count") >= plans + 3
        ),
        20,
    )
    pods = job_workers(api, ns)
    assert [(p.metadata.name, p.metadata.uid, p.metadata.deletion_timestamp) for p in pods] == [(name, uid, None)], (
        "the suspended worker was removed or replaced",
        [(p.metadata.name, p.spec.node_selector) for p in pods],
    )
    assert names.ANNOTATION_SUSPEND_REQUEST in (pods[0].metadata.annotations or {})

    # its own pool frees up: the same pod resumes there
    write_forecasts(world["forecasts"], {quiet: 0.0, busy: 0.0})
    wait_for("suspend request withdrawn", lambda: not requested(), 20)
    assert [(p.metadata.name, p.metadata.uid) for p in job_workers(api, ns)] == [(name, uid)]
    assert world["controller"].poll() is None, world["log"].read_text()[-2000:]

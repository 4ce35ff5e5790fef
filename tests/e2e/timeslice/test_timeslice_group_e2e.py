"""Two ElasticRLJobs in one time-slice group on the local cluster (issue 13 §4).

Real processes on the real API server: ``python -m elastic_controller`` (static-file forecast,
the pool idle) and ``python -m timeslice serve --store kubernetes`` (its group Leases in the
test's namespace, which is also the controller's ``--lease-namespace``; the explicit ``noop``
hand-over, since KWOK nodes have no driver to move state). ``kubectl apply`` two jobs with
``spec.timesliceGroup: g1`` → one set of shared ResourceClaims ``ts-g1-w<i>-gpus`` owned by both
jobs, both jobs' workers reference them by ``resourceClaimName``; the jobs' ``Resident``
condition and ``fencingToken`` follow the orchestrator's Lease through an Acquire by ``a``,
its Yield and an Acquire by ``b``; and the controller wrote no suspend request on any worker.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from local_cluster import ClusterHandle, free_port, module_process
from rose_common import names
from rose_common.proto import rose_timeslice_v1_pb2 as pb
from rose_common.proto import rose_timeslice_v1_pb2_grpc as pb_grpc
from tests.support import timeslice_secure as sec
from tests.support.elastic_fixtures import write_forecasts
from tests.support.erj_manifests import elastic_rl_job
from tests.support.k8s_helpers import delete_namespace, new_namespace, wait_for

GROUP = "g1"
JOBS = ("a", "b")


def _ready(port: int, path: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture
def world(cluster: ClusterHandle, api: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    pools = sorted(set(cluster.pools.values()))
    forecasts = tmp_path / "forecasts.json"
    write_forecasts(forecasts, dict.fromkeys(pools, 0.0))
    ns = new_namespace(api, "tsg")
    cport, oport, omport = free_port(), free_port(), free_port()
    ctl = ["elastic_controller", "--forecast-backend=static-file", f"--forecast-file={forecasts}",
           f"--kubeconfig={cluster.kubeconfig}", "--plan-interval=1", "--dwell=0", f"--lease-namespace={ns}",
           "--lease-name=ctl", f"--metrics-listen=127.0.0.1:{cport}"]  # fmt: skip
    tls = sec.tls_files(tmp_path / "tls")  # the orchestrator as in a cluster: TLS, TokenReview, the job check
    orch = ["timeslice", "serve", "--store", "kubernetes", f"--kubeconfig={cluster.kubeconfig}", "--namespace", ns,
            "--handover", "noop", "--lease-name", "orch", "--lease-ttl", "30", "--listen", f"127.0.0.1:{oport}",
            "--metrics-listen", f"127.0.0.1:{omport}", *sec.tls_flags(tls)]  # fmt: skip
    try:
        with (
            module_process(ctl, tmp_path / "controller.log"),
            module_process(orch, tmp_path / "orchestrator.log"),
        ):
            wait_for("controller metrics up", lambda: _ready(cport, "/metrics"), 30)
            wait_for("orchestrator ready (leader)", lambda: _ready(omport, "/readyz"), 60)
            with sec.channel(f"127.0.0.1:{oport}", tls) as ch:
                yield {
                    "ns": ns,
                    "stub": pb_grpc.TimeSliceOrchestratorStub(ch),
                    "tmp": tmp_path,
                    "md": sec.bearer(sec.sa_token(api, ns)),
                }
    finally:
        for log in ("controller.log", "orchestrator.log"):
            with contextlib.suppress(OSError):
                print(f"--- {log} (tail)\n" + (tmp_path / log).read_text()[-3000:])
        delete_namespace(api, ns)


def _apply(cluster: ClusterHandle, ns: str, name: str) -> None:
    body = elastic_rl_job(
        name,
        ns,
        minGPUs=2,
        maxGPUs=2,
        gpusPerWorker=1,
        timesliceGroup=GROUP,
        minUsefulRunSeconds=60,
        template={"spec": {"containers": [{"name": "trainer", "image": "rose/grpo"}]}},
    )
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not on PATH: the test applies the jobs as a user would")
    out = subprocess.run(
        [kubectl, f"--kubeconfig={cluster.kubeconfig}", "apply", "-f", "-"],
        input=json.dumps(body),
        text=True,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr


def _workers(api: Any, ns: str, job: str) -> list[Any]:
    pods = client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=f"{names.LABEL_JOB}={job}").items
    return sorted(pods, key=lambda p: p.metadata.name)


def _claims(api: Any, ns: str) -> dict[str, Any]:
    items = client.ResourceV1Api(api).list_namespaced_resource_claim(ns).items
    return {c.metadata.name: c for c in items}


def _resident(api: Any, ns: str, job: str) -> tuple[str | None, int | None]:
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(names.GROUP, names.VERSION, ns, names.PLURAL, job)
    status = obj.get("status") or {}
    cond = next((c for c in status.get("conditions") or [] if c["type"] == "Resident"), None)
    return (cond or {}).get("reason"), status.get("fencingToken")


def _states(api: Any, ns: str) -> dict[str, tuple[str | None, int | None]]:
    return {j: _resident(api, ns, j) for j in JOBS}


def test_two_jobs_of_a_group_share_claims_and_their_status_follows_the_orchestrator(
    cluster: ClusterHandle, api: Any, world: dict[str, Any]
) -> None:
    ns, stub, md = world["ns"], world["stub"], world["md"]
    for job in JOBS:
        _apply(cluster, ns, job)

    def both_grown() -> dict[str, list[Any]] | None:
        got = {j: _workers(api, ns, j) for j in JOBS}
        return got if all(len(p) == 2 for p in got.values()) else None

    workers = wait_for("both jobs' two workers created", both_grown, 90)
    shared = {f"ts-{GROUP}-w0-gpus", f"ts-{GROUP}-w1-gpus"}
    for job, pods in workers.items():
        refs = {c.resource_claim_name for p in pods for c in p.spec.resource_claims or [] if c.name == "gpus"}
        templates = [c.resource_claim_template_name for p in pods for c in p.spec.resource_claims or []]
        assert refs == shared and not any(templates), (job, refs, templates)

    def owned_by_both() -> dict[str, Any] | None:
        got = _claims(api, ns)
        owners = {n: {o.name for o in got[n].metadata.owner_references or []} for n in shared if n in got}
        return got if owners == {n: set(JOBS) for n in shared} else None

    claims = wait_for("the shared claims, owned by both jobs", owned_by_both, 60)
    assert set(claims) == shared, f"one set of claims for the group, got {sorted(claims)}"
    rct = client.ResourceV1Api(api).list_namespaced_resource_claim_template(ns).items
    assert not rct, "grouped jobs have no claim template of their own"
    wait_for(
        "both jobs report NoGrant", lambda: _states(api, ns) == {"a": ("NoGrant", None), "b": ("NoGrant", None)}, 60
    )

    a = stub.Acquire(pb.AcquireRequest(group=GROUP, job=f"{ns}/a", role="trainer"), timeout=30, metadata=md)
    want = {"a": ("Resident", a.fencing_token), "b": ("Waiting", a.fencing_token)}
    wait_for(f"a resident, b waiting at token {a.fencing_token}", lambda: _states(api, ns) == want, 60)

    stub.Yield(pb.YieldRequest(group=GROUP, job=f"{ns}/a", fencing_token=a.fencing_token), timeout=10, metadata=md)
    b = stub.Acquire(pb.AcquireRequest(group=GROUP, job=f"{ns}/b", role="trainer"), timeout=30, metadata=md)
    assert b.fencing_token > a.fencing_token
    want = {"a": ("Waiting", b.fencing_token), "b": ("Resident", b.fencing_token)}
    wait_for(f"the flip: b resident, a waiting at token {b.fencing_token}", lambda: _states(api, ns) == want, 60)

    expected = {("a", "TimesliceResident"), ("a", "TimesliceWaiting"), ("b", "TimesliceResident")}

    def reasons() -> set[tuple[str, str]]:
        events = client.CoreV1Api(api).list_namespaced_event(ns).items
        return {(e.involved_object.name, e.reason) for e in events}

    # an Event is written after the status it reports (the recorder sends it on its own)
    wait_for("the Timeslice Events of both jobs", lambda: expected <= reasons() or None, 30)
    for job in JOBS:
        for p in _workers(api, ns, job):
            ann = p.metadata.annotations or {}
            assert names.ANNOTATION_SUSPEND_REQUEST not in ann, f"{p.metadata.name}: the controller wrote a request"

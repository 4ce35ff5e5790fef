"""RBAC and admission on the real kube-apiserver, installed into a namespace other than rose-system
(docs/security.md): checked by impersonation with the venv's kubectl (``auth can-i --as`` and real
requests ``--as``), denied requests sent as server-side dry runs so that a request let through by a
broken policy changes nothing.

- the node driver (rose-dra-driver, token bound to a pod on node 0: the impersonated
  ``authentication.kubernetes.io/node-name`` extra) writes only node 0's pods and Node, only its own
  annotations, pods/resize only the cpu, Events only about pods and stamped with node 0;
- the extender (rose-extender) patches only ``rose.io/suspend-request`` and deletes nothing;
- serving claims and the rose-serving PriorityClass only in namespaces labelled rose.io/serving=allowed;
- Pod Security: an RL worker pod of the example job is admitted under ``enforce=baseline``;
- control annotations (issue 22, finding 6): a tenant with the ``edit`` role cannot set, change or
  remove ``rose.io/`` pod annotations (a forged suspend state or fencing token), nor can an account
  that merely shares a ROSE account's name in another namespace;
- ElasticRLJob templates (finding 10): held to Pod Security baseline at apply time (each offending
  field named), no ``nodeName``, another service account only for who may create pods; the
  namespace's ``pod-security.kubernetes.io/enforce=privileged`` opts out; the controller's own pods
  are held to the same rules.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from elastic_controller import workers
from local_cluster import ClusterHandle
from rose_common.elasticrljob import ElasticRLJob
from rose_common.kube.client import Raw
from rose_common.kube.errors import ApiError
from tests.support.k8s_helpers import delete_namespace, new_namespace, report_container_resources

MANIFESTS = Path(__file__).resolve().parents[3] / "manifests"
INSTALL = [
    "driver/serviceaccount.yaml",
    "driver/rbac.yaml",
    "driver/admission-policy.yaml",
    "extender/serviceaccount.yaml",
    "extender/rbac.yaml",
    "policies/serving-namespaces.yaml",
    "policies/controller-pods.yaml",
    "policies/control-annotations.yaml",
    "policies/elastic-pod-security.yaml",
]
KUBECTL = shutil.which("kubectl") or str(Path(sys.executable).with_name("kubectl"))
NODE_EXTRA = "authentication.kubernetes.io/node-name"
MERGE = "application/merge-patch+json"


@dataclass(frozen=True)
class Env:
    kubeconfig: Path
    install_ns: str  # where ROSE's accounts live: not rose-system
    ns: str  # a tenant namespace with a pod on node 0 and one on node 1
    node0: str
    node1: str
    drv: Raw  # requests as the node-0 driver (impersonated: account and node-name extra)
    ext: Raw  # requests as the extender

    def driver(self) -> list[str]:
        return [
            f"--as=system:serviceaccount:{self.install_ns}:rose-dra-driver",
            f"--as-user-extra={NODE_EXTRA}={self.node0}",
        ]

    def extender(self) -> list[str]:
        return [f"--as=system:serviceaccount:{self.install_ns}:rose-extender"]


def kubectl(env: Env, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KUBECTL, f"--kubeconfig={env.kubeconfig}", *args],
        check=False,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def ok(env: Env, *args: str, stdin: str | None = None) -> str:
    r = kubectl(env, *args, stdin=stdin)
    assert r.returncode == 0, f"kubectl {' '.join(args)}: {r.stderr}"
    return r.stdout


def denied(env: Env, *args: str, stdin: str | None = None) -> str:
    """Send a server-side dry run until it is refused (policies load asynchronously); the message."""
    deadline = time.monotonic() + 30
    while True:
        r = kubectl(env, *args, "--dry-run=server", stdin=stdin)
        if r.returncode != 0:
            assert "forbidden" in r.stderr.lower() or "denied" in r.stderr.lower(), r.stderr
            return r.stderr
        assert time.monotonic() < deadline, f"kubectl {' '.join(args)} was never refused: {r.stdout}"
        time.sleep(0.5)


def can_i(env: Env, who: list[str], verb: str, resource: str) -> bool:
    res, _, sub = resource.partition("/")  # can-i takes a subresource as a flag
    r = kubectl(env, "auth", "can-i", verb, res, *([f"--subresource={sub}"] if sub else []), "-n", env.ns, *who)
    assert r.stdout.strip() in ("yes", "no"), r.stderr
    return r.stdout.strip() == "yes"


def _install_docs(install_ns: str) -> list[dict[str, Any]]:
    """The manifests as the chart renders them for ``install_ns``: namespace, subjects, and the
    ROSE accounts the control-annotation policy names (``rose-system`` replaced, as the chart does)."""
    docs = [
        d
        for f in INSTALL
        for d in yaml.safe_load_all((MANIFESTS / f).read_text().replace("rose-system", install_ns))
        if d
    ]
    for d in docs:
        if d["kind"] in ("ServiceAccount", "Secret", "Role") or (
            d["kind"] == "RoleBinding" and "namespace" not in d["metadata"]
        ):
            d["metadata"]["namespace"] = install_ns
        for s in d.get("subjects", []):
            s["namespace"] = install_ns
    return docs


def _pod(name: str, node: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "tenant", **labels}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/rose/fake:1",
                    "resources": {"requests": {"cpu": "1", "memory": "64Mi"}},
                }
            ],
        },
    }


def impersonating(cluster: ClusterHandle, user: str, node: str | None = None) -> Raw:
    """A client whose requests the API server treats as ``user`` (and, for a driver, its node):
    kubectl patch reads the object first, which neither account may do on every path it writes."""
    api = cluster.api_client()
    api.set_default_header("Impersonate-User", user)
    if node is not None:
        api.set_default_header("Impersonate-Extra-" + NODE_EXTRA.replace("/", "%2F"), node)
    return Raw(api)


@pytest.fixture(scope="module")
def env(cluster: ClusterHandle) -> Iterator[Env]:
    api = cluster.api_client()
    install_ns = new_namespace(api, "rose-sec")
    ns = new_namespace(api, "sec-tenant")
    node0, node1 = cluster.node_names[0], cluster.node_names[1]
    drv = impersonating(cluster, f"system:serviceaccount:{install_ns}:rose-dra-driver", node0)
    ext = impersonating(cluster, f"system:serviceaccount:{install_ns}:rose-extender")
    e = Env(cluster.kubeconfig, install_ns, ns, node0, node1, drv, ext)
    docs = _install_docs(install_ns)
    stream = yaml.safe_dump_all(docs)
    try:
        ok(e, "apply", "-f", "-", stdin=stream)
        rl_worker = {"rose.io/elastic-rl-job": "cartpole", "rose.io/role": "rl-worker"}
        for name, node, labels in (("sec-pod-0", e.node0, {}), ("sec-pod-1", e.node1, rl_worker)):
            ok(e, "create", "-n", ns, "-f", "-", stdin=json.dumps(_pod(name, node, **labels)))
            report_container_resources(api, ns, name)  # KWOK plays no kubelet resize report
        yield e
    finally:
        kubectl(e, "delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=stream)
        delete_namespace(api, ns)
        delete_namespace(api, install_ns)
        for c in (api, drv.api, ext.api):
            c.close()


def refused(raw: Raw, path: str, body: dict[str, Any], content_type: str = MERGE, method: str = "PATCH") -> str:
    """A server-side dry run, until it is refused (policies load asynchronously); the message."""
    deadline = time.monotonic() + 30
    while True:
        try:
            raw.json(method, path + "?dryRun=All", body=body, content_type=content_type)
        except ApiError as e:
            assert e.code in (403, 422), e.status
            return e.status.message
        assert time.monotonic() < deadline, f"PATCH {path} {body} was never refused"
        time.sleep(0.5)


def patched(raw: Raw, path: str, body: dict[str, Any], content_type: str = MERGE) -> dict[str, Any]:
    out: dict[str, Any] = raw.json("PATCH", path, body=body, content_type=content_type)
    return out


def pod_path(env: Env, name: str) -> str:
    return f"/api/v1/namespaces/{env.ns}/pods/{name}"


def ann(key: str, value: str | None) -> dict[str, Any]:
    return {"metadata": {"annotations": {key: value}}}


# --- the node driver ---------------------------------------------------------------------------


def test_driver_rbac_by_can_i(env: Env) -> None:
    drv = env.driver()
    assert can_i(env, drv, "patch", "pods") and can_i(env, drv, "patch", "pods/resize")
    assert can_i(env, drv, "create", "events")
    assert can_i(env, drv, "create", "pods/eviction")  # cluster-wide: an Eviction carries no node
    for verb, res in (
        ("delete", "pods"),
        ("update", "pods"),
        ("patch", "events"),
        ("delete", "nodes"),
        ("update", "nodes"),
        ("patch", "nodes/status"),
        ("create", "pods/binding"),
    ):
        assert not can_i(env, drv, verb, res), f"the driver may {verb} {res}"


def test_driver_cannot_patch_pods_on_another_node(env: Env) -> None:
    body = ann("rose.io/suspend-state", "Running")
    msg = refused(env.drv, pod_path(env, "sec-pod-1"), body)
    assert f"on node '{env.node0}' may patch only pods bound to that node" in msg
    out = patched(env.drv, pod_path(env, "sec-pod-0"), body)
    assert out["metadata"]["annotations"]["rose.io/suspend-state"] == "Running"


def test_driver_may_change_only_its_annotations_on_its_pods(env: Env) -> None:
    path = pod_path(env, "sec-pod-0")
    msg = refused(env.drv, path, ann("rose.io/suspend-request", "{}"))
    assert "may change only the pod annotations rose.io/suspend-state, rose.io/suspended-cpu" in msg
    assert "not rose.io/suspend-request" in msg
    msg = refused(env.drv, path, {"metadata": {"labels": {"app": "other"}}})
    assert "may not change a pod's labels" in msg
    msg = refused(env.drv, path, {"spec": {"activeDeadlineSeconds": 1}})
    assert "may not change a pod's spec" in msg
    out = patched(env.drv, path, ann("rose.io/suspended-cpu", '{"main":"1"}'))
    assert out["metadata"]["labels"] == {"app": "tenant"}
    # the workload reports it relays from the node agent (dra_driver/agent/reports.py) are its own too
    reports = {
        "rose.io/workload-phase": "Training",
        "rose.io/seconds-to-safe-point": "1.0",
        "rose.io/reported-state-bytes": "1",
        "rose.io/reported-min-gpus": "1",
        "rose.io/reported-min-host-memory-bytes": "1",
    }
    out = env.drv.json("PATCH", path + "?dryRun=All", body={"metadata": {"annotations": reports}}, content_type=MERGE)
    assert out["metadata"]["annotations"]["rose.io/workload-phase"] == "Training"


def test_driver_may_resize_only_the_cpu_of_its_pods(env: Env) -> None:
    smp = "application/strategic-merge-patch+json"

    def resize(res: dict[str, str]) -> dict[str, Any]:
        return {"spec": {"containers": [{"name": "main", "resources": {"requests": res}}]}}

    msg = refused(env.drv, pod_path(env, "sec-pod-0") + "/resize", resize({"memory": "32Mi"}), smp)
    assert "may resize only the cpu requests and limits" in msg
    msg = refused(env.drv, pod_path(env, "sec-pod-1") + "/resize", resize({"cpu": "500m"}), smp)
    assert "may patch only pods bound to that node" in msg
    out = patched(env.drv, pod_path(env, "sec-pod-0") + "/resize", resize({"cpu": "500m"}), smp)
    assert out["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "500m", "memory": "64Mi"}


def test_driver_may_annotate_only_its_own_node_and_only_its_annotations(env: Env) -> None:
    node0, node1 = f"/api/v1/nodes/{env.node0}", f"/api/v1/nodes/{env.node1}"
    lent = ann("rose.io/lent-gpus", "0")
    assert "may annotate only its own Node" in refused(env.drv, node1, lent)
    msg = refused(env.drv, node0, {"metadata": {"labels": {"rose.io/pool": "stolen"}}})
    assert "may not change a Node's labels" in msg
    taint = {"spec": {"taints": [{"key": "rose.io/evil", "effect": "NoSchedule"}]}}
    assert "may not change a Node's spec" in refused(env.drv, node0, taint)
    assert "not rose.io/policy-test" in refused(env.drv, node0, ann("rose.io/policy-test", "1"))
    out = patched(env.drv, node0 + "?dryRun=All", lent)  # allowed; a dry run leaves the Node as it is
    assert out["metadata"]["annotations"]["rose.io/lent-gpus"] == "0"


def _event(env: Env, host: str, kind: str = "Pod") -> str:
    name = f"sec-ev-{uuid.uuid4().hex[:6]}"
    ev = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": env.ns},
        "involvedObject": {"apiVersion": "v1", "kind": kind, "name": "sec-pod-0", "namespace": env.ns},
        "reason": "Suspended",
        "message": "policy test",
        "type": "Normal",
        "source": {"component": "rose-dra-driver", "host": host},
        "reportingComponent": "rose-dra-driver",
        "reportingInstance": host,
    }
    return json.dumps(ev)


def test_driver_events_name_its_node_and_a_pod(env: Env) -> None:
    drv = env.driver()
    msg = denied(env, "create", "-f", "-", *drv, stdin=_event(env, env.node1))
    assert f"must stamp its Events with source.host and reportingInstance '{env.node0}'" in msg
    assert "only about Pods" in denied(env, "create", "-f", "-", *drv, stdin=_event(env, env.node0, kind="Node"))
    ok(env, "create", "-f", "-", *drv, stdin=_event(env, env.node0))


def test_driver_evictions_carry_a_uid_precondition(env: Env) -> None:
    path = pod_path(env, "sec-pod-0") + "/eviction"
    body: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "sec-pod-0", "namespace": env.ns},
    }
    msg = refused(env.drv, path, body, "application/json", method="POST")
    assert "must carry deleteOptions.preconditions.uid" in msg
    uid = json.loads(ok(env, "get", "pod/sec-pod-0", "-n", env.ns, "-o", "json"))["metadata"]["uid"]
    body["deleteOptions"] = {"preconditions": {"uid": uid}, "dryRun": ["All"]}
    env.drv.json("POST", path + "?dryRun=All", body=body)  # allowed; a dry run evicts nothing


# --- the extender ------------------------------------------------------------------------------


def test_extender_has_its_own_least_privilege_account(env: Env) -> None:
    ext = env.extender()
    assert can_i(env, ext, "patch", "pods") and can_i(env, ext, "get", "pods")
    assert can_i(env, ext, "list", "resourceclaims") and can_i(env, ext, "watch", "resourceslices")
    assert can_i(env, ext, "create", "events")
    for verb, res in (
        ("delete", "pods"),
        ("create", "pods/eviction"),
        ("create", "pods/binding"),
        ("update", "pods"),
        ("patch", "nodes"),
        ("get", "secrets"),
    ):
        assert not can_i(env, ext, verb, res), f"the extender may {verb} {res}"
    r = kubectl(env, "delete", "pod/sec-pod-1", "-n", env.ns, "--dry-run=server", *ext)
    assert r.returncode != 0 and "forbidden" in r.stderr.lower(), r.stderr


def _request(by: str) -> dict[str, Any]:
    return ann("rose.io/suspend-request", json.dumps({"by": by, "reason": "test"}))


def test_extender_may_patch_only_the_suspend_request(env: Env) -> None:
    path = pod_path(env, "sec-pod-1")  # an RL worker
    msg = refused(env.ext, path, ann("rose.io/suspend-state", "Suspended"))
    assert "only the pod annotation rose.io/suspend-request, not rose.io/suspend-state" in msg
    msg = refused(env.ext, path, {"metadata": {"labels": {"rose.io/role": "serving"}}})
    assert "may not change a pod's labels" in msg
    msg = refused(env.ext, pod_path(env, "sec-pod-0"), _request("rose-scheduler-extender"))
    assert "only of RL workers" in msg
    assert "only its own suspend requests" in refused(env.ext, path, _request("rose-elastic-controller"))
    assert (
        "rose.io/suspend-request"
        in patched(env.ext, path, _request("rose-scheduler-extender"))["metadata"]["annotations"]
    )
    patched(env.ext, path, ann("rose.io/suspend-request", None))  # withdraws its own
    ok(env, "annotate", "pod/sec-pod-1", "-n", env.ns, "rose.io/suspend-request=" + json.dumps({"by": "planner"}))
    try:
        msg = refused(env.ext, path, ann("rose.io/suspend-request", None))
        assert "only its own suspend requests" in msg
    finally:
        ok(env, "annotate", "pod/sec-pod-1", "-n", env.ns, "rose.io/suspend-request-")


def test_extender_events_are_its_suspend_events(env: Env) -> None:
    ev = json.loads(_event(env, "rose-scheduler"))
    ev["reason"] = "Killing"
    msg = denied(env, "create", "-f", "-", *env.extender(), stdin=json.dumps(ev))
    assert "only SuspendRequested or SuspendWithdrawn Events about Pods, not Killing" in msg
    ev["reason"] = "SuspendRequested"
    ok(env, "create", "-f", "-", *env.extender(), stdin=json.dumps(ev))


# --- the ElasticRLJob controller ------------------------------------------------------------------


def test_controller_may_delete_only_worker_pods(env: Env) -> None:
    """Its RBAC (pods create/patch/delete, cluster-wide) lives with the controller's manifests;
    granted here so that the request reaches admission, where the policy must refuse it."""
    user = f"system:serviceaccount:{env.install_ns}:rose-elastic-controller"
    role = f"rose-sec-test-controller-{env.install_ns}"
    ok(env, "create", "clusterrole", role, "--verb=create,patch,delete", "--resource=pods")
    try:
        ok(
            env,
            "create",
            "clusterrolebinding",
            role,
            f"--clusterrole={role}",
            f"--serviceaccount={env.install_ns}:rose-elastic-controller",
        )
        msg = denied(env, "delete", "pod/sec-pod-0", "-n", env.ns, f"--as={user}")
        assert "may create, change or delete only worker pods" in msg
        msg = denied(env, "create", "-n", env.ns, "-f", "-", f"--as={user}", stdin=json.dumps(_pod("sec-x", env.node0)))
        assert "may create, change or delete only worker pods" in msg
        ok(env, "delete", "pod/sec-pod-1", "-n", env.ns, "--dry-run=server", f"--as={user}")  # a worker: allowed
    finally:
        kubectl(env, "delete", "clusterrolebinding,clusterrole", role, "--ignore-not-found")


# --- serving classes -----------------------------------------------------------------------------


def _claim(kind: str, device_class: str, first_available: bool = False) -> str:
    req: dict[str, Any] = {"name": "gpu"}
    if first_available:
        req["firstAvailable"] = [{"name": "a", "deviceClassName": device_class}]
    else:
        req["exactly"] = {"deviceClassName": device_class}
    spec = {"devices": {"requests": [req]}}
    name = f"sec-{kind.lower()}-{uuid.uuid4().hex[:6]}"
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec if kind == "ResourceClaim" else {"spec": spec},
    }
    return json.dumps(body)


def _serving_pod() -> str:
    pod = _pod(f"sec-serving-{uuid.uuid4().hex[:6]}", "")
    del pod["spec"]["nodeName"]
    pod["spec"]["priorityClassName"] = "rose-serving"
    return json.dumps(pod)


@pytest.fixture
def serving_ns(cluster: ClusterHandle, env: Env) -> Iterator[str]:
    api = cluster.api_client()
    name = new_namespace(api, "sec-serving")
    ok(env, "label", "namespace", name, "rose.io/serving=allowed")
    yield name
    delete_namespace(api, name)
    api.close()


def test_unlabelled_namespace_cannot_claim_serving_or_use_serving_priority(env: Env) -> None:
    for body in (
        _claim("ResourceClaim", "serving.gpu.rose.io"),
        _claim("ResourceClaimTemplate", "serving.gpu.rose.io"),
        _claim("ResourceClaim", "serving.gpu.rose.io", first_available=True),
        _claim("ResourceClaimTemplate", "serving-share.gpu.rose.io", first_available=True),
    ):
        msg = denied(env, "create", "-n", env.ns, "-f", "-", stdin=body)
        assert f"namespace '{env.ns}' may not claim serving devices" in msg
        assert "rose.io/serving=allowed" in msg
    msg = denied(env, "create", "-n", env.ns, "-f", "-", stdin=_serving_pod())
    assert "may not use the rose-serving PriorityClass" in msg
    ok(
        env,
        "create",
        "-n",
        env.ns,
        "--dry-run=server",
        "-f",
        "-",
        stdin=_claim("ResourceClaim", "lendable.gpu.rose.io"),
    )


def test_labelled_namespace_may_claim_serving(env: Env, serving_ns: str) -> None:
    for body in (
        _claim("ResourceClaim", "serving.gpu.rose.io"),
        _claim("ResourceClaimTemplate", "serving.gpu.rose.io"),
        _serving_pod(),
    ):
        ok(env, "create", "-n", serving_ns, "-f", "-", stdin=body)


# --- Pod Security ----------------------------------------------------------------------------------


def _example_job(ns: str) -> ElasticRLJob:
    """The example job (examples/01_cartpole_reinforce.py) as an ElasticRLJob."""
    container = {
        "name": "trainer",
        "image": "ghcr.io/rose-project/rose:0.1.0",
        "command": ["python", "examples/01_cartpole_reinforce.py", "--updates", "30"],
    }
    return ElasticRLJob.model_validate(
        {
            "metadata": {"name": "cartpole", "namespace": ns, "uid": str(uuid.uuid4()), "generation": 1},
            "spec": {"minGPUs": 1, "maxGPUs": 2, "gpusPerWorker": 1, "template": {"spec": {"containers": [container]}}},
        }
    )


def test_rl_worker_pod_is_admitted_under_baseline_pod_security(cluster: ClusterHandle, env: Env) -> None:
    api = cluster.api_client()
    ns = new_namespace(api, "sec-psa")
    try:
        ok(env, "label", "namespace", ns, "pod-security.kubernetes.io/enforce=baseline")
        job = _example_job(ns)
        pod = workers.worker_pod(job, 0)
        ok(env, "create", "-n", ns, "--dry-run=server", "-f", "-", stdin=json.dumps(workers.claim_template(job)))
        r = kubectl(env, "create", "-n", ns, "--dry-run=server", "-f", "-", stdin=json.dumps(pod))
        assert r.returncode == 0, f"an RL worker pod is refused under baseline Pod Security: {r.stderr}"
        host = json.loads(json.dumps(pod))  # the control: the same pod with a hostPath mount is refused
        host["spec"]["volumes"] = [{"name": "sock", "hostPath": {"path": "/var/lib/kubelet/plugins/gpu.rose.io"}}]
        r = kubectl(env, "create", "-n", ns, "--dry-run=server", "-f", "-", stdin=json.dumps(host))
        assert r.returncode != 0 and "hostPath" in r.stderr, r.stderr
    finally:
        with contextlib.suppress(Exception):
            delete_namespace(api, ns)
        api.close()


# --- control annotations (issue 22, finding 6) ------------------------------------------------------

TENANT = "sec-tenant-user"
JOBS_ONLY = "sec-jobs-only-user"  # may create ElasticRLJobs, not pods


def wait_can(env: Env, who: list[str], verb: str, resource: str) -> None:
    """Until RBAC (its informer) grants what a test just bound."""
    deadline = time.monotonic() + 30
    while not can_i(env, who, verb, resource):
        assert time.monotonic() < deadline, f"{who} never got {verb} {resource}"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def tenant(cluster: ClusterHandle, env: Env) -> Iterator[Raw]:
    """A tenant user with the built-in ``edit`` role in the tenant namespace, plus ``create
    elasticrljobs`` (and nothing on pods beyond edit): requests sent as that user."""
    ok(env, "create", "rolebinding", "sec-tenant-edit", "-n", env.ns, "--clusterrole=edit", f"--user={TENANT}")
    ok(
        env,
        "create",
        "role",
        "sec-tenant-jobs",
        "-n",
        env.ns,
        "--verb=create,update,patch,get",
        "--resource=elasticrljobs.elastic.rose.io",
    )
    ok(env, "create", "rolebinding", "sec-tenant-jobs", "-n", env.ns, "--role=sec-tenant-jobs", f"--user={TENANT}")
    wait_can(env, [f"--as={TENANT}"], "patch", "pods")
    wait_can(env, [f"--as={TENANT}"], "create", "elasticrljobs.elastic.rose.io")
    raw = impersonating(cluster, TENANT)
    try:
        yield raw
    finally:
        raw.api.close()


def test_a_tenant_with_edit_cannot_forge_control_annotations(env: Env, tenant: Raw) -> None:
    """Finding 6: a forged ``rose.io/fencing-token`` raised a node's fence for another group, a
    forged ``rose.io/suspend-state: Suspended`` hid a running worker from the planner; both were
    plain pod patches for the ``edit`` role. Now refused with a message naming the annotation."""
    path = pod_path(env, "sec-pod-1")  # an RL worker
    assert can_i(env, [f"--as={TENANT}"], "patch", "pods")  # edit may patch pods: the policy must refuse
    assert not can_i(env, [f"--as={TENANT}"], "update", "controlannotations.rose.io")
    for key, value in (
        ("rose.io/suspend-state", "Suspended"),
        ("rose.io/fencing-token", "victim:2147483647"),
        ("rose.io/suspend-request", '{"by": "timeslice"}'),
        ("gpu.rose.io/anything", "1"),
    ):
        msg = refused(tenant, path, ann(key, value))
        assert "pod annotations under rose.io/ are ROSE's control state" in msg, msg
        assert f"{TENANT} may not change {key}" in msg, msg
    pod = _pod(f"sec-forged-{uuid.uuid4().hex[:6]}", env.node0)
    pod["metadata"]["annotations"] = {"rose.io/fencing-token": "victim:2147483647"}
    msg = refused(tenant, f"/api/v1/namespaces/{env.ns}/pods", pod, "application/json", method="POST")
    assert f"{TENANT} may not create a pod with rose.io/fencing-token" in msg, msg
    # a ROSE account's annotation stays as it wrote it: the tenant can neither change nor remove it
    patched(env.ext, path, _request("rose-scheduler-extender"))
    try:
        msg = refused(tenant, path, ann("rose.io/suspend-request", None))
        assert "may not change rose.io/suspend-request" in msg, msg
        out = patched(tenant, path, ann("example.com/note", "mine"))  # its own annotations: allowed
        assert "rose.io/suspend-request" in out["metadata"]["annotations"]
    finally:
        patched(env.ext, path, ann("rose.io/suspend-request", None))
        ok(env, "annotate", "pod/sec-pod-1", "-n", env.ns, "example.com/note-")


def test_an_account_named_like_roses_in_another_namespace_is_not_exempt(cluster: ClusterHandle, env: Env) -> None:
    """The exemption names ROSE's accounts with their install namespace: a tenant's own
    ServiceAccount called rose-timeslice (the orchestrator's name) is a tenant."""
    ok(env, "create", "serviceaccount", "rose-timeslice", "-n", env.ns)
    ok(
        env,
        "create",
        "rolebinding",
        "sec-fake-timeslice",
        "-n",
        env.ns,
        "--clusterrole=edit",
        f"--serviceaccount={env.ns}:rose-timeslice",
    )
    wait_can(env, [f"--as=system:serviceaccount:{env.ns}:rose-timeslice"], "patch", "pods")
    fake = impersonating(cluster, f"system:serviceaccount:{env.ns}:rose-timeslice")
    try:
        msg = refused(fake, pod_path(env, "sec-pod-1"), ann("rose.io/fencing-token", "victim:9"))
        assert "ROSE's control state" in msg, msg
    finally:
        fake.api.close()


# --- ElasticRLJob templates and the controller's pods (issue 22, finding 10) ------------------------


def _job(name: str, spec: dict[str, Any], template_meta: dict[str, Any] | None = None) -> dict[str, Any]:
    container = {"name": "trainer", "image": "registry.invalid/rose/fake:1"}
    pod_spec = {"containers": [container], **spec}
    template = {"metadata": template_meta or {}, "spec": pod_spec}
    return {
        "apiVersion": "elastic.rose.io/v1alpha1",
        "kind": "ElasticRLJob",
        "metadata": {"name": name},
        "spec": {"minGPUs": 1, "maxGPUs": 1, "template": template},
    }


HOSTILE: dict[str, Any] = {
    "hostNetwork": True,
    "hostPID": True,
    "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
    "containers": [
        {
            "name": "trainer",
            "image": "registry.invalid/rose/fake:1",
            "securityContext": {"privileged": True, "capabilities": {"add": ["SYS_ADMIN", "CHOWN"]}},
            "ports": [{"containerPort": 80, "hostPort": 80}],
        }
    ],
    "securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}], "seccompProfile": {"type": "Unconfined"}},
}


def _jobs_path(ns: str) -> str:
    return f"/apis/elastic.rose.io/v1alpha1/namespaces/{ns}/elasticrljobs"


def test_an_elasticrljob_template_is_held_to_baseline_pod_security(
    cluster: ClusterHandle, env: Env, tenant: Raw
) -> None:
    """Finding 10: the template became a pod as written (privileged, hostPath /, host namespaces, any
    node). Refused at apply time, the message naming each field; a plain template is accepted."""
    msg = refused(tenant, _jobs_path(env.ns), _job("sec-hostile", HOSTILE), "application/json", method="POST")
    for field in (
        "spec.template.spec.hostNetwork",
        "spec.template.spec.hostPID",
        "spec.template.spec.volumes[root].hostPath",
        "container trainer securityContext.privileged",
        "container trainer securityContext.capabilities.add SYS_ADMIN",
        "container trainer ports[].hostPort",
        "sysctls kernel.msgmax",
        "seccompProfile Unconfined",
    ):
        assert field in msg, (field, msg)
    assert "held to Pod Security baseline" in msg and "pod-security.kubernetes.io/enforce=privileged" in msg, msg
    assert "CHOWN" not in msg.split("capabilities.add")[1].split(";")[0], msg  # a baseline capability is fine
    apparmor = {"annotations": {"container.apparmor.security.beta.kubernetes.io/trainer": "unconfined"}}
    msg = refused(tenant, _jobs_path(env.ns), _job("sec-aa", {}, apparmor), "application/json", method="POST")
    assert "container.apparmor.security.beta.kubernetes.io/trainer=unconfined" in msg, msg
    msg = refused(
        tenant, _jobs_path(env.ns), _job("sec-node", {"nodeName": env.node0}), "application/json", method="POST"
    )
    assert "spec.template.spec.nodeName is not allowed: the scheduler (rose-scheduler) places the workers" in msg
    # a user who may create ElasticRLJobs but not pods cannot lend itself another account of the namespace
    ok(env, "create", "rolebinding", "sec-jobs-only", "-n", env.ns, "--role=sec-tenant-jobs", f"--user={JOBS_ONLY}")
    wait_can(env, [f"--as={JOBS_ONLY}"], "create", "elasticrljobs.elastic.rose.io")
    assert not can_i(env, [f"--as={JOBS_ONLY}"], "create", "pods")
    jobs_only = impersonating(cluster, JOBS_ONLY)
    try:
        sa = _job("sec-sa", {"serviceAccountName": "builder"})
        msg = refused(jobs_only, _jobs_path(env.ns), sa, "application/json", method="POST")
        assert f"serviceAccountName 'builder' needs the right to create pods in namespace '{env.ns}'" in msg, msg
        assert JOBS_ONLY in msg, msg
        jobs_only.json("POST", _jobs_path(env.ns) + "?dryRun=All", body=_job("sec-default", {}))
    finally:
        jobs_only.api.close()
    ok(
        env,
        "create",
        "-n",
        env.ns,
        "--dry-run=server",
        "-f",
        "-",
        f"--as={TENANT}",  # edit may create pods
        stdin=json.dumps(_job("sec-sa-edit", {"serviceAccountName": "builder"})),
    )
    ok(
        env,
        "create",
        "-n",
        env.ns,
        "--dry-run=server",
        "-f",
        "-",
        f"--as={TENANT}",
        stdin=json.dumps(_job("sec-plain", {"securityContext": {"runAsNonRoot": True}})),
    )


def test_a_privileged_namespace_opts_out_of_the_template_rules(cluster: ClusterHandle, env: Env) -> None:
    api = cluster.api_client()
    ns = new_namespace(api, "sec-priv")
    try:
        ok(env, "label", "namespace", ns, "pod-security.kubernetes.io/enforce=privileged")
        job = json.dumps(_job("sec-hostile", HOSTILE))
        deadline = time.monotonic() + 30  # the namespace label reaches the policy's informer asynchronously
        while (r := kubectl(env, "create", "-n", ns, "--dry-run=server", "-f", "-", stdin=job)).returncode != 0:
            assert time.monotonic() < deadline, r.stderr
            time.sleep(0.5)
    finally:
        delete_namespace(api, ns)
        api.close()


def test_the_controllers_pods_are_held_to_baseline_pod_security(env: Env) -> None:
    """The same rules for pods the controller's account creates (a job admitted before the policy,
    or a controller bug): a worker with a hostPath is refused, the worker of the example job passes."""
    user = f"system:serviceaccount:{env.install_ns}:rose-elastic-controller"
    role = f"rose-sec-test-controller-psa-{env.install_ns}"
    ok(env, "create", "clusterrole", role, "--verb=create", "--resource=pods")
    try:
        ok(
            env,
            "create",
            "clusterrolebinding",
            role,
            f"--clusterrole={role}",
            f"--serviceaccount={env.install_ns}:rose-elastic-controller",
        )
        pod = workers.worker_pod(_example_job(env.ns), 0)
        hostile = json.loads(json.dumps(pod))
        hostile["spec"]["hostPID"] = True
        msg = denied(env, "create", "-n", env.ns, "-f", "-", f"--as={user}", stdin=json.dumps(hostile))
        assert "of an ElasticRLJob is held to Pod Security baseline and may not set spec.hostPID" in msg, msg
        ok(env, "create", "-n", env.ns, "--dry-run=server", "-f", "-", f"--as={user}", stdin=json.dumps(pod))
    finally:
        kubectl(env, "delete", "clusterrolebinding,clusterrole", role, "--ignore-not-found")


def _roles_job(name: str, trainer: dict[str, Any], rollout: dict[str, Any]) -> dict[str, Any]:
    def template(extra: dict[str, Any]) -> dict[str, Any]:
        return {"spec": {"containers": [{"name": "c", "image": "registry.invalid/rose/fake:1"}], **extra}}

    roles = {
        "trainer": {"workers": 1, "template": template(trainer)},
        "rollout": {"maxWorkers": 2, "template": template(rollout)},
    }
    return {
        "apiVersion": "elastic.rose.io/v1alpha1",
        "kind": "ElasticRLJob",
        "metadata": {"name": name},
        "spec": {"roles": roles},
    }


def test_the_role_templates_of_a_job_with_roles_are_checked_at_apply_time(
    cluster: ClusterHandle, env: Env, tenant: Raw
) -> None:
    """Issue 23 §3: a role template may not place its pods (nodeName) nor lend the requester the
    namespace's other accounts; the baseline holds for the pods the controller creates from it."""
    path = _jobs_path(env.ns)
    msg = refused(
        tenant, path, _roles_job("sec-roles-node", {"nodeName": env.node0}, {}), "application/json", method="POST"
    )
    assert "spec.roles.trainer.template.spec.nodeName is not allowed: the scheduler (rose-scheduler)" in msg, msg
    ok(
        env,
        "create",
        "rolebinding",
        "sec-roles-jobs-only",
        "-n",
        env.ns,
        "--role=sec-tenant-jobs",
        f"--user={JOBS_ONLY}",
    )
    wait_can(env, [f"--as={JOBS_ONLY}"], "create", "elasticrljobs.elastic.rose.io")
    jobs_only = impersonating(cluster, JOBS_ONLY)
    try:
        sa = _roles_job("sec-roles-sa", {}, {"serviceAccountName": "builder"})
        msg = refused(jobs_only, path, sa, "application/json", method="POST")
        assert (
            f"spec.roles.rollout.template.spec.serviceAccountName 'builder' needs the right to create pods in "
            f"namespace '{env.ns}'" in msg
        ), msg
        jobs_only.json("POST", path + "?dryRun=All", body=_roles_job("sec-roles-ok", {}, {}))
    finally:
        jobs_only.api.close()
    # the controller's pod of a role template that breaks baseline is refused when it is created
    meta = {"name": "sec-roles-psa", "namespace": env.ns, "uid": "u"}
    job = ElasticRLJob.model_validate({**_roles_job("sec-roles-psa", {"hostPID": True}, {}), "metadata": meta})
    user = f"system:serviceaccount:{env.install_ns}:rose-elastic-controller"
    role = f"rose-sec-test-roles-psa-{env.install_ns}"
    ok(env, "create", "clusterrole", role, "--verb=create", "--resource=pods")
    try:
        ok(
            env,
            "create",
            "clusterrolebinding",
            role,
            f"--clusterrole={role}",
            f"--serviceaccount={env.install_ns}:rose-elastic-controller",
        )
        pod = workers.worker_pod(job, 0, None, None, "trainer")
        msg = denied(env, "create", "-n", env.ns, "-f", "-", f"--as={user}", stdin=json.dumps(pod))
        assert "of an ElasticRLJob is held to Pod Security baseline and may not set spec.hostPID" in msg, msg
    finally:
        kubectl(env, "delete", "clusterrolebinding,clusterrole", role, "--ignore-not-found")

"""The time-slice orchestrator's rights on the real kube-apiserver (issue 22, finding 9;
docs/security.md "Time-slice orchestrator"): its ServiceAccount, RBAC and admission policy
(``manifests/timeslice/``) installed into a namespace other than rose-system, checked by
impersonating ``system:serviceaccount:<install ns>:rose-timeslice``; refused requests are
server-side dry runs, so a request a broken policy let through changes nothing.

It may patch only ``rose.io/suspend-request`` (its own: ``"by": "timeslice"``) and
``rose.io/fencing-token`` (of the pod's own group key), only on workers of a time-slice group;
no other annotation, no label or spec, no other owner's request, no serving pod. Before issue 22
it could patch any field of every pod in the cluster (RBAC only).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from local_cluster import ClusterHandle
from local_cluster.objects import delete_namespace, new_namespace
from rose_common.kube.client import Raw
from rose_common.kube.errors import ApiError

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests" / "timeslice"
KUBECTL = shutil.which("kubectl") or str(Path(sys.executable).with_name("kubectl"))
MERGE = "application/merge-patch+json"
GROUP = "g1"


def _docs(install_ns: str) -> list[dict[str, Any]]:
    """serviceaccount, rbac and admission policy as kustomize renders them for ``install_ns``."""
    files = ("serviceaccount.yaml", "rbac.yaml", "admission-policy.yaml")
    docs = [d for f in files for d in yaml.safe_load_all((MANIFESTS / f).read_text()) if d]
    for d in docs:
        if d["kind"] in ("ServiceAccount", "Role", "RoleBinding"):
            d["metadata"]["namespace"] = install_ns
        for s in d.get("subjects", []):
            s["namespace"] = install_ns
    return docs


def _kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KUBECTL, f"--kubeconfig={kubeconfig}", *args], check=False, input=stdin,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def _pod(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "tenant", **labels}},
            "spec": {"nodeSelector": {"rose.io/none": "nowhere"},
                     "containers": [{"name": "main", "image": "registry.invalid/rose/fake:1"}]}}  # fmt: skip


@pytest.fixture(scope="module")
def world(cluster: ClusterHandle) -> Iterator[dict[str, Any]]:
    api = cluster.api_client()
    install_ns, ns = new_namespace(api, "rose-ts-sec"), new_namespace(api, "ts-tenant")
    stream = yaml.safe_dump_all(_docs(install_ns))
    ts = cluster.api_client()
    ts.set_default_header("Impersonate-User", f"system:serviceaccount:{install_ns}:rose-timeslice")
    try:
        r = _kubectl(cluster.kubeconfig, "apply", "-f", "-", stdin=stream)
        assert r.returncode == 0, r.stderr
        worker = {"rose.io/elastic-rl-job": "grpo", "rose.io/timeslice-group": GROUP}
        for name, labels in (("worker-0", worker), ("serving-0", {"rose.io/role": "serving"})):
            r = _kubectl(cluster.kubeconfig, "create", "-n", ns, "-f", "-", stdin=json.dumps(_pod(name, **labels)))
            assert r.returncode == 0, r.stderr
        yield {"ns": ns, "raw": Raw(ts), "kubeconfig": cluster.kubeconfig}
    finally:
        _kubectl(cluster.kubeconfig, "delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=stream)
        delete_namespace(api, ns)
        delete_namespace(api, install_ns)
        ts.close()
        api.close()


def _refused(raw: Raw, path: str, body: dict[str, Any]) -> str:
    """A server-side dry run, until it is refused (policies load asynchronously); the message."""
    deadline = time.monotonic() + 30
    while True:
        try:
            raw.json("PATCH", path + "?dryRun=All", body=body, content_type=MERGE)
        except ApiError as e:
            assert e.code in (403, 422), e.status
            return str(e.status.message)
        assert time.monotonic() < deadline, f"PATCH {path} {body} was never refused"
        time.sleep(0.5)


def _ann(**kv: str | None) -> dict[str, Any]:
    return {
        "metadata": {"annotations": {k.replace("_", "-").replace("rose-io-", "rose.io/"): v for k, v in kv.items()}}
    }


def _request(by: str) -> str:
    return json.dumps({"at": "2026-12-01T00:00:00+00:00", "by": by, "reason": "time-slice hand-over 1"})


def test_the_orchestrator_may_write_only_its_hand_over_annotations(world: dict[str, Any]) -> None:
    raw, ns = world["raw"], world["ns"]
    worker, serving = f"/api/v1/namespaces/{ns}/pods/worker-0", f"/api/v1/namespaces/{ns}/pods/serving-0"
    key = f"{ns}/{GROUP}"
    # first the refusals (the policy may load after the binding: retried until refused)
    msg = _refused(raw, worker, _ann(rose_io_suspend_state="Suspended"))
    assert "only the pod annotations rose.io/suspend-request, rose.io/fencing-token, not rose.io/suspend-state" in msg
    assert "may not change a pod's labels" in _refused(raw, worker, {"metadata": {"labels": {"app": "x"}}})
    msg = _refused(raw, serving, _ann(rose_io_suspend_request=_request("timeslice")))
    assert "only workers of a time-slice group" in msg
    msg = _refused(raw, worker, _ann(rose_io_suspend_request=_request("rose-elastic-controller")))
    assert 'only its own suspend requests ("by": "timeslice")' in msg
    msg = _refused(raw, worker, _ann(rose_io_fencing_token="other-ns/g1:7"))
    assert f"only fencing tokens of the pod's own group {key}" in msg
    # what the hand-over writes is admitted (and really written)
    body = _ann(rose_io_suspend_request=_request("timeslice"), rose_io_fencing_token=f"{key}:1")
    out = raw.json("PATCH", worker, body=body, content_type=MERGE)
    assert out["metadata"]["annotations"]["rose.io/fencing-token"] == f"{key}:1"
    out = raw.json("PATCH", worker, body=_ann(rose_io_suspend_request=None, rose_io_fencing_token=f"{key}:2"),
                   content_type=MERGE)  # fmt: skip
    assert "rose.io/suspend-request" not in out["metadata"]["annotations"]
    # another owner's request is not its to withdraw
    r = _kubectl(world["kubeconfig"], "annotate", "pod/worker-0", "-n", ns,
                 "rose.io/suspend-request=" + _request("planner"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "only its own suspend requests" in _refused(raw, worker, _ann(rose_io_suspend_request=None))

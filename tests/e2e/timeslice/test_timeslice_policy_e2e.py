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

MANIFESTS = Path(__file__).resolve().parents[3] / "manifests" / "timeslice"
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
    return subprocess.run(
        [KUBECTL, f"--kubeconfig={kubeconfig}", *args],
        check=False,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _pod(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "tenant", **labels}},
        "spec": {
            "nodeSelector": {"rose.io/none": "nowhere"},
            "containers": [{"name": "main", "image": "registry.invalid/rose/fake:1"}],
        },
    }


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
    out = raw.json(
        "PATCH", worker, body=_ann(rose_io_suspend_request=None, rose_io_fencing_token=f"{key}:2"), content_type=MERGE
    )
    assert "rose.io/suspend-request" not in out["metadata"]["annotations"]
    # another owner's request is not its to withdraw
    r = _kubectl(
        world["kubeconfig"], "annotate", "pod/worker-0", "-n", ns, "rose.io/suspend-request=" + _request("planner")
    )
    assert r.returncode == 0, r.stderr
    assert "only its own suspend requests" in _refused(raw, worker, _ann(rose_io_suspend_request=None))


def _helm_template(tmp: Path, *sets: str) -> subprocess.CompletedProcess[str]:
    """``helm template`` of the chart (helm as hack/build-binaries.sh builds it) with ``--set`` values."""
    import os

    from local_cluster.binaries import HACK, cache_dir

    pins = dict(line.split("=", 1) for line in (HACK / "versions.env").read_text().splitlines() if "=" in line)
    helm = cache_dir() / "bin" / f"helm-{os.environ.get('ROSE_HELM_VERSION', pins['HELM_VERSION'])}" / "helm"
    if not helm.is_file():
        pytest.fail(f"{helm} is missing: run hack/build-binaries.sh (it builds helm from helm.sh/helm/v3)")
    env = dict(
        os.environ,
        HELM_CONFIG_HOME=str(tmp / "cfg"),
        HELM_CACHE_HOME=str(tmp / "cache"),
        HELM_DATA_HOME=str(tmp / "data"),
    )
    args = [a for s in sets for a in ("--set", s)]
    cmd = [str(helm), "template", "r", "charts/rose", "-n", "ai-infra", "--kube-version", "v1.37.2", *args]
    return subprocess.run(
        cmd, text=True, capture_output=True, cwd=MANIFESTS.parents[1], env=env, timeout=300, check=False
    )


def test_chart_values_cannot_switch_the_orchestrators_protections_off(tmp_path: Path) -> None:
    """Low of issue 22: ``env.rose-timeslice.ROSE_TIMESLICE_AUTHENTICATE=none`` (or ``…_INSECURE``)
    fails the render naming the value, instead of silently dropping the protection; other env values
    still apply. Before, the value was merged over the manifest's."""
    for var, value in (("ROSE_TIMESLICE_AUTHENTICATE", "none"), ("ROSE_TIMESLICE_INSECURE", "true")):
        r = _helm_template(tmp_path, f"env.rose-timeslice.{var}={value}")
        assert r.returncode != 0 and f"values.env.rose-timeslice.{var} would switch a protection off" in r.stderr
    r = _helm_template(tmp_path, "env.rose-timeslice.ROSE_TIMESLICE_MAX_HOLD=5m")
    assert r.returncode == 0, r.stderr
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    (dep,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "rose-timeslice"]
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["ROSE_TIMESLICE_MAX_HOLD"] == "5m" and env["ROSE_TIMESLICE_AUTHENTICATE"] == "tokenreview"
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("ValidatingAdmissionPolicy", "rose-timeslice-pods"), ("NetworkPolicy", "rose-timeslice")} <= kinds

"""Installing ROSE as a user would, on a real kube-apiserver: the README's kustomize commands run
verbatim, and the version the API server reports.

I/O: one local cluster of its own (real etcd, kube-apiserver, kube-controller-manager,
kube-scheduler; KWOK plays the kubelets, so pods are admitted, scheduled and marked Running but no
container runs), driven with the venv's ``kubectl``. Its own cluster, because an install adds
cluster-wide admission policies (serving namespaces, driver and extender accounts) that would change
what the other end-to-end tests may do.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from local_cluster.binaries import pinned_versions
from local_cluster.objects import allocated_claim
from tests.support.cluster_fixtures import session_shaped_cluster
from tests.support.helm import helm, helm_run
from tests.support.k8s_helpers import delete_namespace, new_namespace, wait_for

if TYPE_CHECKING:
    from local_cluster import ClusterHandle

REPO = Path(__file__).resolve().parents[3]
KUBECTL = shutil.which("kubectl") or str(Path(sys.executable).with_name("kubectl"))
MARKER = "<!-- install-commands:"


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    with session_shaped_cluster(tmp_path_factory.mktemp("install"), nodes=2, extender=False) as c:
        yield c


def kubectl(
    c: ClusterHandle, *args: str, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, KUBECONFIG=str(c.kubeconfig))
    r = subprocess.run(
        [KUBECTL, *args], input=stdin, text=True, capture_output=True, cwd=REPO, env=env, timeout=300, check=False
    )
    if check:
        assert r.returncode == 0, f"kubectl {' '.join(args)} exited {r.returncode}: {r.stderr}"
    return r


def readme_install_block() -> str:
    """The fenced block after the install-commands marker in README.md, as written."""
    text = (REPO / "README.md").read_text()
    at = text.index(MARKER)
    m = re.search(r"```bash\n(.*?)```", text[at:], re.S)
    assert m, "README.md: no ```bash block after the install-commands marker"
    return m.group(1)


def rendered(c: ClusterHandle, path: str) -> list[dict[str, Any]]:
    out = kubectl(c, "kustomize", path).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def uninstall(c: ClusterHandle, path: str) -> None:
    """Delete what ``path`` renders except the CRD (the next install finds it in place; a Helm
    chart ships it under crds/, which Helm skips when it exists)."""
    docs = [d for d in rendered(c, path) if d["kind"] != "CustomResourceDefinition"]
    kubectl(
        c, "delete", "-f", "-", "--ignore-not-found", "--wait=true", "--timeout=240s", stdin=yaml.safe_dump_all(docs)
    )


def workloads_admitted(c: ClusterHandle, namespace: str) -> None:
    """Every Deployment has all its pods and every DaemonSet a pod on each matching node: the API
    server accepted each pod spec (a refused pod leaves the controller at fewer replicas)."""

    def done() -> list[str] | None:
        got = json.loads(kubectl(c, "-n", namespace, "get", "deployments,daemonsets", "-o", "json").stdout)["items"]
        missing = []
        for o in got:
            st = o.get("status") or {}
            if o["kind"] == "Deployment":
                ok = st.get("replicas", 0) == o["spec"].get("replicas", 1)
            else:
                ok = st.get("desiredNumberScheduled", 0) > 0 and st.get("currentNumberScheduled") == st.get(
                    "desiredNumberScheduled"
                )
            if not ok:
                missing.append(f"{o['kind']}/{o['metadata']['name']}: {st}")
        return None if missing or not got else [o["metadata"]["name"] for o in got]

    wait_for(f"every workload's pods in {namespace}", done, timeout=180, interval=2)


def test_apiserver_reports_the_release_version(own_cluster: ClusterHandle) -> None:
    """kube-apiserver is built with the release's version ldflags: /version is the pinned release,
    so `kubectl version` and a chart's kubeVersion constraint see a real version."""
    r = kubectl(own_cluster, "version", "-o", "json")
    server = json.loads(r.stdout)["serverVersion"]
    want = pinned_versions().kubernetes
    assert server["gitVersion"] == want, server
    assert (server["major"], server["minor"]) == tuple(want.lstrip("v").split(".")[:2]), server


def test_readme_install_commands_run_verbatim(own_cluster: ClusterHandle) -> None:
    """The README's install block, run as written: every object the top-level kustomization
    renders exists afterwards, namespaced ones in rose-system, and every workload's pods are
    admitted by the API server."""
    block = readme_install_block()
    env = dict(os.environ, KUBECONFIG=str(own_cluster.kubeconfig), PATH=f"{Path(KUBECTL).parent}:{os.environ['PATH']}")
    try:
        r = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block],
            cwd=REPO,
            env=env,
            text=True,
            capture_output=True,
            timeout=600,
            check=False,
        )
        assert r.returncode == 0, f"README install block exited {r.returncode}:\n{block}\n{r.stderr}"
        docs = rendered(own_cluster, "manifests/")
        namespaced = {d.get("metadata", {}).get("namespace") for d in docs} - {None}
        assert namespaced == {"rose-system"}, namespaced
        kubectl(own_cluster, "get", "-f", "-", stdin=yaml.safe_dump_all(docs))  # exits non-zero if any is missing
        workloads_admitted(own_cluster, "rose-system")
    finally:
        uninstall(own_cluster, "manifests/")


@pytest.mark.parametrize("overlay", ["manifests/overlays/kind", "manifests/overlays/nvidia"])
def test_overlay_is_accepted_by_the_api_server(own_cluster: ClusterHandle, overlay: str) -> None:
    """Each overlay renders and every object passes the API server's validation (dry-run=server:
    the nvidia overlay names a RuntimeClass this cluster does not have, so its pods are not run)."""
    kubectl(own_cluster, "apply", "-k", "manifests/cluster")  # the namespace the dry run resolves against
    try:
        docs = rendered(own_cluster, overlay)
        r = kubectl(own_cluster, "apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump_all(docs))
        assert r.stdout.count("(server dry run)") == len(docs), r.stdout
    finally:
        uninstall(own_cluster, "manifests/cluster")


def test_chart_lints_and_renders_what_kustomize_renders(tmp_path: Path) -> None:
    """`helm lint` passes (both GPU modes); `helm template` renders every object of the top-level
    kustomization (the CRD from crds/, the Namespace only on request) in the release namespace,
    plus the dashboard ConfigMap and, when asked, the Prometheus Operator monitors."""
    for mode in ("nvidia", "simulated"):
        helm(tmp_path, "lint", "--strict", "charts/rose", "--set", f"gpus.mode={mode}")
    out = helm(
        tmp_path,
        "template",
        "r",
        "charts/rose",
        "-n",
        "ai-infra",
        "--kube-version",
        "v1.37.2",
        "--include-crds",
        "--set",
        "namespace.create=true",
        "--set",
        "monitoring.enabled=true",
    ).stdout
    chart = [d for d in yaml.safe_load_all(out) if d]
    got = {(d["kind"], d["metadata"]["name"]) for d in chart}
    kustomize = yaml.safe_load_all(
        subprocess.run(
            [KUBECTL, "kustomize", "manifests/"], cwd=REPO, text=True, capture_output=True, check=True
        ).stdout
    )
    want = {(d["kind"], d["metadata"]["name"].replace("rose-system", "ai-infra")) for d in kustomize if d}
    assert want <= got, want - got
    extra = got - want
    assert extra == {
        ("ConfigMap", "rose-dashboard"),
        ("Secret", "rose-timeslice-tls"),  # the orchestrator's TLS, generated by the chart
        ("PodMonitor", "rose-dra-driver"),
        ("PodMonitor", "rose-elastic-controller"),
        ("ServiceMonitor", "rose-predictor"),
        ("ServiceMonitor", "rose-scheduler-extender"),
    }, extra
    for d in chart:
        ns = d["metadata"].get("namespace")
        assert ns in (None, "ai-infra"), (d["kind"], d["metadata"]["name"], ns)
        for s in d.get("subjects") or []:
            assert s["kind"] != "ServiceAccount" or s["namespace"] == "ai-infra", (d["metadata"]["name"], s)
    dash = next(d for d in chart if d["metadata"]["name"] == "rose-dashboard")
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dash["data"]["slo-vs-rl-throughput.json"])["panels"]
    driver = next(d for d in chart if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    assert driver["runtimeClassName"] == "nvidia"


def test_chart_refuses_values_that_drop_a_protection(tmp_path: Path) -> None:
    """Issue 22 (low): `components.policies=false` and env overrides of the orchestrator's
    authentication or the extender's loopback listen address dropped a protection silently. Each is
    refused with a message naming the protection: the first two unless their insecure.* value is
    set, the orchestrator's at all (test_timeslice_policy_e2e checks each of its variables); the
    control-annotation policy names the release namespace's accounts."""
    base = ("template", "r", "charts/rose", "-n", "ai-infra", "--kube-version", "v1.37.2")
    cases = (
        ("components.policies=false", "insecure.withoutPolicies", "drops ROSE's cluster-wide admission policies"),
        ("env.rose-scheduler.ROSE_EXTENDER_LISTEN=0.0.0.0:8888", "insecure.extenderListen", "beyond loopback"),
    )
    for value, allow, why in cases:
        r = helm_run(tmp_path, *base, "--set", value)
        assert r.returncode != 0 and why in r.stderr and allow in r.stderr, (value, r.stderr)
        helm(tmp_path, *base, "--set", value, "--set", f"{allow}=true")
    helm(tmp_path, *base, "--set", "env.rose-scheduler.ROSE_EXTENDER_LISTEN=127.0.0.1:9999")
    r = helm_run(tmp_path, *base, "--set", "env.rose-timeslice.ROSE_TIMESLICE_AUTHENTICATE=none")
    assert r.returncode != 0 and "ROSE_TIMESLICE_AUTHENTICATE would switch a protection off" in r.stderr, r.stderr
    r = helm_run(tmp_path, *base, "--set", "components.polices=true")  # a typo: the schema refuses it
    assert r.returncode != 0 and "polices" in r.stderr, r.stderr
    out = helm(tmp_path, *base).stdout
    policy = next(d for d in yaml.safe_load_all(out) if d and d["metadata"]["name"] == "rose-control-annotations")
    accounts = policy["spec"]["matchConditions"][0]["expression"]
    assert "system:serviceaccount:ai-infra:rose-dra-driver" in accounts and "rose-system" not in accounts, accounts


def test_chart_installs_in_another_namespace(own_cluster: ClusterHandle, tmp_path: Path) -> None:
    """`helm install` into ai-infra (not rose-system) with simulated GPUs: every object of the
    release exists afterwards and every workload's pods are admitted by the API server."""
    uninstall(own_cluster, "manifests/")  # the harness's DeviceClasses and PriorityClasses: the chart creates them
    kc = own_cluster.kubeconfig
    helm(
        tmp_path,
        "install",
        "rose",
        "charts/rose",
        "-n",
        "ai-infra",
        "--create-namespace",
        "--set",
        "gpus.mode=simulated",
        kubeconfig=kc,
    )
    try:
        manifest = helm(tmp_path, "get", "manifest", "rose", "-n", "ai-infra", kubeconfig=kc).stdout
        docs = [d for d in yaml.safe_load_all(manifest) if d]
        assert len(docs) >= 50, len(docs)
        kubectl(own_cluster, "get", "-f", "-", stdin=yaml.safe_dump_all(docs))  # exits non-zero if any is missing
        workloads_admitted(own_cluster, "ai-infra")
        pods = json.loads(kubectl(own_cluster, "-n", "ai-infra", "get", "pods", "-o", "json").stdout)["items"]
        images = {c["image"] for p in pods for c in p["spec"]["containers"]}
        assert "ghcr.io/rose-project/rose:0.1.0" in images, images
    finally:
        helm(tmp_path, "uninstall", "rose", "-n", "ai-infra", "--wait", kubeconfig=kc)


@pytest.fixture(scope="module")
def examples_ns(own_cluster: ClusterHandle) -> Iterator[str]:
    """ROSE installed with the README's kustomization and a namespace opened for serving."""
    kubectl(own_cluster, "apply", "-k", "manifests/")
    api = own_cluster.api_client()
    try:
        ns = new_namespace(api, "examples")
        kubectl(own_cluster, "label", "namespace", ns, "rose.io/serving=allowed")
        yield ns
        delete_namespace(api, ns)
    finally:
        # No uninstall here: this module-scoped fixture ends with the module, right before its
        # own cluster goes down, so no test runs after it on this install; `kubectl delete
        # --wait` of manifests/ (17.6 s) is already exercised by the README and chart tests.
        api.close()


def allocated_device(c: ClusterHandle, ns: str, pod: str) -> str | None:
    api = c.api_client()
    try:
        claim = allocated_claim(api, ns, pod)
    finally:
        api.close()
    if claim is None:
        return None
    device: str = claim["status"]["allocation"]["devices"]["results"][0]["device"]
    return device


def test_example_serving_claim_is_refused_outside_serving_namespaces(own_cluster: ClusterHandle) -> None:
    """serving-claim-template.yaml: in a namespace without rose.io/serving=allowed it is refused
    with a message naming the label."""
    kubectl(own_cluster, "apply", "-k", "manifests/policies")
    api = own_cluster.api_client()
    ns = new_namespace(api, "closed")
    try:
        # the API server loads a policy asynchronously: server-side dry runs until it is in force
        def refused_dry_run() -> int | None:
            args = ("-n", ns, "apply", "--dry-run=server", "-f", "examples/serving-claim-template.yaml")
            return kubectl(own_cluster, *args, check=False).returncode or None

        wait_for("the serving-claim policy in force", refused_dry_run, 30, 0.5)
        r = kubectl(own_cluster, "-n", ns, "apply", "-f", "examples/serving-claim-template.yaml", check=False)
        assert r.returncode != 0 and "rose.io/serving=allowed" in r.stderr, r
    finally:
        delete_namespace(api, ns)
        api.close()


def test_example_serving_deployment_gets_serving_gpus(own_cluster: ClusterHandle, examples_ns: str) -> None:
    """serving-claim-template.yaml + serving-deployment.yaml: both replicas are scheduled, each
    with a claim allocated to a serving device."""
    ns = examples_ns
    kubectl(own_cluster, "-n", ns, "apply", "-f", "examples/serving-claim-template.yaml")
    kubectl(own_cluster, "-n", ns, "apply", "-f", "examples/serving-deployment.yaml")

    def devices() -> list[str] | None:
        pods = json.loads(
            kubectl(
                own_cluster, "-n", ns, "get", "pods", "-l", "app.kubernetes.io/name=llm-serving", "-o", "json"
            ).stdout
        )["items"]
        got = [d for p in pods if (d := allocated_device(own_cluster, ns, p["metadata"]["name"]))]
        return got if len(pods) == 2 and len(got) == 2 else None

    got = wait_for("2 serving replicas with allocated claims", devices, timeout=120, interval=1)
    assert all(d.endswith("-serving") for d in got), got


def test_example_rl_worker_gets_a_lendable_gpu_from_rose_scheduler(
    own_cluster: ClusterHandle, examples_ns: str
) -> None:
    """lendable-claim-template.yaml + rl-worker-pod.yaml: scheduled by rose-scheduler, its claim
    allocated to a lendable device."""
    ns = examples_ns
    kubectl(own_cluster, "-n", ns, "apply", "-f", "examples/lendable-claim-template.yaml")
    kubectl(own_cluster, "-n", ns, "apply", "-f", "examples/rl-worker-pod.yaml")
    device = wait_for(
        "the RL worker's claim allocated",
        lambda: allocated_device(own_cluster, ns, "rl-worker-0"),
        timeout=120,
        interval=1,
    )
    assert device.endswith("-lendable"), device
    pod = json.loads(kubectl(own_cluster, "-n", ns, "get", "pod", "rl-worker-0", "-o", "json").stdout)
    assert pod["spec"]["nodeName"] and pod["spec"]["schedulerName"] == "rose-scheduler", pod["spec"]
    events = kubectl(
        own_cluster,
        "-n",
        ns,
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=rl-worker-0,reason=Scheduled",
        "-o",
        "json",
    ).stdout
    assert any(
        e.get("reportingComponent") == "rose-scheduler" or e["source"].get("component") == "rose-scheduler"
        for e in json.loads(events)["items"]
    ), events


def test_example_elasticrljob_is_accepted_with_defaults(own_cluster: ClusterHandle, examples_ns: str) -> None:
    """elasticrljob.yaml: accepted by the API server, the CRD's defaults filled in."""
    kubectl(own_cluster, "-n", examples_ns, "apply", "-f", "examples/elasticrljob.yaml")
    job = json.loads(
        kubectl(own_cluster, "-n", examples_ns, "get", "elasticrljob", "grpo-qwen-7b", "-o", "json").stdout
    )
    spec = job["spec"]
    assert (spec["gracefulShutdownPeriod"], spec["suspendPolicy"], spec["minUsefulRunSeconds"]) == (
        30,
        "HostMemoryFirst",
        600,
    ), spec


def test_example_scheduler_config_is_loaded_by_kube_scheduler(own_cluster: ClusterHandle, tmp_path: Path) -> None:
    """kube-scheduler-config.yaml: the real kube-scheduler loads and validates it
    (--write-config-to writes the effective configuration and exits)."""
    from local_cluster.binaries import ensure

    out = tmp_path / "effective.yaml"
    conf = yaml.safe_load((REPO / "examples" / "kube-scheduler-config.yaml").read_text())
    conf["clientConnection"] = {"kubeconfig": str(own_cluster.kubeconfig)}  # with --config, the flag is ignored
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(conf))
    argv = [str(ensure(build=False).kube_scheduler), f"--config={tmp_path / 'config.yaml'}", f"--write-config-to={out}"]
    r = subprocess.run(argv, cwd=REPO, text=True, capture_output=True, timeout=120, check=False)
    assert r.returncode == 0 and out.exists(), r.stderr
    eff = yaml.safe_load(out.read_text())
    assert [p["schedulerName"] for p in eff["profiles"]] == ["rose-scheduler"]
    assert eff["extenders"][0]["urlPrefix"] == "http://127.0.0.1:8888", eff["extenders"]

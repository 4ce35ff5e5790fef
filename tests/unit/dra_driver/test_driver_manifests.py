"""The driver's manifests: least-privilege RBAC, the node-pinning policy, flags the CLI knows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dra_driver import cli
from rose_common.cli import env_name

DIR = Path(__file__).resolve().parents[3] / "manifests" / "driver"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DIR / name).read_text()) if d]


def test_kustomization_lists_every_file() -> None:
    k = _docs("kustomization.yaml")[0]
    assert sorted(k["resources"]) == sorted(p.name for p in DIR.glob("*.yaml") if p.name != "kustomization.yaml")


def test_rbac_is_least_privilege() -> None:
    role = next(d for d in _docs("rbac.yaml") if d["kind"] == "ClusterRole")
    rules = {(r["apiGroups"][0], r["resources"][0]): set(r["verbs"]) for r in role["rules"]}
    assert rules == {
        ("resource.k8s.io", "resourceslices"): {"get", "list", "watch", "create", "update", "delete"},
        ("resource.k8s.io", "resourceclaims"): {"get", "list", "watch"},
        # the binding conditions (issue 27 §1): status.devices of claims allocated on its node
        ("resource.k8s.io", "resourceclaims/status"): {"patch"},
        ("resource.k8s.io", "resourceclaims/driver"): {"associated-node:patch"},
        # the planner's reclaim taint carried onto share devices (issue 27 §2/§3): read only
        ("resource.k8s.io", "devicetaintrules"): {"list", "watch"},
        ("", "pods"): {"get", "list", "watch", "patch"},
        ("", "pods/eviction"): {"create"},
        ("", "pods/resize"): {"patch"},
        ("", "nodes"): {"get", "patch"},
        ("", "events"): {"create"},
    }
    assert all("*" not in r["verbs"] and "*" not in r["resources"] for r in role["rules"])
    (driver_rule,) = [r for r in role["rules"] if r["resources"] == ["resourceclaims/driver"]]
    assert driver_rule["resourceNames"] == ["gpu.rose.io"]  # only its own driver's device status


def test_policies_pin_writes_to_the_tokens_node() -> None:
    docs = _docs("admission-policy.yaml")
    policies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    bindings = {d["spec"]["policyName"] for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert (
        set(policies)
        == bindings
        == {
            "rose-dra-driver-resourceslices",
            "rose-dra-driver-pods",
            "rose-dra-driver-nodes",
            "rose-dra-driver-events",
            "rose-dra-driver-evictions",
        }
    )
    text = yaml.safe_dump(policies["rose-dra-driver-resourceslices"])
    assert "authentication.kubernetes.io/node-name" in text and "spec.?nodeName" in text
    pod_rules = policies["rose-dra-driver-pods"]["spec"]["matchConstraints"]["resourceRules"]
    assert {"pods", "pods/resize"} <= {r for rule in pod_rules for r in rule["resources"]}


def test_policies_hold_in_any_install_namespace() -> None:
    """The policies match the driver's account by name, never by a hard-coded namespace."""
    for d in _docs("admission-policy.yaml"):
        if d["kind"] != "ValidatingAdmissionPolicy":
            continue
        cond = d["spec"]["matchConditions"][0]["expression"]
        assert 'endsWith(":rose-dra-driver")' in cond and "rose-system" not in cond, d["metadata"]["name"]


def test_daemonset_env_names_are_driver_flags() -> None:
    ds = _docs("daemonset.yaml")[0]
    env = [e["name"] for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]]
    flags = {env_name(cli.ENV_PREFIX, a.option_strings[0]) for a in cli.build_parser()._actions if a.option_strings}
    assert set(env) <= flags, set(env) - flags


NVIDIA = DIR.parent / "overlays" / "nvidia"


def test_nvidia_overlay_gives_the_driver_libcuda_and_nvml() -> None:
    k = yaml.safe_load((NVIDIA / "kustomization.yaml").read_text())
    assert "../../driver" in k["resources"]
    patch = yaml.safe_load((NVIDIA / k["patches"][0]["path"]).read_text())
    assert k["patches"][0]["target"] == {"kind": "DaemonSet", "name": patch["metadata"]["name"]}
    assert patch["metadata"]["name"] == _docs("daemonset.yaml")[0]["metadata"]["name"]
    spec = patch["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == "nvidia"
    env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert set(env["NVIDIA_DRIVER_CAPABILITIES"].split(",")) >= {"compute", "utility"}
    base = _docs("daemonset.yaml")[0]["spec"]["template"]["spec"]
    assert "runtimeClassName" not in base  # the base stays runnable without the NVIDIA toolkit
    assert spec["containers"][0]["name"] == base["containers"][0]["name"]


def test_no_install_namespace_is_hard_coded() -> None:
    """Binding subjects leave the namespace to kustomize and policies match accounts by name, so
    installing into any namespace keeps RBAC bound and the policies in force."""
    for sub in ("driver", "extender"):
        for path in sorted((DIR.parent / sub).glob("*.yaml")):
            if path.name not in ("rbac.yaml", "admission-policy.yaml", "serviceaccount.yaml"):
                continue
            for d in yaml.safe_load_all(path.read_text()):
                if not d:
                    continue
                assert "rose-system" not in yaml.safe_dump(d.get("spec", {})), f"{path.name}: {d['metadata']['name']}"
                assert all("namespace" not in s for s in d.get("subjects", [])), f"{path.name}: {d['metadata']['name']}"
                assert d["metadata"].get("namespace") is None, f"{path.name}: {d['metadata']['name']}"

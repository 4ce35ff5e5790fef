"""examples/kuberay-raycluster.yaml: its GPU workers use ROSE's lendable claim template, the
rose-scheduler profile, the rose-rl PriorityClass and the downward-API identity the SDK reads, as the
bare RL worker pod does; its Ray version is the one the tests run."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]


def _load(name: str) -> Any:
    return yaml.safe_load((REPO / "examples" / name).read_text())


def test_kuberay_worker_group_runs_on_lent_gpus() -> None:
    rc, template, pod = (
        _load("kuberay-raycluster.yaml"),
        _load("lendable-claim-template.yaml"),
        _load("rl-worker-pod.yaml"),
    )
    assert rc["apiVersion"] == "ray.io/v1" and rc["kind"] == "RayCluster"
    (group,) = rc["spec"]["workerGroupSpecs"]
    spec = group["template"]["spec"]
    assert spec["schedulerName"] == pod["spec"]["schedulerName"] == "rose-scheduler"
    assert spec["priorityClassName"] == pod["spec"]["priorityClassName"]
    assert group["template"]["metadata"]["labels"]["rose.io/role"] == pod["metadata"]["labels"]["rose.io/role"]
    (claim,) = spec["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == template["metadata"]["name"]
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "lendable.gpu.rose.io" and request["exactly"]["count"] == 1
    assert group["rayStartParams"]["num-gpus"] == "1"
    (c,) = spec["containers"]
    assert c["resources"]["claims"] == [{"name": claim["name"]}]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}
    assert env == {
        "ROSE_POD_UID": "metadata.uid",
        "ROSE_POD_NAMESPACE": "metadata.namespace",
        "ROSE_POD_NAME": "metadata.name",
    }
    head = rc["spec"]["headGroupSpec"]["template"]["spec"]
    assert "resourceClaims" not in head and "schedulerName" not in head  # the head holds no GPU


def test_ray_version_is_the_tested_one() -> None:
    groups = tomllib.loads((REPO / "pyproject.toml").read_text())["dependency-groups"]["test"]
    assert f"ray=={_load('kuberay-raycluster.yaml')['spec']['rayVersion']}" in groups

"""ElasticRLJob spec.timesliceGroup → the controller's worker pods carry the group label and the
SDK's job name, and the hand-over's plan finds exactly those workers."""

from __future__ import annotations

from typing import Any

import pytest

from elastic_controller import workers
from rose_common import names
from rose_common.elasticrljob import ElasticRLJob
from timeslice.handover import plan

TEMPLATE = {"spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]}}


def job(name: str, group: str | None) -> ElasticRLJob:
    spec: dict[str, Any] = {"minGPUs": 1, "maxGPUs": 2, "template": TEMPLATE}
    if group:
        spec["timesliceGroup"] = group
    return ElasticRLJob.model_validate(
        {"metadata": {"name": name, "namespace": "rl", "uid": f"u-{name}"}, "spec": spec}
    )


def test_group_members_are_labelled_and_named_for_the_sdk() -> None:
    pod = workers.worker_pod(job("grpo", "trainers"), 0)
    assert pod["metadata"]["labels"][names.LABEL_TIMESLICE_GROUP] == "trainers"
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env[names.ENV_TIMESLICE_JOB] == "rl/grpo"
    alone = workers.worker_pod(job("solo", None), 0)
    assert names.LABEL_TIMESLICE_GROUP not in alone["metadata"]["labels"]
    assert names.ENV_TIMESLICE_JOB not in {e["name"] for e in alone["spec"]["containers"][0]["env"]}


def test_group_members_carry_a_projected_token_for_the_orchestrator() -> None:
    pod = workers.worker_pod(job("grpo", "trainers"), 0)
    spec = pod["spec"]
    (vol,) = [v for v in spec["volumes"] if v["name"] == workers.TIMESLICE_TOKEN_VOLUME]
    (src,) = vol["projected"]["sources"]
    assert src["serviceAccountToken"]["audience"] == names.TIMESLICE_TOKEN_AUDIENCE
    (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == workers.TIMESLICE_TOKEN_VOLUME]
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env[names.ENV_TIMESLICE_TOKEN_FILE] == f"{mount['mountPath']}/{src['serviceAccountToken']['path']}"
    alone = workers.worker_pod(job("solo", None), 0)["spec"]
    assert not alone.get("volumes") and not alone["containers"][0].get("volumeMounts")


def test_the_hand_over_plans_over_the_controllers_workers() -> None:
    pods = [workers.worker_pod(job(n, "trainers"), i) for n in ("a", "b") for i in range(2)]
    p = plan(pods, "trainers", 5, "rl/a", "rl/b", "t")
    assert [x.key() for x in p.suspend.patches] == ["rl/a-w0", "rl/a-w1"]
    assert [x.key() for x in p.restore.patches] == ["rl/b-w0", "rl/b-w1"]


def test_serve_takes_the_kube_hand_over_only_with_the_kubernetes_store() -> None:
    from timeslice.cli import _handover, _PerSwitch, build_parser

    args = build_parser().parse_args(["serve", "--handover", "kube", "--store", "memory"])
    with pytest.raises(SystemExit, match="--handover kube needs --store kubernetes"):
        _handover(args, None)
    assert isinstance(_handover(args, object()), _PerSwitch)  # a fresh KubeHandover per switch

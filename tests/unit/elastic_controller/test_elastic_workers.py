"""Worker Pods and the claim template: what the extender, the DRA driver and the SDK read from them."""

from __future__ import annotations

from typing import Any

import pytest

from elastic_controller import workers
from rose_common import extender_names, names
from rose_common.elasticrljob import ElasticRLJob

TEMPLATE = {
    "metadata": {"labels": {"team": "rl"}, "annotations": {"note": "x"}},
    "spec": {
        "containers": [{"name": "trainer", "image": "trainer:1", "env": [{"name": "ROSE_JOB_NAME", "value": "old"}]}]
    },
}


def make_job(**spec: Any) -> ElasticRLJob:
    base: dict[str, Any] = {"minGPUs": 2, "maxGPUs": 8, "gpusPerWorker": 2, "template": TEMPLATE}
    base.update(spec)
    return ElasticRLJob.model_validate(
        {"metadata": {"name": "grpo", "namespace": "rl", "uid": "u-1", "generation": 1}, "spec": base}
    )


def test_claim_template_asks_for_gpus_per_worker_lendable_devices() -> None:
    t = workers.claim_template(make_job())
    assert t["apiVersion"] == "resource.k8s.io/v1" and t["metadata"]["name"] == "grpo-gpus"
    (req,) = t["spec"]["spec"]["devices"]["requests"]
    assert req == {
        "name": "gpus",
        "exactly": {"deviceClassName": names.DEVICE_CLASS_LENDABLE, "allocationMode": "ExactCount", "count": 2},
    }
    assert t["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_worker_pod_carries_what_the_extender_driver_and_sdk_read() -> None:
    pod = workers.worker_pod(make_job(stateBytesPerWorker=4096, checkpointPath="s3://b/ck"), 3, pool="pool-a")
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == "grpo-w3" and meta["namespace"] == "rl"
    assert meta["labels"] == {
        "team": "rl",
        names.LABEL_JOB: "grpo",
        names.LABEL_ROLE: "rl-worker",
        workers.LABEL_WORKER_INDEX: "3",
    }
    ann = meta["annotations"]
    assert ann[names.ANNOTATION_GRACE] == "30" and ann[extender_names.ANNOTATION_MIN_RUN] == "600"
    assert ann[extender_names.ANNOTATION_GPUS] == "2" and ann[names.ANNOTATION_STATE_BYTES] == "4096"
    assert ann["note"] == "x"
    owner = meta["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == (names.KIND, "grpo", True)
    assert spec["schedulerName"] == names.SCHEDULER_NAME
    assert spec["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "grpo-gpus"}]
    assert spec["nodeSelector"] == {names.LABEL_POOL: "pool-a"}
    (c,) = spec["containers"]
    assert c["resources"]["claims"] == [{"name": "gpus"}]
    env = {e["name"]: e for e in c["env"]}
    assert env["ROSE_POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    assert env["ROSE_JOB_NAME"]["value"] == "grpo", "the controller's value wins over the template's"
    assert env["ROSE_CHECKPOINT_PATH"]["value"] == "s3://b/ck"
    assert (env["ROSE_MIN_WORKERS"]["value"], env["ROSE_MAX_WORKERS"]["value"]) == ("1", "4")


def test_worker_pod_does_not_change_the_job_template() -> None:
    job = make_job()
    workers.worker_pod(job, 0)
    assert job.spec.template == TEMPLATE


def test_the_template_cannot_forge_roses_control_annotations_labels_or_node() -> None:
    """Issue 22 finding 6: the controller copied the template's metadata, so a template carrying
    ``rose.io/fencing-token`` or ``rose.io/suspend-state`` reached the worker pods under the
    controller's (trusted) name. ROSE's keys are dropped; the tenant's own keys are kept."""
    forged = {
        names.ANNOTATION_FENCING_TOKEN: "victim:2147483647",
        names.ANNOTATION_SUSPEND_STATE: "Suspended",
        names.ANNOTATION_SUSPEND_REQUEST: '{"by": "timeslice"}',
        names.ANNOTATION_GRACE: "86400",
        "x.rose.io/anything": "1",
        "note": "x",
    }
    labels = {names.LABEL_TIMESLICE_GROUP: "victim", names.LABEL_POOL: "p", "team": "rl"}
    spec = {"nodeName": "node-0", "containers": [{"name": "trainer", "image": "trainer:1"}]}
    pod = workers.worker_pod(
        make_job(template={"metadata": {"labels": labels, "annotations": forged}, "spec": spec}), 0
    )
    ann, got = pod["metadata"]["annotations"], pod["metadata"]["labels"]
    assert not {
        names.ANNOTATION_FENCING_TOKEN,
        names.ANNOTATION_SUSPEND_STATE,
        names.ANNOTATION_SUSPEND_REQUEST,
        "x.rose.io/anything",
    } & set(ann)
    assert ann[names.ANNOTATION_GRACE] == "30" and ann["note"] == "x"
    assert names.LABEL_TIMESLICE_GROUP not in got and names.LABEL_POOL not in got and got["team"] == "rl"
    assert "nodeName" not in pod["spec"]
    assert workers.is_control_key("rose.io/x") and workers.is_control_key("gpu.rose.io/x")
    assert not workers.is_control_key("notrose.io/x") and not workers.is_control_key("rose.io")


def test_reported_state_bytes_override_the_spec_estimate() -> None:
    pod = workers.worker_pod(make_job(stateBytesPerWorker=1), 0, state_bytes=99)
    assert pod["metadata"]["annotations"][names.ANNOTATION_STATE_BYTES] == "99"
    assert names.ANNOTATION_STATE_BYTES not in workers.worker_pod(make_job(), 0)["metadata"]["annotations"]


def test_a_template_without_containers_is_refused_with_what_to_fix() -> None:
    with pytest.raises(ValueError, match=r"spec.template.spec.containers is empty"):
        workers.worker_pod(make_job(template={"spec": {}}), 0)


def test_worker_names_round_trip_and_stay_dns_labels() -> None:
    assert workers.worker_index("grpo", workers.worker_name("grpo", 12)) == 12
    assert workers.worker_index("grpo", "grpo-x-w1") is None
    assert workers.worker_index("grpo", "other-w1") is None
    with pytest.raises(ValueError, match="shorten the job's name"):
        workers.worker_name("j" * 60, 100)

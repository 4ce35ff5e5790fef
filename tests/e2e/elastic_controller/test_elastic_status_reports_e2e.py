"""The workers' reports in an ElasticRLJob's status, against the real kube-apiserver: the status
the controller computes from reported pod annotations is accepted through the status
subresource, reads back equal and is printed (column ``Workload``, ``-o wide``); a phase the CRD
refuses is refused by the server with the field named."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from elastic_controller.observe import observe
from elastic_controller.planner import JobTarget
from elastic_controller.status import compute_status
from rose_common import names
from rose_common.elasticrljob import ElasticRLJob
from tests.support.erj_manifests import elastic_rl_job
from tests.support.k8s_helpers import delete_namespace, new_namespace

TEMPLATE = {"spec": {"containers": [{"name": "t", "image": "t:1"}]}}


@pytest.fixture
def ns(api: Any) -> Iterator[str]:
    name = new_namespace(api, "erj-reports")
    yield name
    delete_namespace(api, name)


def _job(api: Any, ns: str) -> ElasticRLJob:
    body = elastic_rl_job("r", minGPUs=1, maxGPUs=2, template=TEMPLATE)
    obj = client.CustomObjectsApi(api).create_namespaced_custom_object(
        names.GROUP, names.VERSION, ns, names.PLURAL, body
    )
    return ElasticRLJob.model_validate(obj)


def _patch(api: Any, ns: str, status: dict[str, Any]) -> dict[str, Any]:
    crd = client.CustomObjectsApi(api)
    out: dict[str, Any] = crd.patch_namespaced_custom_object_status(
        names.GROUP, names.VERSION, ns, names.PLURAL, "r", {"status": status}
    )
    return out


def test_reported_status_is_accepted_printed_and_a_bad_phase_refused(api: Any, ns: str) -> None:
    job = _job(api, ns)
    ann = {
        names.ANNOTATION_WORKLOAD_PHASE: "rollout",
        names.ANNOTATION_SECONDS_TO_SAFE_POINT: "7.5",
        names.ANNOTATION_REPORTED_STATE_BYTES: str(3 << 30),
    }
    pod = {
        "metadata": {"name": "r-w0", "uid": "u0", "labels": {names.LABEL_JOB: "r"}, "annotations": ann},
        "spec": {},
        "status": {"phase": "Running"},
    }
    workers = [w for w in [observe("r", pod)] if w is not None]
    status, _ = compute_status(job, workers, JobTarget(f"{ns}/r", 1), None, datetime.now(UTC).replace(microsecond=0))
    out = _patch(api, ns, status.model_dump(mode="json", exclude_none=True))
    back = ElasticRLJob.model_validate(out).status
    assert back == status and back is not None
    assert (back.workload_phase, back.seconds_to_safe_point, back.state_bytes) == ("rollout", 7.5, 3 << 30)

    m, url, headers, _, _ = api.param_serialize(
        method="GET",
        resource_path=f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{ns}/{names.PLURAL}/r",
        query_params=[("includeObject", "None")],
        header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
        auth_settings=["BearerToken"],
    )
    table = json.loads(api.call_api(m, url, header_params=headers).read())
    columns = [c["name"] for c in table["columnDefinitions"]]
    assert dict(zip(columns, table["rows"][0]["cells"], strict=True))["Workload"] == "rollout"

    with pytest.raises(ApiException) as e:
        _patch(api, ns, {"workloadPhase": "has spaces", "secondsToSafePoint": -1})
    assert e.value.status == 422
    assert "status.workloadPhase" in e.value.body and "status.secondsToSafePoint" in e.value.body

"""The ElasticRLJob models against the real kube-apiserver: defaults, the status subresource, printer columns."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from elastic_controller.observe import observe
from elastic_controller.planner import JobTarget
from elastic_controller.status import compute_status
from rose_common import names
from rose_common.elasticrljob import ElasticRLJob, ElasticRLJobSpec
from tests.support.erj_manifests import elastic_rl_job
from tests.support.k8s_helpers import delete_namespace, new_namespace

TEMPLATE = {"spec": {"containers": [{"name": "t", "image": "t:1"}]}}


@pytest.fixture
def ns(api: Any) -> Iterator[str]:
    name = new_namespace(api, "erj-model")
    yield name
    delete_namespace(api, name)


def _crd(api: Any) -> Any:
    return client.CustomObjectsApi(api)


def test_server_defaults_equal_the_model_defaults(api: Any, ns: str) -> None:
    spec = ElasticRLJobSpec.model_validate({"minGPUs": 2, "maxGPUs": 4, "template": TEMPLATE})
    body = elastic_rl_job("d", minGPUs=2, maxGPUs=4, template=TEMPLATE)
    obj = _crd(api).create_namespaced_custom_object(names.GROUP, names.VERSION, ns, names.PLURAL, body)
    assert obj["spec"] == spec.model_dump(mode="json", exclude_none=True)
    assert ElasticRLJob.model_validate(obj).spec == spec


def test_status_from_the_controller_is_accepted_and_printed(api: Any, ns: str) -> None:
    body = elastic_rl_job("s", minGPUs=2, maxGPUs=4, template=TEMPLATE)
    obj = _crd(api).create_namespaced_custom_object(names.GROUP, names.VERSION, ns, names.PLURAL, body)
    job = ElasticRLJob.model_validate(obj)
    pods = [
        {
            "metadata": {"name": f"s-w{i}", "uid": f"u{i}", "labels": {names.LABEL_JOB: "s"}},
            "spec": {},
            "status": {"phase": "Running"},
        }
        for i in range(2)
    ]
    workers = [w for w in (observe("s", p) for p in pods) if w is not None]
    status, _ = compute_status(job, workers, JobTarget(f"{ns}/s", 2), None, datetime.now(UTC).replace(microsecond=0))
    patch = {"status": status.model_dump(mode="json", exclude_none=True)}
    out = _crd(api).patch_namespaced_custom_object_status(names.GROUP, names.VERSION, ns, names.PLURAL, "s", patch)
    assert ElasticRLJob.model_validate(out).status == status
    m, url, headers, _, _ = api.param_serialize(
        method="GET",
        resource_path=f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{ns}/{names.PLURAL}/s",
        header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
        auth_settings=["BearerToken"],
    )
    resp = api.call_api(m, url, header_params=headers)
    table = json.loads(resp.read())
    columns = [c["name"] for c in table["columnDefinitions"]]
    row = dict(zip(columns, table["rows"][0]["cells"], strict=True))
    assert (row["Phase"], row["Active-GPUs"], row["Target-GPUs"], row["Min"], row["Max"]) == ("Running", 2, 2, 2, 4)

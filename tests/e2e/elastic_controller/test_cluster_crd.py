"""The ElasticRLJob CRD on the real kube-apiserver: a bad spec is refused with a clear message."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from rose_common import names
from tests.support.erj_manifests import elastic_rl_job
from tests.support.k8s_helpers import delete_namespace, new_namespace


@pytest.fixture
def ns(api: Any) -> Iterator[str]:
    name = new_namespace(api, "crd")
    yield name
    delete_namespace(api, name)


def _job(name: str, **spec: Any) -> dict[str, Any]:
    return elastic_rl_job(name, **{"minGPUs": 2, "maxGPUs": 8, "gpusPerWorker": 1, "template": {"spec": {}}, **spec})


def _create(api: Any, ns: str, body: dict[str, Any]) -> dict[str, Any]:
    obj: dict[str, Any] = client.CustomObjectsApi(api).create_namespaced_custom_object(
        names.GROUP, names.VERSION, ns, names.PLURAL, body
    )
    return obj


def test_valid_job_is_accepted_with_defaults(api: Any, ns: str) -> None:
    obj = _create(api, ns, _job("ok"))
    assert obj["spec"]["gracefulShutdownPeriod"] == 30
    assert obj["spec"]["suspendPolicy"] == "HostMemoryFirst"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"minGPUs": 9, "maxGPUs": 8}, "minGPUs must be less than or equal to maxGPUs"),
        ({"minGPUs": 0}, "spec.minGPUs: Invalid value: 0"),
        ({"gracefulShutdownPeriod": -1}, "spec.gracefulShutdownPeriod"),
        ({"gpusPerWorker": 4, "minGPUs": 2}, "multiples of gpusPerWorker"),
        ({"suspendPolicy": "CheckpointAndEvict"}, "needs checkpointPath"),
    ],
)
def test_bad_spec_is_refused_with_what_to_fix(api: Any, ns: str, spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ApiException) as e:
        _create(api, ns, _job("bad", **spec))
    assert e.value.status == 422
    assert message in str(e.value.body), e.value.body
    items = client.CustomObjectsApi(api).list_namespaced_custom_object(names.GROUP, names.VERSION, ns, names.PLURAL)
    assert items["items"] == [], "a refused spec must not be half-applied"

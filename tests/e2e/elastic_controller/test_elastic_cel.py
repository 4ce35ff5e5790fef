"""Every CEL rule of the ElasticRLJob CRD, refused by the real kube-apiserver with its message.

Table-driven from ``elastic_cel_cases.CASES`` (one row per ``x-kubernetes-validations``
rule; the unit tier fails when the CRD has a rule without a row). Each row's object violates
exactly its rule: the refusal must carry that rule's message and no other rule's, and nothing
is stored. The valid base object is accepted, so a refusal is the rule's doing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from rose_common import names
from tests.support.elastic_cel_cases import CASES, VALID_SPEC, CelCase, violating_spec
from tests.support.erj_manifests import elastic_rl_job
from tests.support.k8s_helpers import delete_namespace, new_namespace


@pytest.fixture(scope="module")
def ns(cluster: Any) -> Iterator[str]:
    api = cluster.api_client()
    name = new_namespace(api, "cel")
    yield name
    delete_namespace(api, name)
    api.close()


def _body(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return elastic_rl_job(name, **spec)


def _create(api: Any, ns: str, body: dict[str, Any]) -> None:
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        names.GROUP, names.VERSION, ns, names.PLURAL, body, dry_run="All"
    )


def test_the_valid_base_object_is_accepted(api: Any, ns: str) -> None:
    _create(api, ns, _body("base", VALID_SPEC))


@pytest.mark.parametrize("case", CASES, ids=[c.message for c in CASES])
def test_each_cel_rule_is_refused_with_its_message(api: Any, ns: str, case: CelCase) -> None:
    with pytest.raises(ApiException) as e:
        _create(api, ns, _body("bad", violating_spec(case)))
    body = str(e.value.body)
    assert e.value.status == 422, body
    assert case.message in body, f"refusal without the rule's message {case.message!r}: {body}"
    field = case.path.lstrip(".")
    assert f"{field}: Invalid value" in body, f"the refusal does not name {field}: {body}"
    others = [c.message for c in CASES if c.message != case.message and c.message in body]
    assert not others, f"the object violates more than its own rule: {others}"
    items = client.CustomObjectsApi(api).list_namespaced_custom_object(names.GROUP, names.VERSION, ns, names.PLURAL)
    assert items["items"] == [], "a refused object must not be stored"

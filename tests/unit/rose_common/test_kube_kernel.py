"""rose_common.kube.errors and rose_common.kube.objects: the typed errors and object views."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException

from rose_common.kube import objects
from rose_common.kube.errors import (
    ApiError,
    Conflict,
    Gone,
    NotFound,
    Status,
    Unprocessable,
    error_for,
    from_api_exception,
    parse_status,
)

STATUS_422 = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "message": 'Pod "rl-0" is invalid: spec: Forbidden: pod updates may not change fields',
    "reason": "Invalid",
    "details": {"name": "rl-0", "kind": "pods", "causes": [{"reason": "FieldValueForbidden", "field": "spec"}]},
    "code": 422,
}


@pytest.mark.parametrize(
    ("code", "cls"), [(404, NotFound), (409, Conflict), (410, Gone), (422, Unprocessable), (403, ApiError)]
)
def test_each_code_has_its_error(code: int, cls: type[ApiError]) -> None:
    err = error_for(Status(code, "R", "m"))
    assert type(err) is cls and isinstance(err, ApiError) and err.code == code


def test_the_client_exception_is_translated_with_its_parsed_status() -> None:
    e = ApiException(status=422, reason="Unprocessable Entity")
    e.body = json.dumps(STATUS_422)
    err = from_api_exception(e)
    assert isinstance(err, Unprocessable)
    assert err.status.reason == "Invalid" and "may not change" in err.status.message
    assert err.status.details["causes"][0]["field"] == "spec"
    assert "422 Invalid" in str(err)


def test_a_body_that_is_not_a_status_becomes_the_message() -> None:
    s = parse_status(502, b"<html>bad gateway</html>", "Bad Gateway")
    assert s == Status(502, "Bad Gateway", "<html>bad gateway</html>")
    assert parse_status(404, None, "Not Found") == Status(404, "Not Found", "")
    assert parse_status(404, "[1, 2]").message == "[1, 2]"  # JSON, but not a Status object


POD = {
    "metadata": {
        "namespace": "ml",
        "name": "rl-0",
        "uid": "u-1",
        "resourceVersion": "7",
        "labels": {"a": "1"},
        "annotations": {"b": "2"},
        "deletionTimestamp": "2026-01-01T00:00:00Z",
    },
    "spec": {"nodeName": "n1"},
    "status": {"phase": "Running"},
}


def test_object_views_read_metadata() -> None:
    assert objects.namespaced_name(POD) == "ml/rl-0" and objects.uid(POD) == "u-1"
    assert objects.labels(POD) == {"a": "1"} and objects.annotations(POD) == {"b": "2"}
    assert objects.resource_version(POD) == "7" and objects.deleting(POD)
    assert objects.spec(POD)["nodeName"] == "n1" and objects.status(POD)["phase"] == "Running"
    assert objects.namespaced_name({"metadata": {"name": "node-a"}}) == "node-a"  # cluster-scoped


@pytest.mark.parametrize("obj", [None, {}, {"metadata": None}, {"metadata": "x"}, {"metadata": {"labels": None}}])
def test_object_views_tolerate_absent_or_malformed_parts(obj: dict | None) -> None:  # type: ignore[type-arg]
    assert objects.labels(obj) == {} and objects.annotations(obj) == {} and objects.name(obj) == ""
    assert objects.uid(obj) == "" and not objects.deleting(obj) and objects.spec(obj) == {}


def test_list_items_and_version() -> None:
    doc = {"metadata": {"resourceVersion": "42"}, "items": [POD, "junk", None]}
    assert objects.items(doc) == [POD] and objects.resource_version(doc) == "42"
    assert objects.items({"items": None}) == [] and objects.items(None) == []

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.podwatch import Action, BadSuspendRequestError, decide, parse_request
from rose_common import names


def pod(ann: dict[str, str] | None = None, job: bool = True, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "namespace": "ml",
        "name": "rl-0",
        "uid": "u",
        "annotations": ann or {},
        "labels": {names.LABEL_JOB: "j"} if job else {},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta}


REQ = '{"by": "extender", "reason": "serving", "graceSeconds": 12, "at": "2026-01-01T00:00:00Z"}'


def test_request_on_rl_pod_suspends_with_its_grace() -> None:
    a = decide(pod({names.ANNOTATION_SUSPEND_REQUEST: REQ}), set())
    assert a == Action("suspend", a.pod, 12.0) and a.pod.uid == "u"  # type: ignore[union-attr]


def test_request_acted_on_is_left_alone_and_withdrawal_resumes() -> None:
    ann = {names.ANNOTATION_SUSPEND_REQUEST: REQ, names.ANNOTATION_SUSPEND_STATE: "Suspended"}
    assert decide(pod(ann), {"u"}) is None
    # a failed suspend (the state stays Suspending) is not retried on every pod event
    failed = {names.ANNOTATION_SUSPEND_REQUEST: REQ, names.ANNOTATION_SUSPEND_STATE: "Suspending"}
    assert decide(pod(failed), {"u"}) is None
    assert decide(pod({names.ANNOTATION_SUSPEND_STATE: "Suspended"}), {"u"}).kind == "resume"  # type: ignore[union-attr]
    assert decide(pod(), set()) is None
    assert decide(pod({names.ANNOTATION_SUSPEND_REQUEST: REQ}, job=False), set()) is None  # serving pods
    assert decide(pod({names.ANNOTATION_SUSPEND_REQUEST: REQ}, deleting=True), set()) is None


@pytest.mark.parametrize(
    ("raw", "frag"),
    [("nope", "not JSON"), ("[1]", "JSON object"), ('{"graceSeconds": -1}', ">= 0"), ('{"graceSeconds": "5"}', ">= 0")],
)
def test_malformed_requests_are_refused_clearly(raw: str, frag: str) -> None:
    with pytest.raises(BadSuspendRequestError, match=frag):
        parse_request(raw)
    assert parse_request("{}") is None

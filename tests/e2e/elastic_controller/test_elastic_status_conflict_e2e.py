"""The controller's status write on the real kube-apiserver (docs/bench/soak.md, T5): a status
computed from a stale copy of the job is refused, so status.suspendCount never goes back."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from elastic_controller.desired import desired
from elastic_controller.kube import KubeJobApi
from elastic_controller.observe import observe
from elastic_controller.reconciler import StatusConflict, converge
from rose_common import names
from rose_common.elasticrljob import ElasticRLJob
from rose_common.kube.client import Raw
from tests.support.k8s_helpers import delete_namespace, new_namespace

TEMPLATE = {"spec": {"containers": [{"name": "t", "image": "t:1"}]}}
NOW = datetime.now(UTC).replace(microsecond=0)


@pytest.fixture
def ns(api: Any) -> Iterator[str]:
    name = new_namespace(api, "erj-conflict")
    yield name
    delete_namespace(api, name)


def _workers(state: str) -> list[Any]:
    pods = [
        {
            "metadata": {
                "name": f"c-w{i}",
                "uid": f"u{i}",
                "labels": {names.LABEL_JOB: "c"},
                "annotations": {names.ANNOTATION_SUSPEND_STATE: state},
            },
            "spec": {},
            "status": {"phase": "Running"},
        }
        for i in range(2)
    ]
    return [w for w in (observe("c", p) for p in pods) if w is not None]


def _read(crd: Any, ns: str) -> ElasticRLJob:
    obj = crd.get_namespaced_custom_object(names.GROUP, names.VERSION, ns, names.PLURAL, "c")
    return ElasticRLJob.model_validate(obj)


def test_a_status_from_a_stale_copy_of_the_job_is_refused_and_the_count_kept(api: Any, ns: str) -> None:
    crd = client.CustomObjectsApi(api)
    body = {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {"name": "c"},
        "spec": {"minGPUs": 2, "maxGPUs": 2, "template": TEMPLATE},
    }
    stale = ElasticRLJob.model_validate(
        crd.create_namespaced_custom_object(names.GROUP, names.VERSION, ns, names.PLURAL, body)
    )
    kube = KubeJobApi(Raw(api))
    suspended = desired(stale, _workers("Suspended"), None, NOW)
    assert suspended.status.suspend_count == 1
    assert converge(kube, stale, suspended) == []  # written under the copy's resourceVersion
    # the workers begin resuming; a pass from the same (now stale) copy computes suspendCount 0
    resuming = desired(stale, _workers("Resuming"), None, NOW)
    assert (resuming.status.phase, resuming.status.suspend_count) == ("Resuming", 0)
    with pytest.raises(StatusConflict, match="changed since resourceVersion"):
        kube.patch_status(stale, resuming.status)
    failures = converge(kube, stale, resuming)
    assert [(f.action, f.conflict) for f in failures] == [("patch_status", True)]  # nothing else tried
    fresh = _read(crd, ns)
    assert fresh.status is not None
    assert (fresh.status.phase, fresh.status.suspend_count) == ("Suspended", 1)
    # from the fresh copy the pass is accepted and the count stays
    again = desired(fresh, _workers("Resuming"), None, NOW)
    assert converge(kube, fresh, again) == []
    after = _read(crd, ns).status
    assert after is not None
    assert (after.phase, after.suspend_count) == ("Resuming", 1)

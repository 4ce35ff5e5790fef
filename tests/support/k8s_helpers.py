"""The end-to-end tests' view of the harness's object helpers (local_cluster/objects.py)."""

import contextlib
from collections.abc import Iterator
from typing import Any

from local_cluster.objects import (
    claim_template,
    create_claim_template,
    delete_namespace,
    gpu_pod,
    new_namespace,
    pod_claim,
    report_container_resources,
    wait_for,
)

__all__ = [
    "claim_template",
    "create_claim_template",
    "delete_namespace",
    "gpu_pod",
    "new_namespace",
    "pod_claim",
    "report_container_resources",
    "scratch_namespace",
    "wait_for",
]


@contextlib.contextmanager
def scratch_namespace(api: Any, prefix: str) -> Iterator[str]:
    """A new namespace for one test, deleted after it (whatever the test left in it)."""
    name = new_namespace(api, prefix)
    try:
        yield name
    finally:
        delete_namespace(api, name)

"""The end-to-end tests' view of the harness's object helpers (local_cluster/objects.py)."""

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
    "wait_for",
]

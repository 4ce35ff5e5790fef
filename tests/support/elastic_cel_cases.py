"""The table of ElasticRLJob CEL rules: one row per ``x-kubernetes-validations`` rule of
``manifests/crd/elasticrljob.yaml``, with an object that violates exactly that rule.

Pure data (no client import), read by ``test_elastic_cel.py`` (each row sent to the real
kube-apiserver) and by ``tests/unit/elastic_controller/test_elastic_cel_table.py`` (a rule in the CRD without a row
here, or a row without its rule, fails the unit tier).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CelCase:
    path: str  # where the rule sits in the schema: ".spec", ".spec.template", ...
    message: str  # the rule's message, exactly as in the CRD
    spec: dict[str, Any]  # fields that, merged over VALID_SPEC, violate this rule and no other


VALID_SPEC: dict[str, Any] = {"minGPUs": 2, "maxGPUs": 8, "gpusPerWorker": 1, "template": {"spec": {}}}
_NO_SIZE: dict[str, Any] = {"minGPUs": None, "maxGPUs": None, "template": None}  # None: the field left out
_TRAINER: dict[str, Any] = {"workers": 1, "template": {"spec": {}}}
_ROLLOUT: dict[str, Any] = {"minWorkers": 1, "maxWorkers": 2, "template": {"spec": {}}}
_BIG = (256 << 30) + 1
_SHARE: dict[str, Any] = {"memory": "20Gi", "compute": 25}

CASES: tuple[CelCase, ...] = (
    CelCase(".spec", "minGPUs must be less than or equal to maxGPUs", {"minGPUs": 9, "maxGPUs": 8}),
    CelCase(".spec", "minGPUs and maxGPUs must be multiples of gpusPerWorker", {"minGPUs": 2, "gpusPerWorker": 4}),
    CelCase(".spec", "suspendPolicy CheckpointAndEvict needs checkpointPath", {"suspendPolicy": "CheckpointAndEvict"}),
    CelCase(
        ".spec",
        "stateBytesPerWorker must be at most gpusPerWorker x 274877906944 bytes, 256 GiB per GPU: "
        "a worker's device state fits its GPUs' memory",
        {"stateBytesPerWorker": (256 << 30) + 1},
    ),
    CelCase(
        ".spec",
        "spec.roles replaces minGPUs, maxGPUs, template and stateBytesPerWorker: give either roles or those fields",
        {"roles": {"trainer": _TRAINER, "rollout": _ROLLOUT}},
    ),
    CelCase(".spec", "a job without spec.roles needs minGPUs, maxGPUs and template", {"template": None}),
    CelCase(
        ".spec",
        "spec.roles and timesliceGroup do not combine yet: a time-slice group shares one claim per worker index",
        {**_NO_SIZE, "roles": {"trainer": _TRAINER, "rollout": _ROLLOUT}, "timesliceGroup": "g"},
    ),
    CelCase(
        ".spec.roles.rollout",
        "rollout minWorkers must be less than or equal to maxWorkers",
        {**_NO_SIZE, "roles": {"trainer": _TRAINER, "rollout": {**_ROLLOUT, "minWorkers": 3}}},
    ),
    CelCase(
        ".spec.roles.trainer",
        "stateBytesPerWorker must be at most gpusPerWorker x 274877906944 bytes, 256 GiB per GPU: "
        "a worker's device state fits its GPUs' memory",
        {**_NO_SIZE, "roles": {"trainer": {**_TRAINER, "stateBytesPerWorker": _BIG}, "rollout": _ROLLOUT}},
    ),
    CelCase(
        ".spec.roles.rollout",
        "stateBytesPerWorker must be at most gpusPerWorker x 274877906944 bytes, 256 GiB per GPU: "
        "a worker's device state fits its GPUs' memory",
        {**_NO_SIZE, "roles": {"trainer": _TRAINER, "rollout": {**_ROLLOUT, "stateBytesPerWorker": _BIG}}},
    ),
    CelCase(
        ".spec",
        "gpuShare gives each worker a fraction of one GPU: gpusPerWorker must be 1",
        {"gpuShare": _SHARE, "gpusPerWorker": 2},
    ),
    CelCase(
        ".spec",
        "gpuShare does not combine with spec.roles or timesliceGroup yet",
        {"gpuShare": _SHARE, "timesliceGroup": "g"},
    ),
    CelCase(
        ".spec.gpuShare",
        "gpuShare.memory must be a quantity above 0, such as 20Gi",
        {"gpuShare": {**_SHARE, "memory": "0"}},
    ),
    CelCase(
        ".spec.gpuShare",
        "gpuShare.memory must be at most 256Gi, the most memory one GPU has",
        {"gpuShare": {**_SHARE, "memory": "257Gi"}},
    ),
)


def violating_spec(case: CelCase) -> dict[str, Any]:
    """VALID_SPEC with the row's fields merged over it; a field the row sets to None is left out."""
    return {k: v for k, v in {**VALID_SPEC, **case.spec}.items() if v is not None}
